"""The stateful part of the derived layer: reads the engine's buffers through a typed reader, calls the pure
per-GPU evaluation (:mod:`exporter.derived.evaluate`), keeps the counters, the hysteresis and the idle-gap
tracking, steers deep sampling, and exports the derived metric families.

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

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

from exporter import log, names
from exporter.derived import findings as fnd
from exporter.derived.evaluate import (
    Windows,
    evaluate_gpu,
    host_findings,
    mig_gpu_findings,
    overlap_mean,
    unjudged,
)
from exporter.derived.gpuview import GpuView, activity_points
from exporter.derived.hostshape import io_signals
from exporter.derived.series import IDLE_LEVEL, Point, bucket_counts
from exporter.derived.verdict import Candidate, Settled, settle
from exporter.derived.workload import LABELS as WORKLOAD_LABELS
from exporter.derived.workload import workloads
from exporter.names import STATES, VERDICTS, WAITING_CAUSES
from exporter.samples.derived import GAP_BUCKETS, DerivedState, Finding, GpuActivity, GpuVerdict, WorkloadSummary
from exporter.samples.gpu import GpuIdentity, GpuKey, GpuSample
from exporter.sampling import CPU_WINDOW_MAX, UNCHANGED, NoDataError, Option, SamplerSpec, Stage, Targets, Unchanged
from exporter.snapshot import Snapshot, Stamped

# The tripwire of a stable GPU (see Analyzer._moved): activity this far from what the last evaluation saw
# evaluates the GPU at once instead of at its next --stable-interval. A tenth of the GPU's time: well above
# the jitter of a steady GPU's readings, well below the drop of a GPU that starts to wait.
TRIP_ACTIVITY = 0.1
# Host-level findings (numa_mismatch, memory_pressure, a powersave governor, link downgrades) are evaluated at
# least this often while every GPU stands; a shorter --stable-interval evaluates them at that pace. A stable
# GPU's evaluation every 10 s (its counters at most that far behind, its verdict still tripped at once by its
# activity) is half of what 5 s cost -- ~8 ms of CPU per run on an 8-GPU host; the host findings alone are
# well under a millisecond, and keep the 5 s they had.
HOST_FINDINGS_S = 5.0
# Host samplers slowed while no GPU waits (DESIGN.md "Sampling that pays only for what it learns"), and their
# slow interval; back to the configured one as soon as an evaluation sees a GPU waiting. A configured interval
# slower than this is kept. Counters and rate() stay exact: /proc/stat jiffies and PSI's total stall time are
# cumulative, so a longer interval loses resolution, never time. What the verdict of a waiting GPU needs --
# the CPU shape and PSI over the classifier's window -- comes at the configured rates again within one slow
# interval of the onset (2 s: the shape compares the ends of its <= 12 s window, which a pair 2 s apart gives
# as well as one 1 s apart, and a /proc/stat pass on a 192-CPU host costs ~2 ms of CPU); the 30 s passes
# (cpufreq governors, NUMA placement) feed findings of a working GPU from their newest sample, and are read at
# their configured rate as soon as the GPU waits. Per-thread reads serve waiting GPUs (DESIGN.md: deep
# evidence on demand): while none waits a pass every 60 s keeps the pair a GPU's first evaluation after its
# onset starts from and the process-thread series (a pass over 8 x 150 threads costs ~35 ms of CPU: 0.12%
# of a core at 30 s); the onset brings --collector.derived.deep-interval within the next run. The PCIe chain
# (5 s) is not slowed: pcie_link_downgraded judges the hops upstream of a GPU over the classifier's window
# (15 s), which a 30 s pass would leave empty half of the time -- the series of those hops would come and go.
# The GPU processes' own counters (proc, 1 s) go to 5 s: CPU time and I/O are cumulative, the CPU shape takes
# the ends of its 10 s window, and NUMA placement and the process series read the newest sample.
QUIET_INTERVALS = {
    names.CPU: 2.0, names.PRESSURE: 2.0, names.PROC: 5.0,
    names.PROC_THREADS: 60.0, names.CPUFREQ: 30.0, names.NUMA: 30.0,
}
# Of those, the ones back at their quiet pace while GPUs wait once their verdicts have settled.
SETTLED_QUIET = frozenset({names.CPU, names.PRESSURE})


class EngineReader(Protocol):
    """What the analyzer needs of the engine: its clock, its buffers, the newest snapshot, and the interval
    of the deep sampler (which it shortens while a GPU waits)."""

    @property
    def snapshot(self) -> Snapshot: ...

    def now(self) -> float: ...

    def window(self, name: str, seconds: float, now: float | None = None) -> Sequence[Stamped[Any]]: ...

    def history(self, name: str) -> Sequence[Stamped[Any]]: ...

    def interval(self, name: str) -> float | None: ...

    def set_interval(self, name: str, interval: float) -> None: ...


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


@dataclass
class _GpuState:
    """Per-GPU mutable state: counters, hysteresis, gap tracking, the last verdict."""

    state_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    waiting_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAITING_CAUSES, 0.0))
    gaps: _GapTracker = field(default_factory=_GapTracker)
    settled: Settled | None = None
    verdict: GpuVerdict | None = None
    judged: _Judged | None = None
    evaluated_t: float = float("-inf")
    pending_s: float = 0.0  # seconds elapsed since the counters were last split into states


class Analyzer(Stage):
    """Working vs waiting, the bottleneck verdict and platform findings for every GPU."""

    name = names.DERIVED
    help = "Derived layer: state seconds, idle gaps, burstiness, verdicts and findings (reads other samplers)."
    default_interval = 1.0
    options = (
        Option("window", "duration", 15.0, "Classifier window: verdicts, burstiness and findings look this far back."),
        Option("hold", "duration", 3.0, "Hysteresis: a new verdict must hold this long before it replaces the old."),
        Option("deep-interval", "duration", 0.5, "Per-thread sampling interval while a GPU is waiting."),
        Option("deep-settled-interval", "duration", 2.0,
               "Per-thread sampling interval once every waiting GPU's verdict has held for the whole window "
               "(/proc/stat and PSI then go back to their quiet 2 s too); --collector.derived.deep-interval "
               "again as soon as a verdict moves or another GPU starts waiting."),
        Option("stable-interval", "duration", 10.0,
               "How often a GPU whose verdict holds is evaluated again (its state and waiting seconds advance at "
               "each evaluation: at most this far behind). Each run (--collector.derived.interval) still checks "
               "its newest activity, and evaluates it at once when the activity moved; a GPU whose verdict "
               "changed within the window (or does not agree with its newest evidence) is evaluated every run. "
               f"Host-level findings are evaluated at least every {HOST_FINDINGS_S:g} s."),
        Option("quiet-host", "bool", True,
               "While no GPU waits, read /proc/stat and PSI every 2 s, the cpufreq and NUMA passes every 30 s "
               "and the per-thread pass every 60 s; their configured intervals again as soon as a GPU waits."),
    )

    def __init__(self, options: Mapping[str, Any], targets: Targets) -> None:
        self.targets = targets
        self.log = log.get_logger(collector=self.name)
        self.interval = float(options.get("interval", self.default_interval))
        self.window_s = float(options.get("window", 15.0))
        self.cpu_window_s = min(self.window_s, CPU_WINDOW_MAX)
        self.recent_s = max(3.0, self.window_s / 3)
        self.hold_s = float(options.get("hold", 3.0))
        self.deep_fast = float(options.get("deep-interval", 0.5))
        self.deep_settled = float(options.get("deep-settled-interval", 2.0))
        self.stable_s = max(self.interval, float(options.get("stable-interval", 10.0)))
        self.host_s = max(self.interval, min(self.stable_s, HOST_FINDINGS_S))
        self.quiet_host = bool(options.get("quiet-host", True))
        self._configured: dict[str, float] = {}  # host sampler -> its configured interval, learnt at first sight
        self._engine: EngineReader | None = None
        self._deep_slow: float | None = None
        self._focus: frozenset[int] | None = None
        self._full_t: float | None = None  # when the last full deep pass was requested while focused
        self._last_t: float | None = None
        self._host_t = float("-inf")  # when the host findings were last evaluated
        self._shape: tuple[frozenset[int], frozenset[int]] | None = None  # the GPUs and lost GPUs seen last
        self._previous: DerivedState | None = None
        self._gpus: dict[GpuKey, _GpuState] = {}
        self._raised: set[tuple[str, str]] = set()

    @property
    def state(self) -> DerivedState | None:
        """The newest published state (what an UNCHANGED run leaves standing)."""
        return self._previous

    def bind(self, engine: EngineReader) -> None:
        """Read ``engine``'s buffers from now on (the pipeline calls this once the engine exists)."""
        self._engine = engine

    def samplers(self) -> list[SamplerSpec]:
        return [SamplerSpec(self.name, self.interval, self.update, blocking=False)]

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
        shape = (frozenset(identities), frozenset(lost))
        if not due and shape == self._shape and self._previous is not None and now - self._host_t < self.host_s:
            self._request_full(now)
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
                st.settled, st.verdict, st.judged, st.pending_s = None, None, None, 0.0
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
                self._account(st, view.util_points, cand, st.pending_s, now)
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
                                    idle_ratio=view.burst.idle_ratio)
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
        found.extend(host_findings(w, snap.value(names.NUMA), snap.value(names.CPUFREQ), gpu_key, busy))
        self._host_t = now
        settled = any_waiting and settled
        self._adapt_depth(any_waiting, frozenset(waiting_pids), now, settled)
        self._adapt_host(any_waiting, settled)
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
        whenever they are read), its deep evidence keeps being sampled, and a change of shape trips it. A GPU
        in MIG mode (judged per instance), a lost one and a new one are evaluated every run."""
        if idx in lost or keys[0].mig is not None:
            return True
        st = self._gpus[keys[0]]
        j = st.judged
        if j is None or st.settled is None or not j.agreed:
            return True
        if now - st.evaluated_t >= self.stable_s - 1e-9 or now - st.settled.since < self.window_s:
            return True
        return self._moved(idx, ident, j, st.evaluated_t, now)

    def _moved(self, idx: int, ident: GpuIdentity, j: _Judged, since: float, now: float) -> bool:
        """The tripwire: whether GPU ``idx``'s activity since ``since`` differs from its last evaluation's.

        A dip, a gap or new work shows as the new stretch's mean utilisation, mean activity (the burstiness
        points: SM activity with GPM) or idle share leaving the window's by more than ``TRIP_ACTIVITY``; the
        check reads only the samples taken since (a few per GPU), not the window."""
        assert self._engine is not None
        lookback = now - since + 2.0  # one earlier sample of each counter, so the first new interval has a pair
        fast = self._engine.window(names.GPU_FAST, lookback, now)
        buffered = self._engine.window(names.GPU_SAMPLES, lookback, now)
        util, shape = activity_points(fast, buffered, idx, bool(ident.gpm))
        recent = [p for p in shape if p.t + p.dt > since]
        if not recent:
            return False
        span = sum(p.dt for p in recent)
        if span <= 0:
            return False
        mean = sum(p.value * p.dt for p in recent) / span
        idle = sum(p.dt for p in recent if p.value < IDLE_LEVEL) / span
        new_util = overlap_mean(util, since, now)
        return (abs(mean - j.shape_mean) > TRIP_ACTIVITY or abs(idle - j.idle_ratio) > TRIP_ACTIVITY
                or (new_util is not None and abs(new_util - (j.util or 0.0)) > TRIP_ACTIVITY))

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

    def _account(self, st: _GpuState, util: Sequence[Point], cand: Candidate, dt: float, now: float) -> None:
        """Split ``dt`` into working / waiting (by cause) / idle: counters exact at any scrape interval."""
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
        else:
            st.state_seconds["waiting"] += rest
            wc = cause if cause in WAITING_CAUSES else cand.waiting_cause
            st.waiting_seconds[wc] += rest

    def _activity(self, st: _GpuState, view: GpuView | None, links: Mapping[str, bool]) -> GpuActivity:
        return GpuActivity(
            state_seconds=MappingProxyType(dict(st.state_seconds)),
            waiting_seconds=MappingProxyType(dict(st.waiting_seconds)),
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

    def _adapt_depth(self, waiting: bool, pids: frozenset[int], now: float, settled: bool = False) -> None:
        """Per-thread sampling fast while a GPU waits, and only of the waiting GPUs' processes ``pids``; back
        to every process at the configured interval otherwise. Once every waiting GPU's verdict has held for
        the window (``settled``), at --collector.derived.deep-settled-interval: the evidence that found the
        cause is in, what follows only has to show it still holds (or moves, which unsettles it again).

        While focused, one full pass is still requested every configured interval, so the other GPUs keep
        the per-thread evidence (a launch-bound GPU's hot thread) they had before any GPU waited."""
        assert self._engine is not None
        current = self._engine.interval(names.PROC_THREADS)
        if current is not None and self._deep_slow is None:
            self._deep_slow = current
        focus = pids if waiting else None
        if focus != self._focus:
            self.targets.set_focus(focus)
            if self._focus is None:
                self._full_t = now  # the passes up to now were full
            self._focus = focus
            self.log.debug("deep_focus_changed", sampler=names.PROC_THREADS,
                           pids=",".join(map(str, sorted(focus))) if focus is not None else "all")
        self._request_full(now)
        if current is None or self._deep_slow is None:
            return
        if not waiting:
            want = self._quiet(names.PROC_THREADS, self._deep_slow)
        else:
            want = min(max(self.deep_fast, self.deep_settled) if settled else self.deep_fast, self._deep_slow)
        if current != want:
            self._engine.set_interval(names.PROC_THREADS, want)
            self.log.debug("deep_sampling_changed", sampler=names.PROC_THREADS, interval=want, waiting=waiting)

    def _request_full(self, now: float) -> None:
        """While deep sampling is focused, ask for a full pass as often as passes run while no GPU waits
        (also from a run whose evaluations all still stand): the working GPUs' per-thread evidence stays as
        fresh as it was, and no fresher -- every 5 s, a pass over all eight processes of an 8-GPU host was
        ~1% of a core while two GPUs waited."""
        if self._focus is not None and self._deep_slow is not None and self._full_t is not None \
                and now - self._full_t >= self._quiet(names.PROC_THREADS, self._deep_slow):
            self.targets.request_full()
            self._full_t = now

    def _quiet(self, name: str, configured: float) -> float:
        """Sampler ``name``'s interval while no GPU waits."""
        return max(configured, QUIET_INTERVALS[name]) if self.quiet_host else configured

    def _adapt_host(self, waiting: bool, settled: bool = False) -> None:
        """Host samplers at their quiet intervals while no GPU waits; configured again once one does (the
        per-thread sampler is steered by :meth:`_adapt_depth`). /proc/stat and PSI go back to their quiet
        pace once the waiting verdicts have settled: the CPU shape compares a window's ends, the finer pace
        is what detection needs, at the onset."""
        assert self._engine is not None
        for name in QUIET_INTERVALS:
            if name == names.PROC_THREADS:
                continue
            current = self._engine.interval(name)
            if current is None:
                continue  # that collector is off
            configured = self._configured.setdefault(name, current)
            quiet = not waiting or (settled and name in SETTLED_QUIET)
            want = self._quiet(name, configured) if quiet else configured
            if current != want:
                self._engine.set_interval(name, want)
                self.log.debug("host_sampling_changed", sampler=name, interval=want, waiting=waiting)

    # ---- exposition ---------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        d = snap.value(self.name)
        if not isinstance(d, DerivedState):
            return
        w = f"{d.window_s:.0f} s"
        state = CounterMetricFamily(
            "gpufeed_gpu_state_seconds",
            "Seconds each GPU spent working (a kernel resident), waiting (work submitted, GPU idle) or idle "
            "(no work submitted); rate() is exact over any range.", labels=["gpu", "state"])
        waiting = CounterMetricFamily(
            "gpufeed_gpu_waiting_seconds",
            "Seconds each GPU spent waiting, attributed to the cause the classifier saw at the time; a cause "
            "appears with its first waiting second.",
            labels=["gpu", "cause"])
        bottleneck = GaugeMetricFamily(
            "gpufeed_gpu_bottleneck", f"Current verdict per GPU (window {w}, hysteresis): one series, value 1, "
            "labelled with the current cause; the other causes are absent (not 0).", labels=["gpu", "cause"])
        confidence = GaugeMetricFamily(
            "gpufeed_gpu_bottleneck_confidence", "Confidence 0..1 in the current verdict.", labels=["gpu"])
        gaps = HistogramMetricFamily(
            "gpufeed_gpu_idle_gap_seconds",
            "Length of each completed idle stretch of a GPU between bursts of activity (SM activity with GPM, "
            "utilisation otherwise).", labels=["gpu"])
        burst = GaugeMetricFamily(
            "gpufeed_gpu_burstiness_ratio",
            f"Coefficient of variation of GPU activity over the last {w} (0 steady, above 1 bursty).",
            labels=["gpu"])
        idle = GaugeMetricFamily(
            "gpufeed_gpu_idle_ratio", f"Share of the last {w} the GPU was idle (activity below 5%).", labels=["gpu"])
        periodic = GaugeMetricFamily(
            "gpufeed_gpu_idle_gaps_periodic",
            f"1 when the GPU's idle gaps over the last {w} recur at a regular period (batch boundaries); absent "
            "otherwise.",
            labels=["gpu"])
        down = GaugeMetricFamily(
            "gpufeed_pcie_link_downgraded",
            f"1 while this hop of the GPU's PCIe chain runs below its maximum while the GPU is busy (last {w}); "
            "absent for the hops that do not.",
            labels=["gpu", "bdf"])
        finding = GaugeMetricFamily(
            "gpufeed_finding", "1 for each platform finding currently raised; gpu=\"\" for host-wide ones.",
            labels=["check", "gpu"])
        links_done: set[int] = set()
        acts = {GpuKey(i): a for i, a in d.activity.items()} | dict(d.mig_activity)
        for key, a in sorted(acts.items()):
            lab = key.labels()  # a MIG instance's series carry mig next to gpu
            for s in STATES:
                _sample(state, "_total", {**lab, "state": s}, a.state_seconds.get(s, 0.0))
            for c in WAITING_CAUSES:
                # A cause appears with its first waiting second (the series budget: five zeros a GPU otherwise);
                # rate() and increase() over it are exact from its second sample on.
                if (secs := a.waiting_seconds.get(c, 0.0)) > 0.0:
                    _sample(waiting, "_total", {**lab, "cause": c}, secs)
            cum = 0
            for le, n in zip((*map(str, GAP_BUCKETS), "+Inf"), a.gap_buckets, strict=True):
                cum += n
                _sample(gaps, "_bucket", {**lab, "le": le}, float(cum))
            _sample(gaps, "_count", lab, float(cum))
            _sample(gaps, "_sum", lab, a.gap_seconds_sum)
            if a.burstiness is not None:
                _sample(burst, "", lab, a.burstiness)
            if a.idle_ratio is not None:
                _sample(idle, "", lab, a.idle_ratio)
                if a.periodic_gaps:  # a flag: 1 or absent (the series budget)
                    _sample(periodic, "", lab, 1.0)
            if key.gpu not in links_done:  # the PCIe chain is the physical GPU's: once per GPU
                links_done.add(key.gpu)
                # Downgraded hops only (the series budget): every hop of the chain is judged, and `== 1`, the
                # alert and the fleet report read the ones that hold.
                for bdf, flag in sorted(a.links.items()):
                    if flag:
                        down.add_metric([str(key.gpu), bdf], 1.0)
        for key, v in d.verdicts().items():
            # The active value only (DESIGN.md series budget): 1 series instead of one per verdict; a change of
            # verdict ends one series and starts another, which `== 1`, `count by (cause)` and `or` read alike.
            assert v.cause in VERDICTS, v.cause
            _sample(bottleneck, "", {**key.labels(), "cause": v.cause}, 1.0)
            _sample(confidence, "", key.labels(), v.confidence)
        for check_gpu in sorted({(f.check, "" if f.gpu is None else str(f.gpu)) for f in d.findings}):
            finding.add_metric(list(check_gpu), 1.0)
        yield from (state, waiting, bottleneck, confidence, gaps, burst, idle, periodic, down, finding)
        yield from workload_families(d)


def workload_families(d: DerivedState) -> Iterator[Metric]:
    """gpufeed_workload_info (one series per GPU, labels only when known) and the workload's CPU."""
    info = Metric("gpufeed_workload_info",
                  "Who owns the GPU's workload (value 1), one series per GPU: container_id, slurm_job_id and unit from "
                  "the cgroup path; namespace, pod and container from the kubelet's pod-resources API. A label is "
                  "present only when known. Join: * on (job, instance, gpu) group_left(namespace) ...", "gauge")
    cores = GaugeMetricFamily("gpufeed_workload_cpu_cores",
                              "CPU the GPU's workload used over the CPU window (cores).", labels=["gpu"])
    cap = GaugeMetricFamily("gpufeed_workload_cpu_capacity_cores",
                            "CPU the GPU's workload may use: the smaller of its cpuset (allowed CPUs) and its CFS "
                            "quota (cores).", labels=["gpu"])
    for idx, wl in sorted(d.workloads.items()):
        g = str(idx)
        info.add_sample("gpufeed_workload_info",
                        {"gpu": g, **{k: wl.labels[k] for k in WORKLOAD_LABELS if k in wl.labels}}, 1.0)
        if wl.cpu_cores is not None:
            cores.add_metric([g], wl.cpu_cores)
        if wl.capacity_cores is not None:
            cap.add_metric([g], wl.capacity_cores)
    yield from (info, cores, cap)


def _sample(family: Metric, suffix: str, labels: Mapping[str, str], value: float) -> None:
    """Append one sample with its own label set (``mig`` only on a MIG instance's series)."""
    family.samples.append(Sample(family.name + suffix, dict(labels), float(value), None))
