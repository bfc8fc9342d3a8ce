"""The stateful part of the derived layer: reads the engine's buffers through a typed reader, calls the pure
per-GPU evaluation (:mod:`exporter.derived.evaluate`), keeps the counters, the hysteresis and the idle-gap
tracking, and orchestrates the two other jobs: each evaluation's sampling cadence goes out through the
:class:`~exporter.derived.cadence.Pacer` (the feedback into collection), and its published state becomes
metric families in :mod:`exporter.derived.families`.

The analyzer is a :class:`~exporter.sampling.Stage` with one non-blocking sampler (``derived``, every second):
it reads only in-memory ring buffers, so it runs on the event loop. The pipeline (``exporter/pipeline.py``)
builds it and binds it to the engine; nothing else does. Everything it decides is in ``exporter.derived``.

What it judges is keyed by :class:`~exporter.samples.gpu.GpuKey`: a whole GPU, or -- for a GPU in MIG mode,
whose whole-GPU utilisation the driver does not report -- each MIG instance on its own (``gpu`` and ``mig``
labels), with its own state seconds, waiting causes, idle gaps and verdict. Platform findings stay per
physical GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from prometheus_client.core import Metric

from exporter import log, names
from exporter.derived import findings as fnd
from exporter.derived.cadence import CadencePolicy, Pacer, SamplerPace
from exporter.derived.evaluate import (
    Windows,
    activity_moved,
    evaluate_gpu,
    host_findings,
    mig_gpu_findings,
    overlap_mean,
    unjudged,
    with_captures,
)
from exporter.derived.families import derived_families
from exporter.derived.gpuview import GpuView
from exporter.derived.hostshape import io_signals
from exporter.derived.series import IDLE_LEVEL, Point, bucket_counts
from exporter.derived.verdict import Candidate, Settled, settle
from exporter.derived.workload import workloads
from exporter.names import STATES, WAITING_CAUSES
from exporter.samples.capture import CaptureNote, CaptureStats
from exporter.samples.derived import GAP_BUCKETS, DerivedState, Finding, GpuActivity, GpuVerdict, WorkloadSummary
from exporter.samples.gpu import GpuFast, GpuIdentity, GpuKey, GpuSample, GpuSlow
from exporter.sampling import CPU_WINDOW_MAX, UNCHANGED, NoDataError, Option, SamplerSpec, Stage, Targets, Unchanged
from exporter.snapshot import Snapshot, Stamped

# Host-level findings (numa_mismatch, memory_pressure, a powersave governor, link downgrades) are evaluated at
# least this often while every GPU stands; a shorter --stable-interval evaluates them at that pace. A stable
# GPU's evaluation every 15 s (its counters at most that far behind -- one scrape interval --, its verdict still
# tripped at once by its activity) is a third of what 5 s cost -- ~8 ms of CPU per run on an 8-GPU host; the host
# findings alone are well under a millisecond, and keep the 5 s they had.
HOST_FINDINGS_S = 5.0


class EngineReader(SamplerPace, Protocol):
    """What the analyzer needs of the engine: its clock, its buffers, the newest snapshot, and the intervals
    of the samplers its cadence steers (:class:`~exporter.derived.cadence.SamplerPace`)."""

    @property
    def snapshot(self) -> Snapshot: ...

    def now(self) -> float: ...

    def window(self, name: str, seconds: float, now: float | None = None) -> Sequence[Stamped[Any]]: ...

    def history(self, name: str) -> Sequence[Stamped[Any]]: ...


@dataclass
class _GapTracker:
    """Incremental idle-gap detection over activity points, so a gap is counted exactly once."""

    last_t: float = float("-inf")
    open_start: float | None = None
    seen_active: bool = False
    counts: list[int] = field(default_factory=lambda: [0] * (len(GAP_BUCKETS) + 1))
    total: float = 0.0

    def feed(self, points: Sequence[Point]) -> None:
        for p in points:
            if p.t <= self.last_t:
                continue
            self.last_t = p.t
            if p.value < IDLE_LEVEL:
                if self.open_start is None and self.seen_active:
                    self.open_start = p.t
            else:
                if self.open_start is not None:
                    gap = p.t - self.open_start
                    for i, n in enumerate(bucket_counts([gap])):
                        self.counts[i] += n
                    self.total += gap
                    self.open_start = None
                self.seen_active = True


@dataclass(frozen=True, slots=True)
class _Judged:
    """What the last evaluation of one GPU produced: reused, as it is, while the GPU stays stable."""

    activity: GpuActivity
    findings: tuple[Finding, ...]
    workload: WorkloadSummary | None
    busy: bool
    waiting: bool
    waiting_pids: frozenset[int]
    agreed: bool  # the candidate was the settled verdict (no switch pending)
    util: float | None  # mean utilisation over the window: the tripwire's baselines (with the two below)
    shape_mean: float  # mean of the burstiness points (SM activity with GPM)
    idle_ratio: float
    processes: frozenset[int] = frozenset()  # NVML's processes of the GPU it judged (a change is a tripwire)
    health: tuple[Any, ...] = ()  # its Xid counts and memory-health fields then (a change is a tripwire too)


@dataclass
class _GpuState:
    """Per-GPU mutable state: counters, hysteresis, gap tracking, the last verdict."""

    state_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    waiting_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAITING_CAUSES, 0.0))
    # Joules spent waiting, by cause: only the causes seen (the series budget), only with an energy counter.
    waiting_joules: dict[str, float] = field(default_factory=dict)
    energy: tuple[float, float] | None = None  # the last energy reading accounted: (engine time, joules)
    gaps: _GapTracker = field(default_factory=_GapTracker)
    settled: Settled | None = None
    verdict: GpuVerdict | None = None
    judged: _Judged | None = None
    evaluated_t: float = float("-inf")
    pending_s: float = 0.0  # seconds elapsed since the counters were last split into states
    # Waiting seconds held back while the verdict is younger than the window (_attribute), the cause they go
    # to once one has held, the settled verdict's start at the last split, and the last waiting cause seen.
    deferred_s: float = 0.0
    deferred_j: float = 0.0
    booked: str | None = None
    accounted_since: float | None = None
    last_cause: str | None = None


def energy_readings(fast: Sequence[Stamped[GpuSample]], index: int) -> list[tuple[float, float]]:
    """GPU ``index``'s energy counter readings in the fast window: (engine time, joules), ascending; empty when
    the GPU has no energy field (held entries repeat an older reading and are skipped)."""
    out: list[tuple[float, float]] = []
    for s in fast:
        g = s.value.gpus.get(index)
        if isinstance(g, GpuFast) and (e := g.fields.get("energy")) is not None:
            out.append((s.t, e))
    return out


class Analyzer(Stage):
    """Working vs waiting, the bottleneck verdict and platform findings for every GPU."""

    name = names.DERIVED
    help = "Derived layer: state seconds, idle gaps, burstiness, verdicts and findings (reads other samplers)."
    default_interval = 1.0
    options = (
        Option("window", "duration", 15.0, "Classifier window: verdicts, burstiness and findings look this far back."),
        Option("hold", "duration", 3.0, "Hysteresis: a new verdict must hold this long before it replaces the old."),
        Option("deep-interval", "duration", 0.5, "Per-thread sampling interval while a GPU is waiting."),
        Option("deep-settled-interval", "duration", 5.0,
               "Per-thread sampling interval once every waiting GPU's verdict has held for the whole window "
               "(every host source then goes back to its quiet pace too; never longer than "
               "--collector.proc.threads-interval); --collector.derived.deep-interval again as soon as a verdict "
               "moves or another GPU starts waiting."),
        Option("stable-interval", "duration", 15.0,
               "How often a GPU whose verdict holds is evaluated again (its state and waiting seconds advance at "
               "each evaluation: at most this far behind). Each run (--collector.derived.interval) still checks "
               "its newest activity, and evaluates it at once when the activity moved; a GPU whose verdict "
               "changed within the window (or does not agree with its newest evidence) is evaluated every run. "
               f"Host-level findings are evaluated at least every {HOST_FINDINGS_S:g} s."),
        Option("steady-interval", "duration", 2.0,
               "How often the analyzer runs while every GPU is read at its steady rate (steadily busy or steadily "
               "idle: --collector.gpu.steady-interval) and none waits, and while every waiting GPU's verdict has "
               "held for the whole window: each run checks every GPU's newest activity (the tripwire), and a steady "
               "GPU's activity is read only once a second. The first run after a GPU dips, starts waiting or its "
               "verdict moves goes back to --collector.derived.interval; not shorter than that one."),
        Option("quiet-host", "bool", True,
               "While no GPU waits, read /proc/stat, PSI, diskstats, meminfo and the NFS counters every 2 s, the "
               "GPU processes' files every 5 s, the cpufreq and NUMA passes every 30 s and the per-thread pass "
               "every 60 s; their configured intervals again as soon as a GPU waits, until its verdict settles."),
    )

    def __init__(self, options: Mapping[str, Any], targets: Targets) -> None:
        self.targets = targets
        self.log = log.get_logger(collector=self.name)
        self.interval = float(options.get("interval", self.default_interval))
        self.window_s = float(options.get("window", 15.0))
        self.cpu_window_s = min(self.window_s, CPU_WINDOW_MAX)
        self.recent_s = max(3.0, self.window_s / 3)
        self.hold_s = float(options.get("hold", 3.0))
        self.stable_s = max(self.interval, float(options.get("stable-interval", 15.0)))
        self.host_s = max(self.interval, min(self.stable_s, HOST_FINDINGS_S))
        self.steady_run_s = max(self.interval, float(options.get("steady-interval", 2.0)))
        # Whether the newest run saw every GPU at its steady rate and none waiting, or every waiting GPU's
        # verdict settled (its pace: steady_run_s).
        self._steady = False
        self._waiting = False  # whether the newest full evaluation found a GPU waiting
        self._settled = False  # whether it found every waiting GPU's verdict held, agreed, for the window
        self.pacer = Pacer(CadencePolicy(deep_fast=float(options.get("deep-interval", 0.5)),
                                         deep_settled=float(options.get("deep-settled-interval", 5.0)),
                                         quiet_host=bool(options.get("quiet-host", True))), targets, self.log)
        self._engine: EngineReader | None = None
        self._last_t: float | None = None
        self._host_t = float("-inf")  # when the host findings were last evaluated
        self._shape: tuple[frozenset[int], frozenset[int]] | None = None  # the GPUs and lost GPUs seen last
        self._previous: DerivedState | None = None
        self._gpus: dict[GpuKey, _GpuState] = {}
        self._raised: set[tuple[str, str]] = set()
        self._captures: Mapping[int, CaptureNote] = {}  # the capture stage's newest per GPU, as last published

    @property
    def state(self) -> DerivedState | None:
        """The newest published state (what an UNCHANGED run leaves standing)."""
        return self._previous

    def bind(self, engine: EngineReader) -> None:
        """Read ``engine``'s buffers from now on (the pipeline calls this once the engine exists)."""
        self._engine = engine

    def samplers(self) -> list[SamplerSpec]:
        return [SamplerSpec(self.name, self.interval, self.update, blocking=False, pace=self._pace)]

    def _pace(self) -> float:
        """The analyzer's interval now (SamplerSpec.pace, asked after each of its runs)."""
        return self.steady_run_s if self._steady else self.interval

    # ---- evaluation --------------------------------------------------------------------------------------

    def _window(self, name: str, seconds: float, now: float) -> Sequence[Stamped[Any]]:
        assert self._engine is not None
        return tuple(self._engine.window(name, seconds, now))

    def windows(self, now: float) -> Windows:
        """Every window one evaluation reads, ending at ``now``."""
        assert self._engine is not None
        win = self.window_s
        deep = self._window(names.PROC_THREADS, self.cpu_window_s, now)
        if len(deep) < 2:
            deep = tuple(self._engine.history(names.PROC_THREADS))[-2:]
        return Windows(
            now=now, window_s=win, cpu_window_s=self.cpu_window_s, recent_s=self.recent_s,
            fast=self._window(names.GPU_FAST, win, now),
            buffered=self._window(names.GPU_SAMPLES, win, now),
            slow=self._window(names.GPU_SLOW, max(win, 11.0), now),
            procs=self._window(names.PROC, self.cpu_window_s, now),
            deep=deep,
            cpus=self._window(names.CPU, self.cpu_window_s, now),
            pcie=self._window(names.PCIE, win, now),
            memory=self._window(names.MEMORY, win, now),
            io=io_signals(self._window(names.PRESSURE, win, now), self._window(names.DISK, win, now),
                          self._window(names.NFS, win, now)),
            workload=self._window(names.WORKLOAD, win, now),
            nic=self._window(names.NIC, max(win, 11.0), now),
        )

    def update(self) -> DerivedState | Unchanged:
        if self._engine is None:
            raise NoDataError("analyzer not bound to an engine")
        eng = self._engine
        now = float(eng.now())
        snap = eng.snapshot
        identities: dict[int, Any] = {}
        lost: set[int] = set()
        for name in names.GPU_SAMPLERS:
            v = snap.value(name)
            if isinstance(v, GpuSample):
                identities.update(v.identities)
                lost |= v.lost
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        keys_of: dict[int, list[GpuKey]] = {}
        for idx in sorted(identities):
            ident: GpuIdentity = identities[idx]
            # A GPU in MIG mode is judged per instance; its platform findings once, for the physical GPU.
            keys_of[idx] = ([GpuKey(idx, m.gi) for m in ident.mig] if ident.mig_mode and ident.mig and idx not in lost
                            else [GpuKey(idx)])
            for key in keys_of[idx]:
                self._gpus.setdefault(key, _GpuState()).pending_s += dt
        due = {idx for idx in identities if self._due(idx, keys_of[idx], identities[idx], lost, now)}
        fast = snap.value(names.GPU_FAST)
        # The steady pace: every GPU read at its steady rate and none waiting; or, while GPUs wait, every waiting
        # verdict settled -- the evidence that found the cause is in, what follows only has to show it still
        # holds, which the tripwire checks at the steady pace as well (any move brings the 1 s runs back).
        paced = bool(identities) and not lost and isinstance(fast, GpuSample)
        all_steady = isinstance(fast, GpuSample) and fast.steady.issuperset(identities)  # read where paced
        self._steady = paced and ((not self._waiting and all_steady) or self._settled)
        shape = (frozenset(identities), frozenset(lost))
        captures = _captures(snap)
        if not due and shape == self._shape and self._previous is not None and now - self._host_t < self.host_s \
                and captures == self._captures:
            self.pacer.request_full(now)
            return UNCHANGED  # every verdict holds and no activity moved: the previous state stands
        self._shape = shape
        w = self.windows(now)
        bdf_index = {ident.pci_bus_id.lower(): i for i, ident in identities.items()}
        gpu_key = {str(i): i for i in identities} | bdf_index
        verdicts: dict[GpuKey, GpuVerdict] = {}
        activity: dict[GpuKey, GpuActivity] = {}
        blind: dict[GpuKey, str] = {}
        found: list[Finding] = []
        busy: list[int] = []
        any_waiting = False
        waiting_pids: set[int] = set()
        by_gpu = self.targets.by_gpu()
        fed = workloads(w.slow, identities, snap.value(names.WORKLOAD), snap.value(names.KUBERNETES)) if due else {}
        summaries: dict[int, WorkloadSummary] = {}
        for idx in sorted(identities):
            ident = identities[idx]
            keys = keys_of[idx]
            if idx in lost:
                found.append(fnd.gpu_lost(idx))
                st = self._gpus[GpuKey(idx)]
                st.settled, st.verdict, st.judged, st.pending_s, st.energy = None, None, None, 0.0, None
                activity[GpuKey(idx)] = self._activity(st, None, {})
                continue
            if idx not in due:  # stable: the last evaluation stands
                st = self._gpus[keys[0]]
                assert st.judged is not None and st.verdict is not None
                verdicts[keys[0]], activity[keys[0]] = st.verdict, st.judged.activity
                found.extend(st.judged.findings)
                if st.judged.workload is not None:
                    summaries[idx] = st.judged.workload
                if st.judged.busy:
                    busy.append(idx)
                continue
            views: list[GpuView] = []
            for key in keys:
                if key.mig is not None and (why := unjudged(idx, w, key.mig)) is not None:
                    blind[key] = why
                    continue
                st = self._gpus[key]
                prev = st.settled.cause if st.settled else None
                # The workload (process tree, cgroup, owner) is the whole GPU's: a MIG instance is judged on
                # its own processes' CPU evidence.
                wl = fed.get(idx) if key.mig is None else None
                ev = evaluate_gpu(idx, w, previous=prev, mig=key.mig, workload=wl)
                summary = None
                if wl is not None:
                    summary = WorkloadSummary(labels=wl.labels, processes=len(wl.members),
                                              cpu_cores=ev.shape.used_cores, capacity_cores=ev.shape.capacity_cores)
                    summaries[idx] = summary
                view, cand = ev.view, ev.candidate
                views.append(view)
                st.gaps.feed(view.shape_points)
                st.settled = settle(st.settled, cand.cause, now, self.hold_s)
                if st.settled.cause != prev:
                    self.log.info("verdict_changed", **key.labels(), cause=st.settled.cause, previous=prev,
                                  confidence=cand.confidence, waiting_ratio=round(cand.waiting_ratio, 3),
                                  evidence=cand.evidence[0] if cand.evidence else "")
                uuid = next((m.uuid for m in ident.mig if m.gi == key.mig), view.uuid)
                st.verdict = self._verdict(view, cand, st, uuid=uuid)
                verdicts[key] = st.verdict
                # The energy counter is the physical GPU's: not split among MIG instances.
                joules = (self._waiting_energy(st, energy_readings(w.fast, idx), view.util_points,
                                               dt=st.pending_s, now=now) if key.mig is None else None)
                self._account(st, view.util_points, cand, st.pending_s, now, joules=joules)
                st.pending_s, st.evaluated_t = 0.0, now
                pids: set[int] = set()
                if ev.waiting:
                    pids.update(view.pids)
                    if key.mig is None:
                        pids.update(by_gpu.get(str(idx), ()))
                    if wl is not None:
                        pids.update(wl.members)
                if ev.busy and idx not in busy:
                    busy.append(idx)
                found.extend(ev.findings)
                activity[key] = self._activity(st, view, ev.links)
                st.judged = _Judged(activity=activity[key], findings=tuple(ev.findings), workload=summary,
                                    busy=ev.busy, waiting=ev.waiting, waiting_pids=frozenset(pids),
                                    agreed=cand.cause == st.settled.cause and st.settled.pending is None,
                                    util=view.util, shape_mean=view.burst.mean,
                                    idle_ratio=view.burst.idle_ratio,
                                    processes=_nvml_pids(snap.value(names.GPU_SLOW), idx),
                                    health=_health(snap.value(names.GPU_SLOW), idx))
            if keys[0].mig is not None:
                gpu_found, links = mig_gpu_findings(idx, w, views)
                found.extend(gpu_found)
                for key in keys:
                    if key in activity:
                        activity[key] = dataclasses.replace(activity[key], links=MappingProxyType(dict(links)))
        settled = True  # every waiting GPU's verdict has held, agreed, for the whole window
        for key, st in self._gpus.items():
            if key.gpu in identities and key.gpu not in lost and st.judged is not None and st.judged.waiting:
                any_waiting = True
                waiting_pids.update(st.judged.waiting_pids)
                settled = settled and st.judged.agreed and st.settled is not None \
                    and now - st.settled.since >= self.window_s
        self._captures = captures
        verdicts, captured = with_captures(verdicts, captures)  # a capture's word (on the published copy only)
        found.extend(captured)
        found.extend(host_findings(w, snap.value(names.NUMA), snap.value(names.CPUFREQ), gpu_key, busy))
        self._host_t = now
        settled = any_waiting and settled
        self._waiting, self._settled = any_waiting, settled
        self._steady = paced and ((not any_waiting and all_steady) or settled)
        self.pacer.steer(eng, now, waiting=any_waiting, settled=settled, pids=frozenset(waiting_pids))
        self._log_findings(found)
        # A GPU missing from this evaluation (its sampler failed once, or it was unplugged) keeps its state:
        # its counters continue where they were if it comes back, instead of resetting. Bounded by the
        # number of GPUs (and MIG instances) the host ever had.
        self._previous = DerivedState(
            t=now, gpus=MappingProxyType({k.gpu: v for k, v in verdicts.items() if k.mig is None}),
            findings=tuple(found),
            activity=MappingProxyType({k.gpu: a for k, a in activity.items() if k.mig is None}),
            window_s=self.window_s,
            mig=MappingProxyType({k: v for k, v in verdicts.items() if k.mig is not None}),
            mig_activity=MappingProxyType({k: a for k, a in activity.items() if k.mig is not None}),
            unjudged=MappingProxyType(blind), workloads=MappingProxyType(summaries),
        )
        return self._previous

    def _due(self, idx: int, keys: Sequence[GpuKey], ident: GpuIdentity, lost: set[int], now: float) -> bool:
        """Whether GPU ``idx`` is evaluated in this run, or its last evaluation still stands.

        It stands while the GPU is stable -- its last evaluation agreed with the settled verdict, the verdict
        has not changed within the window, it was evaluated less than --stable-interval ago -- and its newest
        activity has not moved from what that evaluation saw. That holds for a waiting GPU too, once its
        cause has held for the window: its waiting seconds then advance at each evaluation (integrals, exact
        whenever they are read), its deep evidence keeps being sampled, and a change of shape or of the GPU's
        NVML processes (a job that ends, another that starts) trips it. A GPU
        in MIG mode (judged per instance), a lost one and a new one are evaluated every run."""
        if idx in lost or keys[0].mig is not None:
            return True
        st = self._gpus[keys[0]]
        j = st.judged
        if j is None or st.settled is None or not j.agreed:
            return True
        if now - st.evaluated_t >= self.stable_s - 1e-9 or now - st.settled.since < self.window_s:
            return True
        slow = self._engine.snapshot.value(names.GPU_SLOW) if self._engine else None
        if _nvml_pids(slow, idx) != j.processes:
            return True  # a job ended or another started: its verdict must not name the one that left
        if _health(slow, idx) != j.health:
            return True  # an Xid, an uncorrected ECC error, a row remap: its finding now, not a stable interval later
        return self._moved(idx, ident, j, st.evaluated_t, now)

    def _moved(self, idx: int, ident: GpuIdentity, j: _Judged, since: float, now: float) -> bool:
        """The tripwire (:func:`~exporter.derived.evaluate.activity_moved`) over the samples GPU ``idx`` had
        since ``since``, and at least over the recent part of the window the classifier judges alone
        (``recent_s``, 5 s by default; a few samples per GPU, not the window). One second of a bursty GPU swings
        by more than the tripwire's band from its window's mean by itself (two waiting GPUs were evaluated in
        full at nearly every run); a change of activity that holds moves the recent part past the band within a
        few seconds, well inside the time a verdict has to follow it."""
        assert self._engine is not None
        since = min(since, now - self.recent_s)
        lookback = now - since + 2.0  # one earlier sample of each counter, so the first new interval has a pair
        fast = self._engine.window(names.GPU_FAST, lookback, now)
        buffered = self._engine.window(names.GPU_SAMPLES, lookback, now)
        return activity_moved(fast, buffered, idx, gpm=bool(ident.gpm), start=since, now=now, util=j.util,
                              shape_mean=j.shape_mean, idle_ratio=j.idle_ratio)

    def _verdict(self, view: GpuView, cand: Candidate, st: _GpuState, *, uuid: str) -> GpuVerdict:
        """The settled verdict: the candidate's evidence when they agree, else the held one and why."""
        assert st.settled is not None
        if st.settled.cause == cand.cause or st.verdict is None:
            return GpuVerdict(view.index, uuid, cand.cause, cand.confidence, round(cand.waiting_ratio, 4),
                              cand.evidence, mig=view.mig)
        held = st.verdict
        note = f"holding {held.cause}: newest evidence points to {cand.cause} (needs {self.hold_s:.0f} s to switch)"
        return GpuVerdict(view.index, uuid, held.cause, round(held.confidence * 0.8, 2),
                          round(cand.waiting_ratio, 4), (*cand.evidence[:1], note), mig=view.mig)

    def _account(self, st: _GpuState, util: Sequence[Point], cand: Candidate, dt: float, now: float, *,
                 joules: float | None = None) -> None:
        """Split ``dt`` into working / waiting (by cause) / idle: counters exact at any scrape interval; the
        ``joules`` the GPU spent not working go with its waiting seconds."""
        if dt <= 0:
            return
        u = overlap_mean(util, now - dt, now)
        if u is None:
            u = max(0.0, 1.0 - cand.waiting_ratio) if cand.cause != "idle" else 0.0
        working = u * dt
        rest = dt - working
        st.state_seconds["working"] += working
        cause = st.verdict.cause if st.verdict is not None else cand.cause
        if cause == "idle":
            st.state_seconds["idle"] += rest
            self._attribute(st, None, 0.0, 0.0, now)  # an idle GPU's joules are not waiting joules
        else:
            st.state_seconds["waiting"] += rest
            self._attribute(st, cause if cause in WAITING_CAUSES else cand.waiting_cause, rest, joules or 0.0, now)

    def _attribute(self, st: _GpuState, cause: str | None, rest: float, joules: float, now: float) -> None:
        """Book ``rest`` waiting seconds to ``cause`` (None: none waited) -- once the settled verdict has held
        for the window. A window that spans a phase change mixes two phases' evidence, and its verdict in
        between (a few seconds of latency_bound between launch_bound and healthy) is the window's, not the
        GPU's: seconds are held back while the verdict is younger than the window, booked to it once it has
        held, and, when it is replaced before, to the last cause that held (at start, where none has, they wait
        for the first that holds). Exact, up to a window late (docs/derived.md). The joules spent waiting
        (``gpufeed_gpu_waiting_joules_total``) follow the seconds: held back and booked with them."""
        since = st.settled.since if st.settled is not None else None
        if since != st.accounted_since and st.deferred_s > 0 and st.booked is not None:
            st.waiting_seconds[st.booked] += st.deferred_s  # a verdict replaced before it held
            self._book_joules(st, st.booked, st.deferred_j)
            st.deferred_s = st.deferred_j = 0.0
        st.accounted_since = since
        young = since is not None and now - since < self.window_s - 1e-9
        if cause is not None:
            st.last_cause = cause
            if young:
                st.deferred_s += rest
                st.deferred_j += joules
                return
            st.waiting_seconds[cause] += st.deferred_s + rest
            self._book_joules(st, cause, st.deferred_j + joules)
            st.deferred_s, st.deferred_j, st.booked = 0.0, 0.0, cause
        elif not young and st.deferred_s > 0 and st.last_cause is not None:  # idle held: to the last cause seen
            st.waiting_seconds[st.booked or st.last_cause] += st.deferred_s
            self._book_joules(st, st.booked or st.last_cause, st.deferred_j)
            st.deferred_s = st.deferred_j = 0.0

    @staticmethod
    def _book_joules(st: _GpuState, cause: str, joules: float) -> None:
        if joules > 0:  # a cause's series appears with its first joule; a GPU without the counter has none
            st.waiting_joules[cause] = st.waiting_joules.get(cause, 0.0) + joules

    @staticmethod
    def _waiting_energy(st: _GpuState, readings: Sequence[tuple[float, float]], util: Sequence[Point], *,
                        dt: float, now: float) -> float | None:
        """The joules the GPU spent not working since the last energy reading accounted, over the same
        evaluation as the waiting seconds (``_account`` books them with those seconds, to the same cause, or
        drops them when the GPU was idle); None without an energy counter.

        Each interval between two energy readings (``readings``: the fast path's cumulative energy counter,
        NVML field 83, ascending) contributes its energy times the share of it the GPU was not working (1 -
        mean utilisation over the interval, from the same points as the waiting seconds; without them, the
        evaluation's own waiting share). So the joules are the integral of power over the waiting time, exact
        when power varies within an evaluation. A reading below the previous one (the counter restarted:
        driver reload, GPU reset, a re-enumerated GPU) only sets a new baseline: that interval's energy is
        unknown and not counted (the first evaluation starts at the newest reading before its interval). A GPU
        without the field has no readings: no joules, no series."""
        if not readings:
            return None
        if util:
            # Energy only as far as the utilisation points reach: an interval past them (a steady GPU's read that
            # carried the previous GPM pair, a buffered read still to come) would have no share to split it by,
            # and is booked at the next evaluation instead, when its points have come.
            end = util[-1].t + util[-1].dt + 1e-6
            n = len(readings)
            while n > 0 and readings[n - 1][0] > end:
                n -= 1
            if n == 0:
                return 0.0
            readings = readings[:n]
        last = st.energy
        if last is None or readings[-1][0] >= last[0]:
            st.energy = readings[-1]
        if dt <= 0:
            return 0.0
        if last is None:  # the first evaluation with a counter: from the newest reading before its interval
            last = next((r for r in reversed(readings) if r[0] <= now - dt), readings[0])
        share = None
        joules = 0.0
        # Only the points that reach into what is booked now: each interval's mean then scans these few, not the
        # whole window (a waiting GPU's 100 ms readings x 150 points a run).
        lo, hi = min(last[0], now - dt), max(now, readings[-1][0])
        util = [p for p in util if p.t + p.dt > lo and p.t < hi]
        for t, e in readings:
            if t <= last[0]:
                continue
            spent = e - last[1]
            if spent > 0:
                u = overlap_mean(util, last[0], t)
                if u is None:
                    if share is None:
                        w = overlap_mean(util, now - dt, now)
                        share = 1.0 - (0.0 if w is None else w)
                    frac = share
                else:
                    frac = 1.0 - u
                if frac > 0:
                    joules += spent * frac
            last = (t, e)
        return joules

    def _activity(self, st: _GpuState, view: GpuView | None, links: Mapping[str, bool]) -> GpuActivity:
        return GpuActivity(
            state_seconds=MappingProxyType(dict(st.state_seconds)),
            waiting_seconds=MappingProxyType(dict(st.waiting_seconds)),
            waiting_joules=MappingProxyType(dict(st.waiting_joules)),
            gap_buckets=tuple(st.gaps.counts),
            gap_seconds_sum=st.gaps.total,
            burstiness=None if view is None else view.burst.cv,
            idle_ratio=None if view is None or view.burst.span_s <= 0 else view.burst.idle_ratio,
            periodic_gaps=False if view is None else view.burst.periodic,
            links=MappingProxyType(dict(links)),
        )

    def _log_findings(self, found: Sequence[Finding]) -> None:
        """One event when a finding is raised and one when it clears (not one per evaluation)."""
        now = {(f.check, "" if f.gpu is None else str(f.gpu)): f for f in found}
        for key, f in now.items():
            if key not in self._raised:
                self.log.warning("finding_raised", check=f.check, gpu=key[1], severity=f.severity, detail=f.detail)
        for key in self._raised - set(now):
            self.log.info("finding_cleared", check=key[0], gpu=key[1])
        self._raised = set(now)

    # ---- exposition ---------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        d = snap.value(self.name)
        if isinstance(d, DerivedState):
            yield from derived_families(d)


def _captures(snap: Snapshot) -> Mapping[int, CaptureNote]:
    """Each GPU's newest capture (the capture stage's sample; {} when captures are off)."""
    stats = snap.value(names.CAPTURE)
    return stats.newest if isinstance(stats, CaptureStats) else {}


# The slow fields that only move when the GPU's memory is in trouble (corrected ECC errors tick on healthy boards).
_HEALTH_FIELDS = ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "remapped_rows_correctable",
                  "remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failure")


def _health(slow: object, idx: int) -> tuple[Any, ...]:
    """GPU ``idx``'s Xid counts and memory-health fields in the newest slow sample (() when none is there)."""
    g = slow.gpus.get(idx) if isinstance(slow, GpuSample) else None
    if not isinstance(g, GpuSlow):
        return ()
    return (tuple(sorted(g.xid_errors.items())), tuple(g.fields.get(k) for k in _HEALTH_FIELDS))


def _nvml_pids(slow: object, idx: int) -> frozenset[int]:
    """The pids NVML lists on GPU ``idx`` in the newest slow sample (empty when none is there)."""
    g = slow.gpus.get(idx) if isinstance(slow, GpuSample) else None
    return frozenset(p.pid for p in g.processes) if isinstance(g, GpuSlow) else frozenset()
