"""CPU time and memory of one process, and of the whole host, straight from procfs.

Only the measured process's own ``utime + stime`` counts (fields 14 and 15 of ``/proc/<pid>/stat``,
all of its threads, none of its children): the simulator renders in a child process by design, so
measuring the daemon pid measures the daemon alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# /proc/<pid>/stat times are in clock ticks of USER_HZ (proc(5), "utime %lu ... sysconf(_SC_CLK_TCK)").
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all threads, not children), from /proc/<pid>/stat."""
    text = (PROC / str(pid) / "stat").read_text()
    # comm may contain spaces and parentheses: split after the last ')'; state is then field 3.
    fields = text.rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes, from VmRSS in /proc/<pid>/status (kB there)."""
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def thread_count(pid: int) -> int:
    """Threads of ``pid``, from Threads in /proc/<pid>/status."""
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def host_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of all cores since boot, from the ``cpu`` line of /proc/stat."""
    first = (PROC / "stat").read_text().split("\n", 1)[0].split()
    values = [int(v) for v in first[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is already in user.
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's children file, /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            out += [int(x) for x in (t / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(out))


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
        self._h0 = (0, 0)

    def start(self) -> None:
        self._c0 = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self._h0 = host_ticks()
        self._t0 = time.monotonic()

    def stop(self) -> tuple[dict[str, CpuReading], float]:
        """Per-name readings and the host's average busy cores over the window (all processes)."""
        wall = time.monotonic() - self._t0
        out = {k: CpuReading(cpu_seconds(p) - self._c0[k], wall) for k, p in self.pids.items()}
        busy1, _ = host_ticks()
        busy = (busy1 - self._h0[0]) / CLK_TCK
        return out, busy / wall if wall > 0 else 0.0


def cpu_seconds_self() -> float:
    """User + system CPU seconds of this process (all threads)."""
    t = os.times()
    return t.user + t.system
