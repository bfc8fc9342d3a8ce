"""Findings table: platform checks that hold whatever the verdict."""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import yaml

from exporter import thresholds
from exporter.derived import findings as fnd
from exporter.derived.gpuview import activity_points, gpu_view
from exporter.derived.hostshape import io_signals
from exporter.samples.derived import Finding
from exporter.samples.host import CpufreqCpu, CpufreqSample, MemorySample
from exporter.samples.topology import NumaSample, Placement
from exporter.snapshot import Stamped
from tests.support.builders import GpuSpec, const, gpu_windows, nfs_window, pcie_window, pressure_window, square

GPU = "0000:82:00.0"
RISER = "0000:81:00.0"
ROOT = "0000:80:03.1"


def downgrades(gpu: GpuSpec, hops: Sequence[tuple[str, Any, tuple[int, int]]], t1: float = 30.0) -> list[str]:
    fast, buf, slow = gpu_windows([gpu], 0.0, t1)
    view = gpu_view(gpu.index, fast, buf, slow)
    util, _ = activity_points(fast, buf, gpu.index, gpu.gpm)
    pcie = pcie_window(GPU, hops, 0.0, t1)
    return [bdf for bdf, _, _ in fnd.link_downgrades(view, fnd.chain_links(pcie, GPU), util)]


def full(_t: float) -> tuple[int, int]:
    return (4, 16)


def test_idle_gpu_at_gen1_is_not_a_downgrade() -> None:
    gpu = GpuSpec(bdf=GPU, util=const(0.0))
    assert downgrades(gpu, [(ROOT, full, (4, 16)), (GPU, lambda _t: (1, 8), (4, 16))]) == []


def test_busy_gpu_on_gen3_x8_below_a_gen4_x16_slot_is_downgraded_at_the_gpu() -> None:
    gpu = GpuSpec(bdf=GPU, util=const(0.3), rx=const(7e9))
    assert downgrades(gpu, [(ROOT, full, (4, 16)), (GPU, lambda _t: (3, 8), (4, 16))]) == [GPU]


def test_downgrade_at_a_riser_names_the_riser_hop() -> None:
    gpu = GpuSpec(bdf=GPU, util=const(0.9))
    hops = [(ROOT, full, (4, 16)), (RISER, lambda _t: (3, 16), (4, 16)), (GPU, full, (4, 16))]
    assert downgrades(gpu, hops) == [RISER]


def test_gen5_gpu_in_a_gen4_slot_is_a_system_limit_not_a_downgrade() -> None:
    gpu = GpuSpec(bdf=GPU, util=const(0.9))
    assert downgrades(gpu, [(ROOT, full, (4, 16)), (GPU, full, (5, 16))]) == []


def test_flapping_link_on_an_idle_gpu_is_never_reported() -> None:
    gpu = GpuSpec(bdf=GPU, util=const(0.0))
    flap = lambda t: (1, 16) if int(t) % 2 else (5, 16)  # noqa: E731
    assert downgrades(gpu, [(ROOT, full, (5, 16)), (GPU, flap, (5, 16))]) == []


def test_busy_link_that_reaches_its_maximum_in_the_window_is_not_downgraded() -> None:
    gpu = GpuSpec(bdf=GPU, util=const(0.9))
    flap = lambda t: (4, 16) if int(t) % 3 == 0 else (2, 16)  # noqa: E731
    assert downgrades(gpu, [(ROOT, full, (4, 16)), (GPU, flap, (4, 16))]) == []


def test_link_that_was_slow_only_while_idle_is_not_downgraded() -> None:
    # Idle at Gen1 for 15 s, then busy at full speed: the slow samples were all taken while idle.
    gpu = GpuSpec(bdf=GPU, util=lambda t: 0.0 if t < 15 else 0.9)
    link = lambda t: (1, 16) if t < 15 else (4, 16)  # noqa: E731
    assert downgrades(gpu, [(ROOT, full, (4, 16)), (GPU, link, (4, 16))]) == []


def test_thermal_reasons_on_a_busy_gpu_raise_clock_throttled() -> None:
    fast, buf, slow = gpu_windows([GpuSpec(util=const(0.99), clock_ratio=const(0.55),
                                      reasons=frozenset({"hw_thermal"}))], 0.0, 15.0)
    f = fnd.clock_throttled(gpu_view(0, fast, buf, slow))
    assert f is not None and f.check == "gpu_clock_throttled" and f.gpu == 0


def test_idle_gpu_with_power_cap_reason_is_not_throttled() -> None:
    fast, buf, slow = gpu_windows([GpuSpec(util=const(0.0), reasons=frozenset({"sw_power_cap"}))], 0.0, 15.0)
    assert fnd.clock_throttled(gpu_view(0, fast, buf, slow)) is None


def test_powersave_governor_is_reported_only_with_a_busy_gpu() -> None:
    freq = CpufreqSample(MappingProxyType({c: CpufreqCpu("powersave", 1e9, 3e9) for c in range(4)}))
    assert fnd.governor_powersave(freq, []) is None
    f = fnd.governor_powersave(freq, [0])
    assert f is not None and f.gpu is None and "4 of 4 CPUs" in f.detail


def _mem(avail: float, dirty: float, ooms: int, t: float) -> Stamped[MemorySample]:
    total = 256 << 30
    return Stamped(t, MemorySample(total, int(avail * total), int(dirty * total), 0, 0, ooms))


def test_low_memavailable_dirty_pages_and_oom_kills_are_memory_pressure() -> None:
    io = io_signals(pressure_window({"memory": (0.25, 0.08)}, 0.0, 15.0), [], [])
    f = fnd.memory_pressure([_mem(0.03, 0.12, 3, 0.0), _mem(0.03, 0.12, 4, 15.0)], io)
    assert f is not None and f.severity == "critical"
    assert "OOM" in f.detail and "MemAvailable 3%" in f.detail


def test_plenty_of_memory_is_no_memory_pressure() -> None:
    io = io_signals(pressure_window({"memory": (0.0, 0.0)}, 0.0, 15.0), [], [])
    assert fnd.memory_pressure([_mem(0.8, 0.001, 0, 0.0), _mem(0.8, 0.001, 0, 15.0)], io) is None


def test_nfs_retransmissions_are_reported_exactly_where_the_alert_would_page() -> None:
    """The finding and GpufeedNFSRetransmissions share one definition: >= 0.05% of calls and >= 0.05/s."""
    def retrans(ops: float, per_s: float) -> Finding | None:
        return fnd.nfs_retransmissions(io_signals([], [], nfs_window({"read": ops}, per_s, 0.0, 15.0)), 15.0)

    f = retrans(1000.0, 20.0)
    assert f is not None and "20.0 RPCs/s" in f.detail and "2.00% of calls" in f.detail
    assert retrans(248391.0, 1203.0) is not None  # the playbook's Task 13: 0.48%
    assert retrans(1000.0, 0.4) is None  # 0.04% of calls: the alert would not page either
    assert retrans(2.0, 0.04) is None  # 2% of calls, but below the 0.05/s floor
    assert retrans(1000.0, 0.0) is None


def test_remote_placement_is_numa_mismatch_for_its_gpu() -> None:
    numa = NumaSample(MappingProxyType({}), (
        Placement("0", 27431, "python", 0, 0.0, False, ("cpus_remote", "memory_remote")),
        Placement("1", 5200, "python", 1, 1.0, True, ()),
    ))
    out = fnd.numa_mismatch(numa, {"0": 0, "1": 1})
    assert [(f.check, f.gpu) for f in out] == [("numa_mismatch", 0)]
    assert "pid 27431" in out[0].detail


def test_bursty_square_wave_has_periodic_gaps_and_a_steady_load_does_not() -> None:
    fast, buf, slow = gpu_windows([GpuSpec(util=square(0.95, 0.0, 3.0, 0.18), gpm=False)], 0.0, 15.0)
    v = gpu_view(0, fast, buf, slow)
    assert v.burst.periodic and v.burst.period_s is not None and abs(v.burst.period_s - 3.0) < 0.15
    assert v.burst.cv is not None and v.burst.cv > 1.5
    assert all(abs(g.seconds - 2.46) < 0.15 for g in v.burst.gaps)
    fast, buf, slow = gpu_windows([GpuSpec(util=const(0.9), gpm=False)], 0.0, 15.0)
    steady = gpu_view(0, fast, buf, slow)
    assert not steady.burst.periodic and steady.burst.gaps == () and (steady.burst.cv or 0) < 0.05


def test_a_width_downgrade_has_the_alerts_severity_in_diagnose_too() -> None:
    # It was critical in diagnose (and warning on the pager) whenever the width was below the maximum.
    gpu = GpuSpec(bdf=GPU, util=const(0.3), rx=const(7e9))
    fast, buf, slow = gpu_windows([gpu], 0.0, 30.0)
    view = gpu_view(gpu.index, fast, buf, slow)
    util, _ = activity_points(fast, buf, gpu.index, gpu.gpm)
    pcie = pcie_window(GPU, [(ROOT, full, (4, 16)), (GPU, lambda _t: (3, 8), (4, 16))], 0.0, 30.0)
    found = fnd.link_downgrades(view, fnd.chain_links(pcie, GPU), util)
    alert = yaml.safe_load(thresholds.PATH.read_text())["pcie_link_downgraded"]["severity"]
    assert [sev for _, sev, _ in found] == [alert] == ["warning"]
