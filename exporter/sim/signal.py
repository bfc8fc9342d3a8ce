"""Scenario values as functions of time, with exact integrals.

Every scenario value is piecewise constant in time: a number is one piece, a square wave changes at
``k*P`` and ``k*P + D*P``, and noise is drawn on a fixed grid (:data:`NOISE_STEP`) and held in between.
So every counter the simulator renders is an exact integral: a :class:`Piecewise` keeps its breakpoints
and the running integral at each, and answers ``at(x)`` and ``integral(x)`` by bisection, in any order,
with the same answer for the same ``x`` (renders may be asked for out of order, or twice).

Noise is counter-based: the value on grid step ``k`` of signal ``key`` comes from a generator seeded with
``(seed, key, k // CHUNK)``, so it depends on nothing but the scenario seed, the key and the time.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from array import array
from collections.abc import Callable, Sequence

from exporter.sim.spec import Noise, Square, Value

NOISE_STEP = 0.1  # seconds between noise draws (the GPM / fast-path floor: finer would be invisible)
_CHUNK = 512


class Piecewise:
    """A right-continuous piecewise-constant function on ``[0, duration]``.

    ``xs[i]`` is where piece ``i`` starts (``xs[0] == 0``) and ``vs[i]`` its value; ``cum[i]`` is the
    integral from 0 to ``xs[i]``.
    """

    __slots__ = ("cum", "duration", "total", "vs", "xs")

    def __init__(self, xs: Sequence[float], vs: Sequence[float], duration: float) -> None:
        self.xs = array("d", xs)
        self.vs = array("d", vs)
        self.duration = duration
        cum = array("d", [0.0])
        for i in range(1, len(self.xs)):
            cum.append(cum[-1] + self.vs[i - 1] * (self.xs[i] - self.xs[i - 1]))
        self.cum = cum
        self.total = cum[-1] + self.vs[-1] * (duration - self.xs[-1])

    @classmethod
    def const(cls, v: float, duration: float) -> Piecewise:
        """One piece."""
        return cls([0.0], [v], duration)

    def _piece(self, x: float) -> int:
        return max(0, bisect.bisect_right(self.xs, x) - 1)

    def at(self, x: float) -> float:
        """The value at ``x`` (clamped into the domain)."""
        return self.vs[self._piece(min(max(x, 0.0), self.duration))]

    def integral(self, x: float) -> float:
        """The integral from 0 to ``x`` (clamped into the domain)."""
        x = min(max(x, 0.0), self.duration)
        i = self._piece(x)
        return self.cum[i] + self.vs[i] * (x - self.xs[i])

    def mean(self) -> float:
        """Average over the whole domain."""
        return self.total / self.duration if self.duration > 0 else self.vs[0]

    @property
    def is_const(self) -> bool:
        """One piece only."""
        return len(self.xs) == 1


def combine(fn: Callable[..., float], parts: Sequence[Piecewise], duration: float) -> Piecewise:
    """``fn`` applied piece by piece to several functions on the same domain (breakpoints merged)."""
    if all(p.is_const for p in parts):
        return Piecewise.const(fn(*(p.vs[0] for p in parts)), duration)
    xs: list[float] = []
    for x in heapq.merge(*(p.xs for p in parts)):
        if not xs or x > xs[-1]:
            xs.append(x)
    idx = [0] * len(parts)
    vs: list[float] = []
    for x in xs:
        args = []
        for j, p in enumerate(parts):
            i = idx[j]
            while i + 1 < len(p.xs) and p.xs[i + 1] <= x:
                i += 1
            idx[j] = i
            args.append(p.vs[i])
        vs.append(fn(*args))
    # Merge equal neighbours: fewer pieces, same function.
    mx: list[float] = [xs[0]]
    mv: list[float] = [vs[0]]
    for x, v in zip(xs[1:], vs[1:], strict=True):
        if v != mv[-1]:
            mx.append(x)
            mv.append(v)
    return Piecewise(mx, mv, duration)


def total(parts: Sequence[Piecewise], duration: float, scale: float = 1.0) -> Piecewise:
    """``scale`` x the sum of ``parts``."""
    if not parts:
        return Piecewise.const(0.0, duration)
    return combine(lambda *a: scale * math.fsum(a), parts, duration)


def _noise_values(seed: int, key: str, n: Noise, *, first: int, count: int, lo: float, hi: float) -> list[float]:
    out: list[float] = []
    chunk = -1
    rng = random.Random()
    for k in range(first, first + count):
        c = k // _CHUNK
        if c != chunk:
            chunk = c
            rng = random.Random(f"{seed}/{key}/{c}")
            for _ in range(k - c * _CHUNK):
                rng.gauss(0.0, 1.0)
        out.append(min(hi, max(lo, n.mean + n.sd * rng.gauss(0.0, 1.0))))
    return out


def build(v: Value, duration: float, *, seed: int, key: str, lo: float = -math.inf,
          hi: float = math.inf) -> Piecewise:
    """The function of time (seconds from the phase start) that a scenario value describes."""
    if isinstance(v, Square):
        high, low = min(hi, max(lo, v.high)), min(hi, max(lo, v.low))
        if v.duty >= 1.0 or high == low:
            return Piecewise.const(high if v.duty > 0 else low, duration)
        if v.duty <= 0.0:
            return Piecewise.const(low, duration)
        xs: list[float] = []
        vs: list[float] = []
        k = 0
        while k * v.period_s < duration:
            xs += [k * v.period_s, k * v.period_s + v.duty * v.period_s]
            vs += [high, low]
            k += 1
        while xs and xs[-1] >= duration and len(xs) > 1:
            xs.pop()
            vs.pop()
        return Piecewise(xs, vs, duration)
    if isinstance(v, Noise):
        if v.sd == 0:
            return Piecewise.const(min(hi, max(lo, v.mean)), duration)
        steps = max(1, math.ceil(duration / NOISE_STEP))
        values = _noise_values(seed, key, v, first=0, count=steps, lo=lo, hi=hi)
        return Piecewise([k * NOISE_STEP for k in range(steps)], values, duration)
    return Piecewise.const(min(hi, max(lo, float(v))), duration)


class Track:
    """One signal over the whole timeline: a Piecewise per phase, looping after the last phase."""

    __slots__ = ("cum", "ends", "length", "phases", "starts")

    def __init__(self, phases: Sequence[Piecewise], starts: Sequence[float]) -> None:
        self.phases = list(phases)
        self.starts = list(starts)
        self.ends = [s + p.duration for s, p in zip(starts, phases, strict=True)]
        self.length = self.ends[-1]
        cum = [0.0]
        for p in self.phases:
            cum.append(cum[-1] + p.total)
        self.cum = cum

    def _locate(self, t: float) -> tuple[int, float, int]:
        """(loop number, local time, phase index) of scenario time ``t``."""
        n = math.floor(t / self.length) if t >= self.length else 0
        local = t - n * self.length
        i = min(bisect.bisect_right(self.ends, local), len(self.phases) - 1)
        return n, local, i

    def at(self, t: float) -> float:
        """The value at time ``t``."""
        _, local, i = self._locate(max(t, 0.0))
        return self.phases[i].at(local - self.starts[i])

    def integral(self, t: float) -> float:
        """The integral from 0 to ``t`` (all loops included)."""
        if t <= 0:
            return 0.0
        n, local, i = self._locate(t)
        return n * self.cum[-1] + self.cum[i] + self.phases[i].integral(local - self.starts[i])

    def integral_at(self, at: At) -> float:
        """:meth:`integral` at a time already located (one bisection shared by many tracks)."""
        if at.t <= 0:
            return 0.0
        p = self.phases[at.phase]
        x = at.local - self.starts[at.phase]
        base = at.loops * self.cum[-1] + self.cum[at.phase]
        if len(p.xs) == 1:
            return base + p.vs[0] * min(max(x, 0.0), p.duration)
        return base + p.integral(x)


class At:
    """A scenario time located on the timeline: loop number, time within the loop, phase index."""

    __slots__ = ("local", "loops", "phase", "t")

    def __init__(self, t: float, ends: Sequence[float]) -> None:
        length = ends[-1]
        self.t = t
        self.loops = math.floor(t / length) if t >= length else 0
        self.local = t - self.loops * length if t > 0 else 0.0
        self.phase = min(bisect.bisect_right(ends, self.local), len(ends) - 1)
