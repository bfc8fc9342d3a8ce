"""The adaptive fast rate (exporter/gpu/pace.py): a GPU whose driver samples and GPM show it steadily busy or
steadily idle is read once per steady interval (1 s), and at the configured 100 ms from the first dip or gap
until it has been steady for 10 s again. Counters stay exact: every read lies on the device's own integral,
whatever rate it was taken at, including reads taken while the rate changed in the middle of an idle gap."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter.gpu import pace
from exporter.samples.gpu import GpuFast
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]
FIELDS = "nvmlDeviceGetFieldValues"
TX = 1e8  # bytes/s: well under the counter-width guard (a 32-bit counter wraps at 4.3 GB)
GAP = (20.0, 21.5)  # the GPU idles for 1.5 s at t=20


def _with_gap(t: float) -> dict[str, Any]:
    busy = 0.0 if GAP[0] <= t < GAP[1] else 1.0
    return {"gpu_util": busy, "sm_active": busy, "pcie_tx_bytes_per_s": TX}


def _busy_integral(t: float) -> float:
    """Seconds busy from 0 to t under _with_gap."""
    return t - max(0.0, min(t, GAP[1]) - GAP[0])


def _reads(r: Rig, index: int = 0) -> list[tuple[float, GpuFast]]:
    return [(t, g) for t, s in r.history("gpu") if isinstance(g := s.gpus.get(index), GpuFast)]


def _field_reads(r: Rig, start: float, end: float) -> int:
    """Fast field reads of GPU 0 in [start, end) (the slow path reads its own batch every 5 s)."""
    return sum(1 for t, _ in _reads(r) if start <= t < end)


def test_a_steadily_busy_gpu_is_read_once_a_second_and_a_gap_brings_back_100_ms(rig: MakeRig) -> None:
    r = rig([device(0)])
    r.rates(0, _with_gap)
    with capture_logs() as logs:
        r.run_until(40.0)
    assert _field_reads(r, 0.0, 9.9) >= 95, "at the fast rate until steady for 10 s"
    assert _field_reads(r, 12.0, 20.0) in range(7, 10), "steady: one read per second"
    # The gap is seen at the first buffered read after it opens (driver samples every 1/6 s, read every 1 s):
    # within 1.1 s the GPU is at 100 ms again, and stays there for 10 s after the gap's end.
    back = min(t for t, _ in _reads(r) if t > GAP[0] and _field_reads(r, t, t + 1.0) >= 9)
    assert back <= GAP[0] + 1.1
    assert _field_reads(r, GAP[1], GAP[1] + 9.0) >= 85
    assert _field_reads(r, 34.0, 40.0) in range(5, 8), "steady again"
    changes = [(e["gpu"], e["interval_s"]) for e in logs if e["event"] == "gpu_fast_rate_changed"]
    assert changes == [(0, 1.0), (0, 0.1), (0, 1.0)]


def test_every_read_lies_on_the_device_integral_at_either_rate_and_across_a_gap(rig: MakeRig) -> None:
    r = rig([device(0)])
    r.rates(0, _with_gap)
    r.run_until(40.0)
    reads = _reads(r)
    spacings = {round(b - a, 1) for (a, _), (b, _) in itertools.pairwise(reads)}
    assert {0.1, 1.0} <= spacings, "both rates were used"
    for t, g in reads:
        at = g.counter_t if g.counter_t is not None else t
        assert g.busy_seconds is not None and abs(g.busy_seconds - _busy_integral(at)) < 0.02, t
        assert g.sm_active_seconds is not None and abs(g.sm_active_seconds - _busy_integral(at)) < 0.02, t
        assert abs(g.fields["pcie_tx_bytes"] - TX * t) <= TX * 0.011, t  # the fake steps in 10 ms


def test_rate_over_any_range_is_the_same_as_at_the_fixed_fast_rate(tmp_path: Path) -> None:
    adaptive = Rig(tmp_path / "adaptive", [device(0)])
    fixed = Rig(tmp_path / "fixed", [device(0)], options={"steady-interval": 0.1})
    for r in (adaptive, fixed):
        r.rates(0, _with_gap)
        r.run_until(40.0)

    def busy_between(r: Rig, a: float, b: float) -> float:
        pts = [(g.counter_t or t, g.busy_seconds or 0.0) for t, g in _reads(r)]
        va = min(pts, key=lambda p: abs(p[0] - a))
        vb = min(pts, key=lambda p: abs(p[0] - b))
        return (vb[1] - va[1]) / (vb[0] - va[0])

    for a, b in ((5.0, 15.0), (12.0, 25.0), (19.0, 23.0), (15.0, 38.0)):
        assert abs(busy_between(adaptive, a, b) - busy_between(fixed, a, b)) < 0.02, (a, b)
    assert _field_reads(adaptive, 0.0, 40.0) < 0.7 * _field_reads(fixed, 0.0, 40.0)  # 10 s start + 11.5 s gap


def test_a_gpu_at_the_fast_rate_is_counted_on_the_host_gauge(rig: MakeRig) -> None:
    r = rig([device(0), device(1)])
    r.rates(0, {"gpu_util": 1.0, "sm_active": 1.0})
    r.rates(1, lambda t: {"gpu_util": 0.5 if int(t * 2) % 2 else 0.9, "sm_active": 0.6})  # bursty: waiting
    r.run_until(15.0)
    assert r.value("gpufeed_gpu_fast_rate_gpus") == 1.0
    assert _field_reads(r, 12.0, 15.0) <= 4
    assert sum(1 for t, _ in _reads(r, 1) if t >= 12.0) >= 28


def test_a_gpu_moving_close_to_a_pcie_counter_period_per_second_stays_at_100_ms(rig: MakeRig) -> None:
    # 3 GB/s on 32-bit byte counters (4.3 GB period): read once a second, a counter could wrap unseen.
    r = rig([device(0, pcie_counter_bits=32)])
    r.rates(0, {"gpu_util": 1.0, "sm_active": 1.0, "pcie_rx_bytes_per_s": 3e9})
    r.run_until(20.0)
    assert _field_reads(r, 12.0, 20.0) >= 75
    assert r.value("gpufeed_gpu_fast_rate_gpus") == 1.0


def _catch_up(t: float) -> dict[str, Any]:
    """1.5 GB/s on 32-bit counters (0.35 of a period per second), except that the counter stands still for half
    a second at t=19.6 and makes it up in the next half (a driver or simulator update that came late). The steady
    reads come at whole seconds plus 0.1: the span from 20.1 to 21.1 holds the whole catch-up."""
    rx = 0.0 if 19.6 <= t < 20.1 else 3.0e9 if 20.1 <= t < 20.6 else 1.5e9
    return {"gpu_util": 1.0, "sm_active": 1.0, "pcie_rx_bytes_per_s": rx}


def test_one_late_counter_update_does_not_take_a_steady_gpu_back_to_100_ms(rig: MakeRig) -> None:
    # One 1 s span can hold 2.25 GB of it (0.52 of a period: over the guard), and the span before it then holds
    # 0.75 GB: only the two together say what the counter sustained.
    r = rig([device(0, pcie_counter_bits=32)])
    r.rates(0, _catch_up)
    with capture_logs() as logs:
        r.run_until(30.0)
    assert _field_reads(r, 12.0, 30.0) in range(16, 20), "steady throughout"
    assert [e["interval_s"] for e in logs if e["event"] == "gpu_fast_rate_changed"] == [1.0]
    reads = _reads(r)
    total = {t: g.fields["pcie_rx_bytes"] for t, g in reads}
    t_end = max(total)
    assert abs(total[t_end] - 1.5e9 * t_end) <= 1.5e9 * 0.011, "the counter stays exact across the late update"


def test_traffic_that_stays_over_the_guard_takes_a_steady_gpu_to_100_ms_by_its_second_span(rig: MakeRig) -> None:
    # Steady at 1 GB/s, then 2.6 GB/s from t=20 (0.6 of a 32-bit period per second, over the guard's half).
    r = rig([device(0, pcie_counter_bits=32)])
    r.rates(0, lambda t: {"gpu_util": 1.0, "sm_active": 1.0, "pcie_rx_bytes_per_s": 2.6e9 if t >= 20.0 else 1e9})
    with capture_logs() as logs:
        r.run_until(26.0)
    back = min(t for t, _ in _reads(r) if t > 20.0 and _field_reads(r, t, t + 1.0) >= 9)
    assert back <= 23.1, "two spans of a second after the change, and the read that sees it"
    assert [(e["interval_s"], e["reason"]) for e in logs if e["event"] == "gpu_fast_rate_changed"] == [
        (1.0, "steady"), (0.1, "pcie_traffic")]


def test_a_gpu_nothing_reports_on_is_never_steady() -> None:
    p = pace.Pace()
    assert not p.steady(100.0)
    p.observe("samples", pace.BUSY, 0.0)
    assert not p.steady(9.9) and p.steady(10.0)
    assert p.observe("samples", pace.IDLE, 11.0), "busy to idle is a dip"
    assert not p.steady(20.9) and p.steady(21.0 + 1e-9) is False
    p.observe("samples", pace.IDLE, 12.0)
    assert p.steady(22.0)
    assert pace.classify([0.95, 1.0]) == pace.BUSY and pace.classify([]) == pace.IDLE
    assert pace.classify([0.95, 0.0]) == pace.DIP and pace.classify([0.5]) == pace.DIP


def test_the_buffered_samples_are_read_every_4_s_while_steady_and_every_second_from_a_dip_none_lost(
        rig: MakeRig) -> None:
    r = rig([device(0)])
    r.rates(0, _with_gap)
    r.run_until(40.0)
    reads = [(t, s.gpus[0]) for t, s in r.history("gpu_samples")]

    def spacings(start: float, end: float) -> set[float]:
        return {round(b - a, 1) for (a, _), (b, _) in itertools.pairwise(reads) if start <= a and b <= end}

    assert spacings(0.0, 11.0) == {1.0}, "not steady yet: --collector.gpu.samples-interval"
    assert spacings(13.0, 21.0) == {4.0}, "every GPU steady: --collector.gpu.samples-steady-interval"
    assert spacings(21.0, 31.0) == {1.0}, "from the gap (seen by the fast read's GPM pair at 21 s) until steady"
    assert spacings(34.0, 40.0) == {4.0}, "steady again"
    # The driver buffers its samples: a longer interval reads more of them, and the busy integral's increase
    # between any two reads is the device's, at either interval.
    for (a, ga), (b, gb) in itertools.pairwise(reads[1:]):
        assert ga.busy_seconds is not None and gb.busy_seconds is not None
        assert abs((gb.busy_seconds - ga.busy_seconds) - (_busy_integral(b) - _busy_integral(a))) < 0.02, (a, b)
    assert sum(len(g.gpu_util) for _, g in reads[1:]) == pytest.approx(6 * reads[-1][0], abs=6), (
        "every driver sample up to the last read")


def test_a_samples_steady_interval_not_longer_than_the_samples_interval_keeps_that_one(rig: MakeRig) -> None:
    r = rig([device(0)], options={"samples-steady-interval": 1.0})
    r.rates(0, _with_gap)
    r.run_until(20.0)
    assert {round(b - a, 1) for a, b in itertools.pairwise(t for t, _ in r.history("gpu_samples"))} == {1.0}


def test_a_steady_gpu_takes_its_gpm_pair_and_sm_clock_every_other_read_and_a_dip_brings_back_every_read(
        rig: MakeRig) -> None:
    r = rig([device(0)])
    r.rates(0, _with_gap)
    calls: dict[float, dict[str, int]] = {}
    for t in (13.0, 19.0, 22.0, 28.0):  # steady from ~10 s; the gap at 20-21.5 keeps 100 ms reads till ~31.5 s
        r.run_until(t)
        calls[t] = dict(r.fake.calls)

    def between(a: float, b: float, name: str) -> int:
        return calls[b].get(name, 0) - calls[a].get(name, 0)

    steady_reads = _field_reads(r, 13.0, 19.0)
    assert steady_reads in range(5, 8)
    # One pair (nvmlGpmSampleGet + nvmlGpmMetricsGet) and one clock read per 2 s of steady reads; the fields
    # (the PCIe counters the wrap guard watches) at every read.
    assert between(13.0, 19.0, "nvmlGpmSampleGet") in range(2, 5)
    assert between(13.0, 19.0, "nvmlGpmMetricsGet") in range(2, 5)
    assert between(13.0, 19.0, "nvmlDeviceGetClockInfo") in range(2, 5)
    assert between(13.0, 19.0, FIELDS) >= steady_reads
    steady = [(t, g) for t, g in _reads(r) if 13.0 <= t < 19.0]
    assert all(g.sm_active is not None and g.sm_clock_hz is not None for _, g in steady), "carried in between"
    assert len({g.counter_t for _, g in steady}) in range(2, 5), "a repeat carries its pair's time"
    fast = _field_reads(r, 22.0, 28.0)
    assert fast >= 55
    assert between(22.0, 28.0, "nvmlGpmSampleGet") >= fast - 2, "at the fast rate, a pair at every read"
