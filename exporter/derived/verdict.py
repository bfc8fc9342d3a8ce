"""The bottleneck verdict per GPU, following the field playbook's checklist.

1. Is the GPU working or waiting? Waiting share = 1 - utilisation while work is submitted. As in
   TensorBoard's input-pipeline analysis, >= 20% of the time waiting is "highly" bound (a waiting
   verdict); 5-20% is "moderately" bound and stays a working verdict with a note in the evidence.
2. If working: is it doing a good job? Clocks pulled down by power/thermal reasons -> gpu_throttled;
   kernels resident but SMs mostly inactive (GPM) -> gpu_inefficient; else healthy.
3. If waiting, on what? PCIe near the current link's capacity -> transfer_bound; threads in D state
   with iowait / IO pressure / NFS storms -> io_bound; many allowed cores busy in user time ->
   input_bound; one thread at a full core -> launch_bound; nothing on the host -> latency_bound.

Pure: every input is a value, the previous verdict included (for hysteresis).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.derived.gpuview import THERMAL_REASONS, GpuView
from exporter.derived.hostshape import SATURATED_CORE, CpuShape, IoSignals
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


def io_score(shape: CpuShape, io: IoSignals) -> tuple[int, list[str]]:
    """Storage / network-FS stall evidence: points and the sentences that earned them."""
    score = 0
    why: list[str] = []
    if shape.d_state_threads >= 1:
        score += 2
        why.append(f"{shape.d_state_threads:.0f} threads of pid {','.join(map(str, shape.pids))} blocked in D state")
    if shape.allowed_iowait is not None and shape.allowed_iowait >= 0.10:
        score += 1
        why.append(f"iowait {_pct(shape.allowed_iowait)} on the process's {shape.allowed_cpus} allowed CPUs")
    if io.psi_io_some is not None and io.psi_io_some >= 0.20:
        score += 1 + (1 if (io.psi_io_full or 0) >= 0.10 else 0)
        why.append(f"IO pressure: tasks stalled on IO {_pct(io.psi_io_some)} of the time (PSI some)")
    if io.nfs_retrans_per_s:
        score += 1
        why.append(f"NFS client retransmitting {io.nfs_retrans_per_s:.1f} RPCs/s")
    if io.nfs_metadata_ops_per_s is not None and io.nfs_metadata_ops_per_s >= 1000:
        score += 1
        why.append(f"NFS metadata storm: {io.nfs_metadata_ops_per_s:.0f} getattr/lookup/open per s")
    if io.disk_await_s is not None and io.disk_await_s >= 0.020 and (io.disk_util or 0) >= 0.5:
        score += 1
        why.append(f"disk {io.disk_name} at {_pct(io.disk_util or 0)} busy, {1000 * io.disk_await_s:.0f} ms per IO")
    size = shape.read_size
    if size is not None and size < 32 * 1024 and (shape.read_syscalls_per_s or 0) >= 1000:
        score += 1
        why.append(f"small reads: {shape.read_syscalls_per_s:.0f} read calls/s averaging {_size(size)}")
    return score, why


def _cpu_verdict(shape: CpuShape) -> tuple[str | None, float, list[str]]:
    """input_bound / launch_bound from the CPU shape, judged against the allowed CPUs; None if neither."""
    hot = shape.hot
    workers = shape.workers
    allowed = max(1, shape.allowed_cpus)
    used = shape.process_cores if shape.process_cores is not None else shape.allowed_busy_cores
    saturated_allowed = used is not None and used >= SATURATED_CORE * allowed
    busy_allowed_share = None if shape.allowed_busy_cores is None else shape.allowed_busy_cores / allowed
    busy_str = ""
    if shape.allowed_busy_cores is not None:
        busy_str = f"{shape.allowed_busy_cores:.1f} of {allowed} allowed CPUs busy"
        if shape.allowed_user_share is not None:
            busy_str += f" ({_pct(shape.allowed_user_share)} user time)"
    if hot is not None:
        hot_str = f"thread {hot.tid} ({hot.comm}) at {hot.cores:.2f} core, {_pct(hot.system_share)} system"
        worker_cores = sum(w.cores for w in workers)
        many = len(workers) >= 3 or (len(workers) >= 2 and hot.cores < LAUNCH_CORE and worker_cores >= 1.2)
        if many:
            why = [f"{len(workers)} worker threads of pid {workers[0].pid} busy at {worker_cores:.1f} cores in "
                   "user time (data loading/preprocessing)"]
            if busy_str:
                why.append(busy_str)
            conf = 0.9 if len(workers) >= 4 or saturated_allowed else 0.75
            return "input_bound", conf, why
        if hot.cores >= LAUNCH_CORE:
            why = [hot_str + " -- the submission thread is saturated"]
            if hot.system_share < 0.1:
                why.append("little system time: pure-Python overhead between launches")
            return "launch_bound", 0.9, why
        if busy_allowed_share is not None and busy_allowed_share >= 0.8 and not saturated_allowed:
            # The GPU process's allowed CPUs are full, but not with its own threads: data-loader worker
            # *processes* (PyTorch DataLoader forks them) or other jobs on the same CPUs.
            return "input_bound", 0.6, [f"{busy_str}, mostly not the GPU process's own threads (data-loader "
                                        "worker processes or other jobs on the same CPUs)"]
        if saturated_allowed and used is not None:
            share = hot.cores / used if used > 0 else 0.0
            why = [f"the process uses {used:.2f} cores of its {allowed} allowed CPUs (saturated)"]
            if share >= 0.5:
                return "launch_bound", 0.7, [hot_str, *why]
            return "input_bound", 0.7, [*why, busy_str] if busy_str else why
        return None, 0.0, []
    # No per-thread sample yet: fall back to process and per-core shape (less certain).
    if used is None:
        return None, 0.0, []
    if saturated_allowed and allowed <= 1:
        return "launch_bound", 0.5, [f"the process uses {used:.2f} cores of its single allowed CPU (saturated)"]
    if shape.allowed_saturated >= 2 and (shape.allowed_user_share or 0) >= 0.6 and used >= 1.5:
        return "input_bound", 0.6, [f"{shape.allowed_saturated} allowed CPUs saturated, process at "
                                    f"{used:.1f} cores", busy_str]
    if shape.allowed_saturated >= 1 and 0.85 <= used < 1.5:
        return "launch_bound", 0.55, [f"one allowed CPU saturated, process at {used:.2f} cores "
                                      "(per-thread detail not sampled yet)"]
    if busy_allowed_share is not None and busy_allowed_share >= 0.8:
        return "input_bound", 0.55, [f"{busy_str}: the GPU process's CPUs are full (per-thread detail not "
                                     "sampled yet)"]
    return None, 0.0, []


def classify(
    view: GpuView,
    shape: CpuShape,
    io: IoSignals,
    *,
    capacity: float | None,
    link_name: str,
    window_s: float,
    previous: str | None = None,
) -> Candidate:
    """The verdict this window supports for one GPU (before hysteresis)."""
    util = view.util
    if util is None:
        return Candidate("idle", 0.3, 0.0, "latency_bound", (f"{view.name}: no utilisation data yet",))
    window = f"the last {window_s:.0f} s"
    if util < IDLE_UTIL:
        procs = f"{len(view.pids)} process(es) attached" if view.pids else "no compute process"
        return Candidate("idle", 0.95, 0.0, "latency_bound",
                         (f"{view.name} utilisation {_pct(util)} over {window}: no work submitted ({procs})",))
    waiting = max(0.0, 1.0 - util)
    sm = view.sm_active
    activity = f"utilisation {_pct(util)}" + (f", SM active {_pct(sm)}" if sm is not None else "")
    link_util, direction = link_utilisation(view, capacity)
    score, io_why = io_score(shape, io)
    cpu_cause, cpu_conf, cpu_why = _cpu_verdict(shape)
    # The best-supported waiting cause, used for the waiting-seconds counter whatever the verdict.
    peak = link_peak(view, capacity)
    if link_util is not None and link_util >= TRANSFER_LINK:
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
        wcause, wconf, wwhy = cpu_cause, cpu_conf, cpu_why
    else:
        wcause, wconf = "latency_bound", 0.7
        wwhy = ["host is quiet: no saturated thread or cores, no IO pressure, PCIe lightly used -- not enough "
                "parallel work reaches the GPU (small batches, serial dependencies)"]
        if shape.process_cores is not None:
            wwhy.append(f"GPU processes use {shape.process_cores:.2f} cores of {shape.allowed_cpus} allowed")
        if link_util is not None:
            wwhy.append(f"PCIe at {_pct(link_util)} of the current {link_name} link")
    threshold = WAITING_LEAVE if previous in WAITING_CAUSES_SET else WAITING_ENTER
    if waiting >= threshold:
        head = f"{view.name} waited {_pct(waiting)} of {window} ({activity})"
        if view.burst.periodic and view.burst.period_s:
            head += f"; idle gaps recur every {view.burst.period_s:.1f} s (batch boundaries)"
        elif view.burst.gaps:
            head += f"; {len(view.burst.gaps)} idle gaps"
        return Candidate(wcause, round(wconf, 2), waiting, wcause, (head, *(w for w in wwhy if w)))
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
