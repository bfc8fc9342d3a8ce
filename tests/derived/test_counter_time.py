"""A busy GPU sampled with real-time jitter: stale GPM repeats must not read as idle or waiting time.

On a live host the 100 ms fast sampler often ticks ~90 ms after the previous GPM sample; NVML needs pairs
>= 100 ms apart, so that tick republishes the previous integrals (same ``counter_t``) under a newer stamp.
Paired with the stamps, each repeat is an idle interval and the next is clipped at 100%: an 8-GPU host at
95% looked ``latency_bound`` with ~30% waiting. Paired with ``counter_t`` the activity is exact.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from types import MappingProxyType

import pytest

from exporter import linkmath
from exporter.derived.gpuview import gpu_view
from exporter.derived.hostshape import cpu_shape, io_signals
from exporter.derived.verdict import classify
from exporter.samples.gpu import GpuFast, GpuSample
from exporter.snapshot import Stamped
from tests.derived.test_analyzer import run
from tests.support.builders import GpuSpec, ThreadSpec, const, cpu_window, gpu_windows, identity, proc_window
from tests.support.engine import FakeEngine, analyzer

GPM_MIN_PAIR = 0.1
JITTER = (0.09, 0.11, 0.1, 0.09, 0.105, 0.095)  # tick spacings of a 100 ms sampler on a loaded host
TRAINER = [ThreadSpec(1, 0.55, 0.08, "R"), ThreadSpec(4, 0.35, 0.03)]


def jittered_fast(g: GpuSpec, t1: float, spacing: Sequence[float] = JITTER) -> list[Stamped[GpuSample]]:
    """Fast samples the way the backend publishes them: a GPM pair only when >= 100 ms passed since the
    previous GPM sample; otherwise the previous integrals and ratio again, with their old ``counter_t``."""
    ids = MappingProxyType({g.index: identity(g)})
    sm = g.sm or g.util
    out: list[Stamped[GpuSample]] = []
    t, k = 0.0, 0
    gpm_t = 0.0
    busy = smsec = 0.0
    ratio: float | None = None
    while t <= t1 + 1e-9:
        if t > 0 and t - gpm_t >= GPM_MIN_PAIR - 1e-9:
            n = 100
            step = (t - gpm_t) / n
            b = sum(g.util(gpm_t + (i + 0.5) * step) for i in range(n)) * step
            s = sum(sm(gpm_t + (i + 0.5) * step) for i in range(n)) * step
            busy, smsec, ratio = busy + b, smsec + s, s / (t - gpm_t)
            gpm_t = t
        f = GpuFast(sm_active=ratio, sm_occupancy=None, tensor_active=None, dram_active=None,
                    pcie_tx_bytes_per_s=None, pcie_rx_bytes_per_s=None,
                    fields=MappingProxyType({"pcie_tx_bytes": 0.0, "pcie_rx_bytes": 0.0, "pcie_replays": 0.0}),
                    sm_clock_hz=g.max_clock_hz, sm_active_seconds=smsec, busy_seconds=busy,
                    counter_t=gpm_t)
        out.append(Stamped(t, GpuSample(ids, MappingProxyType({g.index: f}), frozenset())))
        t += spacing[k % len(spacing)]
        k += 1
    return out


def stamped_only(window: Sequence[Stamped[GpuSample]]) -> list[Stamped[GpuSample]]:
    """The same samples from a producer that does not say when its integrals were taken."""
    out = []
    for s in window:
        gpus = {i: dataclasses.replace(v, counter_t=None) if isinstance(v, GpuFast) else v
                for i, v in s.value.gpus.items()}
        out.append(Stamped(s.t, GpuSample(s.value.identities, MappingProxyType(gpus), s.value.lost)))
    return out


BUSY_GPU = GpuSpec(util=const(0.95), sm=const(0.82))


def test_stale_gpm_repeats_under_jitter_are_not_idle_time_and_the_busy_gpu_is_healthy() -> None:
    w = 15.0
    fast = jittered_fast(BUSY_GPU, w)
    _, buf, slow = gpu_windows([BUSY_GPU], 0.0, w)
    counter_ts = [getattr(s.value.gpus[0], "counter_t", None) for s in fast]
    repeats = sum(1 for a, b in itertools.pairwise(counter_ts) if a == b)
    assert repeats >= len(fast) // 4, "the window must hold stale repeats"
    # The symptom: paired with the stamps, a third of the intervals read as idle and busy time is lost.
    stale = gpu_view(0, stamped_only(fast), buf, slow)
    assert stale.util is not None and stale.util < 0.75
    assert sum(p.dt for p in stale.util_points if p.value < 0.05) > 0.2 * stale.span_s

    view = gpu_view(0, fast, buf, slow)
    assert view.util == pytest.approx(0.95, abs=0.005)
    assert view.sm_active == pytest.approx(0.82, abs=0.005)
    assert view.burst.idle_ratio == 0.0
    assert view.burst.gaps == ()
    assert all(p.value == pytest.approx(0.95, abs=1e-6) for p in view.util_points)
    assert all(p.dt >= GPM_MIN_PAIR - 1e-9 for p in view.util_points)

    procs = proc_window(BUSY_GPU.pids[0], TRAINER, 5.0, w, total_threads=8)
    cpus = cpu_window(32, {0: (0.55, 0.08), 1: (0.35, 0.03), 2: (0.35, 0.03), 3: (0.35, 0.03), 4: (0.35, 0.03)},
                      5.0, w)
    c = classify(view, cpu_shape(procs, procs, cpus, view.pids), io_signals([], [], []),
                 capacity=linkmath.capacity_bytes_per_second(5, 16), link_name="Gen5 x16", window_s=w)
    assert c.cause == "healthy"
    assert c.waiting_ratio == pytest.approx(0.05, abs=0.01)


def test_live_jitter_keeps_waiting_time_and_idle_ratio_of_a_steady_gpu_near_zero() -> None:
    t1 = 40.0
    _, buf, slow = gpu_windows([BUSY_GPU], 0.0, t1)
    procs = proc_window(BUSY_GPU.pids[0], TRAINER, 0.0, t1, cpus_allowed=frozenset(range(16)), total_threads=8)
    eng = FakeEngine({"gpu": jittered_fast(BUSY_GPU, t1), "gpu_samples": buf, "gpu_slow": slow, "proc": procs,
                      "proc_threads": procs, "cpu": cpu_window(16, {0: (0.55, 0.08)}, 0.0, t1)})
    an = analyzer(eng)
    st = run(an, eng, [t / 2 for t in range(2, 81)])
    a = st.activity[0]
    total = sum(a.state_seconds.values())
    # A stable GPU is evaluated (and its counters advanced) at each --stable-interval (15 s), never beyond now.
    assert 39.0 - an.stable_s - 1e-6 <= total <= 39.0 + 1e-6
    assert a.state_seconds["working"] == pytest.approx(0.95 * total, rel=0.02)
    assert a.state_seconds["waiting"] <= 0.07 * total
    assert a.idle_ratio == 0.0
    assert st.gpus[0].cause == "healthy"
