"""Samples of the host-side collectors (cpu, proc, cpufreq, memory, pressure, disk, nfs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter.samples.rows import Rows

# An empty mapping shared by every sample that has nothing there (a default_factory building one per sample
# leaves a tracked proxy per sample in the ring buffers).
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


class PressureTotals(NamedTuple):
    """Cumulative stall time of one PSI resource, seconds (``full`` is None for cpu on older kernels).

    A row type (exporter/samples/rows.py): the pressure collector's PressureSample.resources is a RowMap.
    """

    some: float
    full: float | None


@dataclass(frozen=True, slots=True)
class PressureSample:
    """``/proc/pressure/{cpu,io,memory}`` totals, keyed by resource name."""

    resources: Mapping[str, PressureTotals]


class CpuTimes(NamedTuple):
    """Cumulative seconds one CPU spent in each mode, from a ``cpuN`` line of /proc/stat.

    A row type (exporter/samples/rows.py): a CpuSample keeps its CPUs as tick tuples and builds these on read.
    """

    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    irq: float
    softirq: float
    steal: float

    @property
    def busy(self) -> float:
        """Seconds doing work (everything but idle and iowait)."""
        return self.user + self.nice + self.system + self.irq + self.softirq + self.steal

    @property
    def total(self) -> float:
        """All seconds accounted."""
        return self.busy + self.idle + self.iowait


def _no_nodes() -> Mapping[int, CpuTimes]:
    return _EMPTY


@dataclass(frozen=True, slots=True)
class CpuSample:
    """Per-CPU times and the NUMA node of each CPU (``node_of`` is empty when the host has no NUMA info).

    ``cpus`` holds each online CPU's counters after node_exporter-style hygiene (a field that jumps
    backwards keeps its previous value; a large idle jump back is a hotplug and resets that CPU).
    ``node_totals`` are per-NUMA-node sums accumulated from per-CPU increases, so they never go backwards
    even when a CPU goes offline; node 0 holds every CPU when the host has no NUMA info.
    """

    cpus: Mapping[int, CpuTimes]
    node_of: Mapping[int, int]
    node_totals: Mapping[int, CpuTimes] = field(default_factory=_no_nodes)


class ThreadStat(NamedTuple):
    """One thread of a process, from /proc/<pid>/task/<tid>/stat (times in seconds, cumulative).

    A row type (exporter/samples/rows.py): ProcessSample.threads stores them as exact tuples.
    """

    tid: int
    comm: str
    state: str
    utime: float
    stime: float
    processor: int
    # Cumulative seconds runnable but waiting for a CPU (task/<tid>/schedstat) and (voluntary, nonvoluntary)
    # context switches (task/<tid>/status); None when not read or not readable.
    run_delay: float | None = None
    switches: tuple[int, int] | None = None
    # Cumulative seconds on a CPU (schedstat's first field, nanosecond resolution): how a pass tells that the
    # thread has not run since the previous one. None when schedstat is not readable.
    on_cpu: float | None = None


NO_THREADS = Rows(ThreadStat)  # a process sample whose threads were not read


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process: /proc/<pid>/stat, status and io; ``threads`` is empty unless deep sampling read them.

    ``io_rchar``/``io_syscr`` are None when /proc/<pid>/io is not readable (another user's process).
    """

    pid: int
    comm: str
    state: str
    utime: float
    stime: float
    num_threads: int
    cpus_allowed: frozenset[int]
    mems_allowed: frozenset[int]
    threads: Rows[ThreadStat]  # NO_THREADS unless deep sampling read them
    io_rchar: int | None
    io_syscr: int | None
    io_read_bytes: int | None = None  # /proc/<pid>/io read_bytes: bytes that reached the block layer
    ppid: int = 0
    start: int = 0  # /proc/<pid>/stat (22) starttime, clock ticks after boot: with the pid, the process's identity
    children_cpu: float = 0.0  # cutime + cstime (s): CPU of the children it has reaped


@dataclass(frozen=True, slots=True)
class ProcSample:
    """The inspected processes by pid; ``deep`` says whether per-thread stats were read this time.

    A deep pass focused on the waiting GPUs' processes reads only those; ``held`` then carries the other
    targets as their last full deep pass read them (at most --collector.proc.threads-interval old), for
    exposition only: their times are from that earlier read, so analysis uses ``processes`` alone.
    """

    processes: Mapping[int, ProcessSample]
    deep: bool
    held: Mapping[int, ProcessSample] = field(default_factory=lambda: _EMPTY)
    # Pids read only as part of a GPU's workload (no GPU context): analysed, not exported one series per pid
    # (a trainer with 8 data-loader workers per GPU would multiply the per-process series by nine).
    workload: frozenset[int] = frozenset()


class CpufreqCpu(NamedTuple):
    """cpufreq state of one CPU (frequencies in Hz; None when the file is absent).

    A row type (exporter/samples/rows.py): CpufreqSample.cpus is a RowMap of them.
    """

    governor: str | None
    cur_hz: float | None
    max_hz: float | None


@dataclass(frozen=True, slots=True)
class CpufreqSample:
    """cpufreq per CPU (a RowMap(CpufreqCpu, ...) from the collector)."""

    cpus: Mapping[int, CpufreqCpu]


@dataclass(frozen=True, slots=True)
class MemorySample:
    """/proc/meminfo (bytes) and /proc/vmstat ``oom_kill`` (None on kernels without it)."""

    total: int
    available: int
    dirty: int
    writeback: int
    mlocked: int
    oom_kills: int | None


class DiskStats(NamedTuple):
    """One whole block device from /proc/diskstats (counters cumulative; times in seconds).

    A row type (exporter/samples/rows.py): DiskSample.devices is a RowMap of them.
    """

    reads: int
    read_bytes: int
    read_time: float
    writes: int
    write_bytes: int
    write_time: float
    in_flight: int
    io_time: float


@dataclass(frozen=True, slots=True)
class DiskSample:
    """Whole block devices by name."""

    devices: Mapping[str, DiskStats]


@dataclass(frozen=True, slots=True)
class NfsSample:
    """NFS client RPC counters from /proc/net/rpc/nfs; ``ops`` maps op name (read, getattr, open, lookup,
    ...) to calls summed over protocol versions."""

    rpc_calls: int
    retransmissions: int
    ops: Mapping[str, int]
    auth_refreshes: int = 0
