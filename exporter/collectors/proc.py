"""GPU processes (and any named pids): CPU times, placement and reads from /proc/<pid>, threads on demand.

Two samplers, because per-thread reads cost one file per thread (a training job has ~150): ``proc`` reads
process-level files every second; ``proc_threads`` reads every ``/proc/<pid>/task/<tid>/stat`` every 5 s
by default, and the derived layer shortens its interval (``engine.set_interval("proc_threads", 0.5)``)
while a GPU is waiting -- cheap always-on signals, deep evidence on demand. While it does, it also narrows
the deep sampler to the waiting GPUs' processes (``ctx.targets.set_focus``): the other processes are left
out of those deep samples (their process-level evidence comes from ``proc`` every second), except one full
pass per ``threads-interval`` that keeps the other GPUs' per-thread evidence as fresh as when nothing waits.
Deep sampling then costs what the waiting GPUs need, not what the whole host has. ``proc_threads`` keeps only
``CPU_WINDOW_MAX`` + 2 s of samples (each holds every thread), not ``--engine.history``.

A deep pass reads each thread's ``schedstat`` first, through a descriptor kept open
(exporter/sources.py KeptFiles): its time on a CPU says whether the thread ran since the previous pass. One
that did not keeps its previous stat and status (its times, state and context switches only change when it
runs), so the idle majority of a trainer's threads cost one ``pread`` each; every ``FULL_EVERY_S`` a pass
reads every thread's stat again anyway. What that can miss is a thread woken but not yet on a CPU for a whole
pass (shown in its previous state, usually S, until it runs: its run delay then shows the wait).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import log
from exporter.collectors import register
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.samples.host import NO_THREADS, ProcessSample, ProcSample, ThreadStat
from exporter.samples.rows import Rows
from exporter.sampling import (
    CPU_WINDOW_MAX,
    PROC,
    PROC_THREADS,
    Collector,
    CollectorContext,
    CollectorError,
    Option,
    SamplerSpec,
)
from exporter.snapshot import Snapshot
from exporter.sources import GONE, USER_HZ, KeptFiles, SourceTooLargeError

# utime/stime in /proc/<pid>/stat are clock ticks: "measured in clock ticks (divide by sysconf(_SC_CLK_TCK))"
# -- proc(5), /proc/pid/stat fields (14) and (15); exporter.sources.USER_HZ.
THREADS_SAMPLER = PROC_THREADS
# Deep samples are read only over the analyzer's CPU window (at most CPU_WINDOW_MAX); a little margin so the
# oldest sample of a full window is still there.
THREADS_HISTORY = CPU_WINDOW_MAX + 2.0
# Every thread's stat is read again at least this often (seconds), whether it ran or not.
FULL_EVERY_S = 5.0
# Positions in a stored ThreadStat row (Rows.tuples()).
_TID, _UTIME, _STIME, _RUN_DELAY, _SWITCHES, _ON_CPU = map(
    ThreadStat._fields.index, ("tid", "utime", "stime", "run_delay", "switches", "on_cpu"))
# Thread states as fs/proc/array.c task_state_array prints them; running/sleeping/disk_sleep are always
# exported (0 included) so "threads in D state" is a value, not an absent series.
STATE_NAMES = {
    "R": "running", "S": "sleeping", "D": "disk_sleep", "T": "stopped", "t": "tracing_stop",
    "X": "dead", "Z": "zombie", "P": "parked", "I": "idle",
}


class PidListOption(Option):
    """A comma-separated list of positive pids; a bad entry is a configuration error naming it."""

    def parse(self, value: object) -> tuple[int, ...]:
        items = value if isinstance(value, list | tuple) else str(value).split(",")
        out: list[int] = []
        for item in items:
            s = str(item).strip()
            if not s:
                continue
            if not s.isdigit() or int(s) <= 0:
                raise ValueError(f"not a pid: {s!r} (expected e.g. 123,456)")
            out.append(int(s))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class StatFields:
    """The fields of a /proc/<pid>/stat line that gpufeed uses."""

    comm: str
    state: str
    utime: float
    stime: float
    num_threads: int
    processor: int
    ppid: int = 0
    start: int = 0
    children_cpu: float = 0.0


def parse_stat(text: str) -> StatFields:
    """Parse a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat line.

    ``comm`` may contain spaces and parentheses (a thread can name itself ``a) b (c``), so it is everything
    between the first ``(`` and the LAST ``)``; the fields after it are space separated.
    """
    lpar = text.find("(")
    rpar = text.rfind(")")
    if lpar < 0 or rpar < lpar:
        raise ValueError(f"no (comm) in {text[:60]!r}")
    rest = text[rpar + 2:].split()
    # Field numbers below are proc(5)'s, 1-based; rest[0] is field 3 (state).
    if len(rest) < 37:
        raise ValueError(f"{len(rest) + 2} fields, expected at least 39")
    return StatFields(
        comm=text[lpar + 1:rpar],
        state=rest[0],
        utime=int(rest[11]) / USER_HZ,  # (14) utime
        stime=int(rest[12]) / USER_HZ,  # (15) stime
        num_threads=int(rest[17]),  # (20) num_threads
        processor=int(rest[36]),  # (39) processor
        ppid=int(rest[1]),  # (4) ppid
        start=int(rest[19]),  # (22) starttime
        # (16) cutime + (17) cstime: CPU of the children it waited for. Data-loader workers re-forked every
        # short epoch live too briefly to be sampled twice; their CPU shows here once the parent reaps them.
        children_cpu=(int(rest[13]) + int(rest[14])) / USER_HZ,
    )


def parse_status(text: str) -> tuple[frozenset[int], frozenset[int]]:
    """``Cpus_allowed_list`` and ``Mems_allowed_list`` from /proc/<pid>/status."""
    cpus: frozenset[int] | None = None
    mems: frozenset[int] | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            cpus = parse_cpulist(value)
        elif key == "Mems_allowed_list":
            mems = parse_cpulist(value)
    if cpus is None or mems is None:
        raise ValueError("no Cpus_allowed_list/Mems_allowed_list")
    return cpus, mems


def parse_io(text: str) -> tuple[int, int, int | None]:
    """``rchar``, ``syscr`` and ``read_bytes`` from /proc/<pid>/io. ``read_bytes`` counts what reached the block
    layer -- direct and asynchronous I/O included, which no read syscall shows (Documentation/filesystems/
    proc.rst, "/proc/<pid>/io"); None on a kernel that does not print it."""
    vals: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "syscr", "read_bytes"):
            vals[key] = int(value)
    if "rchar" not in vals or "syscr" not in vals:
        raise ValueError("no rchar/syscr")
    return vals["rchar"], vals["syscr"], vals.get("read_bytes")


def parse_schedstat(text: str) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) from /proc/<pid>/task/<tid>/schedstat:
    ``<run ns> <run-delay ns> <timeslices>`` (Documentation/scheduler/sched-stats.rst)."""
    parts = text.split()
    if len(parts) < 2:
        raise ValueError(f"schedstat: {text.strip()[:40]!r}")
    return int(parts[0]) / 1e9, int(parts[1]) / 1e9


def parse_switches(text: str) -> tuple[int, int] | None:
    """``voluntary_ctxt_switches`` and ``nonvoluntary_ctxt_switches`` from a (task) status file."""
    vol = nonvol = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "voluntary_ctxt_switches":
            vol = int(value)
        elif key == "nonvoluntary_ctxt_switches":
            nonvol = int(value)
    return None if vol is None or nonvol is None else (vol, nonvol)


class _Counters(CounterMetricFamily):
    """Per-process counters, with each pid's start time (``lives``): a pid whose start time changed is another
    process, and the exposition's MonotonicGuard takes its lower value as the reset it is."""

    lives: Mapping[str, int] = MappingProxyType({})


class _GoneError(Exception):
    """The process vanished while it was being read."""


class _MalformedError(Exception):
    """One process's file could not be parsed (empty, truncated, garbage): that process is skipped."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


@register
class ProcCollector(Collector):
    """CPU time, placement and read pattern of the GPU processes; per-thread state on a second sampler."""

    name = PROC
    help = "GPU processes (and --collector.proc.pids) from /proc/<pid>/{stat,status,io,task/*/stat}."
    default_interval = 1.0
    sampler_intervals = MappingProxyType({PROC: "interval", THREADS_SAMPLER: "threads-interval"})
    options = (
        PidListOption("pids", "list", (), "Extra pids to inspect besides the GPU processes (e.g. 123,456)."),
        Option("threads-interval", "duration", 5.0, "Interval of per-thread sampling (sampler proc_threads)."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.static_pids = frozenset(int(p) for p in ctx.options.get("pids", ()))
        self.threads_interval = float(ctx.options.get("threads-interval", 5.0))
        self._log = log.get_logger(collector=self.name)
        self._tag = f"{id(self):x}"
        # Each target as the newest deep pass that read it (only the deep sampler's thread touches it).
        self._last_deep: dict[int, ProcessSample] = {}
        self._full_at: dict[int, float] = {}  # pid -> when a deep pass last read every thread's stat
        self._workload: dict[bool, frozenset[int]] = {False: frozenset(), True: frozenset()}
        self._root = os.fspath(ctx.proc())
        # One set of kept descriptors per sampler (they run on different worker threads).
        self._kept = KeptFiles()
        self._kept_deep = KeptFiles()

    def samplers(self) -> list[SamplerSpec]:
        return [
            SamplerSpec(self.name, self.interval, self.update),
            SamplerSpec(THREADS_SAMPLER, self.threads_interval, self.update_threads, history=THREADS_HISTORY),
        ]

    def pids(self) -> frozenset[int]:
        """The GPU processes (published by the GPU collector) plus the configured ones."""
        return self.ctx.targets.pids() | self.static_pids

    def update(self) -> ProcSample:
        try:
            return self._sample(deep=False)
        finally:
            self._kept.sweep()

    def close(self) -> None:
        self._kept.close()
        self._kept_deep.close()

    def update_threads(self) -> ProcSample:
        """Process-level reads plus every thread's stat (the deep sampler); while the derived layer focuses
        deep inspection on the waiting GPUs' processes, only those (and --collector.proc.pids) are read.

        The other processes of a waiting GPU's workload (data-loader workers, container members: published by
        the workload collector) are read here too, in focused passes only: a GPU that works needs no evidence
        from its workers, and 8 trainers x 8 workers read every second would cost more than all else."""
        targets = self.pids()
        focus = self.ctx.targets.take_focus()
        read = targets if focus is None else targets & (focus | self.static_pids)
        focus_now = self.ctx.targets.focus()
        if focus_now:
            read = read | (self.ctx.targets.workload_pids() & focus_now)
        try:
            sample = self._sample(deep=True, pids=read)
        finally:
            self._kept_deep.sweep()
        self._full_at = {p: t for p, t in self._full_at.items() if p in targets}
        last = {p: v for p, v in self._last_deep.items() if p in targets and p not in read}
        direct = self.ctx.targets.pids() | self.static_pids
        # Left out of this pass: exposed as last read, so their series do not flap (workload-only pids are
        # never exposed per pid).
        held = {p: v for p, v in last.items() if p in direct}
        last.update(sample.processes)
        self._last_deep = last
        if not held:
            return sample
        return ProcSample(processes=sample.processes, deep=True, held=MappingProxyType(held), workload=sample.workload)

    def _sample(self, deep: bool, pids: frozenset[int] | None = None) -> ProcSample:
        """Every target process (or ``pids``); one whose files are malformed or cannot be read (EACCES, EIO)
        is skipped (logged once per pid), the others are kept. A host-level problem fails the sampler: the procfs
        root missing, or a read failing for every process inspected (hidepid, missing privileges)."""
        order = sorted(self.pids() if pids is None else pids)
        if order and not self.ctx.proc().is_dir():
            raise CollectorError(f"{self.ctx.proc()}: procfs root missing (check --path.procfs)")
        out: dict[int, ProcessSample] = {}
        unreadable: list[CollectorError] = []
        for pid in order:
            key = ("proc_parse_failed", self._tag, str(pid))
            try:
                out[pid] = self._process(pid, deep)
            except _GoneError:
                continue
            except _MalformedError as e:
                if log.once(key):
                    self._log.warning("proc_parse_failed", pid=pid, file=e.path, reason=e.reason,
                                      action="process skipped")
                continue
            except CollectorError as e:
                unreadable.append(e)
                if log.once(("proc_read_failed", self._tag, str(pid))):
                    self._log.warning("proc_read_failed", pid=pid, error=str(e), action="process skipped")
                continue
            log.forget(key)  # parsed again (or a new process with that pid): log the next failure
            log.forget(("proc_read_failed", self._tag, str(pid)))
        if unreadable and not out:
            raise unreadable[0]
        direct = self.ctx.targets.pids() | self.static_pids
        workload = frozenset(p for p in out if p not in direct)
        # The previous pass's set while unchanged: the cycle collector tracks every set, and each sample in the
        # ring buffer holds one (one slot per sampler: the two run on different threads).
        if workload == self._workload[deep]:
            workload = self._workload[deep]
        self._workload[deep] = workload
        return ProcSample(processes=MappingProxyType(out), deep=deep, workload=workload)

    def _read(self, path: str, deep: bool = False) -> str:
        """One file under /proc (through the sampler's kept descriptors); _GoneError when the process or thread
        no longer exists."""
        try:
            return (self._kept_deep if deep else self._kept).read(path).decode("utf-8", "replace")
        except SourceTooLargeError as e:
            # A 1 GB file over one process's stat is that process's problem: it is skipped, not read whole, and
            # the other processes are still sampled.
            raise _MalformedError(path, str(e)) from e
        except OSError as e:
            if e.errno in GONE:
                raise _GoneError(path) from e
            raise CollectorError(f"{path}: {e.strerror or e}") from e

    def _process(self, pid: int, deep: bool) -> ProcessSample:
        """One process from /proc/<pid>/stat, status and io (and task/*/stat when ``deep``)."""
        base = f"{self._root}/{pid}/"
        stat = self._parse(parse_stat, self._read(base + "stat", deep), pid, "stat")
        cpus, mems = self._parse(parse_status, self._read(base + "status", deep), pid, "status")
        rchar: int | None = None
        syscr: int | None = None
        storage: int | None = None
        try:
            rchar, syscr, storage = self._parse(parse_io, self._read(base + "io", deep), pid, "io")
        except CollectorError as e:  # read errors only: malformed content is a _MalformedError
            if not isinstance(e.__cause__, PermissionError):
                raise
            # Another user's process (ptrace access mode check): the read pattern is unknown, not zero.
        except _GoneError:
            if not os.path.isdir(base):
                raise
            # The process is alive but has no io file: a kernel without CONFIG_TASK_IO_ACCOUNTING.
        # One table per process, not one object per thread: the cycle collector does not traverse its rows
        # (exporter/samples/rows.py).
        threads = Rows(ThreadStat, self._threads(pid)) if deep else NO_THREADS
        return ProcessSample(
            pid=pid, comm=stat.comm, state=stat.state, utime=stat.utime, stime=stat.stime,
            num_threads=stat.num_threads, cpus_allowed=cpus, mems_allowed=mems, threads=threads,
            io_rchar=rchar, io_syscr=syscr, io_read_bytes=storage, ppid=stat.ppid, start=stat.start,
            children_cpu=stat.children_cpu,
        )

    @staticmethod
    def _parse(fn: Any, text: str, pid: int | str, what: str) -> Any:
        """``fn(text)``; _MalformedError naming the file when it is empty or does not parse."""
        if not text:
            # An exiting process makes reads fail with ESRCH or ENOENT, never return nothing: empty is broken.
            raise _MalformedError(f"/proc/{pid}/{what}", "empty")
        try:
            return fn(text)
        except (ValueError, IndexError, CpulistError) as e:
            raise _MalformedError(f"/proc/{pid}/{what}", str(e)) from e

    def _threads(self, pid: int) -> Iterable[tuple[Any, ...]]:
        """Per-thread CPU times from /proc/<pid>/task/<tid>/{schedstat,stat,status}; a thread exiting mid-read
        is skipped. A thread that did not run since the previous pass (schedstat's time on a CPU unchanged) is
        its previous reading with the new run delay; one that ran, or every thread once per ``FULL_EVERY_S``,
        has its stat and status read (see the module docstring)."""
        base = f"{self._root}/{pid}/task"
        try:
            tids = sorted(int(t) for t in os.listdir(base) if t.isdigit())
        except OSError as e:
            if e.errno in GONE:
                raise _GoneError(base) from e
            raise CollectorError(f"{base}: {e.strerror or e}") from e
        last = self._last_deep.get(pid)
        # The previous pass's rows as stored (exact tuples, ThreadStat's field order): a thread that did not run
        # is carried over as the same object, not a copy -- an idle thread of a waiting trainer's 150 costs the
        # cycle collector nothing then (exporter/samples/rows.py).
        before = {row[_TID]: row for row in last.threads.tuples()} if last is not None else {}
        now = self.ctx.clock()
        full = now - self._full_at.get(pid, -math.inf) >= FULL_EVERY_S
        if full:
            self._full_at[pid] = now
        for tid in tids:
            d = f"{base}/{tid}/"
            prev = before.get(tid)
            sched = self._sched(d)
            if sched is not None and prev is not None and not full and sched[0] == prev[_ON_CPU]:
                # Did not run: nothing else changed (its run delay grows only when it gets a CPU).
                yield prev if sched[1] == prev[_RUN_DELAY] else (*prev[:_RUN_DELAY], sched[1], *prev[_RUN_DELAY + 1:])
                continue
            try:
                st = self._parse(parse_stat, self._read(d + "stat", True), f"{pid}/task/{tid}", "stat")
            except _GoneError:
                continue
            if prev is None:
                ran = True
            elif sched is not None:
                ran = sched[0] != prev[_ON_CPU]
            else:  # no schedstat: the tick-resolution times say whether it ran
                ran = st.utime + st.stime > prev[_UTIME] + prev[_STIME]
            switches = self._switches(d) if ran or prev is None else prev[_SWITCHES]
            yield ThreadStat(tid=tid, comm=st.comm, state=st.state, utime=st.utime, stime=st.stime,
                             processor=st.processor, run_delay=None if sched is None else sched[1],
                             switches=switches, on_cpu=None if sched is None else sched[0])

    def _sched(self, d: str) -> tuple[float, float] | None:
        """A thread's (seconds on a CPU, run delay) from its schedstat; None where unreadable (gone -- its stat
        read says so --, or a kernel without CONFIG_SCHED_INFO)."""
        try:
            return parse_schedstat(self._kept_deep.read(d + "schedstat").decode("ascii", "replace"))
        except (OSError, ValueError):  # gone, unreadable, too large, garbage
            return None

    def _switches(self, d: str) -> tuple[int, int] | None:
        """A thread's (voluntary, nonvoluntary) context switches from its status; None where unreadable."""
        try:
            return parse_switches(self._read(d + "status", True))
        except (_GoneError, CollectorError, _MalformedError, ValueError):
            return None

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        shallow: ProcSample | None = snap.value(self.name)
        deep: ProcSample | None = snap.value(THREADS_SAMPLER)
        yield from self._counters(shallow)
        if deep is not None:
            yield self._thread_states(deep)

    @staticmethod
    def _counters(shallow: ProcSample | None) -> Iterator[Metric]:
        """CPU and read counters, from the process-level sampler only. Never from the deep sample in its place:
        that one is up to --collector.proc.threads-interval older, and a counter that falls back to it goes
        backwards (a failed read of /proc/<pid>/stat made rate() invent a spike). A failure omits them."""
        if shallow is None:
            return
        # User and system time summed, as client_python's process_cpu_seconds_total: a series each would be eight
        # more of DESIGN.md's 200 host-level series on the 8-GPU host; the verdicts read both from the sample, and
        # the per-thread evidence (a launch thread's system time) is in the verdict's own text.
        cpu = _Counters(
            "gpufeed_process_cpu_seconds",
            "CPU time of an inspected process (all its threads), user and system summed, from /proc/<pid>/stat.",
            labels=["pid", "comm"],
        )
        rbytes = _Counters(
            "gpufeed_process_read_bytes",
            "Bytes the process asked to read (rchar: includes page-cache hits and sockets), from /proc/<pid>/io; "
            "absent when not readable (another user's process).",
            labels=["pid", "comm"],
        )
        rcalls = _Counters(
            "gpufeed_process_read_syscalls", "Read syscalls of the process (syscr), from /proc/<pid>/io.",
            labels=["pid", "comm"],
        )
        lives = {str(pid): p.start for pid, p in shallow.processes.items()}
        for fam in (cpu, rbytes, rcalls):
            fam.lives = lives
        for pid, p in sorted(shallow.processes.items()):
            if pid in shallow.workload:
                continue
            labels = [str(pid), p.comm]
            cpu.add_metric(labels, p.utime + p.stime)
            if p.io_rchar is not None and p.io_syscr is not None:
                rbytes.add_metric(labels, float(p.io_rchar))
                rcalls.add_metric(labels, float(p.io_syscr))
        yield cpu
        yield rbytes
        yield rcalls

    @staticmethod
    def _thread_states(deep: ProcSample) -> Metric:
        """Threads per state from the newest deep sample (the processes it left out: as last read)."""
        threads = GaugeMetricFamily(
            "gpufeed_process_threads",
            "Threads of the process per state other than sleeping (S): running (R), disk_sleep (D), stopped, ... "
            "-- the ones that want a CPU or wait on I/O -- from /proc/<pid>/task/*/stat (sampled every "
            "--collector.proc.threads-interval, faster while a GPU waits).",
            labels=["pid", "comm", "state"],
        )
        for pid, p in sorted({**deep.held, **deep.processes}.items()):
            if pid in deep.workload:
                continue
            counts = Counter(STATE_NAMES.get(s, s) for s in p.threads.column("state") if s != "S")
            # States with threads only, and not S -- the idle majority of a trainer's ~150 threads, a series per
            # process that no verdict reads -- (the host-level series budget): a state absent is 0 to sum/or.
            for state in sorted(counts):
                threads.add_metric([str(pid), p.comm, state], float(counts[state]))
        return threads
