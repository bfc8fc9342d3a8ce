"""One evaluation of one GPU, and of the host, over sample windows: pure, no state, no clock.

:func:`evaluate_gpu` is everything the analyzer decides about a GPU at one instant before hysteresis and
accounting: the window view, whether to judge only the recent part (work started or stopped inside the
window), the CPU shape of its processes, the verdict candidate, and the GPU's platform findings. The analyzer
(:mod:`exporter.derived.analyzer`) calls it and keeps the state; tests call the same function with plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter import linkmath
from exporter.derived import findings as fnd
from exporter.derived import interconnect as ic
from exporter.derived.gpuview import GpuView, activity_points, gpm_means, gpu_view
from exporter.derived.hostshape import CpuShape, IoSignals, cpu_shape
from exporter.derived.series import IDLE_LEVEL, Point, gaps, mean_and_idle
from exporter.derived.verdict import WAITING_LEAVE, Candidate, classify, collective_wait
from exporter.derived.workload import GroupSignals, Workload, enrich, group_signals
from exporter.names import CAPTURE_INPUT, CAPTURE_LAUNCH, CAPTURE_SYNC
from exporter.samples.capture import CaptureNote
from exporter.samples.derived import Finding, GpuVerdict
from exporter.samples.gpu import GpuIdentity, GpuKey, GpuSample
from exporter.samples.host import CpufreqSample, CpuSample, MemorySample, ProcSample
from exporter.samples.topology import NicSample, NumaSample, PcieSample
from exporter.samples.workload import WorkloadSample
from exporter.snapshot import Stamped

# The tripwire of a stable GPU (activity_moved): activity this far from what the last evaluation saw evaluates
# the GPU at once instead of at its next --stable-interval. A tenth of the GPU's time: well above the jitter of
# a steady GPU's readings, well below the drop of a GPU that starts to wait.
TRIP_ACTIVITY = 0.1
# When the mean activity of the last third of the window differs from the whole window's by this much,
# the condition changed inside the window and the recent part is judged alone (fast onset detection).
ONSET_CHANGE = 0.25
# Data short of the judged span by more than this (the first seconds after start) makes a "first reading".
PARTIAL_SLACK_S = 1.0

# A capture's stacks (exporter/capture) and the verdicts they confirm: the main thread waiting on the input
# pipeline's workers or queue confirms an input or IO wait; one busy in Python launching work, launch_bound.
CAPTURE_CONFIRMS = {CAPTURE_INPUT: ("input_bound", "io_bound"), CAPTURE_LAUNCH: ("launch_bound",)}
CAPTURE_CONFIRMED = 0.1  # added to the confidence of a verdict the stacks confirm
CAPTURE_QUESTIONED = 0.8  # the confidence's factor when they show another wait (the held verdict's, too)

# What a verdict on a GPU without GPM (Ampere and older, consumer boards) rests on, said in its evidence.
NO_GPM_NOTE = ("no GPM on this GPU (Ampere or older): judged from the driver's utilisation samples, SM clocks, "
               "PCIe counters and the host; SM activity and occupancy are not measured, so a busy GPU doing a "
               "poor job (gpu_inefficient) reads as healthy")
# Why a MIG instance gets no verdict without GPM (DESIGN.md: a MIG GPU is never called idle for lack of data).
MIG_NO_GPM = ("no verdict: NVML reports no utilisation for MIG instances (nvml.h: unsupported on MIG) and this "
              "GPU has no GPM (Hopper and newer), so this instance's activity is not measured -- use DCGM "
              "profiling (dcgmi dmon -e 1001) for it")


@dataclass(frozen=True, slots=True)
class Windows:
    """The sample windows one evaluation reads, ending at ``now`` (engine time).

    ``window_s`` is the classifier window (GPU windows span it; ``slow`` a little more), ``cpu_window_s`` the
    CPU windows' span, ``recent_s`` the part judged alone when activity changed inside the window.
    """

    now: float
    window_s: float
    cpu_window_s: float
    recent_s: float
    fast: Sequence[Stamped[GpuSample]]
    buffered: Sequence[Stamped[GpuSample]]
    slow: Sequence[Stamped[GpuSample]]
    procs: Sequence[Stamped[ProcSample]]
    deep: Sequence[Stamped[ProcSample]]
    cpus: Sequence[Stamped[CpuSample]]
    pcie: Sequence[Stamped[PcieSample]]
    memory: Sequence[Stamped[MemorySample]]
    io: IoSignals
    workload: Sequence[Stamped[WorkloadSample]] = ()  # the workload collector's samples over the window
    nic: Sequence[Stamped[NicSample]] = ()  # the nic collector's samples (network adapters beside the GPUs)


@dataclass(frozen=True, slots=True)
class GpuEvaluation:
    """What one evaluation found for one GPU, before hysteresis.

    ``view`` covers the whole window (activity points, burstiness, links); ``judged_s`` is the span the
    candidate was judged over (the window, or its recent part). ``links`` maps each hop of the GPU's PCIe
    chain to whether it runs below its maximum while busy; ``waiting`` says whether the GPU waits enough to
    deserve deep (per-thread) sampling.
    """

    view: GpuView
    candidate: Candidate
    judged_s: float
    shape: CpuShape
    findings: tuple[Finding, ...]
    links: Mapping[str, bool]
    busy: bool
    waiting: bool


def overlap_mean(points: Sequence[Point], start: float, end: float) -> float | None:
    """Time-weighted mean activity over the part of [start, end) the points cover."""
    tot = w = 0.0
    for p in points:
        a, b = max(start, p.t), min(end, p.t + p.dt)
        if b > a:
            tot += p.value * (b - a)
            w += b - a
    return tot / w if w > 0 else None


def activity_moved(fast: Sequence[Stamped[GpuSample]], buffered: Sequence[Stamped[GpuSample]], index: int, *,
                   gpm: bool, start: float, now: float, util: float | None, shape_mean: float,
                   idle_ratio: float) -> bool:
    """The tripwire: whether GPU ``index``'s activity since ``start`` differs from what its last evaluation saw
    (its mean utilisation ``util``, mean activity ``shape_mean`` and idle share ``idle_ratio``).

    A dip, a gap or new work shows as the new stretch's mean utilisation, mean activity (the burstiness
    points: SM activity with GPM) or idle share leaving the window's by more than ``TRIP_ACTIVITY``."""
    util_points, shape = activity_points(fast, buffered, index, gpm)
    covered = mean_and_idle([p for p in shape if p.t + p.dt > start])
    if covered is None:
        return False
    _, mean, idle = covered
    new_util = overlap_mean(util_points, start, now)
    return (abs(mean - shape_mean) > TRIP_ACTIVITY or abs(idle - idle_ratio) > TRIP_ACTIVITY
            or (new_util is not None and abs(new_util - (util or 0.0)) > TRIP_ACTIVITY))


def since(window: Sequence[Stamped[Any]], start: float) -> Sequence[Stamped[Any]]:
    """The samples of ``window`` taken at or after ``start``."""
    return tuple(s for s in window if s.t >= start)


def _since_keep2(window: Sequence[Stamped[Any]], start: float) -> Sequence[Stamped[Any]]:
    """Samples since ``start``, but at least the newest two (deep samples may be seconds apart)."""
    out = since(window, start)
    return out if len(out) >= 2 else tuple(window)[-2:]


def work_onset(util: Sequence[Point], start: float, now: float) -> float | None:
    """When work started, if the window opens with an idle stretch of at least 2 s that is also at least
    twice the longest idle gap after it (so batch gaps of a bursty job are not mistaken for an onset)."""
    t_on = next((p.t for p in util if p.value >= IDLE_LEVEL), None)
    if t_on is None or t_on - max(start, util[0].t if util else start) < 2.0 or now - t_on < 1.0:
        return None
    longest = max((g.seconds for g in gaps([p for p in util if p.t >= t_on])), default=0.0)
    return t_on if t_on - start >= 2 * longest else None


def link_capacity(view: GpuView, pcie: Sequence[Stamped[PcieSample]]) -> tuple[float | None, str]:
    """Achievable bytes/s of the GPU's *current* link (NVML first, sysfs otherwise) and its name."""
    gen, width = view.link_gen, view.link_width
    if (gen is None or width is None) and pcie:
        dev = pcie[-1].value.devices.get(view.bdf)
        if dev is not None and dev.link is not None and dev.link.current_speed_gts is not None:
            gen = linkmath.generation_of(dev.link.current_speed_gts)
            width = dev.link.current_width
    if gen is None or width is None:
        return None, ""
    try:
        return linkmath.capacity_bytes_per_second(gen, width), f"Gen{gen} x{width}"
    except ValueError:
        return None, ""


def _recent_view(index: int, w: Windows, span: float, mig: int | None = None) -> GpuView:
    start = w.now - span
    return gpu_view(index, since(w.fast, start), since(w.buffered, start - 1.0), w.slow, mig=mig)


def identity(w: Windows, index: int) -> GpuIdentity | None:
    """GPU ``index``'s newest identity in the windows."""
    for win in (w.slow, w.fast, w.buffered):
        if win and (ident := win[-1].value.identities.get(index)) is not None:
            return ident
    return None


def unjudged(index: int, w: Windows, mig: int) -> str | None:
    """Why MIG instance ``mig`` of GPU ``index`` cannot be judged (None when it can): without GPM nothing
    measures a MIG instance's activity, and no data is not the same as idle."""
    ident = identity(w, index)
    if ident is not None and not ident.gpm:
        return MIG_NO_GPM
    return None


def evaluate_gpu(
    index: int, w: Windows, *, previous: str | None, mig: int | None = None, workload: Workload | None = None,
) -> GpuEvaluation:
    """Judge GPU ``index`` (or its MIG instance ``mig``) over ``w``; ``previous`` is its settled verdict (the
    waiting threshold's hysteresis band depends on it). ``workload`` (:mod:`exporter.derived.workload`) is what
    feeds the GPU; without it the CPU evidence is the GPU's (or instance's) NVML processes alone. A MIG
    instance's evaluation has no platform findings: those belong to its GPU (:func:`mig_gpu_findings`)."""
    view = gpu_view(index, w.fast, w.buffered, w.slow, mig=mig)
    util_pts = view.util_points
    judged, span = view, w.window_s
    onset = work_onset(util_pts, w.now - w.window_s, w.now)
    recent = overlap_mean(util_pts, w.now - w.recent_s, w.now)
    if onset is not None:
        # Work started inside the window after a long idle stretch: judge only since it started, so a
        # half-idle, half-busy window is not mistaken for a GPU that waits.
        span = max(1.0, w.now - onset)
        judged = _recent_view(index, w, span, mig)
    elif recent is not None and view.util is not None and abs(recent - view.util) >= ONSET_CHANGE:
        # The activity changed within the window (work stopped or collapsed): judge the recent part.
        span = w.recent_s
        judged = _recent_view(index, w, span, mig)
    whole = span == w.window_s
    members = workload.members if workload is not None and workload.members else view.pids
    # Without a context process (NVML shows none: the container's processes were found by its visible
    # devices) any of them may submit work: all count as context.
    context = workload.context if workload is not None and workload.context else None
    shape = cpu_shape(
        w.procs if whole else since(w.procs, w.now - span),
        w.deep if whole else _since_keep2(w.deep, w.now - span),
        w.cpus if whole else since(w.cpus, w.now - span), members, context)
    sig = None
    if workload is not None and workload.group is not None:
        sig = group_signals(w.workload if whole else _since_keep2(w.workload, w.now - span), workload.group.path)
    shape = enrich(shape, workload, sig)
    capacity, link_name = link_capacity(view, w.pcie)
    # The time the verdict is based on: the span judged, or less while the buffers do not reach back that far
    # (the first seconds after start). A verdict from part of its window says so.
    first = min((p.t for p in judged.util_points), default=None)
    covered = span if first is None else max(0.0, min(span, w.now - first))
    wire = ic.wire_load(view, w.slow, w.nic) if mig is None else None
    cand = classify(judged, shape, w.io, capacity=capacity, link_name=link_name, window_s=covered,
                    previous=previous, wire=wire)
    if covered < span - PARTIAL_SLACK_S and judged.util is not None:
        cand = dataclasses.replace(cand, evidence=(
            *cand.evidence, f"a first reading: {covered:.0f} s of data so far, the window is {span:.0f} s"))
    if mig is None and workload is not None and workload.rank is not None and cand.cause == "gpu_inefficient":
        dram, tensor = gpm_means(w.fast if whole else since(w.fast, w.now - span), index)
        cand = collective_wait(cand, judged, workload.rank, dram=dram, tensor=tensor)
    ident = identity(w, index)
    if mig is None and ident is not None and ident.mig_mode:
        # MIG mode without any GPU instance: nothing can run on the GPU until one is created.
        cand = Candidate("idle", 0.9, 0.0, "latency_bound", (
            f"{view.name} is in MIG mode with no GPU instance: no work can run on it (nvidia-smi mig -lgi)",))
    elif not view.gpm and cand.cause != "idle":
        cand = dataclasses.replace(cand, evidence=(*cand.evidence, NO_GPM_NOTE))
    found, links = gpu_findings(index, view, w) if mig is None else ([], {})
    waiting = cand.cause != "idle" and cand.waiting_ratio >= WAITING_LEAVE
    if mig is None:
        found.extend(workload_findings(index, view, w, shape, waiting=waiting, workload=workload, sig=sig))
    return GpuEvaluation(
        view=view, candidate=cand, judged_s=span, shape=shape, findings=tuple(found),
        links=MappingProxyType(links), busy=(view.util or 0.0) >= fnd.BUSY_UTIL,
        waiting=waiting,
    )


def workload_findings(
    index: int, view: GpuView, w: Windows, shape: CpuShape, *, waiting: bool, workload: Workload | None,
    sig: GroupSignals | None,
) -> list[Finding]:
    """The findings about what feeds the GPU: its CPU quota, CPU contention, its cgroup's memory, and the GPU's
    memory filling while it is partly idle."""
    found = [f for f in (fnd.quota_throttled(index, shape, waiting), fnd.cpu_contention(index, shape, waiting),
                         fnd.gpu_memory_full(view, w.slow)) if f is not None]
    if sig is not None and workload is not None and workload.group is not None:
        f = fnd.workload_memory_pressure(index, workload.describe(), sig.memory_events, sig.psi,
                                         workload.group.memory_max)
        if f is not None:
            found.append(f)
    return found


def gpu_findings(index: int, view: GpuView, w: Windows) -> tuple[list[Finding], dict[str, bool]]:
    """The platform findings of one GPU (link downgrades, PCIe errors, throttling, Xid and memory errors) and
    each hop of its PCIe chain -> whether it is downgraded while busy."""
    found: list[Finding] = []
    chain = fnd.chain_links(w.pcie, view.bdf) if w.pcie else fnd.nvml_links(w.slow, index, view.bdf)
    down = fnd.link_downgrades(view, chain, view.util_points)
    for _bdf, sev, detail in down:
        found.append(Finding("pcie_link_downgraded", index, sev, detail))
    links = dict.fromkeys({ls.bdf for ls in chain}, False) | {b: True for b, _, _ in down}
    for f in (fnd.pcie_errors(view, w.pcie), fnd.clock_throttled(view), fnd.xid_errors(w.slow, index, w.now),
              fnd.memory_errors(w.slow, index), ic.nvlink_degraded(view, w.slow), ic.nic_link_degraded(view, w.nic)):
        if f is not None:
            found.append(f)
    return found, links


def mig_gpu_findings(index: int, w: Windows, instances: Sequence[GpuView]) -> tuple[list[Finding], dict[str, bool]]:
    """The platform findings of a GPU in MIG mode, judged per physical GPU. Its own utilisation is unsupported;
    the GPU counts as busy as its busiest instance (at least that busy), so a downgraded link under load, or
    throttling, is still found."""
    view = gpu_view(index, w.fast, w.buffered, w.slow)
    busiest = max((v for v in instances if v.util is not None), key=lambda v: v.util or 0.0, default=None)
    if busiest is not None:
        view = dataclasses.replace(view, util=busiest.util, util_points=busiest.util_points)
    return gpu_findings(index, view, w)


def host_findings(
    w: Windows, numa: NumaSample | None, cpufreq: CpufreqSample | None, gpu_key: Mapping[str, int],
    busy: Sequence[int],
) -> list[Finding]:
    """Findings that belong to the host or to processes rather than to one GPU's window."""
    found = list(fnd.numa_mismatch(numa, gpu_key))
    for f in (fnd.governor_powersave(cpufreq, busy), fnd.memory_pressure(w.memory, w.io),
              fnd.nfs_retransmissions(w.io, w.window_s)):
        if f is not None:
            found.append(f)
    return found


def with_capture(verdict: GpuVerdict, note: CaptureNote | None) -> tuple[GpuVerdict, Finding | None]:
    """The GPU's verdict with its newest capture's word on it (docs/derived.md, "Stack captures"), and the
    ``sync_bound`` finding when the capture names one. A capture taken for another verdict says nothing here.

    The capture's first evidence line is appended to the verdict's evidence; the confidence rises by
    :data:`CAPTURE_CONFIRMED` (at most 1) when the stacks show what the verdict says (:data:`CAPTURE_CONFIRMS`),
    is multiplied by :data:`CAPTURE_QUESTIONED` when they show another kind of wait, and stays when they show no
    dominant wait or a host sync under latency_bound / launch_bound (the finding names that)."""
    if note is None or note.cause != verdict.cause:
        return verdict, None
    confidence = verdict.confidence
    if verdict.cause in CAPTURE_CONFIRMS.get(note.label or "", ()):
        confidence = min(1.0, confidence + CAPTURE_CONFIRMED)
    elif note.label is not None and not (note.label == CAPTURE_SYNC and verdict.cause in fnd.SYNC_READS_AS):
        confidence *= CAPTURE_QUESTIONED
    evidence = (*verdict.evidence, f"stacks ({note.name}): {note.evidence}")
    return (dataclasses.replace(verdict, confidence=round(confidence, 2), evidence=evidence),
            fnd.sync_bound(verdict, note))


def with_captures(verdicts: Mapping[GpuKey, GpuVerdict],
                  captures: Mapping[int, CaptureNote]) -> tuple[dict[GpuKey, GpuVerdict], list[Finding]]:
    """:func:`with_capture` over every whole GPU's verdict (a capture is of the whole GPU's processes: MIG
    instances' verdicts stay as they are), and the findings it raised."""
    out = dict(verdicts)
    found: list[Finding] = []
    for key, v in verdicts.items():
        if key.mig is None and key.gpu in captures:
            out[key], sync = with_capture(v, captures[key.gpu])
            found.extend([sync] if sync is not None else [])
    return out, found
