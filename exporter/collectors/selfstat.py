"""gpufeed's own cost and headroom: CPU time, resident memory, threads and file descriptors of the daemon.

A monitor of GPU starvation must not cause it (DESIGN.md budgets): these series let an alert or a capacity
review see what gpufeed itself costs on each host, and how close it runs to its fd limit (a daemon out of
descriptors fails every file collector at once). Sample of what it exports::

    gpufeed_self_cpu_seconds_total{mode="user"} 12.43
    gpufeed_self_cpu_seconds_total{mode="system"} 3.9
    gpufeed_self_resident_memory_bytes 4.6137344e+07
    gpufeed_self_threads 9
    gpufeed_self_open_fds 23
    gpufeed_self_max_fds 1024

It reads the daemon's own ``/proc/self/{stat,status,fd}`` in the real procfs, not under ``--path.procfs``:
the configured root may be a host's procfs mounted into a container, or the simulator's rendered tree, and
neither has this process in it. The fd limit is the soft ``RLIMIT_NOFILE`` (getrlimit(2)).

Open descriptors are counted with one stat(2) of ``/proc/self/fd``: since Linux 6.2 its size is the number of
open descriptors. The daemon keeps thousands of per-thread files open (exporter/sources.py KeptFiles), and
listing them cost 7 ms every 5 s, more than any other host source; kernels before 6.2 report size 0 and are
listed as before.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors import register
from exporter.sampling import SELF, Collector, CollectorError
from exporter.snapshot import Snapshot
from exporter.sources import BYTES_PER_KB, USER_HZ, read_source

PROC_SELF = Path("/proc/self")


@dataclass(frozen=True, slots=True)
class SelfSample:
    """The daemon process at one instant."""

    user_seconds: float
    system_seconds: float
    resident_bytes: int
    threads: int
    open_fds: int
    max_fds: int | None  # None: unlimited


def parse_self_stat(text: str) -> tuple[float, float]:
    """utime and stime (fields 14, 15 of proc(5)'s /proc/<pid>/stat) in seconds; comm may hold spaces."""
    rest = text[text.rfind(")") + 2:].split()
    if len(rest) < 13:
        raise CollectorError(f"/proc/self/stat: {len(rest) + 2} fields, expected at least 15")
    try:
        return int(rest[11]) / USER_HZ, int(rest[12]) / USER_HZ
    except ValueError as e:
        raise CollectorError(f"/proc/self/stat: bad utime/stime: {e}") from e


def parse_self_status(text: str) -> tuple[int, int]:
    """VmRSS (bytes) and Threads from /proc/<pid>/status."""
    vals: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            try:
                vals[key] = int(value.split()[0])
            except (ValueError, IndexError) as e:
                raise CollectorError(f"/proc/self/status: bad {key}: {value.strip()!r}") from e
    if "VmRSS" not in vals or "Threads" not in vals:
        raise CollectorError("/proc/self/status: no VmRSS/Threads line")
    return vals["VmRSS"] * BYTES_PER_KB, vals["Threads"]


def count_open_fds(fd_dir: Path) -> int:
    """How many descriptors are open: the size of ``/proc/<pid>/fd`` (Linux 6.2+), else its entries."""
    try:
        size = os.stat(fd_dir).st_size
        if size > 0:
            return size
        with os.scandir(fd_dir) as entries:
            # The listing's own descriptor is among them (it is open while the directory is read).
            return max(0, sum(1 for _ in entries) - 1)
    except OSError as e:
        raise CollectorError(f"{fd_dir}: {e.strerror or e}") from e


@register
class SelfCollector(Collector):
    """CPU, memory, threads and descriptors of the gpufeed process itself."""

    name = SELF
    help = "gpufeed's own CPU time, resident memory, threads and open/maximum file descriptors (/proc/self)."
    default_interval = 5.0

    def update(self) -> SelfSample:
        user, system = parse_self_stat(read_source(PROC_SELF / "stat"))
        rss, threads = parse_self_status(read_source(PROC_SELF / "status"))
        fds = count_open_fds(PROC_SELF / "fd")
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return SelfSample(user_seconds=user, system_seconds=system, resident_bytes=rss, threads=threads,
                          open_fds=fds, max_fds=None if soft == resource.RLIM_INFINITY else soft)

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        s: SelfSample | None = snap.value(self.name)
        if s is None:
            return
        cpu = CounterMetricFamily("gpufeed_self_cpu_seconds", "CPU time the gpufeed process used, by mode.",
                                  labels=["mode"])
        cpu.add_metric(["user"], s.user_seconds)
        cpu.add_metric(["system"], s.system_seconds)
        yield cpu
        yield GaugeMetricFamily("gpufeed_self_resident_memory_bytes", "Resident memory of the gpufeed process "
                                "(VmRSS).", value=float(s.resident_bytes))
        yield GaugeMetricFamily("gpufeed_self_threads", "Threads of the gpufeed process.", value=float(s.threads))
        yield GaugeMetricFamily("gpufeed_self_open_fds", "Open file descriptors of the gpufeed process.",
                                value=float(s.open_fds))
        if s.max_fds is not None:
            yield GaugeMetricFamily("gpufeed_self_max_fds", "The gpufeed process's soft limit on open file "
                                    "descriptors (RLIMIT_NOFILE).", value=float(s.max_fds))
