"""Verdict table: each row is a symptom from the playbook's checklist and the verdict a human would give."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from exporter import linkmath
from exporter.derived.gpuview import gpu_view
from exporter.derived.hostshape import cpu_shape, io_signals
from exporter.derived.verdict import Candidate, classify, settle
from exporter.samples.host import NfsSample, PressureSample
from exporter.snapshot import Stamped
from tests.support.builders import (
    GpuSpec,
    ThreadSpec,
    const,
    cpu_window,
    gpu_windows,
    nfs_window,
    pressure_window,
    proc_window,
    square,
)

W = 15.0


def judge(
    gpu: GpuSpec,
    threads: Sequence[ThreadSpec] = (),
    *,
    allowed: frozenset[int] = frozenset(range(32)),
    n_cpus: int = 32,
    iowait: float = 0.0,
    psi: Mapping[str, tuple[float, float]] | None = None,
    nfs: tuple[Mapping[str, float], float] | None = None,
    reads: tuple[float, float] = (0.0, 0.0),
    previous: str | None = None,
) -> Candidate:
    """Classify GPU ``gpu`` driven by one process with ``threads``, on a quiet host unless told otherwise."""
    fast, buf, slow = gpu_windows([gpu], 0.0, W)
    pid = gpu.pids[0]
    procs = proc_window(pid, threads, 5.0, W, cpus_allowed=allowed, total_threads=8,
                        read_bytes_per_s=reads[0], read_calls_per_s=reads[1])
    # Place each thread's load on its own allowed core, as the kernel would spread runnable threads.
    busy: dict[int, tuple[float, float]] = {}
    cores = sorted(allowed)
    k = 0
    for spec in threads:
        for _ in range(spec.count):
            if spec.user + spec.system > 0.05 and k < len(cores):
                c = cores[k]
                u, s = busy.get(c, (0.0, 0.0))
                busy[c] = (min(1.0, u + spec.user), min(1.0 - min(1.0, u + spec.user), s + spec.system))
                k += 1
    cpus = cpu_window(n_cpus, busy, 5.0, W, iowait=iowait)
    pressure: list[Stamped[PressureSample]] = pressure_window(psi or {}, 0.0, W)
    nfs_w: list[Stamped[NfsSample]] = nfs_window(nfs[0], nfs[1], 0.0, W) if nfs else []
    io = io_signals(pressure, [], nfs_w)
    view = gpu_view(gpu.index, fast, buf, slow)
    shape = cpu_shape(procs, procs, cpus, view.pids)
    cap = linkmath.capacity_bytes_per_second(*gpu.link)
    return classify(view, shape, io, capacity=cap, link_name=f"Gen{gpu.link[0]} x{gpu.link[1]}", window_s=W,
                    previous=previous)


def test_one_hot_thread_with_waiting_gpu_is_launch_bound() -> None:
    c = judge(GpuSpec(util=const(0.42), sm=const(0.11)),
              [ThreadSpec(1, 0.56, 0.43, "R"), ThreadSpec(11, 0.01, 0.0)],
              allowed=frozenset(range(16)))
    assert c.cause == "launch_bound"
    assert c.waiting_ratio == pytest.approx(0.58, abs=0.02)
    assert any("thread 4242" in e and "0.99 core" in e and "43% system" in e for e in c.evidence)
    assert "waited 58%" in c.evidence[0]


def test_pure_python_hot_thread_with_little_system_time_is_still_launch_bound() -> None:
    c = judge(GpuSpec(util=const(0.5), sm=const(0.3)), [ThreadSpec(1, 0.97, 0.02, "R")])
    assert c.cause == "launch_bound"
    assert any("pure-Python" in e for e in c.evidence)


def test_many_saturated_user_time_workers_with_bursty_gpu_is_input_bound() -> None:
    wave = square(0.98, 0.0, 1.2, 0.35)
    c = judge(GpuSpec(util=wave, sm=square(0.8, 0.0, 1.2, 0.35)),
              [ThreadSpec(1, 0.25, 0.05), ThreadSpec(12, 0.93, 0.05, "R")],
              allowed=frozenset(range(16)), psi={"cpu": (0.2, 0.0)})
    assert c.cause == "input_bound"
    assert any("12 python threads of pid 4242" in e and "saturated" in e for e in c.evidence)
    assert "recur every 1.2 s" in c.evidence[0]


def test_saturation_is_judged_against_allowed_cpus_not_the_host_average() -> None:
    # 4 allowed CPUs out of 128, all four full: the host average is 3%, the process is CPU-starved.
    c = judge(GpuSpec(util=const(0.5), sm=const(0.4)),
              [ThreadSpec(1, 0.3, 0.05, "R"), ThreadSpec(3, 0.85, 0.05, "R")],
              allowed=frozenset({8, 9, 10, 11}), n_cpus=128)
    assert c.cause == "input_bound"  # the hot thread holds well under half of the CPU used


def test_three_busy_threads_with_headroom_are_not_input_bound() -> None:
    # Three tokenizer threads at 62% of a core each, CPUs to spare: they could go faster, so they are not
    # what the GPU waits for (the playbook: saturated workers, not busy ones).
    c = judge(GpuSpec(util=const(0.5), sm=const(0.4)),
              [ThreadSpec(1, 0.1, 0.02, "S"), ThreadSpec(3, 0.6, 0.02, "R")])
    assert c.cause == "latency_bound"
    assert any("3 python threads of pid 4242" in e and "not saturated" in e for e in c.evidence)


def test_d_state_readers_with_iowait_io_pressure_and_nfs_storm_are_io_bound() -> None:
    c = judge(GpuSpec(util=square(0.95, 0.0, 3.0, 0.18), gpm=False),
              [ThreadSpec(1, 0.1, 0.02), ThreadSpec(8, 0.05, 0.06, "D")],
              iowait=0.25, psi={"io": (0.55, 0.3)},
              nfs=({"read": 9800, "getattr": 21000, "open": 4900, "lookup": 4900}, 35.0),
              reads=(4.0e7, 9800))
    assert c.cause == "io_bound"
    assert any("D state" in e for e in c.evidence)
    assert any("4.0 KiB" in e for e in c.evidence)


def test_pcie_at_the_current_degraded_links_capacity_is_transfer_bound() -> None:
    c = judge(GpuSpec(util=const(0.3), gpm=False, rx=const(7.2e9), link=(3, 8), max_link=(4, 16)),
              [ThreadSpec(1, 0.3, 0.1), ThreadSpec(4, 0.2, 0.02)])
    assert c.cause == "transfer_bound"
    assert any("Gen3 x8" in e for e in c.evidence)


def test_same_traffic_on_a_full_gen5_link_is_not_transfer_bound() -> None:
    c = judge(GpuSpec(util=const(0.3), gpm=False, rx=const(7.2e9), link=(5, 16)),
              [ThreadSpec(1, 0.3, 0.1), ThreadSpec(4, 0.2, 0.02)])
    assert c.cause == "latency_bound"


def test_busy_gpu_with_thermal_clock_reasons_and_low_clock_is_gpu_throttled() -> None:
    c = judge(GpuSpec(util=const(0.99), sm=const(0.8), clock_ratio=const(0.56),
                      reasons=frozenset({"hw_thermal", "sw_thermal"})), [ThreadSpec(1, 0.4, 0.05)])
    assert c.cause == "gpu_throttled"


def test_resident_kernels_with_a_quarter_of_sms_active_is_gpu_inefficient() -> None:
    c = judge(GpuSpec(util=const(0.99), sm=const(0.24)), [ThreadSpec(1, 0.08, 0.02)])
    assert c.cause == "gpu_inefficient"
    assert c.waiting_ratio < 0.05


def test_partly_idle_gpu_on_a_quiet_host_is_latency_bound() -> None:
    c = judge(GpuSpec(util=const(0.24), gpm=False, rx=const(2e7)),
              [ThreadSpec(1, 0.12, 0.05), ThreadSpec(4, 0.03, 0.01)])
    assert c.cause == "latency_bound"
    assert c.waiting_ratio == pytest.approx(0.76, abs=0.02)


def test_zero_utilisation_with_a_process_attached_is_idle() -> None:
    c = judge(GpuSpec(util=const(0.0)), [ThreadSpec(1, 0.01, 0.0)])
    assert c.cause == "idle"
    assert c.waiting_ratio == 0.0
    assert "(1 process attached)" in c.evidence[0], c.evidence  # P10: was "1 process(es)"


def test_busy_gpu_with_high_sm_activity_is_healthy() -> None:
    c = judge(GpuSpec(util=const(0.97), sm=const(0.82)), [ThreadSpec(1, 0.55, 0.08, "R"), ThreadSpec(4, 0.35, 0.03)])
    assert c.cause == "healthy"


def test_moderately_waiting_gpu_stays_healthy_with_a_note() -> None:
    c = judge(GpuSpec(util=const(0.88), sm=const(0.7)), [ThreadSpec(1, 0.5, 0.05)])
    assert c.cause == "healthy"
    assert any("moderately bound" in e for e in c.evidence)


def test_waiting_verdict_holds_inside_the_hysteresis_band() -> None:
    # 17% waiting: below the 20% entry threshold, above the 15% exit threshold.
    fresh = judge(GpuSpec(util=const(0.83), sm=const(0.7)), [ThreadSpec(1, 0.97, 0.3, "R")])
    held = judge(GpuSpec(util=const(0.83), sm=const(0.7)), [ThreadSpec(1, 0.97, 0.3, "R")], previous="launch_bound")
    assert fresh.cause == "healthy"
    assert held.cause == "launch_bound"


def test_new_verdict_replaces_the_old_only_after_it_held() -> None:
    s = settle(None, "healthy", 0.0, 3.0)
    s = settle(s, "launch_bound", 1.0, 3.0)
    assert s.cause == "healthy"
    s = settle(s, "launch_bound", 3.0, 3.0)
    assert s.cause == "healthy"
    s = settle(s, "launch_bound", 4.0, 3.0)
    assert s.cause == "launch_bound"


def test_a_flapping_candidate_never_replaces_the_verdict() -> None:
    s = settle(None, "healthy", 0.0, 3.0)
    for t in range(1, 20):
        s = settle(s, "launch_bound" if t % 2 else "healthy", float(t), 3.0)
    assert s.cause == "healthy"


def test_copies_bursting_to_the_links_capacity_while_the_gpu_waits_are_transfer_bound() -> None:
    # Gen3 x16 carries ~13 GB/s; copies at 12.5 GB/s half the time average only 48% of it.
    c = judge(GpuSpec(util=square(0.0, 0.9, 2.0, 0.5), gpm=False, rx=square(12.5e9, 0.0, 2.0, 0.5), link=(3, 16),
                      max_link=(3, 16)),
              [ThreadSpec(1, 0.2, 0.1)])
    assert c.cause == "transfer_bound"
    assert any("burst" in e for e in c.evidence)


def test_allowed_cpus_full_of_other_jobs_do_not_make_a_quiet_gpu_input_bound() -> None:
    # Every CPU the GPU process may run on is busy -- with a neighbour's data loaders, not with anything of
    # this GPU's workload: CPU evidence of two jobs is never mixed because they share CPUs.
    fast, buf, slow = gpu_windows([GpuSpec(util=square(0.95, 0.0, 1.5, 0.3), sm=square(0.8, 0.0, 1.5, 0.3))],
                                  0.0, W)
    procs = proc_window(4242, [ThreadSpec(1, 0.3, 0.05)], 5.0, W, cpus_allowed=frozenset(range(8)))
    cpus = cpu_window(32, {c: (0.9, 0.05) for c in range(8)}, 5.0, W)
    view = gpu_view(0, fast, buf, slow)
    shape = cpu_shape(procs, procs, cpus, view.pids)
    c = classify(view, shape, io_signals([], [], []), capacity=5e10, link_name="Gen5 x16", window_s=W)
    assert c.cause == "latency_bound"


def test_zero_sm_activity_on_a_busy_gpu_is_no_evidence_of_inefficiency() -> None:
    c = judge(GpuSpec(util=const(0.97), sm=const(0.0)), [ThreadSpec(1, 0.5, 0.05, "R")])
    assert c.cause == "healthy"


def test_tiny_kernels_behind_a_saturated_launch_thread_are_launch_bound_not_inefficient() -> None:
    # 85% kernel-resident (under the 20% waiting threshold) but SMs mostly empty, one thread at a full core.
    c = judge(GpuSpec(util=const(0.85), sm=const(0.2)), [ThreadSpec(1, 0.6, 0.39, "R")])
    assert c.cause == "launch_bound"
    assert "many tiny kernels" in c.evidence[0]
