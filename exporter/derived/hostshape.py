"""The host side of a waiting GPU: CPU shape of its processes, storage and network-FS stalls.

Pure functions over windows of host samples. The diagnostic signal is the *shape*, not the average: one
thread at a full core (submission) vs many cores busy in user time (preprocessing) vs threads blocked in
D state with iowait and IO pressure (storage). CPU saturation is judged against the CPUs the process is
*allowed* to use (Cpus_allowed_list), never the host average.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from exporter.samples.host import (
    CpuSample,
    DiskSample,
    NfsSample,
    PressureSample,
    ProcessSample,
    ProcSample,
)
from exporter.snapshot import Stamped

# A data-loader worker at >= 0.6 core in mostly user time is "busy"; a core >= 85% busy is saturated.
WORKER_CORE = 0.6
SATURATED_CORE = 0.85
# A workload whose threads want this many cores more than it may use fills its CPUs by itself: one thread
# waiting behind a neighbour on its only CPU wants 1.0 of 1, four workers on two CPUs want 4 of 2.
OVERSUBSCRIBED_MARGIN = 0.5


@dataclass(frozen=True, slots=True)
class ThreadLoad:
    """One thread's CPU use over the window."""

    pid: int
    tid: int
    comm: str
    cores: float  # core-fraction (1.0 = one full core)
    system_share: float  # share of its CPU time spent in the kernel
    state: str
    run_delay: float = 0.0  # share of the window runnable but waiting for a CPU (schedstat)
    nonvoluntary_per_s: float | None = None  # involuntary context switches per second (preempted)
    context: bool = True  # the thread's process holds a GPU context (an NVML process)

    @property
    def demand(self) -> float:
        """The core the thread would use if it got every CPU slice it waited for."""
        return self.cores + self.run_delay

    @property
    def main(self) -> bool:
        """The process's first thread (tid == pid): where a Python trainer submits its kernels."""
        return self.tid == self.pid


@dataclass(frozen=True, slots=True)
class ProcLoad:
    """One process of a GPU's workload over the window (all its threads)."""

    pid: int
    comm: str
    ppid: int
    cores: float
    context: bool  # holds a GPU context (listed by NVML)


@dataclass(frozen=True, slots=True)
class CpuShape:
    """CPU shape of a GPU's processes over the window (``threads`` empty when no deep sample was read)."""

    pids: tuple[int, ...]
    allowed_cpus: int  # CPUs the processes may run on (union of Cpus_allowed_list)
    process_cores: float | None  # cores used by the processes together
    process_system_share: float | None
    threads: tuple[ThreadLoad, ...]  # busiest first
    allowed_busy_cores: float | None  # busy cores summed over the allowed CPUs
    allowed_saturated: int  # allowed CPUs >= SATURATED_CORE busy
    allowed_user_share: float | None  # user share of the busy time on the allowed CPUs
    allowed_iowait: float | None  # mean iowait share of the allowed CPUs
    d_state_threads: float  # mean number of threads in D state across deep samples
    read_bytes_per_s: float | None
    read_syscalls_per_s: float | None
    # The workload (DESIGN.md "Workloads"): its processes, what CPU it may use (the smaller of cpuset and CFS
    # quota) and why, its quota's throttling, its reads that reached storage, its own cgroup's IO pressure.
    processes: tuple[ProcLoad, ...] = ()  # busiest first
    capacity_cores: float | None = None
    capacity_why: str = ""
    quota_cores: float | None = None
    throttled_ratio: float | None = None  # throttled CFS periods / periods over the window
    throttled_per_s: float | None = None  # throttled seconds per second
    storage_read_bytes_per_s: float | None = None  # read_bytes: bytes that reached the block layer
    group_io_some: float | None = None  # the workload cgroup's io.pressure "some" share
    group: str = ""  # the workload's container / job / unit, for evidence ("" when none)
    notes: tuple[str, ...] = ()  # what the workload view could not see
    # CPU of processes no sample saw twice: children its processes reaped in the window (cutime + cstime:
    # data-loader workers re-forked every short epoch), and what the workload's own cgroup used beyond every
    # process seen (its cpu.stat usage).
    reaped: tuple[tuple[int, float], ...] = ()  # (parent pid, cores its exited children used), busiest first
    unseen_cores: float = 0.0
    # Worker processes holding TCP connections: (pid, threads waiting to receive, remote ends).
    network: tuple[tuple[int, int, tuple[str, ...]], ...] = ()

    @property
    def reaped_cores(self) -> float:
        return sum(c for _, c in self.reaped)

    @property
    def used_cores(self) -> float | None:
        """CPU the whole workload uses (its processes, their reaped children, what its own cgroup used beyond
        them), else the GPU processes', else None."""
        if self.processes:
            return sum(p.cores for p in self.processes) + self.reaped_cores + self.unseen_cores
        return self.process_cores

    @property
    def own_demand(self) -> float:
        """Cores the workload's threads want (CPU used plus time runnable but waiting): with more of them busy
        than it has CPUs, its run delay is its own run queue, whoever else runs there."""
        return sum(t.demand for t in self.threads)

    def oversubscribed(self, capacity: float) -> bool:
        """Whether its threads alone want at least half a core more than ``capacity``."""
        return self.own_demand >= capacity + OVERSUBSCRIBED_MARGIN

    @property
    def hot(self) -> ThreadLoad | None:
        return self.threads[0] if self.threads else None

    @property
    def workers(self) -> tuple[ThreadLoad, ...]:
        """Busy threads mostly in user time (data-loader workers; may include the hottest thread)."""
        return tuple(t for t in self.threads if t.cores >= WORKER_CORE and t.system_share < 0.5)

    @property
    def read_size(self) -> float | None:
        if self.read_bytes_per_s is None or not self.read_syscalls_per_s:
            return None
        return self.read_bytes_per_s / self.read_syscalls_per_s


@dataclass(frozen=True, slots=True)
class IoSignals:
    """Host-wide storage, network-FS, memory and CPU pressure over the window (rates per second)."""

    psi_io_some: float | None
    psi_io_full: float | None
    psi_cpu_some: float | None
    psi_memory_some: float | None
    psi_memory_full: float | None
    disk_await_s: float | None  # mean time per completed IO of the busiest device
    disk_util: float | None  # share of time the busiest device had IO in flight
    disk_name: str | None
    nfs_ops_per_s: float | None
    nfs_metadata_ops_per_s: float | None  # getattr + lookup + open + access
    nfs_retrans_per_s: float | None
    nfs_calls_per_s: float | None
    nfs_span_s: float = 0.0  # the seconds the NFS rates cover (less than the window in its first seconds)


def _span(window: Sequence[Stamped[object]]) -> float:
    return window[-1].t - window[0].t if len(window) >= 2 else 0.0


def _procs(window: Sequence[Stamped[ProcSample]], pid: int) -> list[tuple[float, ProcessSample]]:
    return [(s.t, p) for s in window if (p := s.value.processes.get(pid)) is not None]


def _seen(procs: Sequence[Stamped[ProcSample]], deep: Sequence[Stamped[ProcSample]],
          pid: int) -> list[tuple[float, ProcessSample]]:
    """A process's samples: the 1 s process-level ones, or the deep ones for a process only deep passes read
    (a workload's worker processes are read there, and only while their GPU waits)."""
    return _procs(procs, pid) or _procs(deep, pid)


def thread_loads(deep: Sequence[Stamped[ProcSample]], pids: Collection[int],
                 context: Collection[int] | None = None) -> tuple[ThreadLoad, ...]:
    """Per-thread core use between the first and last deep sample that saw each thread, busiest first, with
    its run delay and involuntary switch rate where schedstat / status were read; ``context`` names the
    processes that hold a GPU context (default: all of ``pids``)."""
    parts: list[tuple[ThreadLoad, ...]] = []
    for pid in pids:
        seen = [(t, p) for t, p in _procs(deep, pid) if p.threads]
        if len(seen) < 2:
            continue
        (t0, p0), (t1, p1) = seen[0], seen[-1]
        if t1 - t0 <= 0:
            continue
        parts.append(_process_thread_loads(pid, t0, p0, t1, p1, in_context=context is None or pid in context))
    if len(parts) == 1:
        return parts[0]  # sorted when it was computed (the common case: one GPU process)
    out = [t for part in parts for t in part]
    out.sort(key=_busiest_first)
    return tuple(out)


def _busiest_first(t: ThreadLoad) -> tuple[float, int]:
    return -t.cores, t.tid


# Thread loads of one process between two deep samples, kept for its newest pair only (one entry per
# process, holding the samples so an id is never reused while it lives): a stable GPU is evaluated every 5 s
# while its deep samples change every quiet pass (30 s then), and the same 150 threads' subtractions were
# redone six times. One entry per process bounds what it keeps to one evaluation's loads (a 256-pair cache
# held ~7,000 ThreadLoad objects that every full collection traversed). Kept sorted busiest first, as
# thread_loads returns them.
_LOADS: dict[int, tuple[ProcessSample, ProcessSample, float, float, bool, tuple[ThreadLoad, ...]]] = {}
_LOADS_MAX = 512  # processes; past it (a host churning through workers) the cache is emptied


def _process_thread_loads(pid: int, t0: float, p0: ProcessSample, t1: float, p1: ProcessSample, *,
                          in_context: bool) -> tuple[ThreadLoad, ...]:
    cached = _LOADS.get(pid)
    if cached is not None and cached[0] is p0 and cached[1] is p1 and cached[2:5] == (t0, t1, in_context):
        return cached[5]
    dt = t1 - t0
    first = {th.tid: th for th in p0.threads}
    out: list[ThreadLoad] = []
    for th in p1.threads:
        a = first.get(th.tid)
        if a is None:
            continue
        du, ds = max(0.0, th.utime - a.utime), max(0.0, th.stime - a.stime)
        cpu = du + ds
        delay = 0.0
        if th.run_delay is not None and a.run_delay is not None:
            delay = min(1.0, max(0.0, th.run_delay - a.run_delay) / dt)
        nonvol = None
        if th.switches is not None and a.switches is not None:
            nonvol = max(0, th.switches[1] - a.switches[1]) / dt
        out.append(ThreadLoad(pid, th.tid, th.comm, cpu / dt, ds / cpu if cpu > 0 else 0.0, th.state,
                              delay, nonvol, in_context))
    if len(_LOADS) >= _LOADS_MAX and pid not in _LOADS:
        _LOADS.clear()
    out.sort(key=_busiest_first)
    loads = tuple(out)
    _LOADS[pid] = (p0, p1, t0, t1, in_context, loads)
    return loads


def d_state_mean(deep: Sequence[Stamped[ProcSample]], pids: Collection[int]) -> float:
    """Mean number of the processes' threads in uninterruptible sleep (D) per deep sample."""
    counts = []
    for s in deep:
        if not s.value.deep:
            continue
        # A deep sample focused on other GPUs' processes (no threads read for these) is no evidence here.
        seen = [p for pid in pids if (p := s.value.processes.get(pid)) is not None and p.threads]
        if not seen:
            continue
        counts.append(sum(1 for p in seen for state in p.threads.column("state") if state == "D"))
    return sum(counts) / len(counts) if counts else 0.0


def process_loads(procs: Sequence[Stamped[ProcSample]], deep: Sequence[Stamped[ProcSample]],
                  pids: Collection[int], context: Collection[int]) -> tuple[ProcLoad, ...]:
    """Per-process core use of ``pids`` between the first and last sample that saw each, busiest first."""
    out: list[ProcLoad] = []
    for pid in pids:
        seen = _seen(procs, deep, pid)
        if len(seen) < 2:
            continue
        (t0, p0), (t1, p1) = seen[0], seen[-1]
        if t1 <= t0:
            continue
        cores = max(0.0, (p1.utime + p1.stime) - (p0.utime + p0.stime)) / (t1 - t0)
        out.append(ProcLoad(pid, p1.comm, p1.ppid, cores, pid in context))
    out.sort(key=lambda x: (-x.cores, x.pid))
    return tuple(out)


def reaped_loads(procs: Sequence[Stamped[ProcSample]], deep: Sequence[Stamped[ProcSample]],
                 pids: Collection[int]) -> tuple[tuple[int, float], ...]:
    """Per process of ``pids``: the cores its children that exited in the window used (the growth of its
    cutime + cstime), less what was already counted for the children sampled before they exited (their CPU
    up to their last sample); busiest first, processes under 0.05 core left out."""
    out: list[tuple[int, float]] = []
    for pid in pids:
        seen = _seen(procs, deep, pid)
        if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
            continue
        (t0, p0), (t1, p1) = seen[0], seen[-1]
        reaped = p1.children_cpu - p0.children_cpu
        if reaped <= 0:
            continue
        # Children sampled in the window and gone by its end were counted up to their last sample already.
        alive = {q for w in (procs, deep) if w for q in w[-1].value.processes}
        gone = {c.pid for w in (procs, deep) for st in w for c in st.value.processes.values()
                if c.ppid == pid and c.pid in pids and c.pid not in alive}
        reaped -= sum(_last_cpu(procs, deep, c, t1) for c in gone)
        cores = max(0.0, reaped) / (t1 - t0)
        if cores >= 0.05:
            out.append((pid, cores))
    out.sort(key=lambda x: (-x[1], x[0]))
    return tuple(out)


def _last_cpu(procs: Sequence[Stamped[ProcSample]], deep: Sequence[Stamped[ProcSample]], pid: int,
              until: float) -> float:
    """A process's cumulative CPU (its own and its reaped children's) at its last sample up to ``until``."""
    seen = [(t, p) for t, p in _seen(procs, deep, pid) if t <= until]
    if not seen:
        return 0.0
    p = seen[-1][1]
    return p.utime + p.stime + p.children_cpu


def storage_reads(procs: Sequence[Stamped[ProcSample]], deep: Sequence[Stamped[ProcSample]],
                  pids: Collection[int]) -> float | None:
    """Bytes per second the processes read from storage (read_bytes), None when no process shows it."""
    total, have = 0.0, False
    for pid in pids:
        seen = [(t, p) for t, p in _seen(procs, deep, pid) if p.io_read_bytes is not None]
        if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
            continue
        have = True
        total += max(0, (seen[-1][1].io_read_bytes or 0) - (seen[0][1].io_read_bytes or 0)) / (seen[-1][0] - seen[0][0])
    return total if have else None


# Per-CPU deltas of the newest window pairs: (id(first), id(last)) -> (first, last, deltas). Every GPU of one
# evaluation reads the same newest sample, and a few first ones (the window's, or since a GPU's work onset).
CoreDeltas = dict[int, tuple[float, float, float]]
_DELTAS: dict[tuple[int, int], tuple[Stamped[CpuSample], Stamped[CpuSample], CoreDeltas]] = {}
_DELTAS_MAX = 32


def core_deltas(first: Stamped[CpuSample], last: Stamped[CpuSample]) -> CoreDeltas:
    """Per CPU between two /proc/stat samples: (busy share, user+nice share, iowait share) of the time that
    passed; CPUs missing from either sample or with no time accounted are left out. Kept for the newest
    pairs: an evaluation of 8 GPUs on a 192-CPU host computed the same 192 subtractions 8 times. The cache
    holds the samples themselves, so an id is never reused while its entry lives; a full cache is emptied."""
    key = (id(first), id(last))
    cached = _DELTAS.get(key)
    if cached is not None and cached[0] is first and cached[1] is last:
        return cached[2]
    c0, c1 = first.value.cpus, last.value.cpus
    out: CoreDeltas = {}
    for c in c1:
        a, b = c0.get(c), c1[c]
        if a is None:
            continue
        busy_a, busy_b = a.busy, b.busy  # each a sum of six fields: once per CPU and sample
        tot = (busy_b + b.idle + b.iowait) - (busy_a + a.idle + a.iowait)
        if tot <= 0:
            continue
        out[c] = (max(0.0, busy_b - busy_a) / tot, max(0.0, (b.user + b.nice) - (a.user + a.nice)) / tot,
                  max(0.0, b.iowait - a.iowait) / tot)
    if len(_DELTAS) >= _DELTAS_MAX:
        _DELTAS.clear()
        _SUMS.clear()  # its keys are ids of the samples the entries held
    _DELTAS[key] = (first, last, out)
    return out


# What cpu_shape sums over a set of allowed CPUs (every CPU: None), for a pair core_deltas keeps: CPUs counted,
# busy, user+nice and iowait shares summed, CPUs saturated. The GPUs of one evaluation mostly share their
# allowed CPUs (all of them, or their NUMA node's), and each summed the same 192 CPUs again.
CoreSums = tuple[int, float, float, float, int]
_SUMS: dict[tuple[int, int, frozenset[int] | None], CoreSums] = {}


def core_sums(first: Stamped[CpuSample], last: Stamped[CpuSample], allowed: frozenset[int] | None) -> CoreSums:
    """The per-CPU deltas of ``first`` .. ``last`` (:func:`core_deltas`) summed over ``allowed``."""
    deltas = core_deltas(first, last)  # holds first and last while their entry here may be used
    key = (id(first), id(last), allowed)
    cached = _SUMS.get(key)
    if cached is not None:
        return cached
    n = saturated = 0
    busy = user = iow = 0.0
    for c in (allowed & deltas.keys()) if allowed else deltas:
        share, user_share, iow_share = deltas[c]
        n += 1
        busy += share
        user += user_share
        iow += iow_share
        if share >= SATURATED_CORE:
            saturated += 1
    out = (n, busy, user, iow, saturated)
    if len(_SUMS) >= _DELTAS_MAX * 8:
        _SUMS.clear()
    _SUMS[key] = out
    return out


def cpu_shape(
    procs: Sequence[Stamped[ProcSample]],
    deep: Sequence[Stamped[ProcSample]],
    cpus: Sequence[Stamped[CpuSample]],
    pids: Collection[int],
    context: Collection[int] | None = None,
) -> CpuShape:
    """The CPU shape of ``pids`` over the windows given (process-level, per-thread, per allowed core).

    ``context`` (default: every pid) are the processes holding a GPU context; with a workload, ``pids`` also
    holds its other processes, whose load is listed in ``processes``."""
    source = procs if any(_procs(procs, p) for p in pids) else deep
    allowed: set[int] = set()
    cores = sys_ = 0.0
    have = False
    rbytes = rcalls = 0.0
    have_io = False
    for pid in pids:
        seen = _procs(source, pid) or (_procs(deep, pid) if source is procs else [])
        if not seen:
            continue
        allowed |= seen[-1][1].cpus_allowed
        if len(seen) < 2:
            continue
        (t0, p0), (t1, p1) = seen[0], seen[-1]
        dt = t1 - t0
        if dt <= 0:
            continue
        have = True
        cores += max(0.0, (p1.utime + p1.stime) - (p0.utime + p0.stime)) / dt
        sys_ += max(0.0, p1.stime - p0.stime) / dt
        if None not in (p0.io_rchar, p1.io_rchar, p0.io_syscr, p1.io_syscr):
            have_io = True
            rbytes += max(0, (p1.io_rchar or 0) - (p0.io_rchar or 0)) / dt
            rcalls += max(0, (p1.io_syscr or 0) - (p0.io_syscr or 0)) / dt
    busy = user = iow = 0.0
    saturated = n_allowed = 0
    if len(cpus) >= 2:
        n_allowed, busy, user, iow, saturated = core_sums(cpus[0], cpus[-1], frozenset(allowed) if allowed else None)
    n_cpus = len(allowed) if allowed else (len(cpus[-1].value.cpus) if cpus else 0)
    return CpuShape(
        pids=tuple(sorted(pids)),
        allowed_cpus=n_cpus,
        process_cores=cores if have else None,
        process_system_share=(sys_ / cores if cores > 0 else 0.0) if have else None,
        threads=thread_loads(deep, pids, context),
        allowed_busy_cores=busy if n_allowed else None,
        allowed_saturated=saturated,
        allowed_user_share=(user / busy if busy > 0 else 0.0) if n_allowed else None,
        allowed_iowait=iow / n_allowed if n_allowed else None,
        d_state_threads=d_state_mean(deep, pids),
        read_bytes_per_s=rbytes if have_io else None,
        read_syscalls_per_s=rcalls if have_io else None,
        processes=process_loads(procs, deep, pids, context) if context is not None else (),
        storage_read_bytes_per_s=storage_reads(procs, deep, pids),
        reaped=reaped_loads(procs, deep, pids) if context is not None else (),
    )


def _psi(window: Sequence[Stamped[PressureSample]], res: str, full: bool) -> float | None:
    if len(window) < 2:
        return None
    a, b = window[0].value.resources.get(res), window[-1].value.resources.get(res)
    dt = _span(window)  # type: ignore[arg-type]
    if a is None or b is None or dt <= 0:
        return None
    va, vb = (a.full, b.full) if full else (a.some, b.some)
    if va is None or vb is None:
        return None
    return max(0.0, min(1.0, (vb - va) / dt))


def io_signals(
    pressure: Sequence[Stamped[PressureSample]],
    disks: Sequence[Stamped[DiskSample]],
    nfs: Sequence[Stamped[NfsSample]],
) -> IoSignals:
    """Rates of PSI, disk and NFS counters between the first and last sample of each window."""
    await_s = util = None
    disk_name = None
    if len(disks) >= 2:
        dt = _span(disks)  # type: ignore[arg-type]
        d0, d1 = disks[0].value.devices, disks[-1].value.devices
        for name, b in d1.items():
            a = d0.get(name)
            if a is None or dt <= 0:
                continue
            ios = (b.reads - a.reads) + (b.writes - a.writes)
            u = max(0.0, min(1.0, (b.io_time - a.io_time) / dt))
            aw = ((b.read_time - a.read_time) + (b.write_time - a.write_time)) / ios if ios > 0 else None
            if util is None or u > util:
                util, await_s, disk_name = u, aw, name
    ops = meta = retr = calls = None
    nfs_span = 0.0
    if len(nfs) >= 2:
        dt = nfs_span = _span(nfs)  # type: ignore[arg-type]
        if dt > 0:
            n0, n1 = nfs[0].value, nfs[-1].value
            per_op = {op: max(0, n1.ops.get(op, 0) - n0.ops.get(op, 0)) / dt for op in n1.ops}
            ops = sum(per_op.values())
            meta = sum(per_op.get(op, 0.0) for op in ("getattr", "lookup", "open", "access"))
            retr = max(0, n1.retransmissions - n0.retransmissions) / dt
            calls = max(0, n1.rpc_calls - n0.rpc_calls) / dt
    return IoSignals(
        psi_io_some=_psi(pressure, "io", False),
        psi_io_full=_psi(pressure, "io", True),
        psi_cpu_some=_psi(pressure, "cpu", False),
        psi_memory_some=_psi(pressure, "memory", False),
        psi_memory_full=_psi(pressure, "memory", True),
        disk_await_s=await_s,
        disk_util=util,
        disk_name=disk_name,
        nfs_ops_per_s=ops,
        nfs_metadata_ops_per_s=meta,
        nfs_retrans_per_s=retr,
        nfs_calls_per_s=calls,
        nfs_span_s=nfs_span,
    )

