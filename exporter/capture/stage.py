"""The capture stage: watches the verdicts, starts a capture when a GPU has waited long enough, exports counts.

Built by :func:`exporter.pipeline.build` only with ``--capture.enabled`` (nothing of it exists otherwise), after
the analyzer, and bound to the engine like it. Its one sampler (``capture``, every second, on the event loop:
no I/O) reads the derived layer's newest evaluation from the snapshot and the GPU -> pids map from the
targets, asks :class:`~exporter.capture.trigger.Trigger` which GPUs are due, and starts the capture on a
thread of its own: py-spy samples for seconds, and the samplers keep their schedule meanwhile. Never more than
one capture runs at a time -- an automatic one due while another runs waits for the next check; an HTTP or
diagnose request gets "busy". Sample of what it exports::

    gpufeed_captures_total{gpu="3",trigger="verdict"} 2
    gpufeed_capture_last_timestamp_seconds 1.7812345e+09
    gpufeed_capture_cpu_seconds_total 1.42
    gpufeed_capture_in_progress 0
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import log, names
from exporter.capture import bundle
from exporter.capture.options import CaptureConfig
from exporter.capture.take import (
    TRIGGER_DIAGNOSE,
    TRIGGER_VERDICT,
    CaptureContext,
    CaptureOutcome,
    bundle_name,
    take,
)
from exporter.capture.trigger import Trigger, VerdictChange
from exporter.samples.capture import CaptureNote, CaptureStats
from exporter.samples.derived import DerivedState, GpuVerdict
from exporter.samples.gpu import GpuSample
from exporter.sampling import SamplerSpec, Stage, Targets
from exporter.snapshot import Snapshot, Stamped

_log = log.get_logger(component="capture")

CAPTURE = names.CAPTURE  # the stage and its sampler
CHECK_INTERVAL = 1.0
# The samplers whose window goes into a bundle (GPU samples filtered to the captured GPU) and whose newest
# sample is the host's facts.
WINDOW_SAMPLERS = (*names.GPU_SAMPLERS, names.PROC, names.PROC_THREADS, names.CPU, names.PRESSURE)
HOST_SAMPLERS = (names.PCIE, names.NUMA, names.CPUFREQ, names.WORKLOAD, names.MEMORY, names.KUBERNETES)
RECENT = 16  # outcomes kept for GET /captures
CLOSE_WAIT_S = 1.0  # the drain waits this long for a cancelled capture's bundle
# The verdict and verdict history a capture is taken for, as the trigger judged them.
Judged = tuple[GpuVerdict, tuple[VerdictChange, ...]]


class EngineView(Protocol):
    """What the stage reads of the engine."""

    @property
    def snapshot(self) -> Snapshot: ...

    def now(self) -> float: ...

    def window(self, name: str, seconds: float, now: float | None = None) -> Sequence[Stamped[Any]]: ...


class BusyError(Exception):
    """A capture is already running."""


class CaptureStage(Stage):
    """See the module docstring."""

    name = CAPTURE
    help = "Stacks and an evidence bundle of a GPU's workload when it waits (--capture.*)."
    default_enabled = False
    default_interval = CHECK_INTERVAL

    def __init__(self, config: CaptureConfig, targets: Targets, *, procfs: Path = Path("/proc"),
                 binary: str | None = None,
                 wall: Callable[[], float] = time.time) -> None:  # wall clock: names bundles, never paces
        self.config = config
        self.targets = targets
        self.procfs = procfs
        self.binary = binary
        self.wall = wall
        self.trigger = Trigger(config.after, config.interval)
        self._engine: EngineView | None = None
        self._lock = threading.Lock()  # held by the one running capture
        self._stats_lock = threading.Lock()
        self._total: dict[tuple[str, str], int] = {}
        self._last_wall: float | None = None
        self._cpu = 0.0
        self._recent: list[CaptureOutcome] = []
        self._newest: dict[int, CaptureNote] = {}  # each GPU's newest capture with stacks, while its verdict holds
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()  # the running capture's: set by close(), which kills its py-spy
        self._closed = False  # after close() nothing starts on its own thread (take() still runs when asked)

    def bind(self, engine: EngineView) -> None:
        """Read verdicts and samples from ``engine``."""
        self._engine = engine

    def samplers(self) -> list[SamplerSpec]:
        return [SamplerSpec(CAPTURE, CHECK_INTERVAL, self.check, blocking=False)]

    # ---- the trigger ---------------------------------------------------------------------------------------

    def _state(self) -> DerivedState | None:
        if self._engine is None:
            return None
        state = self._engine.snapshot.value(names.DERIVED)
        return state if isinstance(state, DerivedState) else None

    def _workloads(self, state: DerivedState) -> dict[int, tuple[str, ...]]:
        """Each GPU's workload key: its owner labels when known, else its processes."""
        by_gpu = self.targets.by_gpu()
        out: dict[int, tuple[str, ...]] = {}
        for gpu in state.gpus:
            w = state.workloads.get(gpu)
            labels = tuple(f"{k}={v}" for k, v in sorted(w.labels.items())) if w is not None else ()
            pids = tuple(f"pid={p}" for p in sorted(by_gpu.get(str(gpu), ())))
            out[gpu] = labels or pids
        return out

    def check(self) -> CaptureStats:
        """One look at the verdicts: start the capture that is due, if none runs."""
        state = self._state()
        if state is not None:
            self._forget_changed(state)
        if state is not None and self._engine is not None:
            now = self._engine.now()
            for due in self.trigger.observe(now, state.gpus, self._workloads(state)):
                if not self.targets.by_gpu().get(str(due.gpu)):
                    continue  # nothing to sample; due again once its processes are known
                # The verdict and history judged here go with it: by the time its thread gathers the rest, the
                # analyzer may have published a newer verdict, which the capture was not taken for.
                judged = (state.gpus[due.gpu], self.trigger.history(due.gpu))
                if self.start(due.gpu, TRIGGER_VERDICT, judged) is None:
                    break  # one is running: the others are due again at the next check
                self.trigger.captured(due.workload, now)
                _log.info("capture_started", gpu=due.gpu, cause=due.cause, waited_s=round(now - due.since, 1),
                          workload=",".join(due.workload))
        return self.stats()

    def _forget_changed(self, state: DerivedState) -> None:
        """A capture speaks for the verdict it was taken for: once the GPU's verdict changed, it is not its
        evidence any more (a later return to that cause does not bring it back)."""
        with self._stats_lock:
            for gpu, note in list(self._newest.items()):
                v = state.gpus.get(gpu)
                if v is None or v.cause != note.cause:
                    del self._newest[gpu]

    # ---- captures --------------------------------------------------------------------------------------------

    def context(self, gpu: int | None, trigger: str, judged: Judged | None = None) -> CaptureContext:
        """What the engine knows of ``gpu`` now (its pids, verdict, history, window and the host's facts); with
        ``judged``, the verdict and history the trigger decided on instead of the newest."""
        by_gpu = self.targets.by_gpu()
        pids = tuple(sorted(by_gpu.get(str(gpu), ()))) if gpu is not None else tuple(
            sorted(set().union(*by_gpu.values())) if by_gpu else ())
        if self._engine is None:
            return CaptureContext(gpu=gpu, trigger=trigger, pids=pids)
        snap = self._engine.snapshot
        now = self._engine.now()
        state = snap.value(names.DERIVED)
        state = state if isinstance(state, DerivedState) else None
        verdict: GpuVerdict | None
        if judged is not None:
            verdict, history = judged
        else:
            verdict = state.gpus.get(gpu) if state is not None and gpu is not None else None
            history = self.trigger.history(gpu) if gpu is not None else ()
        window = state.window_s if state is not None else 15.0
        samples = {n: [{"t": round(s.t - now, 3), "value": bundle.jsonable(_only(s.value, gpu))}
                       for s in self._engine.window(n, window, now)] for n in WINDOW_SAMPLERS}
        host = {n: bundle.jsonable(snap.value(n)) for n in HOST_SAMPLERS if snap.value(n) is not None}
        return CaptureContext(gpu=gpu, trigger=trigger, pids=pids, verdict=verdict, history=history,
                              samples={n: v for n, v in samples.items() if v}, host=host, now=now)

    def take(self, gpu: int | None, trigger: str) -> CaptureOutcome:
        """Capture now, on this thread; :class:`BusyError` when one is running."""
        if not self._lock.acquire(blocking=False):
            raise BusyError("a capture is running")
        try:
            self._cancel = threading.Event()
            return self._run(self.context(gpu, trigger))
        finally:
            self._lock.release()

    def take_waiting(self, trigger: str = TRIGGER_DIAGNOSE) -> list[CaptureOutcome]:
        """Capture, one after another on this thread, every GPU whose newest verdict waits and whose processes
        are known (``gpufeed diagnose --stacks`` after its sampling); [] when none waits. :class:`BusyError`
        when a capture is running."""
        state = self._state()
        by_gpu = self.targets.by_gpu()
        waiting = [] if state is None else [
            gpu for gpu, v in sorted(state.gpus.items()) if v.cause in names.WAITING_CAUSES and by_gpu.get(str(gpu))]
        return [self.take(gpu, trigger) for gpu in waiting]

    def start(self, gpu: int | None, trigger: str, judged: Judged | None = None) -> str | None:
        """Start a capture on a thread of its own (which also gathers the engine's context: nothing of it runs on
        the caller's thread, the event loop); its bundle's name, or None when one is running. ``judged``: see
        :meth:`context`."""
        if self._closed or not self._lock.acquire(blocking=False):
            return None
        self._cancel = threading.Event()
        wall = self.wall()

        def run() -> None:
            try:
                self._run(self.context(gpu, trigger, judged), wall)
            finally:
                self._lock.release()

        try:
            self._thread = threading.Thread(target=run, name="gpufeed-capture", daemon=True)
            self._thread.start()
        except Exception:
            self._lock.release()
            raise
        return bundle_name(wall, gpu, trigger)

    def _run(self, ctx: CaptureContext, wall: float | None = None) -> CaptureOutcome:
        wall = self.wall() if wall is None else wall
        cancel = self._cancel
        try:
            out = take(ctx, self.config, procfs=self.procfs, binary=self.binary, wall=wall, cancel=cancel)
        except Exception as e:  # a bug must not kill the thread silently nor leave the lock held
            _log.error("capture_failed", gpu=ctx.gpu, trigger=ctx.trigger, error=repr(e))
            raise
        with self._stats_lock:
            key = ("" if ctx.gpu is None else str(ctx.gpu), ctx.trigger)
            self._total[key] = self._total.get(key, 0) + 1
            self._last_wall = wall
            self._cpu += out.cpu_seconds
            self._recent = [*self._recent[-(RECENT - 1):], out]
            if ctx.gpu is not None and ctx.verdict is not None:
                if out.evidence and out.unavailable is None:
                    self._newest[ctx.gpu] = CaptureNote(ctx.gpu, out.name, ctx.verdict.cause, out.label,
                                                        out.evidence[0])
                else:  # no stacks this time: an older capture is not the newest word on this GPU
                    self._newest.pop(ctx.gpu, None)
        _log.info("capture_written", gpu=ctx.gpu, trigger=ctx.trigger, bundle=str(out.path), label=out.label,
                  unavailable=out.unavailable, error=out.error, cpu_s=round(out.cpu_seconds, 3))
        return out

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the running capture's thread (tests, stop)."""
        t = self._thread
        if t is not None:
            t.join(timeout)

    def close(self) -> None:
        """The engine stops: kill a running py-spy (its bundle says "cancelled") and wait a moment for the
        thread to write it; nothing starts on its own thread after this (diagnose --stacks still calls take()
        once its sampling has stopped the engine)."""
        self._closed = True
        self._cancel.set()
        self.wait(CLOSE_WAIT_S)

    @property
    def running(self) -> bool:
        return self._lock.locked()

    def stats(self) -> CaptureStats:
        with self._stats_lock:
            return CaptureStats(MappingProxyType(dict(self._total)), self._last_wall, self._cpu, self.running,
                                MappingProxyType(dict(self._newest)))

    def listing(self) -> dict[str, Any]:
        """GET /captures: the bundles on disk (oldest first) and the recent outcomes."""
        with self._stats_lock:
            recent = [o.as_json() for o in self._recent]
        return {"dir": str(self.config.dir), "running": self.running,
                "bundles": [{"name": b.name, "bytes": b.bytes} for b in bundle.bundles(self.config.dir)],
                "recent": recent}

    # ---- exposition --------------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        s = snap.value(CAPTURE)
        if not isinstance(s, CaptureStats):
            return
        total = CounterMetricFamily("gpufeed_captures", "Captures of a GPU's workload (stacks and evidence bundle), "
                                    "by GPU and what triggered them (verdict, http, diagnose).",
                                    labels=["gpu", "trigger"])
        for (gpu, trigger), n in sorted(s.total.items()):
            total.add_metric([gpu, trigger], float(n))
        yield total
        if s.last_wall is not None:
            yield GaugeMetricFamily("gpufeed_capture_last_timestamp_seconds",
                                    "Unix time the newest capture started (its bundle's name starts with it).",
                                    value=s.last_wall)
        yield CounterMetricFamily("gpufeed_capture_cpu_seconds", "CPU time the captures used: py-spy's and the "
                                  "capture thread's.", value=s.cpu_seconds)
        yield GaugeMetricFamily("gpufeed_capture_in_progress", "1 while a capture runs.", value=float(s.running))


def _only(value: Any, gpu: int | None) -> Any:
    """A GPU sample narrowed to the captured GPU (its identity and its per-GPU value); others unchanged."""
    if gpu is None or not isinstance(value, GpuSample):
        return value
    return {"identity": value.identities.get(gpu), "gpu": value.gpus.get(gpu), "lost": gpu in value.lost}
