"""The stateful glue of the derived layer: reads the engine's buffers, calls the pure functions in
``exporter.derived``, keeps the counters and the hysteresis, and exports the derived metric families.

It is a collector with one non-blocking sampler (``derived``, every second): its ``update`` reads only
in-memory ring buffers, so it runs on the event loop. Everything it decides is in ``exporter.derived``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter import linkmath
from exporter.collectors.base import Collector, CollectorContext, NoDataError, Option, SamplerSpec, TargetPids
from exporter.derived import findings as fnd
from exporter.derived.gpuview import GpuView, gpu_view
from exporter.derived.hostshape import CPU_WINDOW_MAX, cpu_shape, io_signals
from exporter.derived.series import IDLE_LEVEL, Point, bucket_counts, gaps
from exporter.derived.verdict import WAITING_LEAVE, Candidate, Settled, classify, settle
from exporter.samples.derived import (
    GAP_BUCKETS,
    STATES,
    VERDICTS,
    WAITING_CAUSES,
    DerivedState,
    Finding,
    GpuActivity,
    GpuVerdict,
)
from exporter.samples.gpu import GpuSample
from exporter.samples.topology import PcieSample
from exporter.snapshot import Snapshot, Stamped

THREADS_SAMPLER = "proc_threads"
GPU_SAMPLERS = ("gpu", "gpu_samples", "gpu_slow")
# When the mean activity of the last third of the window differs from the whole window's by this much,
# the condition changed inside the window and the recent part is judged alone (fast onset detection).
ONSET_CHANGE = 0.25


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


@dataclass
class _GpuState:
    """Per-GPU mutable state: counters, hysteresis, gap tracking, the last verdict."""

    state_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    waiting_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAITING_CAUSES, 0.0))
    gaps: _GapTracker = field(default_factory=_GapTracker)
    settled: Settled | None = None
    verdict: GpuVerdict | None = None


def _overlap_mean(points: Sequence[Point], start: float, end: float) -> float | None:
    """Time-weighted mean activity over the part of [start, end) the points cover."""
    tot = w = 0.0
    for p in points:
        a, b = max(start, p.t), min(end, p.t + p.dt)
        if b > a:
            tot += p.value * (b - a)
            w += b - a
    return tot / w if w > 0 else None


def _since(window: Sequence[Stamped[Any]], start: float) -> Sequence[Stamped[Any]]:
    return tuple(s for s in window if s.t >= start)


def _since_keep2(window: Sequence[Stamped[Any]], start: float) -> Sequence[Stamped[Any]]:
    """Samples since ``start``, but at least the newest two (deep samples may be seconds apart)."""
    out = _since(window, start)
    return out if len(out) >= 2 else tuple(window)[-2:]


def work_onset(util: Sequence[Point], start: float, now: float) -> float | None:
    """When work started, if the window opens with an idle stretch of at least 2 s that is also at least
    twice the longest idle gap after it (so batch gaps of a bursty job are not mistaken for an onset)."""
    t_on = next((p.t for p in util if p.value >= IDLE_LEVEL), None)
    if t_on is None or t_on - max(start, util[0].t if util else start) < 2.0 or now - t_on < 1.0:
        return None
    longest = max((g.seconds for g in gaps([p for p in util if p.t >= t_on])), default=0.0)
    return t_on if t_on - start >= 2 * longest else None


class Analyzer(Collector):
    """Working vs waiting, the bottleneck verdict and platform findings for every GPU."""

    name = "derived"
    help = "Derived layer: state seconds, idle gaps, burstiness, verdicts and findings (reads other samplers)."
    default_interval = 1.0
    options = (
        Option("window", "duration", 15.0, "Classifier window: verdicts, burstiness and findings look this far back."),
        Option("hold", "duration", 3.0, "Hysteresis: a new verdict must hold this long before it replaces the old."),
        Option("deep-interval", "duration", 0.5, "Per-thread sampling interval while a GPU is waiting."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.window_s = float(ctx.options.get("window", 15.0))
        self.cpu_window_s = min(self.window_s, CPU_WINDOW_MAX)
        self.recent_s = max(3.0, self.window_s / 3)
        self.hold_s = float(ctx.options.get("hold", 3.0))
        self.deep_fast = float(ctx.options.get("deep-interval", 0.5))
        self._engine: Any = None
        self._deep_slow: float | None = None
        self._focus: frozenset[int] | None = None
        self._full_t: float | None = None  # when the last full deep pass was requested while focused
        self._last_t: float | None = None
        self._gpus: dict[int, _GpuState] = {}
        self._raised: set[tuple[str, str]] = set()

    def samplers(self) -> list[SamplerSpec]:
        return [SamplerSpec(self.name, self.interval, self.update, blocking=False)]

    # ---- evaluation --------------------------------------------------------------------------------------

    def _window(self, name: str, seconds: float, now: float) -> Sequence[Stamped[Any]]:
        return tuple(self._engine.window(name, seconds, now))

    def update(self) -> DerivedState:
        if self._engine is None:
            self._engine = self.ctx.shared.get("engine")
            if self._engine is None:
                raise NoDataError("no engine in the collector context (analyzer not wired)")
        eng = self._engine
        now = float(eng.clock.now())
        win = self.window_s
        fast = self._window("gpu", win, now)
        buffered = self._window("gpu_samples", win, now)
        slow = self._window("gpu_slow", max(win, 11.0), now)
        procs = self._window("proc", self.cpu_window_s, now)
        deep = self._window(THREADS_SAMPLER, self.cpu_window_s, now)
        if len(deep) < 2:
            deep = tuple(eng.history(THREADS_SAMPLER))[-2:]
        cpus = self._window("cpu", self.cpu_window_s, now)
        pcie: Sequence[Stamped[PcieSample]] = self._window("pcie", win, now)
        io = io_signals(self._window("pressure", win, now), self._window("disk", win, now),
                        self._window("nfs", win, now))
        snap = eng.snapshot
        identities: dict[int, Any] = {}
        lost: set[int] = set()
        for name in GPU_SAMPLERS:
            v = snap.value(name)
            if isinstance(v, GpuSample):
                identities.update(v.identities)
                lost |= v.lost
        bdf_index = {ident.pci_bus_id.lower(): i for i, ident in identities.items()}
        gpu_key = {str(i): i for i in identities} | bdf_index
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        verdicts: dict[int, GpuVerdict] = {}
        activity: dict[int, GpuActivity] = {}
        found: list[Finding] = []
        busy: list[int] = []
        any_waiting = False
        waiting_pids: set[int] = set()
        by_gpu = self.ctx.targets.by_gpu()
        for idx in sorted(identities):
            st = self._gpus.setdefault(idx, _GpuState())
            if idx in lost:
                found.append(fnd.gpu_lost(idx))
                st.settled, st.verdict = None, None
                activity[idx] = self._activity(st, None, {})
                continue
            view = gpu_view(idx, fast, buffered, slow)
            util_pts = view.util_points
            st.gaps.feed(view.shape_points)
            judged, span = view, win
            onset = work_onset(util_pts, now - win, now)
            recent = _overlap_mean(util_pts, now - self.recent_s, now)
            if onset is not None:
                # Work started inside the window after a long idle stretch: judge only since it started,
                # so a half-idle, half-busy window is not mistaken for a GPU that waits.
                span = max(1.0, now - onset)
                judged = self._recent_view(idx, fast, buffered, slow, now=now, span=span)
            elif recent is not None and view.util is not None and abs(recent - view.util) >= ONSET_CHANGE:
                # The activity changed within the window (work stopped or collapsed): judge the recent part.
                span = self.recent_s
                judged = self._recent_view(idx, fast, buffered, slow, now=now, span=span)
            shape = cpu_shape(
                procs if span == win else _since(procs, now - span),
                deep if span == win else _since_keep2(deep, now - span),
                cpus if span == win else _since(cpus, now - span), view.pids)
            capacity, link_name = self._capacity(view, pcie)
            prev = st.settled.cause if st.settled else None
            cand = classify(judged, shape, io, capacity=capacity, link_name=link_name, window_s=span,
                            previous=prev)
            st.settled = settle(st.settled, cand.cause, now, self.hold_s)
            if st.settled.cause != prev:
                self.log.info("verdict_changed", gpu=idx, cause=st.settled.cause, previous=prev,
                              confidence=cand.confidence, waiting_ratio=round(cand.waiting_ratio, 3),
                              evidence=cand.evidence[0] if cand.evidence else "")
            st.verdict = self._verdict(view, cand, st)
            verdicts[idx] = st.verdict
            self._account(st, util_pts, cand, dt, now)
            if cand.cause != "idle" and cand.waiting_ratio >= WAITING_LEAVE:
                any_waiting = True
                waiting_pids.update(view.pids)
                waiting_pids.update(by_gpu.get(str(idx), ()))
            if (view.util or 0.0) >= fnd.BUSY_UTIL:
                busy.append(idx)
            links = fnd.chain_links(pcie, view.bdf) if pcie else fnd.nvml_links(slow, idx, view.bdf)
            down = fnd.link_downgrades(view, links, util_pts)
            for _bdf, sev, detail in down:
                found.append(Finding("pcie_link_downgraded", idx, sev, detail))
            flags = dict.fromkeys({ls.bdf for ls in links}, False) | {b: True for b, _, _ in down}
            activity[idx] = self._activity(st, view, flags)
            for f in (fnd.pcie_errors(view, pcie), fnd.clock_throttled(view)):
                if f is not None:
                    found.append(f)
        found.extend(fnd.numa_mismatch(snap.value("numa"), gpu_key))
        for f2 in (
            fnd.governor_powersave(snap.value("cpufreq"), busy),
            fnd.memory_pressure(self._window("memory", win, now), io),
            fnd.nfs_retransmissions(io, win),
        ):
            if f2 is not None:
                found.append(f2)
        self._adapt_depth(any_waiting, frozenset(waiting_pids), now)
        self._log_findings(found)
        self._last_t = now
        # A GPU missing from this evaluation (its sampler failed once, or it was unplugged) keeps its state:
        # its counters continue where they were if it comes back, instead of resetting. Bounded by the
        # number of GPUs the host ever had.
        return DerivedState(
            t=now, gpus=MappingProxyType(verdicts), findings=tuple(found),
            activity=MappingProxyType(activity), window_s=win,
        )

    def _recent_view(
        self, idx: int, fast: Sequence[Stamped[GpuSample]], buffered: Sequence[Stamped[GpuSample]],
        slow: Sequence[Stamped[GpuSample]], *, now: float, span: float,
    ) -> GpuView:
        start = now - span
        return gpu_view(idx, _since(fast, start), _since(buffered, start - 1.0), slow)

    def _capacity(self, view: GpuView, pcie: Sequence[Stamped[PcieSample]]) -> tuple[float | None, str]:
        """Achievable bytes/s of the GPU's *current* link (NVML first, sysfs otherwise) and its name."""
        gen, width = view.link_gen, view.link_width
        if (gen is None or width is None) and pcie:
            dev = pcie[-1].value.devices.get(view.bdf)
            if dev is not None and dev.link is not None and dev.link.current_speed_gts is not None:
                gen = fnd.GEN_BY_GTS.get(float(dev.link.current_speed_gts))
                width = dev.link.current_width
        if gen is None or width is None:
            return None, ""
        try:
            return linkmath.capacity_bytes_per_second(gen, width), f"Gen{gen} x{width}"
        except ValueError:
            return None, ""

    def _verdict(self, view: GpuView, cand: Candidate, st: _GpuState) -> GpuVerdict:
        """The settled verdict: the candidate's evidence when they agree, else the held one and why."""
        assert st.settled is not None
        if st.settled.cause == cand.cause or st.verdict is None:
            return GpuVerdict(view.index, view.uuid, cand.cause, cand.confidence, round(cand.waiting_ratio, 4),
                              cand.evidence)
        held = st.verdict
        note = f"holding {held.cause}: newest evidence points to {cand.cause} (needs {self.hold_s:.0f} s to switch)"
        return GpuVerdict(view.index, view.uuid, held.cause, round(held.confidence * 0.8, 2),
                          round(cand.waiting_ratio, 4), (*cand.evidence[:1], note))

    def _account(self, st: _GpuState, util: Sequence[Point], cand: Candidate, dt: float, now: float) -> None:
        """Split ``dt`` into working / waiting (by cause) / idle: counters exact at any scrape interval."""
        if dt <= 0:
            return
        u = _overlap_mean(util, now - dt, now)
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

    def _adapt_depth(self, waiting: bool, pids: frozenset[int], now: float) -> None:
        """Per-thread sampling fast while a GPU waits, and only of the waiting GPUs' processes ``pids``; back
        to every process at the configured interval otherwise.

        While focused, one full pass is still requested every configured interval, so the other GPUs keep
        the per-thread evidence (a launch-bound GPU's hot thread) they had before any GPU waited."""
        samplers = getattr(self._engine, "samplers", {})
        s = samplers.get(THREADS_SAMPLER)
        if s is not None and self._deep_slow is None:
            self._deep_slow = float(s.interval)
        focus = pids if waiting else None
        if focus != self._focus:
            self.ctx.targets.set_focus(focus)
            if self._focus is None:
                self._full_t = now  # the passes up to now were full
            self._focus = focus
            self.log.debug("deep_focus_changed", sampler=THREADS_SAMPLER,
                           pids=",".join(map(str, sorted(focus))) if focus is not None else "all")
        if focus is not None and self._deep_slow is not None and self._full_t is not None \
                and now - self._full_t >= self._deep_slow:
            self.ctx.targets.request_full()
            self._full_t = now
        if s is None or self._deep_slow is None:
            return
        want = min(self.deep_fast, self._deep_slow) if waiting else self._deep_slow
        if s.interval != want:
            self._engine.set_interval(THREADS_SAMPLER, want)
            self.log.debug("deep_sampling_changed", sampler=THREADS_SAMPLER, interval=want, waiting=waiting)

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
            "Seconds each GPU spent waiting, attributed to the cause the classifier saw at the time.",
            labels=["gpu", "cause"])
        bottleneck = GaugeMetricFamily(
            "gpufeed_gpu_bottleneck", f"Current verdict per GPU, one-hot over causes (window {w}, hysteresis).",
            labels=["gpu", "cause"])
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
            f"1 when the GPU's idle gaps over the last {w} recur at a regular period (batch boundaries).",
            labels=["gpu"])
        down = GaugeMetricFamily(
            "gpufeed_pcie_link_downgraded",
            f"1 when this hop of the GPU's PCIe chain ran below its maximum while the GPU was busy (last {w}).",
            labels=["gpu", "bdf"])
        finding = GaugeMetricFamily(
            "gpufeed_finding", "1 for each platform finding currently raised; gpu=\"\" for host-wide ones.",
            labels=["check", "gpu"])
        for idx, a in sorted(d.activity.items()):
            g = str(idx)
            for s in STATES:
                state.add_metric([g, s], a.state_seconds.get(s, 0.0))
            for c in WAITING_CAUSES:
                waiting.add_metric([g, c], a.waiting_seconds.get(c, 0.0))
            cum, buckets = 0, []
            for le, n in zip((*map(str, GAP_BUCKETS), "+Inf"), a.gap_buckets, strict=True):
                cum += n
                buckets.append((le, float(cum)))
            gaps.add_metric([g], buckets, a.gap_seconds_sum)
            if a.burstiness is not None:
                burst.add_metric([g], a.burstiness)
            if a.idle_ratio is not None:
                idle.add_metric([g], a.idle_ratio)
                periodic.add_metric([g], 1.0 if a.periodic_gaps else 0.0)
            for bdf, flag in sorted(a.links.items()):
                down.add_metric([g, bdf], 1.0 if flag else 0.0)
        for idx, v in sorted(d.gpus.items()):
            for c in VERDICTS:
                bottleneck.add_metric([str(idx), c], 1.0 if v.cause == c else 0.0)
            confidence.add_metric([str(idx)], v.confidence)
        for key in sorted({(f.check, "" if f.gpu is None else str(f.gpu)) for f in d.findings}):
            finding.add_metric(list(key), 1.0)
        yield from (state, waiting, bottleneck, confidence, gaps, burst, idle, periodic, down, finding)


def attach(collectors: list[Collector], settings: Any = None) -> Analyzer | None:
    """Append an Analyzer to ``collectors`` (sharing their context's ``shared`` dict) unless one is there
    or it is disabled in ``settings``; returns it. Call :func:`wire` once the Engine exists."""
    if any(isinstance(c, Analyzer) for c in collectors):
        return next(c for c in collectors if isinstance(c, Analyzer))
    options: Mapping[str, Any] = {}
    if settings is not None:
        if not settings.enabled.get(Analyzer.name, True):
            return None
        options = settings.collector.get(Analyzer.name, {})
    base = collectors[0].ctx if collectors else None
    ctx = CollectorContext(
        procfs=base.procfs if base else (settings.procfs if settings is not None else Path("/proc")),
        sysfs=base.sysfs if base else (settings.sysfs if settings is not None else Path("/sys")),
        options=options,
        targets=base.targets if base else TargetPids(),
        shared=base.shared if base else {},
    )
    analyzer = Analyzer(ctx)
    collectors.append(analyzer)
    return analyzer


def wire(collectors: list[Collector], engine: Any) -> None:
    """Give the analyzers among ``collectors`` the engine whose buffers they read."""
    for c in collectors:
        if isinstance(c, Analyzer):
            c.ctx.shared["engine"] = engine
