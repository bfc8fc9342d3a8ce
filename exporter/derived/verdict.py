"""The bottleneck verdict per GPU, following the field playbook's checklist.

1. Is the GPU working or waiting? Waiting share = 1 - utilisation while work is submitted. As in
   TensorBoard's input-pipeline analysis, >= 20% of the time waiting is "highly" bound (a waiting
   verdict); 5-20% is "moderately" bound and stays a working verdict with a note in the evidence.
2. If working: is it doing a good job? Clocks pulled down by power/thermal reasons -> gpu_throttled;
   kernels resident but SMs mostly inactive (GPM) -> gpu_inefficient, or collective_wait when the process is
   one rank of a multi-rank job, SMs nearly idle, no DRAM or tensor activity and a quiet host (the
   collectives wait for a slower peer: :func:`collective_wait`); else healthy.
3. If waiting, on what? Its NVLinks or the network adapter on its PCIe switch near the capacity of their current
   links -> network_bound (a collective waiting on the wire: exporter/derived/interconnect.py says which path);
   PCIe near the current link's capacity -> transfer_bound; threads in D state
   with iowait / IO pressure / NFS storms -> io_bound; many allowed cores busy in user time ->
   input_bound; one thread at a full core -> launch_bound; nothing on the host -> latency_bound.

Pure: every input is a value, the previous verdict included (for hysteresis).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.clockevents import THERMAL_REASONS
from exporter.derived.gpuview import GpuView
from exporter.derived.hostshape import SATURATED_CORE, CpuShape, IoSignals, ProcLoad, ThreadLoad
from exporter.derived.interconnect import WireLoad
from exporter.jobident import JobIdentity
from exporter.names import WAITING_CAUSES

IDLE_UTIL = 0.03  # below this mean utilisation no work is being submitted (DESIGN.md: idle)
WAITING_ENTER = 0.20  # TensorBoard: >= 20% of step time waiting = highly input-bound
WAITING_LEAVE = 0.15  # hysteresis band: stay waiting until the share falls below this
MODERATE_WAITING = 0.05  # TensorBoard: 5-20% = moderately bound
THROTTLED_CLOCK = 0.85  # SM clock below 85% of max with power/thermal reasons -> throttled
INEFFICIENT_SM = 0.5  # GPM SM activity below half the kernel-resident time -> inefficient
SM_PLAUSIBLE = 0.02
LAUNCH_CORE = 0.85  # the hot thread at >= 0.85 core is saturated (it cannot go faster)
TRANSFER_LINK = 0.6  # PCIe at >= 60% of the current link's achievable capacity while waiting
TRANSFER_PEAK = 0.85  # ... or bursts of copies at >= 85% of it (90th percentile of 100 ms rates)
IO_SCORE = 3
# The GPU's busiest interconnect path (NVLink payload, or the adapter beside it) at >= 70% of its current link's
# capacity while the GPU waits: its collectives wait on the wire. Above TRANSFER_LINK: GPUDirect traffic from the
# adapter also crosses the GPU's PCIe link, and a wire slower than PCIe is the narrower of the two.
NETWORK_LINK = 0.7

# collective_wait: a collective waiting for a peer keeps NCCL's kernel resident on one CTA per channel (at most
# 32 by default, NCCL_MAX_CTAS) -- 24% of an H100's 132 SMs, 30% of an A100's 108 -- spinning on flags: SM
# activity at most this share of the kernel-resident time, with next to no DRAM bandwidth or tensor-pipe use.
COLLECTIVE_SM = 0.35
COLLECTIVE_DRAM = 0.10
COLLECTIVE_TENSOR = 0.05

WAITING_CAUSES_SET = frozenset(WAITING_CAUSES)


@dataclass(frozen=True, slots=True)
class Candidate:
    """The verdict one evaluation supports, before hysteresis.

    ``waiting_cause`` is where this GPU's waiting time goes in gpufeed_gpu_waiting_seconds_total: the
    verdict when it is a waiting cause, else the best-supported waiting cause (latency_bound when the host
    shows no pressure at all).
    """

    cause: str
    confidence: float
    waiting_ratio: float
    waiting_cause: str
    evidence: tuple[str, ...]


def _pct(x: float) -> str:
    return f"{round(100 * x)}%"


def _rate(b: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B/s"


def _size(b: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def link_utilisation(view: GpuView, capacity: float | None) -> tuple[float | None, str]:
    """Busiest direction's traffic as a share of the current link's achievable capacity, and its name."""
    if not capacity or capacity <= 0:
        return None, ""
    rx, tx = view.rx_bytes_per_s or 0.0, view.tx_bytes_per_s or 0.0
    return (rx / capacity, "RX (host to device)") if rx >= tx else (tx / capacity, "TX (device to host)")


def link_peak(view: GpuView, capacity: float | None) -> float | None:
    """Busiest direction's 90th-percentile rate as a share of the current link's capacity."""
    if not capacity or capacity <= 0:
        return None
    return max(view.rx_peak_bytes_per_s or 0.0, view.tx_peak_bytes_per_s or 0.0) / capacity


CACHE_HIT_STORAGE = 1e6  # bytes/s reaching storage below which a workload's reads are page-cache hits


def cache_hits(shape: CpuShape, network_fs: bool = False) -> bool:
    """Whether the workload's reads are page-cache hits: ``read_bytes`` readable and (almost) nothing reaching
    storage, no thread blocked in D state, and no network filesystem busy on the host (whose reads a kernel
    may not count in ``read_bytes``). ``rchar``/``syscr`` count cached reads as much as any."""
    return (shape.storage_read_bytes_per_s is not None and shape.storage_read_bytes_per_s < CACHE_HIT_STORAGE
            and shape.d_state_threads < 0.5 and not network_fs)


def corroborated(shape: CpuShape, network_fs: bool = False) -> str:
    """Why the workload itself shows IO (blocked threads, its own reads, its cgroup's IO pressure), or "".

    Host-wide signals -- PSI, a busy disk, an NFS storm -- may come from another job on the host; they count
    for this GPU only when its own workload shows IO too (DESIGN.md "Workloads"). Reads served from the page
    cache (:func:`cache_hits`) are no IO of its own."""
    if shape.d_state_threads >= 0.5:
        return "threads blocked in D state"
    if (shape.storage_read_bytes_per_s or 0) >= 10e6:
        return "its reads reach storage"
    cached = cache_hits(shape, network_fs)
    if not cached and (shape.read_bytes_per_s or 0) >= 10e6 and (shape.read_syscalls_per_s or 0) >= 100:
        return "it reads"
    if not cached and (shape.read_syscalls_per_s or 0) >= 1000:
        return "it reads"
    if (shape.group_io_some or 0) >= 0.1:
        return "its cgroup stalls on IO"
    return ""


def io_score(shape: CpuShape, io: IoSignals) -> tuple[int, list[str]]:
    """Storage / network-FS stall evidence: points and the sentences that earned them (host-wide signals only
    when the workload corroborates them; otherwise one sentence says they were set aside)."""
    score = 0
    why: list[str] = []
    network_fs = (io.nfs_ops_per_s or 0) >= 10
    own = corroborated(shape, network_fs)
    cached = cache_hits(shape, network_fs)
    if shape.d_state_threads >= 1:
        score += 2
        why.append(f"{shape.d_state_threads:.0f} threads of pid {','.join(map(str, shape.pids))} blocked in D state")
    if own and shape.allowed_iowait is not None and shape.allowed_iowait >= 0.10:
        score += 1
        why.append(f"iowait {_pct(shape.allowed_iowait)} on the process's {shape.allowed_cpus} allowed CPUs")
    if (shape.group_io_some or 0) >= 0.2:
        score += 2
        why.append(f"{shape.group or 'the workload cgroup'} stalled on IO {_pct(shape.group_io_some or 0)} of the "
                   "time (its io.pressure)")
    storage = shape.storage_read_bytes_per_s or 0.0
    if storage >= 50e6 and (io.disk_util or 0) >= 0.5:
        # Asynchronous / direct I/O (libaio, io_uring, O_DIRECT) shows no read syscalls, no iowait and no PSI:
        # only read_bytes of /proc/<pid>/io and the disk's busy time tell.
        score += 3 if (io.disk_util or 0) >= 0.8 else 2
        why.append(f"the workload reads {_rate(storage)} from storage (read_bytes: direct and asynchronous I/O "
                   f"included) while disk {io.disk_name} is {_pct(io.disk_util or 0)} busy")
    host: list[tuple[int, str]] = []
    if io.psi_io_some is not None and io.psi_io_some >= 0.20:
        host.append((1 + (1 if (io.psi_io_full or 0) >= 0.10 else 0),
                     f"IO pressure: tasks stalled on IO {_pct(io.psi_io_some)} of the time (PSI some)"))
    if io.nfs_retrans_per_s:
        host.append((1, f"NFS client retransmitting {io.nfs_retrans_per_s:.1f} RPCs/s"))
    if io.nfs_metadata_ops_per_s is not None and io.nfs_metadata_ops_per_s >= 1000:
        host.append((1, f"NFS metadata storm: {io.nfs_metadata_ops_per_s:.0f} getattr/lookup/open per s"))
    if io.disk_await_s is not None and io.disk_await_s >= 0.020 and (io.disk_util or 0) >= 0.5:
        host.append((1, f"disk {io.disk_name} at {_pct(io.disk_util or 0)} busy, {1000 * io.disk_await_s:.0f} ms "
                        "per IO"))
    if own:
        for points, sentence in host:
            score += points
            why.append(sentence)
    elif host:
        mine = (f"no blocked threads; its {shape.read_syscalls_per_s:.0f} reads/s are page-cache hits, "
                f"{_rate(shape.storage_read_bytes_per_s or 0)} reached storage"
                if cached and (shape.read_syscalls_per_s or 0) >= 100 else "no blocked threads, no reads")
        why.append(f"host-wide IO ({host[0][1]}) set aside: this GPU's workload shows no IO of its own ({mine}) -- "
                   "another job's")
    size = shape.read_size
    if size is not None and size < 32 * 1024 and (shape.read_syscalls_per_s or 0) >= 1000 and not cached:
        score += 1
        why.append(f"small reads: {shape.read_syscalls_per_s:.0f} read calls/s averaging {_size(size)}")
    return score, why


POOL_CORE = 0.3  # a thread wanting >= 0.3 core counts in a pool of same-named threads of its process


@dataclass(frozen=True, slots=True)
class InputSide:
    """The workload's preprocessing: worker processes (no GPU context) and pools of same-named threads of a GPU
    process (decode, tokenizer, data-loader threads); ``launch`` the threads that may submit work."""

    workers: tuple[tuple[ProcLoad, float], ...]  # (process, demand: cores + run delay), busiest first
    pools: tuple[tuple[str, int, tuple[ThreadLoad, ...]], ...]  # (name, pid, threads)
    launch: tuple[ThreadLoad, ...]  # busiest (by demand) first
    reaped: tuple[tuple[int, float], ...] = ()  # (parent pid, cores): its children that exited in the window
    unseen: float = 0.0  # the workload's own cgroup used this many cores beyond every process seen

    @property
    def cores(self) -> float:
        return (sum(p.cores for p, _ in self.workers) + sum(t.cores for _, _, ts in self.pools for t in ts)
                + sum(c for _, c in self.reaped) + self.unseen)

    def short_lived(self) -> list[str]:
        """The CPU of processes too short-lived to be sampled twice, one sentence each."""
        out = [f"children of pid {pid} that exited within the window used {c:.2f} cores (their parent's cutime + "
               "cstime: workers re-forked every epoch, DataLoader persistent_workers=False)" for pid, c in self.reaped]
        if self.unseen:
            out.append(f"its cgroup used {self.unseen:.2f} cores more than every process seen (cpu.stat usage: "
                       "short-lived processes)")
        return out

    def saturated(self) -> list[str]:
        """One sentence per saturated stage: a worker process at a full core, a thread of a pool at one."""
        out: list[str] = []
        sat = [(p, d) for p, d in self.workers if d >= SATURATED_CORE]
        by_name: dict[tuple[str, int], list[tuple[ProcLoad, float]]] = {}
        for p, d in sat:
            by_name.setdefault((p.comm, p.ppid), []).append((p, d))
        for (comm, ppid), lst in sorted(by_name.items(), key=lambda kv: -len(kv[1])):
            cores = sum(p.cores for p, _ in lst)
            what = "process" if len(lst) == 1 else "processes"
            out.append(f"{len(lst)} {comm} {what} of pid {ppid} at {cores:.1f} cores"
                       + ("" if len(lst) > 1 else f" (pid {lst[0][0].pid})") + _wanting(cores, sum(d for _, d in lst)))
        for comm, pid, ts in self.pools:
            hot = [t for t in ts if t.demand >= SATURATED_CORE]
            if hot:
                cores = sum(t.cores for t in hot)
                out.append(f"{len(hot)} {comm} threads of pid {pid} at {cores:.2f} cores"
                           + _wanting(cores, sum(t.demand for t in hot)))
        return out

    def busy(self) -> list[str]:
        """The unsaturated stages, for the evidence of a verdict that is not input_bound."""
        out: list[str] = []
        for comm, pid, ts in self.pools:
            if all(t.demand < SATURATED_CORE for t in ts):
                out.append(f"{len(ts)} {comm} threads of pid {pid} at {sum(t.cores for t in ts) / len(ts):.2f} "
                           "core each: busy, not saturated (their CPUs have headroom)")
        idle = [(p, d) for p, d in self.workers if d < SATURATED_CORE]
        if idle:
            out.append(f"{len(idle)} worker processes at {sum(p.cores for p, _ in idle):.1f} cores, none saturated")
        return out


def _wanting(cores: float, demand: float) -> str:
    """What makes a stage at a fraction of a core saturated: the CPU it waited for (run delay)."""
    if demand - cores < 0.1:
        return ""
    return f" wanting {demand:.1f} (waiting for a CPU {_pct((demand - cores) / demand)} of their time: run delay)"


def _most_demanding_first(t: ThreadLoad) -> tuple[float, int]:
    return -t.demand, t.tid


def input_side(shape: CpuShape) -> InputSide:
    """Split the workload's CPU into preprocessing stages and submission candidates (DESIGN.md "Workloads").

    A pool is >= 2 busy threads of one GPU process sharing a name, its main thread excepted (a Python trainer
    submits from it); threads of processes without a GPU context are workers, whatever their name."""
    ctx_threads = [t for t in shape.threads if t.context]
    named: dict[tuple[int, str], list[ThreadLoad]] = {}
    for t in ctx_threads:
        # By CPU wanted, not used: under a quota, or with more threads than cores, each decode thread gets a
        # fraction of a core and waits the rest (run delay) -- still a pool.
        if not t.main and t.demand >= POOL_CORE:
            named.setdefault((t.pid, t.comm), []).append(t)
    pools = tuple((comm, pid, tuple(ts)) for (pid, comm), ts in sorted(named.items()) if len(ts) >= 2)
    in_pool = {t.tid for _, _, ts in pools for t in ts}
    delay: dict[int, float] = {}
    for t in shape.threads:
        if not t.context:
            delay[t.pid] = delay.get(t.pid, 0.0) + t.run_delay
    workers = tuple((p, p.cores + delay.get(p.pid, 0.0)) for p in shape.processes if not p.context)
    launch = tuple(sorted((t for t in ctx_threads if t.tid not in in_pool), key=_most_demanding_first))
    return InputSide(tuple(sorted(workers, key=lambda x: (-x[1], x[0].pid))), pools, launch, shape.reaped,
                     shape.unseen_cores)


NET_IDLE_CORE = 0.3  # a worker below this while its threads wait on sockets is waiting for the network


def network_wait(shape: CpuShape) -> list[str]:
    """Evidence that the input pipeline waits on the network: worker processes mostly off-CPU (no D state,
    so no iowait and no IO pressure) with threads asleep receiving on TCP connections -- an object store, an
    HTTP or a remote data service. Empty when none waits so."""
    cores = {p.pid: p.cores for p in shape.processes}
    waiting = [(pid, n, remotes) for pid, n, remotes in shape.network if n > 0 and remotes]
    if not waiting or any(cores.get(pid, 0.0) >= NET_IDLE_CORE for pid, _, _ in waiting):
        return []
    ends = sorted({r for _, _, rs in waiting for r in rs})
    named = ", ".join(ends[:3]) + (f" and {len(ends) - 3} more" if len(ends) > 3 else "")
    used = sum(cores.get(pid, 0.0) for pid, _, _ in waiting)
    return [f"{len(waiting)} worker process{'' if len(waiting) == 1 else 'es'} at {used:.2f} cores with "
            f"{sum(n for _, n, _ in waiting)} threads asleep receiving from {named}: the data loading waits on a "
            "remote store (object store, HTTP or a data service), not on the CPU or a local disk"]


def _capacity(shape: CpuShape) -> tuple[float, str]:
    """What the workload may use, in cores, and why (quota, cpuset or allowed CPUs)."""
    if shape.capacity_cores is not None:
        return shape.capacity_cores, shape.capacity_why
    n = max(1, shape.allowed_cpus)
    return float(n), f"its {n} allowed CPUs"


def _starved(t: ThreadLoad, shape: CpuShape) -> str:
    """Why a thread waits for a CPU (run delay), when it does: its own quota, or other work on its CPUs."""
    if t.run_delay < 0.1:
        return ""
    switches = "" if t.nonvoluntary_per_s is None else f", {t.nonvoluntary_per_s:.0f} involuntary switches/s"
    why = "its CPU quota holds it back" if (shape.throttled_ratio or 0) >= 0.2 else "other work holds its CPUs"
    return f"runnable but waiting for a CPU {_pct(t.run_delay)} of the time (run delay{switches}): {why}"


def _cpu_verdict(shape: CpuShape, side: InputSide) -> tuple[str | None, float, list[str]]:
    """input_bound / launch_bound from the workload's CPU shape (``side``: its :func:`input_side`), judged against
    its capacity; None if neither.

    Saturated means wanting a full core (CPU used plus time waiting for one): a data-loader worker process or
    a pool thread at a core is the input stage that starves the GPU; the hottest thread that may submit work
    at a core is the launch stage. Without either, a workload that fills its capacity (its CFS quota, its
    cpuset) is bound by it, on the side that uses most of it. CPUs other jobs keep busy are never evidence."""
    cap, cap_why = _capacity(shape)
    used = shape.used_cores
    throttled = shape.throttled_ratio is not None and shape.throttled_ratio >= 0.2
    quota_note = (f"throttled by the quota: {_pct(shape.throttled_ratio or 0)} of CFS periods "
                  f"({shape.quota_cores:.2g}-CPU limit)") if throttled and shape.quota_cores else ""
    # At its capacity: using nearly all of it, or -- what the kernel counted -- throttled by a quota that is
    # the capacity (on a busy host the group may use less than its quota in the window and still hit it).
    cap_bound = used is not None and (used >= SATURATED_CORE * cap
                                      or (throttled and shape.quota_cores is not None and shape.quota_cores <= cap))
    group = f" of {shape.group}" if shape.group else ""
    sat = side.saturated()
    hot = side.launch[0] if side.launch else None
    # A quota the workload fills puts every runnable thread in run delay: the capacity, not one thread, binds
    # then, unless that thread holds most of what the workload uses.
    launch_sat = hot is not None and hot.demand >= LAUNCH_CORE and not (
        cap_bound and throttled and used is not None and hot.cores < 0.5 * used)
    own_queue = (f"its threads want {shape.own_demand:.1f} cores on {cap_why}: the workload's own run queue "
                 "(more busy workers or threads than CPUs -- lower num_workers, or give it more CPUs)"
                 ) if not throttled and shape.oversubscribed(cap) else ""
    extra = [x for x in (quota_note, own_queue) if x]
    if sat and (not launch_sat or len(sat) >= 2 or len([w for w, d in side.workers if d >= SATURATED_CORE]) >= 2):
        why = [f"{'; '.join(sat)}{group}, in {'user' if _user_heavy(shape) else 'CPU'} time: the input pipeline "
               "(data loading / preprocessing) is saturated"]
        if used is not None:
            why.append(f"the workload uses {used:.1f} cores of {cap_why}")
        why.extend(side.short_lived())
        n_stages = len([w for w, d in side.workers if d >= SATURATED_CORE]) + sum(
            1 for _, _, ts in side.pools for t in ts if t.demand >= SATURATED_CORE)
        return "input_bound", 0.9 if n_stages >= 2 or cap_bound else 0.8, [*why, *extra]
    if launch_sat and hot is not None:
        hot_str = f"thread {hot.tid} ({hot.comm}) at {hot.cores:.2f} core, {_pct(hot.system_share)} system"
        why = [hot_str + " -- the submission thread is saturated"]
        starved = _starved(hot, shape)
        if starved:
            why = [f"{hot_str}, {starved} -- the submission thread wants a full core"]
        elif hot.system_share < 0.1:
            why.append("little system time: pure-Python overhead between launches")
        if hot.main and not side.workers and not side.pools and not side.reaped and hot.system_share < 0.5:
            # From /proc a main thread that decodes batches itself looks the same as one that launches kernels.
            why.append("or the data loading runs in this thread (DataLoader num_workers=0): the two look alike "
                       "from the host; a profiler (py-spy dump) tells them apart")
        others = [t for t in side.launch[1:] if t.demand >= LAUNCH_CORE]
        if others:
            why.append(f"{len(others) + 1} submission threads at a full core across "
                       f"{len({t.pid for t in [hot, *others]})} GPU processes")
        return "launch_bound", 0.9 if not starved else 0.8, [*why, *extra]
    if cap_bound and used is not None:
        full = "all of" if used >= SATURATED_CORE * cap else "and is held at"
        why = [f"the workload{group} uses {used:.2f} cores, {full} {cap_why}"]
        launch_cores = hot.cores if hot is not None else 0.0
        if shape.threads and launch_cores >= 0.5 * used and hot is not None:
            return "launch_bound", 0.7, [f"thread {hot.tid} ({hot.comm}) holds {launch_cores:.2f} of them", *why,
                                         *extra]
        if shape.threads or side.workers or side.reaped or side.unseen:
            held = (f"preprocessing holds {side.cores:.2f} cores" if side.cores >= 0.01 else
                    "no worker process, thread pool or short-lived child holds them: many threads of the GPU "
                    "processes share them")
            return "input_bound", 0.7, [*why, held, *side.short_lived(), *extra]
        # No per-thread detail yet: the GPU processes alone fill it.
        cause = "launch_bound" if used < 1.5 else "input_bound"
        return cause, 0.5, [*why, "(per-thread detail not sampled yet)", *extra]
    if not shape.threads:
        # No per-thread sample yet: the GPU processes' own load (never the CPUs other jobs keep busy).
        ctx = [p for p in shape.processes if p.context]
        pc = sum(p.cores for p in ctx) if ctx else shape.process_cores
        if pc is not None and 0.85 <= pc < 1.5:
            return "launch_bound", 0.55, [f"the GPU process uses {pc:.2f} cores (per-thread detail not sampled yet)"]
        if pc is not None and pc >= 1.5 and _user_heavy(shape):
            return "input_bound", 0.55, [f"the GPU process uses {pc:.1f} cores in user time (per-thread detail not "
                                         "sampled yet)"]
    return None, 0.0, []


def _user_heavy(shape: CpuShape) -> bool:
    return shape.process_system_share is None or shape.process_system_share < 0.5


def classify(
    view: GpuView,
    shape: CpuShape,
    io: IoSignals,
    *,
    capacity: float | None,
    link_name: str,
    window_s: float,
    previous: str | None = None,
    wire: WireLoad | None = None,
) -> Candidate:
    """The verdict this window supports for one GPU (before hysteresis)."""
    util = view.util
    if util is None:
        return Candidate("idle", 0.3, 0.0, "latency_bound", (f"{view.name}: no utilisation data yet",))
    window = f"the last {window_s:.0f} s"
    if util < IDLE_UTIL:
        n = len(view.pids)
        procs = f"{n} process{'' if n == 1 else 'es'} attached" if n else "no compute process"
        return Candidate("idle", 0.95, 0.0, "latency_bound",
                         (f"{view.name} utilisation {_pct(util)} over {window}: no work submitted ({procs})",))
    waiting = max(0.0, 1.0 - util)
    sm = view.sm_active
    activity = f"utilisation {_pct(util)}" + (f", SM active {_pct(sm)}" if sm is not None else "")
    link_util, direction = link_utilisation(view, capacity)
    score, io_why = io_score(shape, io)
    side = input_side(shape)  # once: sorting a GPU process's 150 threads twice was a quarter of an evaluation
    cpu_cause, cpu_conf, cpu_why = _cpu_verdict(shape, side)
    # The best-supported waiting cause, used for the waiting-seconds counter whatever the verdict.
    peak = link_peak(view, capacity)
    if wire is not None and wire.ratio >= NETWORK_LINK:
        wcause, wconf = "network_bound", min(0.95, 0.6 + (wire.ratio - NETWORK_LINK))
        wwhy = [wire.what]
    elif link_util is not None and link_util >= TRANSFER_LINK:
        wcause, wconf = "transfer_bound", min(0.95, 0.6 + (link_util - TRANSFER_LINK))
        wwhy = [f"PCIe {direction} {_rate(link_util * (capacity or 0))} = {_pct(link_util)} of the current "
                f"{link_name} link's achievable {_rate(capacity or 0)}"]
    elif peak is not None and peak >= TRANSFER_PEAK and score < IO_SCORE:
        # Copies in bursts: the link is saturated while they run, the GPU waits for them.
        wcause, wconf = "transfer_bound", 0.7
        wwhy = [f"PCIe copies burst to {_pct(peak)} of the current {link_name} link's achievable "
                f"{_rate(capacity or 0)} (average {_pct(link_util or 0)})"]
    elif score >= IO_SCORE:
        wcause, wconf, wwhy = "io_bound", min(0.95, 0.5 + 0.1 * score), io_why
    elif cpu_cause is not None:
        wcause, wconf, wwhy = cpu_cause, cpu_conf, [*cpu_why, *(w for w in io_why if "set aside" in w)]
    elif net := network_wait(shape):
        wcause, wconf, wwhy = "io_bound", 0.6, [*net, *(w for w in io_why if "set aside" in w)]
    else:
        wcause, wconf = "latency_bound", 0.7
        wwhy = ["host is quiet: no saturated thread or cores, no IO pressure, PCIe lightly used -- not enough "
                "parallel work reaches the GPU (small batches, serial dependencies)"]
        if shape.processes:
            wwhy[0] = ("the workload is quiet: no saturated thread, worker or CPU limit, no IO of its own, PCIe "
                       "lightly used -- not enough parallel work reaches the GPU (small batches, serial dependencies)")
            n = len(shape.processes)
            of = f" of {shape.group}" if shape.group else ""
            wwhy.append(f"the workload ({n} process{'' if n == 1 else 'es'}{of}) uses {shape.used_cores or 0:.2f} "
                        f"cores of {_capacity(shape)[1]}")
        elif shape.process_cores is not None:
            wwhy.append(f"GPU processes use {shape.process_cores:.2f} cores of {shape.allowed_cpus} allowed")
        wwhy.extend(side.busy())
        wwhy.extend(side.short_lived())
        wwhy.extend(w for w in io_why if "set aside" in w)
        if link_util is not None:
            wwhy.append(f"PCIe at {_pct(link_util)} of the current {link_name} link")
    threshold = WAITING_LEAVE if previous in WAITING_CAUSES_SET else WAITING_ENTER
    if waiting >= threshold:
        head = f"{view.name} waited {_pct(waiting)} of {window} ({activity})"
        if view.burst.periodic and view.burst.period_s:
            head += f"; idle gaps recur every {view.burst.period_s:.1f} s (batch boundaries)"
        elif view.burst.gaps:
            gaps = len(view.burst.gaps)
            head += f"; {gaps} idle gap{'' if gaps == 1 else 's'}"
        # What the workload view could not see (a stray context set aside, cgroup files unreadable, no process
        # in NVML) comes last: the verdict says what it stands on.
        return Candidate(wcause, round(wconf, 2), waiting, wcause, (head, *(w for w in wwhy if w), *shape.notes))
    # Working: is it doing a good job?
    thermal = view.throttle_reasons & THERMAL_REASONS
    if view.clock_ratio is not None and view.clock_ratio < THROTTLED_CLOCK and view.throttle_reasons:
        reasons = ", ".join(sorted(view.throttle_reasons))
        return Candidate("gpu_throttled", 0.9 if thermal else 0.8, waiting, wcause, (
            f"{view.name} busy ({activity}) but SM clock at {_pct(view.clock_ratio)} of max",
            f"clock-event reasons: {reasons}",
        ))
    # SM activity of (almost) exactly zero while kernels are resident is not a measurement (GPM metric
    # unsupported or not yet paired): never call a GPU inefficient on it.
    if sm is not None and sm >= SM_PLAUSIBLE and util > 0 and sm / util < INEFFICIENT_SM:
        if cpu_cause == "launch_bound":
            # Kernels resident most of the time but tiny (SMs mostly empty) while the launch thread is
            # saturated: the GPU runs launch-overhead-sized kernels as fast as the CPU can submit them.
            return Candidate("launch_bound", round(min(cpu_conf, 0.8), 2), waiting, "launch_bound", (
                f"{view.name} kernels resident {_pct(util)} of {window} but SM active only {_pct(sm)}: "
                "many tiny kernels", *cpu_why))
        return Candidate("gpu_inefficient", 0.85, waiting, wcause, (
            f"{view.name} kernels resident {_pct(util)} of {window} but SM active only {_pct(sm)}",
            "the GPU is busy doing a poor job, not waiting: look at kernel efficiency, precision, batch size",
        ))
    ev = [f"{view.name} working: {activity} over {window}"]
    if waiting >= MODERATE_WAITING:
        ev.append(f"moderately bound: waiting {_pct(waiting)} (5-20%); most likely on {wcause}")
    return Candidate("healthy", round(min(0.95, 0.5 + util / 2), 2), waiting, wcause, tuple(ev))


def collective_wait(cand: Candidate, view: GpuView, rank: JobIdentity | None, *, dram: float | None,
                    tensor: float | None) -> Candidate:
    """``gpu_inefficient`` turned ``collective_wait`` when the GPU's process is one rank of a multi-rank job, its
    SMs are nearly idle (:data:`COLLECTIVE_SM`), DRAM and tensor pipes quiet and the host shows no pressure (the
    best waiting cause is latency_bound): the signature of collectives spinning while a slower peer catches up.
    Any other candidate is returned as it is -- a single-process job stays gpu_inefficient, a GPU doing real
    work keeps its verdict, and without GPM's DRAM and tensor activity nothing is claimed."""
    if cand.cause != "gpu_inefficient" or rank is None or not rank.multi_rank:
        return cand
    sm, util = view.sm_active, view.util
    if cand.waiting_cause != "latency_bound" or sm is None or not util or sm / util > COLLECTIVE_SM:
        return cand
    if dram is None or tensor is None or dram >= COLLECTIVE_DRAM or tensor >= COLLECTIVE_TENSOR:
        return cand
    return Candidate("collective_wait", 0.75, cand.waiting_ratio, cand.waiting_cause, (
        f"{view.name} kernels resident {_pct(util)} but SM active only {_pct(sm)}, DRAM {_pct(dram)}, tensor "
        f"{_pct(tensor)}: kernels spinning on a few SMs, as collectives do while they wait",
        f"its process is {rank.describe()}; this host shows no pressure (no saturated thread, no IO, PCIe quiet)",
        "the cause is likely on another rank's host: the slowest rank of the job holds every other one "
        "(GpufeedJobStraggler names it and its host's cause)",
    ))


@dataclass(frozen=True, slots=True)
class Settled:
    """A verdict after hysteresis: ``cause`` changes only once a new candidate held for ``hold_s``."""

    cause: str
    since: float
    pending: str | None
    pending_since: float


def settle(prev: Settled | None, cand: str, t: float, hold_s: float) -> Settled:
    """Adopt ``cand`` at once the first time; afterwards only once it has won for ``hold_s`` seconds."""
    if prev is None:
        return Settled(cand, t, None, t)
    if cand == prev.cause:
        return Settled(prev.cause, prev.since, None, t)
    if prev.pending != cand:
        if hold_s <= 0:
            return Settled(cand, t, None, t)
        return Settled(prev.cause, prev.since, cand, t)
    if t - prev.pending_since >= hold_s:
        return Settled(cand, t, None, t)
    return prev
