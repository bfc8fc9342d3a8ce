"""What one GPU did over the window: utilisation, SM activity, burstiness, clocks, PCIe traffic, link.

Built from the three GPU samplers (``gpu`` fast, ``gpu_samples`` buffered, ``gpu_slow``); pure. A MIG instance
(``mig``: its GPU instance id) is viewed the same way: its activity, SM activity, PCIe rates and processes are
its own (GPM per instance; MIG has no driver utilisation samples), the clocks, throttle reasons and link are
its GPU's (shared by every instance).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Clock-event reasons that mean power or thermal limits pulled the clocks down (NVML clocksEventReasons).
from exporter.clockevents import GPU_IDLE as GPU_IDLE_REASON
from exporter.clockevents import THROTTLE_REASONS
from exporter.derived import series
from exporter.derived.series import Burst, Point
from exporter.samples.gpu import GpuBuffered, GpuFast, GpuSample, GpuSlow
from exporter.snapshot import Stamped


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
    util_points: tuple[Point, ...] = ()  # engine time: what util and the state counters are computed from
    shape_points: tuple[Point, ...] = ()  # what burstiness and idle gaps are computed from
    mig: int | None = None  # the GPU instance viewed, None for a whole GPU

    @property
    def name(self) -> str:
        """How evidence names it: ``GPU 0``, or ``GPU 0 MIG 3`` for a MIG instance."""
        return f"GPU {self.index}" if self.mig is None else f"GPU {self.index} MIG {self.mig}"


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
    return _activity(_fast(fast, index), _buffered(buffered, index), gpm)


def _buffered(window: Sequence[Stamped[GpuSample]], index: int) -> list[tuple[float, GpuBuffered]]:
    return [(s.t, g) for s in window if isinstance(g := s.value.gpus.get(index), GpuBuffered)]


def _gpm_series(f: list[tuple[float, GpuFast]], name: str) -> list[tuple[float, float]]:
    """(time, value) of a GPM-derived field of the fast samples, paired with the time it refers to.

    That is ``counter_t`` (the newer GPM sample of the pair the value comes from) when the backend sets it,
    else the stamp. A fast tick too soon after the previous GPM sample for a valid pair republishes the
    previous values with the same ``counter_t``: such repeats are dropped, so the next pair's increase is
    spread over the time it really covers instead of reading as an idle tick and a clipped one.
    """
    out: list[tuple[float, float]] = []
    last = -math.inf
    for t, g in f:
        v = getattr(g, name)
        if v is None:
            continue
        at = t if g.counter_t is None else g.counter_t
        if at <= last:
            continue
        out.append((at, float(v)))
        last = at
    return out


def _activity(
    f: list[tuple[float, GpuFast]], b: list[tuple[float, GpuBuffered]], gpm: bool,
) -> tuple[tuple[Point, ...], tuple[Point, ...]]:
    util: tuple[Point, ...] = ()
    if gpm:
        util = series.counter_points_of(_gpm_series(f, "busy_seconds"))
    if not util:
        # The driver-sample integral is paired with the read's stamp: a read whose buffer is empty (no
        # kernel ran since the last sample) repeats the value, and that interval really was idle.
        util = series.counter_points_of([(t, g.busy_seconds) for t, g in b if g.busy_seconds is not None])
    driver: tuple[Point, ...] | None = None
    if not util:
        driver = _driver_points(b)
        util = driver
    if not util:
        util = series.counter_points_of(_gpm_series(f, "sm_active_seconds"))
    shape: tuple[Point, ...] = ()
    if gpm:
        shape = series.gauge_points_of(_gpm_series(f, "sm_active"))
        if not shape:
            shape = series.counter_points_of(_gpm_series(f, "sm_active_seconds"))
    if not shape:
        shape = (driver if driver is not None else _driver_points(b)) or util
    return util, shape


def _driver_points(b: list[tuple[float, GpuBuffered]]) -> tuple[Point, ...]:
    """The driver's utilisation samples (driver time), duplicates dropped."""
    pts: dict[float, float] = {}
    for _, g in b:
        for p in g.gpu_util:
            pts[p.t] = p.value
    ts = sorted(pts)
    return series.gauge_points_of([(t, pts[t]) for t in ts])


def _rate(totals: list[tuple[float, int]], gauges: list[float]) -> float | None:
    """Mean rate of a byte counter over the window (or the mean of the rate gauge without counters)."""
    if len(totals) >= 2 and totals[-1][0] > totals[0][0]:
        return max(0.0, (totals[-1][1] - totals[0][1]) / (totals[-1][0] - totals[0][0]))
    return sum(gauges) / len(gauges) if gauges else None


def _peak(totals: list[tuple[float, int]], gauges: list[float]) -> float | None:
    """90th percentile of the per-interval rates of a byte counter (or of the rate gauge)."""
    rates = [(b - a) / (tb - ta) for (ta, a), (tb, b) in itertools.pairwise(totals) if tb > ta and b >= a]
    if not rates:
        rates = list(gauges)
    if not rates:
        return None
    rates.sort()
    return rates[min(len(rates) - 1, int(0.9 * len(rates)))]


def _instance(f: list[tuple[float, GpuFast]], mig: int | None) -> list[tuple[float, GpuFast]]:
    """The fast samples of MIG instance ``mig`` (the GPU's own when None)."""
    if mig is None:
        return f
    return [(t, m) for t, g in f if (m := g.mig.get(mig)) is not None]


def gpu_view(
    index: int,
    fast: Sequence[Stamped[GpuSample]],
    buffered: Sequence[Stamped[GpuSample]],
    slow: Sequence[Stamped[GpuSample]],
    *,
    lost: bool = False,
    mig: int | None = None,
) -> GpuView:
    """Summarise GPU ``index`` (or its MIG instance ``mig``) over the windows given."""
    ident = None
    for w in (fast, slow, buffered):
        if w:
            ident = w[-1].value.identities.get(index)
            if ident is not None:
                break
    gpm = bool(ident and ident.gpm)
    f_gpu = _fast(fast, index)
    f = _instance(f_gpu, mig)
    sl = _slow(slow, index)
    # A MIG instance has no driver utilisation samples (nvml.h: unsupported on MIG): GPM or nothing.
    util_pts, shape_pts = _activity(f, _buffered(buffered, index) if mig is None else [], gpm)
    sm_vals = [v for _, v in _gpm_series(f, "sm_active")]
    sm_active = sum(sm_vals) / len(sm_vals) if sm_vals and gpm else None
    util = series.mean(util_pts)
    if util is None and sm_active is not None:
        util = sm_active
    latest = sl[-1][1] if sl else None
    rx_tot = [(t, n) for t, g in f if (n := g.pcie_rx_bytes_total) is not None]
    tx_tot = [(t, n) for t, g in f if (n := g.pcie_tx_bytes_total) is not None]
    rx_g = [] if rx_tot else [g.pcie_rx_bytes_per_s for _, g in f if g.pcie_rx_bytes_per_s is not None]
    tx_g = [] if tx_tot else [g.pcie_tx_bytes_per_s for _, g in f if g.pcie_tx_bytes_per_s is not None]
    max_clock = latest.max_sm_clock_hz if latest else None
    clocks = [g.sm_clock_hz for _, g in f_gpu if g.sm_clock_hz is not None]
    clock_ratio = (sum(clocks) / len(clocks)) / max_clock if clocks and max_clock else None
    reasons: set[str] = set()
    if sl:
        for r in THROTTLE_REASONS:
            if sum(1 for _, g in sl if r in g.clock_event_reasons) * 2 >= len(sl):
                reasons.add(r)
    # Throttle-time counters (NVML field values) catch reasons that come and go between slow samples.
    if len(f_gpu) >= 2 and f_gpu[-1][0] > f_gpu[0][0]:
        dt = f_gpu[-1][0] - f_gpu[0][0]
        for r, v in f_gpu[-1][1].throttle_seconds.items():
            v0 = f_gpu[0][1].throttle_seconds.get(r)
            if r in THROTTLE_REASONS and v0 is not None and (v - v0) / dt >= 0.5:
                reasons.add(r)
    idle_share = sum(1 for _, g in sl if GPU_IDLE_REASON in g.clock_event_reasons) / len(sl) if sl else None
    replays = [n for _, g in f_gpu if (n := g.pcie_replays_total) is not None]
    pids: tuple[int, ...] = ()
    if latest is not None:
        pids = tuple(sorted({p.pid for _, g in sl for p in g.processes if mig is None or p.mig == mig}))
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
        rx_bytes_per_s=_rate(rx_tot, rx_g),
        tx_bytes_per_s=_rate(tx_tot, tx_g),
        rx_peak_bytes_per_s=_peak(rx_tot, rx_g),
        tx_peak_bytes_per_s=_peak(tx_tot, tx_g),
        link_gen=latest.link_gen if latest else None,
        link_width=latest.link_width if latest else None,
        max_link_gen=latest.max_link_gen if latest else None,
        max_link_width=latest.max_link_width if latest else None,
        pids=pids,
        replays=max(0, replays[-1] - replays[0]) if len(replays) >= 2 else 0,
        lost=lost,
        util_points=util_pts,
        shape_points=shape_pts,
        mig=mig,
    )


def gpm_means(fast: Sequence[Stamped[GpuSample]], index: int) -> tuple[float | None, float | None]:
    """Mean GPM DRAM-bandwidth and tensor-pipe activity of GPU ``index`` over ``fast`` (None without GPM)."""
    f = _fast(fast, index)
    out: list[float | None] = []
    for name in ("dram_active", "tensor_active"):
        vals = [v for _, v in _gpm_series(f, name)]
        out.append(sum(vals) / len(vals) if vals else None)
    return out[0], out[1]
