"""GPU activity over a window: per-interval activity points, burstiness and idle gaps.

An activity point is the share of ``[t, t + dt)`` a GPU spent active (SM activity on GPUs with GPM,
kernel-resident utilisation otherwise). Everything here is a pure function of the points: no clock, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from exporter.samples.derived import GAP_BUCKETS
from exporter.samples.derived import IDLE_LEVEL as IDLE_LEVEL  # noqa: PLC0414 - re-exported
from exporter.samples.gpu import GpuBuffered, GpuFast, GpuSample
from exporter.snapshot import Stamped


class Point(NamedTuple):
    """Activity share ``value`` (0..1) over ``[t, t + dt)`` (a tuple: thousands are built per second)."""

    t: float
    dt: float
    value: float


@dataclass(frozen=True, slots=True)
class Gap:
    """One contiguous idle stretch bounded by activity on both sides."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Burst:
    """Shape of a GPU's activity over a window.

    ``cv`` is the coefficient of variation (time-weighted std / mean; 0 = steady, > 1 = bursty), None when
    the GPU was never active. ``periodic`` says whether the idle gaps recur at a regular period (batch
    boundaries), with ``period_s`` the mean distance between gap starts.
    """

    mean: float
    cv: float | None
    idle_ratio: float
    gaps: tuple[Gap, ...]
    periodic: bool
    period_s: float | None
    span_s: float


EMPTY_BURST = Burst(mean=0.0, cv=None, idle_ratio=0.0, gaps=(), periodic=False, period_s=None, span_s=0.0)


def _clip(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def _fast(s: Stamped[GpuSample], index: int) -> GpuFast | None:
    v = s.value.gpus.get(index)
    return v if isinstance(v, GpuFast) else None


def counter_points_of(pairs: Sequence[tuple[float, float]]) -> tuple[Point, ...]:
    """Activity from (t, cumulative seconds) pairs: the counter's increase over each interval."""
    out: list[Point] = []
    for (t0, v0), (t1, v1) in itertools.pairwise(pairs):
        dt = t1 - t0
        if dt > 0:
            x = (v1 - v0) / dt
            out.append(Point(t0, dt, 0.0 if x < 0.0 else 1.0 if x > 1.0 else x))
    return tuple(out)


def gauge_points_of(pairs: Sequence[tuple[float, float]]) -> tuple[Point, ...]:
    """Activity from (t, ratio) pairs, each value describing the interval that ends at its sample."""
    return tuple(Point(t0, t1 - t0, _clip(v1)) for (t0, _), (t1, v1) in itertools.pairwise(pairs) if t1 > t0)


def counter_points(
    window: Sequence[Stamped[GpuSample]], index: int, field: str, kind: type = GpuFast,
) -> tuple[Point, ...]:
    """Activity from differences of a cumulative seconds counter (``busy_seconds`` or ``sm_active_seconds``
    of GpuFast, or ``busy_seconds`` of GpuBuffered), in engine time.

    GpuFast integrals are paired with their ``counter_t`` when set (the time they were integrated up to);
    a repeat with the same ``counter_t`` (a tick without a GPM pair) is skipped, not read as idle.
    """
    out: list[Point] = []
    prev: tuple[float, float] | None = None
    for s in window:
        g = s.value.gpus.get(index)
        v = getattr(g, field, None) if isinstance(g, kind) else None
        if v is None:
            prev = None
            continue
        at = g.counter_t if isinstance(g, GpuFast) and g.counter_t is not None else s.t
        if prev is not None:
            if at <= prev[0]:
                continue
            dt = at - prev[0]
            out.append(Point(prev[0], dt, _clip((v - prev[1]) / dt)))
        prev = (at, float(v))
    return tuple(out)


def gauge_points(window: Sequence[Stamped[GpuSample]], index: int, field: str) -> tuple[Point, ...]:
    """Activity from a GPM ratio (``sm_active``), each value describing the interval that ends at its pair's
    ``counter_t`` (else its stamp); repeats of the same ``counter_t`` are skipped."""
    vals: list[tuple[float, float]] = []
    for s in window:
        g = _fast(s, index)
        v = None if g is None else getattr(g, field)
        if v is None or g is None:
            continue
        at = s.t if g.counter_t is None else g.counter_t
        if not vals or at > vals[-1][0]:
            vals.append((at, float(v)))
    out = [Point(t0, t1 - t0, _clip(v1)) for (t0, _), (t1, v1) in itertools.pairwise(vals) if t1 > t0]
    return tuple(out)


def buffered_points(window: Sequence[Stamped[GpuSample]], index: int) -> tuple[Point, ...]:
    """Activity from the driver's buffered utilisation samples (nvmlDeviceGetSamples), in driver time.

    Each sample covers the time since the previous one; duplicates (same timestamp) are dropped.
    """
    pts: dict[float, float] = {}
    for s in window:
        b = s.value.gpus.get(index)
        if isinstance(b, GpuBuffered):
            for p in b.gpu_util:
                pts[p.t] = p.value
    ts = sorted(pts)
    return tuple(Point(t0, t1 - t0, _clip(pts[t1])) for t0, t1 in itertools.pairwise(ts) if t1 > t0)


def mean(points: Iterable[Point]) -> float | None:
    """Time-weighted mean activity; None without points."""
    total = w = 0.0
    for p in points:
        total += p.value * p.dt
        w += p.dt
    return total / w if w > 0 else None


def gaps(points: Sequence[Point], level: float = IDLE_LEVEL) -> tuple[Gap, ...]:
    """Idle stretches (activity < ``level``) with activity before and after them."""
    out: list[Gap] = []
    start: float | None = None
    seen_active = False
    for p in points:
        if p.value < level:
            if start is None and seen_active:
                start = p.t
        else:
            if start is not None:
                out.append(Gap(start, p.t))
                start = None
            seen_active = True
    return tuple(out)


def mean_and_idle(points: Sequence[Point], level: float = IDLE_LEVEL) -> tuple[float, float, float] | None:
    """The span ``points`` cover, their time-weighted mean and idle share; None when they cover no time."""
    w = sum(p.dt for p in points)
    if w <= 0:
        return None
    return w, sum(p.value * p.dt for p in points) / w, sum(p.dt for p in points if p.value < level) / w


def burstiness(points: Sequence[Point], level: float = IDLE_LEVEL) -> Burst:
    """Mean, coefficient of variation, idle share, idle gaps and their periodicity over ``points``."""
    if (covered := mean_and_idle(points, level)) is None:
        return EMPTY_BURST
    w, m, idle = covered
    var = sum(p.dt * (p.value - m) ** 2 for p in points) / w
    cv = math.sqrt(var) / m if m > 1e-9 else None
    gs = gaps(points, level)
    periodic, period = _periodicity(gs)
    return Burst(mean=m, cv=cv, idle_ratio=idle, gaps=gs, periodic=periodic, period_s=period, span_s=w)


def _cv(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    if m <= 0:
        return math.inf
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)) / m


def _periodicity(gs: Sequence[Gap]) -> tuple[bool, float | None]:
    """Gaps are periodic when at least three recur with starts and lengths within ~25% of their means."""
    if len(gs) < 3:
        return False, None
    starts = [g.start for g in gs]
    spacing = [b - a for a, b in itertools.pairwise(starts)]
    period = sum(spacing) / len(spacing)
    regular = _cv(spacing) <= 0.25 and _cv([g.seconds for g in gs]) <= 0.35
    return regular, period


def bucket_counts(gap_seconds: Iterable[float], buckets: Sequence[float] = GAP_BUCKETS) -> tuple[int, ...]:
    """Non-cumulative counts per bucket (``le`` upper bounds) plus a final +Inf slot."""
    counts = [0] * (len(buckets) + 1)
    for s in gap_seconds:
        for i, le in enumerate(buckets):
            if s <= le:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    return tuple(counts)
