"""Garbage-collection pauses, recorded inside the daemon (bench/probe.py) and summarised by the benchmarks.

A pause is timed from ``gc.callbacks``' start to its stop: wall time (what a 100 ms tick or a scrape waits; on a
shared box it includes the scheduler's preemptions of the collecting thread) and that thread's CPU time (the
collection's own work). Pauses go into fixed bins, per generation, so a recording over an hour holds as much
memory as one over a minute -- the soak measures RSS at the same time, and a growing list of pauses would be a
slope of its own. A p99 needs about a hundred pauses before it is more than the maximum: the 60 s breakdown
window holds 10-60 collections, the hour-long soak thousands.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

BIN_S = 50e-6  # 50 us bins ...
BINS = 2000  # ... up to 100 ms; longer pauses land in the last bin, and the exact maximum is kept beside


class PauseBins:
    """Counts of pauses per bin, wall and CPU apart, with the exact maxima (one generation)."""

    __slots__ = ("count", "cpu", "max_cpu", "max_wall", "wall")

    def __init__(self) -> None:
        # Arrays, not lists: a list of 2,000 ints would be 2,000 more referents for each full collection of the
        # daemon being measured to walk; an array has none.
        self.wall = array("q", bytes(8 * BINS))
        self.cpu = array("q", bytes(8 * BINS))
        self.count = 0
        self.max_wall = self.max_cpu = 0.0

    def add(self, wall: float, cpu: float) -> None:
        self.wall[min(BINS - 1, int(wall / BIN_S))] += 1
        self.cpu[min(BINS - 1, max(0, int(cpu / BIN_S)))] += 1
        self.count += 1
        self.max_wall = max(self.max_wall, wall)
        self.max_cpu = max(self.max_cpu, cpu)

    def dump(self) -> dict[str, Any]:
        """JSON-ready: only the bins that hold pauses (``{bin index: count}``)."""
        return {"bin_s": BIN_S, "count": self.count, "max_wall_s": self.max_wall, "max_cpu_s": self.max_cpu,
                "wall": {str(i): n for i, n in enumerate(self.wall) if n},
                "cpu": {str(i): n for i, n in enumerate(self.cpu) if n}}


def _quantile(bins: Mapping[str, int], count: int, bin_s: float, q: float) -> float:
    """The upper edge of the bin holding the pause of rank ``int(q * count)`` (0-based, as a sorted list's index):
    never under the true quantile, at most a bin over it; infinity when that is the last bin (longer pauses land
    there: the caller takes the exact maximum instead)."""
    if count == 0:
        return 0.0
    rank = min(count - 1, int(q * count))
    seen = 0
    for i, n in sorted((int(k), v) for k, v in bins.items()):
        seen += n
        if seen > rank:
            return math.inf if i >= BINS - 1 else (i + 1) * bin_s
    return math.inf


def summary(dumps: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Count, p99 and maximum (ms), wall and CPU, of the pauses of the given generations' dumps pooled."""
    wall: dict[str, int] = {}
    cpu: dict[str, int] = {}
    count, max_wall, max_cpu, bin_s = 0, 0.0, 0.0, BIN_S
    for d in dumps:
        bin_s = float(d["bin_s"])
        count += int(d["count"])
        max_wall, max_cpu = max(max_wall, float(d["max_wall_s"])), max(max_cpu, float(d["max_cpu_s"]))
        for k, n in d["wall"].items():
            wall[k] = wall.get(k, 0) + int(n)
        for k, n in d["cpu"].items():
            cpu[k] = cpu.get(k, 0) + int(n)
    # The binned p99 never exceeds the exact maximum by more than the bin: report the smaller.
    return {"count": count,
            "p99_ms": 1000 * min(_quantile(wall, count, bin_s, 0.99), max_wall),
            "max_ms": 1000 * max_wall,
            "cpu_p99_ms": 1000 * min(_quantile(cpu, count, bin_s, 0.99), max_cpu),
            "cpu_max_ms": 1000 * max_cpu}


def full_pauses(pauses: list[list[float]]) -> dict[str, float]:
    """Count and maximum (ms), wall and CPU, of the full collections the end of a window ran ([wall, CPU] s each,
    as bench/probe.py dumps them)."""
    return {"count": len(pauses), "max_ms": 1000 * max((p[0] for p in pauses), default=0.0),
            "cpu_max_ms": 1000 * max((p[1] for p in pauses), default=0.0)}
