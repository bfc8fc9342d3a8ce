"""CPU time and memory of one process, and of the whole host, measured from outside with psutil.

Only the measured process's own user + system time counts (all of its threads, none of its children): the
simulator renders in a child process by design, so measuring the daemon pid measures the daemon alone.
psutil rather than the daemon's own /proc parsers, so the benchmark does not grade the daemon with its own
code.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all threads, not children)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes."""
    return int(psutil.Process(pid).memory_info().rss)


def thread_count(pid: int) -> int:
    """Threads of ``pid``."""
    return int(psutil.Process(pid).num_threads())


def host_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait; guest is in user)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
                 - getattr(t, "guest_nice", 0.0))


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        return sorted(c.pid for c in psutil.Process(pid).children())
    except psutil.NoSuchProcess:
        return []


@dataclass(frozen=True, slots=True)
class CpuReading:
    """CPU used by one process over a measured window."""

    seconds: float  # CPU seconds used in the window
    wall: float  # wall seconds of the window

    @property
    def core_percent(self) -> float:
        """Percent of one core."""
        return 100.0 * self.seconds / self.wall if self.wall > 0 else 0.0


class CpuWindow:
    """CPU seconds of several pids, and of the host, between ``start()`` and ``stop()``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._t0 = 0.0
        self._c0: dict[str, float] = {}
        self._h0 = 0.0

    def start(self) -> None:
        self._c0 = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self._h0 = host_busy_seconds()
        self._t0 = time.monotonic()

    def stop(self) -> tuple[dict[str, CpuReading], float]:
        """Per-name readings and the host's average busy cores over the window (all processes)."""
        wall = time.monotonic() - self._t0
        out = {k: CpuReading(cpu_seconds(p) - self._c0[k], wall) for k, p in self.pids.items()}
        busy = host_busy_seconds() - self._h0
        return out, busy / wall if wall > 0 else 0.0


def cpu_seconds_self() -> float:
    """User + system CPU seconds of this process (all threads)."""
    t = os.times()
    return t.user + t.system
