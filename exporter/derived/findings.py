"""Platform findings, independent of the verdict: several may hold at once. Pure functions over windows.

Each check returns zero or more :class:`Finding` values with a detail a human can act on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter import linkmath, thresholds
from exporter.clockevents import THERMAL_REASONS
from exporter.derived.gpuview import GpuView
from exporter.derived.hostshape import CpuShape, IoSignals
from exporter.derived.series import Point
from exporter.names import CAPTURE_SYNC, XID_MEANING
from exporter.samples.capture import CaptureNote
from exporter.samples.derived import Finding, GpuVerdict
from exporter.samples.gpu import GpuSample, GpuSlow
from exporter.samples.host import CpufreqSample, MemorySample
from exporter.samples.topology import NumaSample, PcieSample
from exporter.snapshot import Stamped

# The alert's severity (thresholds.yaml): critical is kept for a lost GPU and uncorrectable errors, and a link
# that trained down, at any width, is a warning in diagnose as on the pager.
PCIE_LINK_SEVERITY = str(thresholds.DEFAULTS["pcie_link_downgraded"]["severity"])

BUSY_UTIL = 0.10  # a GPU at >= 10% utilisation has work: its link should be up to speed
BUSY_TRAFFIC = 50e6  # ... or moves >= 50 MB/s over PCIe
SUSTAIN_S = 4.0  # a downgrade must be seen across busy link samples at least this far apart
# Shared with the alert rules (exporter/thresholds.yaml): a finding and its alert agree on what counts.
MEM_AVAILABLE_LOW = thresholds.MEMORY.max_available_ratio
MEM_AVAILABLE_CRITICAL = 0.05
DIRTY_HIGH = 0.10  # Dirty + Writeback above 10% of MemTotal
PSI_MEMORY_SOME = thresholds.MEMORY.max_memory_stall_ratio
PSI_MEMORY_FULL = 0.02
NFS_RETRANS_RATIO = thresholds.NFS.max_retrans_ratio
NFS_RETRANS_PER_S = thresholds.NFS.min_retrans_per_second
SYNC_READS_AS = ("latency_bound", "launch_bound")  # the verdicts a loop blocked in a host sync reads as


@dataclass(frozen=True, slots=True)
class LinkState:
    """One hop's link as seen in one sample: current and effective maximum (the lower of both ends)."""

    bdf: str
    t: float
    cur_gen: int | None
    cur_width: int | None
    max_gen: int | None
    max_width: int | None


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def chain_links(pcie: Sequence[Stamped[PcieSample]], bdf: str) -> list[LinkState]:
    """Every hop of the GPU's chain (root port .. GPU) in every sample of the window.

    A link's achievable maximum is the lower of its two ends, so a Gen5 GPU in a Gen4 slot (a
    system limit, not a fault) is compared with Gen4.
    """
    out: list[LinkState] = []
    for s in pcie:
        chain = s.value.chains.get(bdf)
        if not chain:
            continue
        parent_gen: int | None = None
        parent_width: int | None = None
        for hop in chain:
            dev = s.value.devices.get(hop)
            link = dev.link if dev is not None else None
            if dev is None or link is None:
                parent_gen = parent_width = None
                continue
            mg, mw = linkmath.generation_of(link.max_speed_gts), link.max_width
            # Root and downstream ports describe the link below them, which the next hop (their link
            # partner) reports too: name each link once, by its lower end.
            below = dev.port in ("root_port", "downstream_port") and dev.link_peer in chain
            if not below:
                if link.limit_speed_gts is not None or link.limit_width is not None:
                    lg = linkmath.generation_of(link.limit_speed_gts) if link.limit_speed_gts is not None else mg
                    lw = link.limit_width if link.limit_width is not None else mw
                else:
                    lg, lw = _min(mg, parent_gen), _min(mw, parent_width)
                cur = linkmath.generation_of(link.current_speed_gts)
                out.append(LinkState(hop, s.t, cur, link.current_width, lg, lw))
            parent_gen, parent_width = mg, mw
    return out


def nvml_links(slow: Sequence[Stamped[GpuSample]], index: int, bdf: str) -> list[LinkState]:
    """The GPU's own link from NVML (system-limited max), for hosts where the pcie collector is off."""
    out = []
    for s in slow:
        g = s.value.gpus.get(index)
        if isinstance(g, GpuSlow):
            out.append(LinkState(bdf, s.t, g.link_gen, g.link_width, g.max_link_gen, g.max_link_width))
    return out


def busy_at(util: Sequence[Point], t: float, around: float = 1.5) -> bool | None:
    """Whether the GPU was working around time ``t`` (None when no activity data covers it)."""
    near = [p for p in util if p.t + p.dt >= t - around and p.t <= t + around]
    if not near:
        return None
    w = sum(p.dt for p in near)
    return w > 0 and sum(p.value * p.dt for p in near) / w >= BUSY_UTIL


def link_downgrades(
    view: GpuView, links: Sequence[LinkState], util: Sequence[Point],
) -> list[tuple[str, str, str]]:
    """(bdf, severity, detail) for each hop below its maximum across the busy part of the window.

    Load-aware: idle NVIDIA GPUs drop to Gen1 by design and idle links flap, so only samples taken while
    the GPU was busy count, the best state seen over them is what is judged (a link that reached its
    maximum while busy is fine), and the busy samples must span at least SUSTAIN_S.
    """
    traffic = (view.rx_bytes_per_s or 0.0) + (view.tx_bytes_per_s or 0.0)
    if (view.util or 0.0) < BUSY_UTIL and traffic < BUSY_TRAFFIC:
        return []
    by_hop: dict[str, list[LinkState]] = {}
    for ls in links:
        b = busy_at(util, ls.t)
        if b is None:
            b = (view.util or 0.0) >= BUSY_UTIL
        if b:
            by_hop.setdefault(ls.bdf, []).append(ls)
    out = []
    for hop, states in by_hop.items():
        if len(states) < 2 or states[-1].t - states[0].t < SUSTAIN_S:
            continue
        gens = [s.cur_gen for s in states if s.cur_gen is not None]
        widths = [s.cur_width for s in states if s.cur_width is not None]
        mg, mw = states[-1].max_gen, states[-1].max_width
        best_gen = max(gens) if gens else None
        best_width = max(widths) if widths else None
        parts = []
        if best_gen is not None and mg is not None and best_gen < mg:
            parts.append(f"Gen{best_gen} (max Gen{mg})")
        if best_width is not None and mw is not None and best_width < mw:
            parts.append(f"x{best_width} (max x{mw})")
        if parts:
            where = "the GPU itself" if hop == view.bdf else f"upstream bridge {hop}"
            out.append((hop, PCIE_LINK_SEVERITY,
                        f"link at {where} runs {' '.join(parts)} while GPU {view.index} is busy; "
                        f"check the slot, riser and BIOS (lspci -vv -s {hop})"))
    return out


def pcie_errors(view: GpuView, pcie: Sequence[Stamped[PcieSample]]) -> Finding | None:
    """AER counters of any hop on the GPU's chain, or the GPU's replay counter, rising in the window."""
    rising: list[str] = []
    severity = "warning"
    if len(pcie) >= 2 and view.bdf:
        a, b = pcie[0].value, pcie[-1].value
        for hop in b.chains.get(view.bdf, ()):
            d0, d1 = a.devices.get(hop), b.devices.get(hop)
            if d0 is None or d1 is None or d0.aer is None or d1.aer is None:
                continue
            for kind in ("fatal", "nonfatal", "correctable"):
                n = getattr(d1.aer, kind) - getattr(d0.aer, kind)
                if n > 0:
                    rising.append(f"{n} {kind} AER errors at {hop}")
                    if kind != "correctable":
                        severity = "critical"
    if view.replays > 0:
        rising.append(f"{view.replays} PCIe replays on GPU {view.index}")
    if not rising:
        return None
    return Finding("pcie_errors", view.index, severity,
                   "; ".join(rising) + " in the window: a marginal link (riser, slot, cable); check lspci -vv")


def numa_mismatch(numa: NumaSample | None, gpu_index: Mapping[str, int]) -> list[Finding]:
    """Placements of GPU processes whose CPUs or memory sit on a node remote from their GPU."""
    if numa is None:
        return []
    out: dict[int | None, list[str]] = {}
    for p in numa.placements:
        if not p.mismatch:
            continue
        idx = gpu_index.get(p.gpu)
        if idx is None and p.gpu.isdigit():
            idx = int(p.gpu)
        what = []
        if "cpus_remote" in p.reasons:
            local = "" if p.local_cpu_ratio is None else f" ({round(100 * p.local_cpu_ratio)}% of its CPUs local)"
            what.append(f"CPUs on a remote node{local}")
        if "memory_remote" in p.reasons:
            what.append("memory bound away from the GPU's node")
        out.setdefault(idx, []).append(
            f"pid {p.pid} ({p.comm}) has {' and '.join(what) or ', '.join(p.reasons)}; GPU on node {p.gpu_node}")
    return [Finding("numa_mismatch", idx, "warning", "; ".join(v) + " (numactl --show; bind with numactl -N)")
            for idx, v in sorted(out.items(), key=lambda kv: -1 if kv[0] is None else kv[0])]


def governor_powersave(cpufreq: CpufreqSample | None, busy_gpus: Sequence[int]) -> Finding | None:
    """CPUs left at the powersave governor while a GPU is busy (slower submission and preprocessing)."""
    if cpufreq is None or not busy_gpus:
        return None
    slow = sorted(c for c, v in cpufreq.cpus.items() if v.governor == "powersave")
    if not slow:
        return None
    gpus = ", ".join(map(str, busy_gpus))
    return Finding("cpu_governor_powersave", None, "warning",
                   f"{len(slow)} of {len(cpufreq.cpus)} CPUs use the powersave governor while GPU {gpus} is busy "
                   "(cpupower frequency-set -g performance)")


def clock_throttled(view: GpuView) -> Finding | None:
    """Power or thermal clock-event reasons holding a busy GPU's SM clock below its maximum."""
    if (view.util or 0.0) < 0.5 or not view.throttle_reasons:
        return None
    if view.clock_ratio is not None and view.clock_ratio >= 0.9 and not (view.throttle_reasons & THERMAL_REASONS):
        return None
    clock = "" if view.clock_ratio is None else f", SM clock at {round(100 * view.clock_ratio)}% of max"
    return Finding("gpu_clock_throttled", view.index, "warning",
                   f"GPU {view.index} busy with clock-event reasons {', '.join(sorted(view.throttle_reasons))}{clock}"
                   " (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER)")


def memory_pressure(memory: Sequence[Stamped[MemorySample]], io: IoSignals) -> Finding | None:
    """MemAvailable low, Dirty/Writeback piling up, memory PSI, or OOM kills in the window."""
    why: list[str] = []
    severity = "warning"
    if memory:
        m = memory[-1].value
        if m.total > 0:
            avail = m.available / m.total
            if avail < MEM_AVAILABLE_LOW:
                why.append(f"MemAvailable {round(100 * avail)}% of MemTotal")
                if avail < MEM_AVAILABLE_CRITICAL:
                    severity = "critical"
            dirty = (m.dirty + m.writeback) / m.total
            if dirty >= DIRTY_HIGH:
                why.append(f"Dirty+Writeback {round(100 * dirty)}% of MemTotal")
        first, last = memory[0].value.oom_kills, m.oom_kills
        if first is not None and last is not None and last > first:
            why.append(f"{last - first} OOM kills")
            severity = "critical"
    if io.psi_memory_some is not None and io.psi_memory_some >= PSI_MEMORY_SOME:
        why.append(f"tasks stalled on memory {round(100 * io.psi_memory_some)}% of the time")
    elif io.psi_memory_full is not None and io.psi_memory_full >= PSI_MEMORY_FULL:
        why.append(f"all tasks stalled on memory {round(100 * io.psi_memory_full)}% of the time")
    if not why:
        return None
    return Finding("memory_pressure", None, severity, "; ".join(why) + " (free -g; vmstat 1)")


def nfs_retransmissions(io: IoSignals, window_s: float) -> Finding | None:
    """The NFS client retransmitted at least NFS_RETRANS_RATIO of its RPCs, and at least NFS_RETRANS_PER_S
    of them per second, in the window (server or network struggling): the GpufeedNFSRetransmissions rule. The
    rates are per second of the time the samples cover, and the detail says that time: less than the window
    in its first seconds."""
    r = io.nfs_retrans_per_s
    if not r or r < NFS_RETRANS_PER_S or not io.nfs_calls_per_s or r / io.nfs_calls_per_s < NFS_RETRANS_RATIO:
        return None
    ratio = f" ({100 * r / io.nfs_calls_per_s:.2f}% of calls)"
    return Finding("nfs_retransmissions", None, "warning",
                   f"NFS client retransmitting {r:.1f} RPCs/s{ratio} over the last "
                   f"{min(window_s, io.nfs_span_s or window_s):.0f} s (nfsstat -c)")


# ---- GPU health: Xid errors and memory errors -----------------------------------------------------------------

XID = thresholds.XID


def _latest_slow(slow: Sequence[Stamped[GpuSample]], index: int) -> GpuSlow | None:
    for s in reversed(slow):
        g = s.value.gpus.get(index)
        if isinstance(g, GpuSlow):
            return g
    return None


def xid_errors(slow: Sequence[Stamped[GpuSample]], index: int, now: float) -> Finding | None:
    """A critical Xid NVML reported for the GPU within the hold time (thresholds.yaml gpu_xid_error.window):
    critical unless every recent one is of the codes the GPU keeps working through."""
    g = _latest_slow(slow, index)
    if g is None:
        return None
    recent = sorted(x for x, t in g.xid_last_seen.items() if x in XID.critical and now - t <= XID.hold_s)
    if not recent:
        return None
    severity = "warning" if all(x in XID.warning for x in recent) else "critical"
    parts = [f"Xid {x} ({XID_MEANING.get(x, 'see the Xid catalogue')}), {g.xid_errors.get(x, 0)} since gpufeed "
             f"started, last {max(0.0, now - g.xid_last_seen[x]):.0f} s ago" for x in recent]
    return Finding("gpu_xid_error", index, severity,
                   f"GPU {index}: " + "; ".join(parts) + " (dmesg | grep -i xid; nvidia-smi -q -d ECC,ROW_REMAPPER)")


def memory_errors(slow: Sequence[Stamped[GpuSample]], index: int) -> Finding | None:
    """Uncorrectable ECC errors since the driver loaded, or row remapping pending or failed: standing
    conditions until a GPU reset (NVIDIA: a pending remap takes effect at reset; a failed one means RMA)."""
    g = _latest_slow(slow, index)
    if g is None:
        return None
    why: list[str] = []
    severity = "warning"
    unc = g.fields.get("ecc_uncorrected_volatile")
    if unc:
        why.append(f"{unc:.0f} uncorrectable ECC errors since the driver loaded")
        severity = "critical"
    if g.fields.get("row_remap_failure"):
        why.append("a row remapping failed (spare rows exhausted: RMA)")
        severity = "critical"
    if g.fields.get("row_remap_pending"):
        why.append("a row remapping is pending until the next GPU reset")
    if not why:
        return None
    return Finding("gpu_memory_errors", index, severity,
                   f"GPU {index}: " + "; ".join(why) + " (nvidia-smi -q -d ECC,ROW_REMAPPER; drain and reset the GPU)")


def gpu_lost(index: int) -> Finding:
    """The GPU fell off the bus (NVML GPU_IS_LOST)."""
    return Finding("gpu_lost", index, "critical",
                   f"GPU {index} is lost (NVML GPU_IS_LOST): fell off the bus; check dmesg for Xid 79 and reseat/RMA")


# ---- workloads (DESIGN.md "Workloads") --------------------------------------------------------------------------

QUOTA_THROTTLED_RATIO = thresholds.WORKLOAD.min_throttled_ratio  # shared with GpufeedCPUQuotaThrottled
CONTENTION_RUN_DELAY = thresholds.WORKLOAD.min_run_delay_ratio  # a workload thread waits this share for a CPU
GPU_MEMORY_FULL = thresholds.WORKLOAD.min_gpu_memory_used_ratio
MEMORY_EVENTS_MIN = 1  # any memory.max / oom_kill event of the workload's cgroup in the window


def quota_throttled(index: int, shape: CpuShape, waiting: bool) -> Finding | None:
    """The workload's CFS quota throttles it in at least QUOTA_THROTTLED_RATIO of its periods while the GPU
    waits: the container's CPU limit holds the GPU back."""
    ratio = shape.throttled_ratio
    if not waiting or ratio is None or ratio < QUOTA_THROTTLED_RATIO:
        return None
    who = shape.group or "the workload's cgroup"
    quota = f"{shape.quota_cores:.3g}-CPU quota" if shape.quota_cores else "CPU quota"
    per_s = "" if shape.throttled_per_s is None else f", {shape.throttled_per_s:.2f} s throttled per s"
    return Finding("cpu_quota_throttled", index, "warning",
                   f"{who} throttled in {round(100 * ratio)}% of CFS periods by its {quota}{per_s} while GPU {index} "
                   "waits: raise or remove the CPU limit (resources.limits.cpu / CPUQuota=)")


def cpu_contention(index: int, shape: CpuShape, waiting: bool) -> Finding | None:
    """A workload thread that wants to run waits for a CPU (schedstat run delay) while the GPU waits, and not
    because of its own quota nor its own threads outnumbering its CPUs (``num_workers`` above the cores):
    other jobs hold its CPUs."""
    if not waiting or (shape.throttled_ratio or 0.0) >= 0.1:
        return None
    cap = shape.capacity_cores if shape.capacity_cores is not None else float(max(1, shape.allowed_cpus))
    if shape.oversubscribed(cap):
        return None  # its own threads queue for its CPUs: the verdict says so, no neighbour is to blame
    worst = max((t for t in shape.threads if t.cores + t.run_delay >= 0.5), key=lambda t: t.run_delay, default=None)
    if worst is None or worst.run_delay < CONTENTION_RUN_DELAY:
        return None
    switches = "" if worst.nonvoluntary_per_s is None else f", {worst.nonvoluntary_per_s:.0f} involuntary switches/s"
    return Finding("cpu_contention", index, "warning",
                   f"thread {worst.tid} ({worst.comm}) of pid {worst.pid} feeding GPU {index} waits for a CPU "
                   f"{round(100 * worst.run_delay)}% of the time (run delay{switches}) while running at "
                   f"{worst.cores:.2f} core: other jobs hold its {shape.allowed_cpus} CPUs (pin the job to its own "
                   "cores, or move the neighbours; pidstat -w -t -p <pid>)")


def gpu_memory_full(view: GpuView, slow: Sequence[Stamped[GpuSample]]) -> Finding | None:
    """Device memory at least GPU_MEMORY_FULL used while the GPU is partly idle: the playbook's "limited by
    VRAM" hint (a batch that no longer fits, or fragmentation). A hint, not a verdict: caching allocators hold
    memory they do not use."""
    util = view.util
    if util is None or util < 0.03 or util >= 0.8:
        return None
    latest = None
    for s in slow:
        g = s.value.gpus.get(view.index)
        if isinstance(g, GpuSlow):
            latest = g
    if latest is None or not latest.memory_total_bytes or latest.memory_used_bytes is None:
        return None
    share = latest.memory_used_bytes / latest.memory_total_bytes
    if share < GPU_MEMORY_FULL:
        return None
    return Finding("gpu_memory_full", view.index, "info",
                   f"GPU {view.index} memory {round(100 * share)}% used while it is busy only {round(100 * util)}% of "
                   "the time: batch size or model may be limited by VRAM (nvidia-smi --query-gpu=memory.used,"
                   "memory.total; torch.cuda.memory_summary())")


def workload_memory_pressure(index: int, who: str, events: Mapping[str, int], psi: Mapping[str, float],
                             limit: int | None) -> Finding | None:
    """The workload's own cgroup hits its memory limit (memory.events max / v1 failcnt), OOM-kills, or stalls
    on memory (its memory.pressure) -- even when the host has memory to spare."""
    why: list[str] = []
    severity = "warning"
    if events.get("oom_kill", 0) >= MEMORY_EVENTS_MIN:
        why.append(f"{events['oom_kill']} OOM kills")
        severity = "critical"
    if events.get("max", 0) >= MEMORY_EVENTS_MIN:
        lim = "" if limit is None else (f" of {limit / (1 << 30):.1f} GiB" if limit >= 1 << 30
                                        else f" of {limit / (1 << 20):.0f} MiB")
        why.append(f"{events['max']} hits of its memory limit{lim}")
    if events.get("high", 0) >= MEMORY_EVENTS_MIN:
        why.append(f"{events['high']} memory.high throttling events")
    some = psi.get("memory_some")
    if some is not None and some >= PSI_MEMORY_SOME:
        why.append(f"its tasks stalled on memory {round(100 * some)}% of the time")
    if not why:
        return None
    return Finding("memory_pressure", index, severity,
                   f"{who or 'the workload cgroup'} of GPU {index}: {'; '.join(why)} in the window (reclaim under its "
                   "limit slows the data pipeline; raise resources.limits.memory or shrink the page cache it needs)")


def sync_bound(verdict: GpuVerdict, note: CaptureNote | None) -> Finding | None:
    """The loop feeding ``verdict``'s GPU blocks in a host sync every step: the newest capture's label is ``sync``
    while the verdict it was taken for (latency_bound or launch_bound, which is how a blocking sync reads from
    the GPU's side) still holds. Only where captures run (--capture.enabled, ptrace granted)."""
    if note is None or note.label != CAPTURE_SYNC or note.cause != verdict.cause \
            or verdict.cause not in SYNC_READS_AS:
        return None
    return Finding("sync_bound", verdict.index, "info", note.evidence)
