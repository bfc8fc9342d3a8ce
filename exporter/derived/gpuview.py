"""What one GPU did over the window: utilisation, SM activity, burstiness, clocks, PCIe traffic, link.

Built from the three GPU samplers (``gpu`` fast, ``gpu_samples`` buffered, ``gpu_slow``); pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.derived import series
from exporter.derived.series import Burst, Point
from exporter.samples.gpu import GpuBuffered, GpuFast, GpuSample, GpuSlow
from exporter.snapshot import Stamped

# Clock-event reasons that mean power or thermal limits pulled the clocks down (NVML clocksEventReasons).
THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake"})
GPU_IDLE_REASON = "gpu_idle"


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU over the window. ``util`` is the share of time a kernel was resident (HTA's busy time)."""

    index: int
    uuid: str
    bdf: str
    gpm: bool
    span_s: float
    util: float | None
    sm_active: float | None
    burst: Burst
    clock_ratio: float | None  # mean SM clock / max SM clock
    throttle_reasons: frozenset[str]  # power/thermal reasons present in at least half the window
    idle_reason_share: float | None  # share of slow samples with the gpu_idle reason
    rx_bytes_per_s: float | None
    tx_bytes_per_s: float | None
    rx_peak_bytes_per_s: float | None  # 90th percentile of per-sample rates: copies in bursts
    tx_peak_bytes_per_s: float | None
    link_gen: int | None
    link_width: int | None
    max_link_gen: int | None
    max_link_width: int | None
    pids: tuple[int, ...]
    replays: int  # PCIe replay counter increase over the window
    lost: bool


def _fast(window: Sequence[Stamped[GpuSample]], index: int) -> list[tuple[float, GpuFast]]:
    return [(s.t, g) for s in window if isinstance(g := s.value.gpus.get(index), GpuFast)]


def _slow(window: Sequence[Stamped[GpuSample]], index: int) -> list[tuple[float, GpuSlow]]:
    return [(s.t, g) for s in window if isinstance(g := s.value.gpus.get(index), GpuSlow)]


def activity_points(
    fast: Sequence[Stamped[GpuSample]], buffered: Sequence[Stamped[GpuSample]], index: int, gpm: bool,
) -> tuple[tuple[Point, ...], tuple[Point, ...]]:
    """(utilisation points in engine time, burstiness points).

    Utilisation: GPM's graphics-active integral on GPUs with GPM, else the integral of the driver's
    buffered utilisation samples. Burstiness: GPM SM activity with GPM, else the driver's utilisation
    samples themselves (finer than our 1 s reads, in driver time).
    """
    util: tuple[Point, ...] = ()
    if gpm:
        util = series.counter_points(fast, index, "busy_seconds")
    if not util:
        util = series.counter_points(buffered, index, "busy_seconds", GpuBuffered)
    if not util:
        util = series.buffered_points(buffered, index)
    if not util:
        util = series.counter_points(fast, index, "sm_active_seconds")
    shape: tuple[Point, ...] = ()
    if gpm:
        shape = series.gauge_points(fast, index, "sm_active") or series.counter_points(fast, index, "sm_active_seconds")
    if not shape:
        shape = series.buffered_points(buffered, index) or util
    return util, shape


def _rate(points: list[tuple[float, GpuFast]], total: str, gauge: str) -> float | None:
    vals = [(t, float(getattr(g, total))) for t, g in points if getattr(g, total) is not None]
    if len(vals) >= 2 and vals[-1][0] > vals[0][0]:
        return max(0.0, (vals[-1][1] - vals[0][1]) / (vals[-1][0] - vals[0][0]))
    rates = [float(getattr(g, gauge)) for _, g in points if getattr(g, gauge) is not None]
    return sum(rates) / len(rates) if rates else None


def _peak(points: list[tuple[float, GpuFast]], total: str, gauge: str) -> float | None:
    """90th percentile of the per-interval rates of a byte counter (or of the rate gauge)."""
    vals = [(t, float(getattr(g, total))) for t, g in points if getattr(g, total) is not None]
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(vals) if b[0] > a[0] and b[1] >= a[1]]
    if not rates:
        rates = [float(getattr(g, gauge)) for _, g in points if getattr(g, gauge) is not None]
    if not rates:
        return None
    rates.sort()
    return rates[min(len(rates) - 1, int(0.9 * len(rates)))]


def gpu_view(
    index: int,
    fast: Sequence[Stamped[GpuSample]],
    buffered: Sequence[Stamped[GpuSample]],
    slow: Sequence[Stamped[GpuSample]],
    *,
    lost: bool = False,
) -> GpuView:
    """Summarise GPU ``index`` over the windows given."""
    ident = None
    for w in (fast, slow, buffered):
        if w:
            ident = w[-1].value.identities.get(index)
            if ident is not None:
                break
    gpm = bool(ident and ident.gpm)
    util_pts, shape_pts = activity_points(fast, buffered, index, gpm)
    f = _fast(fast, index)
    sl = _slow(slow, index)
    sm_vals = [g.sm_active for _, g in f if g.sm_active is not None]
    sm_active = sum(sm_vals) / len(sm_vals) if sm_vals and gpm else None
    util = series.mean(util_pts)
    if util is None and sm_active is not None:
        util = sm_active
    latest = sl[-1][1] if sl else None
    max_clock = latest.max_sm_clock_hz if latest else None
    clocks = [g.sm_clock_hz for _, g in f if g.sm_clock_hz is not None]
    clock_ratio = (sum(clocks) / len(clocks)) / max_clock if clocks and max_clock else None
    reasons: set[str] = set()
    if sl:
        for r in THROTTLE_REASONS:
            if sum(1 for _, g in sl if r in g.clock_event_reasons) * 2 >= len(sl):
                reasons.add(r)
    # Throttle-time counters (NVML field values) catch reasons that come and go between slow samples.
    if len(f) >= 2 and f[-1][0] > f[0][0]:
        dt = f[-1][0] - f[0][0]
        for r, v in f[-1][1].throttle_seconds.items():
            v0 = f[0][1].throttle_seconds.get(r)
            if r in THROTTLE_REASONS and v0 is not None and (v - v0) / dt >= 0.5:
                reasons.add(r)
    idle_share = sum(1 for _, g in sl if GPU_IDLE_REASON in g.clock_event_reasons) / len(sl) if sl else None
    replays = [g.pcie_replays_total for _, g in f if g.pcie_replays_total is not None]
    pids: tuple[int, ...] = ()
    if latest is not None:
        pids = tuple(sorted({p.pid for _, g in sl for p in g.processes}))
    return GpuView(
        index=index,
        uuid=ident.uuid if ident else "",
        bdf=ident.pci_bus_id.lower() if ident else "",
        gpm=gpm,
        span_s=sum(p.dt for p in util_pts),
        util=util,
        sm_active=sm_active,
        burst=series.burstiness(shape_pts),
        clock_ratio=clock_ratio,
        throttle_reasons=frozenset(reasons),
        idle_reason_share=idle_share,
        rx_bytes_per_s=_rate(f, "pcie_rx_bytes_total", "pcie_rx_bytes_per_s"),
        tx_bytes_per_s=_rate(f, "pcie_tx_bytes_total", "pcie_tx_bytes_per_s"),
        rx_peak_bytes_per_s=_peak(f, "pcie_rx_bytes_total", "pcie_rx_bytes_per_s"),
        tx_peak_bytes_per_s=_peak(f, "pcie_tx_bytes_total", "pcie_tx_bytes_per_s"),
        link_gen=latest.link_gen if latest else None,
        link_width=latest.link_width if latest else None,
        max_link_gen=latest.max_link_gen if latest else None,
        max_link_width=latest.max_link_width if latest else None,
        pids=pids,
        replays=max(0, replays[-1] - replays[0]) if len(replays) >= 2 else 0,
        lost=lost,
    )
