"""The sampling engine: runs every sampler at its own interval, keeps bounded history, publishes snapshots.

Blocking samplers (every collector's reads) run on one sampler thread with a schedule of its own: it sleeps
until the next tick of the grid every interval shares (multiples of each interval from the engine's start),
runs every sampler due then in turn, shortest interval first, and records the results itself. The event loop
is not involved: one wake-up of one thread per tick, where handing each call to a worker and back cost two
thread wake-ups, a loop future and a few callbacks per call (~70 us of CPU a wake-up measured on a 2-CPU VM;
a throwaway experiment running every sampler inline took 0.7-1.7 points of a core off the two-waiting
benchmark). Non-blocking samplers (the derived layer, pure CPU over the buffers) run on the event loop.

A slow read (a hung NFS mount behind /proc, a wedged driver call) never stalls the other samplers or the HTTP
server. A watchdog thread looks at the sampler thread ``PATIENCE`` after each tick starts: one still inside
the same call then is replaced -- a fresh thread takes over the schedule and runs what is due, and the old
one, when its call returns, records that result and ends. A hung read therefore delays the samplers due
with it by ``PATIENCE`` and never fails them. A sampler never blocks forever: each call has a deadline
(``DEADLINE_INTERVALS`` x its interval, at least ``DEADLINE_MIN``). Past it the engine stops waiting, records
the sampler as failed (``gpufeed_collector_success`` 0, its samples dropped from exposition,
``gpufeed_sampler_last_success_timestamp_seconds`` frozen), and the thread -- a Python thread cannot be
killed -- is left to finish the call on its own. A sampler whose abandoned call is still blocked is not
called again until that call returns (a second call would block on the same hung source and pile up
threads); its ticks are counted as failed overruns meanwhile. Never more than ``1 + MAX_ABANDONED`` sampler
threads exist (``gpufeed_sampler_abandoned_threads`` counts the stuck calls); with every one of them stuck,
samplers due wait, and fail once they have waited a deadline.

``alive()`` (``/healthz``) keeps reporting the engine, not the sources: a sampler whose ticks keep being
handled is alive even while its source is blocked -- that is ``gpufeed_collector_success 0`` and
``GpufeedSamplesStale``, not a restart (a process with a thread in uninterruptible sleep cannot even exit
until the read returns).

Engine state (buffers, statuses, intervals, the schedule) is guarded by one lock: the sampler thread records
under it, the event loop reads windows and snapshots under it. Time comes from an injectable clock: the
daemon uses the monotonic clock (or scenario time under ``--simulate-speed``), tests and ``diagnose
--scenario`` a virtual one -- with a virtual clock every sampler runs inline (``inline=True``), as threads
cannot wait for virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from exporter import log
from exporter.sampling import (
    BUFFER_MAX_SAMPLES,
    HISTORY_DEFAULT,
    UNCHANGED,
    CollectorError,
    NoDataError,
    SamplerSpec,
    Stage,
)
from exporter.snapshot import SamplerStatus, Snapshot, Stamped

_log = log.get_logger(component="engine")

# Restart backoff of a crashed sampler: doubles per crash up to the max; reset after a quiet period.
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
BACKOFF_RESET = 300.0
# A call may take this long before it counts as stuck: DEADLINE_INTERVALS of its sampler's interval, and never
# less than DEADLINE_MIN (a first nvmlInit on a host without persistence mode takes seconds).
DEADLINE_MIN = 5.0
DEADLINE_INTERVALS = 5.0
# Threads that may be left inside slow or abandoned calls beside the sampler thread: never more than
# 1 + MAX_ABANDONED sampler threads exist.
MAX_ABANDONED = 8
# A tick this late (and far later than any call may take) means the process or the host did not run: a VM
# pause, SIGSTOP. Its ticks are not "overruns" of a slow sampler; the gap is logged once instead.
GAP_MIN = 30.0
# A sampler thread still inside one call this long is replaced by a fresh one, which runs what is due: a slow
# or blocked read delays the samplers due with it by this much, never more.
PATIENCE = 0.1
# The watchdog's longest sleep (it is woken early by schedule changes and by stop).
WATCH_MAX = 1.0
# Samples a buffer keeps whatever their age: the newest pair, for a sampler slower than its horizon.
KEEP_MIN = 2


class DeadlineExceededError(CollectorError):
    """A sampler call did not return within its deadline (a blocked read); the sampler is marked failed."""


class _Runner:
    """One sampler thread: its thread and the call it is inside (None between calls)."""

    __slots__ = ("current", "thread")

    def __init__(self) -> None:
        self.current: _Call | None = None
        self.thread: threading.Thread | None = None


class _Call:
    """One sampler call in flight: the thread running it, when it started (monotonic seconds, and the engine's
    clock), and whether it was abandoned at its deadline."""

    __slots__ = ("abandoned", "runner", "started", "t")

    def __init__(self, runner: _Runner, t: float) -> None:
        self.runner = runner
        self.started = time.monotonic()
        self.t = t
        self.abandoned = False


class Clock(Protocol):
    """Monotonic seconds and a way to wait for a point in time."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class RealClock:
    """Monotonic wall time."""

    def now(self) -> float:
        return time.monotonic()

    def delay(self, t: float) -> float:
        """Real seconds until ``t`` (what a thread waits for it)."""
        return t - time.monotonic()

    async def sleep_until(self, t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class VirtualClock:
    """Time that moves only when told to; ``advance`` wakes sleepers in time order.

    Used by tests of the asyncio scheduler and by anything that must run faster than real time.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = start
        self._seq = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        """Jump to ``t`` without waking sleepers (for synchronous drivers)."""
        self._t = t

    async def sleep_until(self, t: float) -> None:
        if t <= self._t:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (t, next(self._seq), fut))
        await fut

    async def advance(self, dt: float) -> None:
        """Move time forward by ``dt``, waking each sleeper at its own time and letting it run."""
        end = self._t + dt
        while True:
            for _ in range(5):  # let woken or new tasks run their (inline) sampler and re-arm their sleep
                await asyncio.sleep(0)
            if not self._sleepers or self._sleepers[0][0] > end:
                break
            t, _, fut = heapq.heappop(self._sleepers)
            self._t = max(self._t, t)
            if not fut.done():
                fut.set_result(None)
        self._t = end


@dataclass
class Sampler:
    """Runtime state of one sampler (mutable; only the engine touches it, under its lock)."""

    spec: SamplerSpec
    collector: str
    buffer: deque[Stamped[Any]]
    interval: float
    horizon: float  # seconds of samples kept (the buffer's maxlen bounds their count too)
    next_due: float = 0.0
    success: bool = False
    available: bool = True
    duration: float = 0.0
    runs: int = 0
    overruns: int = 0
    failures: int = 0
    restarts: int = 0
    last_run: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    # On a sampler thread: the call in flight, and the one abandoned at its deadline and still running (no new
    # call meanwhile) with when it started.
    running: _Call | None = None
    blocked: _Call | None = None
    blocked_since: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the threads that ran it (time.thread_time), all runs
    # Crash restarts on a sampler thread: the next backoff and when the last crash was.
    backoff: float = BACKOFF_START
    crashed_at: float = -math.inf
    # On the event loop: its task, whether that task is asleep until next_due, and whether set_interval has
    # woken it early.
    task: asyncio.Task[None] | None = None
    sleeping: bool = False
    nudged: bool = False

    def status(self) -> SamplerStatus:
        return SamplerStatus(
            name=self.spec.name,
            collector=self.collector,
            interval=self.interval,
            success=self.success,
            available=self.available,
            duration=self.duration,
            runs=self.runs,
            overruns=self.overruns,
            failures=self.failures,
            restarts=self.restarts,
            last_run=self.last_run,
            last_success=self.last_success,
            error=self.last_error,
            cpu_seconds=self.cpu_seconds,
        )


class Engine:
    """Schedules the samplers of the given stages and publishes an immutable :class:`Snapshot`."""

    def __init__(
        self,
        stages: Iterable[Stage],
        clock: Clock | None = None,
        *,
        history_seconds: float = HISTORY_DEFAULT,
        inline: bool = False,
        on_publish: Callable[[], None] | None = None,
        min_deadline: float = DEADLINE_MIN,
        max_abandoned: int = MAX_ABANDONED,
    ) -> None:
        self.clock: Clock = clock or RealClock()
        self.stages = list(stages)
        self.history_seconds = history_seconds
        self.inline = inline
        self.min_deadline = min_deadline
        self.deadline_intervals = DEADLINE_INTERVALS
        self.max_abandoned = max_abandoned
        self._on_publish = on_publish
        self._delay: Callable[[float], float] | None = getattr(self.clock, "delay", None)
        if not inline and self._delay is None:
            raise TypeError(f"{type(self.clock).__name__} has no real-time delay(): sampler threads cannot wait "
                            "for it; use inline=True")
        self._gap_logged_at = -math.inf
        self.samplers: dict[str, Sampler] = {}
        for c in self.stages:
            for spec in c.samplers():
                if spec.name in self.samplers:
                    raise ValueError(f"sampler {spec.name!r} defined twice")
                self.samplers[spec.name] = Sampler(
                    spec=spec, collector=c.name, buffer=deque(maxlen=self._buffer_len(spec.interval, spec.history)),
                    interval=spec.interval, horizon=self._horizon(spec.history),
                )
        # Samplers that say their own interval (SamplerSpec.pace), by stage: asked after each run of the stage.
        self._paced: dict[str, list[Sampler]] = {}
        for each in self.samplers.values():
            if each.spec.pace is not None:
                self._paced.setdefault(each.collector, []).append(each)
        # Blocking samplers run on the sampler thread (unless inline); the others on the event loop.
        self._threaded = [] if inline else [s for s in self.samplers.values() if s.spec.blocking]
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._runner: _Runner | None = None
        self._threads = 0  # sampler threads alive: the runner and replaced ones still inside a call
        self._watchdog: threading.Thread | None = None
        self._seq = itertools.count(1)
        self._version = 0
        self._latest: dict[str, Stamped[Any]] = {}
        self._snapshot = Snapshot(version=0, t=self.clock.now())
        self._stale = False  # a sampler ran since _snapshot was built: build it again when it is read
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._started_at: float | None = None
        self.batches = 0  # sampler-thread wake-ups that ran more than one sampler (tests)

    def _horizon(self, history: float | None) -> float:
        """Seconds of samples a sampler keeps: its own horizon when it declares a shorter one than
        --engine.history."""
        return self.history_seconds if history is None else min(self.history_seconds, history)

    def _buffer_len(self, interval: float, history: float | None = None) -> int:
        # Bounded by count: enough samples to cover the horizon at the interval, never fewer than 16, never more
        # than BUFFER_MAX_SAMPLES. The horizon bounds it by time as well (_trim): a sampler slowed down keeps its
        # seconds, not its count -- the GPU fast path's 302 samples sized for 100 ms would hold 5 minutes at its
        # steady 1 s.
        return max(16, min(BUFFER_MAX_SAMPLES, math.ceil(self._horizon(history) / interval) + 2))

    def deadline(self, s: Sampler) -> float:
        """How long one call of ``s`` may take before it is abandoned (its spec's, else the default rule)."""
        if s.spec.deadline is not None:
            return s.spec.deadline
        return max(self.min_deadline, self.deadline_intervals * s.interval)

    @property
    def abandoned_threads(self) -> int:
        """Sampler threads stuck in calls that passed their deadline."""
        return sum(1 for s in self._threaded if s.blocked is not None)

    # ---- read side (any thread) ----------------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The newest snapshot: every sampler's newest sample and status as of the last run.

        Built when read, not at every run (25 runs a second on an 8-GPU host; a reader -- the renderer, the
        analyzer -- looks once a second or once a scrape)."""
        with self._lock:
            if self._stale:
                self._stale = False
                self._snapshot = Snapshot(
                    version=self._version,
                    t=self.clock.now(),
                    latest=MappingProxyType(dict(self._latest)),
                    status=MappingProxyType({n: s.status() for n, s in self.samplers.items()}),
                    abandoned_threads=self.abandoned_threads,
                )
            return self._snapshot

    @property
    def version(self) -> int:
        """The newest published version (what :attr:`snapshot` would have); cheap, and safe to read from any
        thread (an int replaced at each publish)."""
        return self._version

    def history(self, name: str) -> Sequence[Stamped[Any]]:
        """Every buffered sample of sampler ``name``, oldest first."""
        s = self.samplers.get(name)
        if s is None:
            return ()
        with self._lock:
            return tuple(s.buffer)

    def window(self, name: str, seconds: float, now: float | None = None) -> Sequence[Stamped[Any]]:
        """Buffered samples of ``name`` taken within the last ``seconds``."""
        now = self.clock.now() if now is None else now
        start = now - seconds
        s = self.samplers.get(name)
        if s is None:
            return ()
        # From the newest back (a buffer is in time order): the cost is the window's, not the buffer's -- the
        # tripwire reads a few seconds of a 1,200-sample GPU buffer for every GPU every second.
        out = []
        with self._lock:
            for x in reversed(s.buffer):
                if x.t < start:
                    break
                out.append(x)
        out.reverse()
        return tuple(out)

    def now(self) -> float:
        """The engine's clock."""
        return self.clock.now()

    def interval(self, name: str) -> float | None:
        """Sampler ``name``'s current interval, or None when there is no such sampler."""
        s = self.samplers.get(name)
        return None if s is None else s.interval

    def _grid(self, t: float, interval: float, *, before: bool = False) -> float:
        """The first tick of ``interval`` at or after ``t`` (the last at or before it with ``before``) on the
        grid every sampler shares -- multiples of its interval from the engine's start --, so that samplers due
        together run in one wake-up."""
        origin = self._started_at
        if origin is None or interval <= 0:
            return t
        k = (t - origin) / interval
        return origin + (math.floor(k + 1e-6) if before else math.ceil(k - 1e-6)) * interval

    def set_interval(self, name: str, interval: float) -> None:
        """Change a sampler's interval from its next run on (adaptive depth); any thread, but a sampler on the
        event loop is woken early only when called there."""
        s = self.samplers[name]
        with self._lock:
            if interval == s.interval:
                return
            s.interval = interval
            # The sooner of the old due time and one new interval after the last run -- but not before now: the
            # new interval's ticks since the last run (a 60 s quiet pace shortened to 0.5 s 40 s after its last
            # pass) were never due, and counting them as missed (_advance) would report overruns, or a "VM
            # paused" gap, that no run caused.
            now = self.clock.now()
            due = min(s.next_due, max(self._grid((s.last_run or now) + interval, interval),
                                      self._grid(now, interval, before=True)))
            moved = due < s.next_due
            s.next_due = due
            want = self._buffer_len(interval, s.spec.history)
            if s.buffer.maxlen is not None and s.buffer.maxlen < want:
                s.buffer = deque(s.buffer, maxlen=want)
            if moved and s in self._threaded:
                self._cond.notify_all()  # the sampler thread sleeps until the old due time
                return
        if moved and s.sleeping and s.task is not None and not s.nudged:
            s.nudged = True
            s.task.cancel()  # wake it: it sleeps again until the new due time (_sleep_until_due)

    def alive(self, now: float | None = None) -> bool:
        """True while every sampler task and thread is running and none is stuck far past its interval."""
        now = self.clock.now() if now is None else now
        if not self._stopping:
            if self._tasks and any(t.done() for t in self._tasks):
                return False
            if self._watchdog is not None and not self._watchdog.is_alive():
                return False
        for s in self.samplers.values():
            started = self._started_at if self._started_at is not None else now
            ref = s.last_run if s.last_run is not None else started
            if now - ref > max(10 * s.interval, 30.0):
                return False
        return True

    # ---- recording (under the lock) ------------------------------------------------------------------------

    def _record(self, s: Sampler, started: float, value: Any, error: BaseException | None, took: float) -> None:
        """Store the outcome of one run of ``s`` and publish a new snapshot (under the lock)."""
        s.runs += 1
        s.duration = took
        s.last_run = self.clock.now()
        name = s.spec.name
        if s.collector in self._paced:
            self._repace(s.collector)
        if error is None and value is UNCHANGED:
            # The newest sample still stands: a success, nothing new to buffer, render or publish.
            s.success, s.available, s.last_error = True, True, None
            s.last_success = started
            self._overran(s, took)
            return
        if error is None:
            if s.runs > 1 and not s.success and s.available:
                _log.info("collector_recovered", collector=s.collector, sampler=name)
            s.success, s.available, s.last_error = True, True, None
            s.last_success = started
            stamped = Stamped(started, value)
            s.buffer.append(stamped)
            self._trim(s, started)
            self._latest[name] = stamped
            log.forget(("sampler_failed", name))
            log.forget(("sampler_nodata", name))
        elif isinstance(error, NoDataError):
            s.success, s.available, s.last_error = False, False, str(error)
            self._latest.pop(name, None)
            if log.once(("sampler_nodata", name)):
                _log.info("collector_not_available", collector=s.collector, sampler=name, reason=str(error))
        else:
            s.success, s.available = False, True
            s.failures += 1
            s.last_error = f"{type(error).__name__}: {error}"
            # A failing source exports no made-up values: drop its newest sample from exposition.
            self._latest.pop(name, None)
            if log.once(("sampler_failed", name)):
                expected = isinstance(error, CollectorError | OSError | ValueError)
                _log.error(
                    "collector_failed", collector=s.collector, sampler=name, error=s.last_error,
                    exc_info=None if expected else error,
                )
        if error is not None:
            # Logged and summarised: drop its traceback. The traceback's frames reach back (f_back) to the frame
            # of the tick that holds the error, a reference cycle only the cycle collector frees -- one per failed
            # run (the kubernetes sampler on a host without a kubelet fails every run), whose frames it then
            # clears inside a collection.
            error.__traceback__ = None
        self._overran(s, took)
        self._publish()

    def _trim(self, s: Sampler, now: float) -> None:
        """Drop the samples older than ``s``'s horizon, keeping the newest ``KEEP_MIN`` whatever their age (a
        sampler slower than its horizon still has a pair to take differences of). Memory follows the sampling
        rate: a sampler back at a slow pace gives back what its fast pace held."""
        buf = s.buffer
        oldest = now - s.horizon
        while len(buf) > KEEP_MIN and buf[0].t < oldest:
            buf.popleft()

    def _overran(self, s: Sampler, took: float) -> None:
        """Count the ticks a run that took ``took`` real seconds overran. None on a virtual clock: no virtual
        time passes during a call, so no tick is missed -- and a deterministic run (a golden, a scenario
        diagnosis) must not show overruns because the machine running it was busy."""
        if took > s.interval and self._delay is not None:
            s.overruns += int(took // s.interval)

    def _repace(self, stage: str) -> None:
        """Apply the interval each paced sampler of ``stage`` wants now (a bad answer keeps the current one)."""
        for p in self._paced[stage]:
            assert p.spec.pace is not None
            try:
                want = float(p.spec.pace())
            except Exception as e:
                if log.once(("sampler_pace_failed", p.spec.name)):
                    _log.error("sampler_pace_failed", sampler=p.spec.name, error=repr(e), exc_info=e)
                continue
            if want > 0 and math.isfinite(want) and want != p.interval:
                self.set_interval(p.spec.name, want)

    def _publish(self) -> None:
        """A new version exists; the snapshot itself is built when it is next read. ``on_publish`` runs on the
        thread that recorded (the daemon's is thread-safe and cheap: exporter/pacing.py)."""
        self._version += 1
        self._stale = True
        if self._on_publish is not None:
            self._on_publish()

    def _still_blocked(self, s: Sampler) -> None:
        """A tick skipped because the sampler's abandoned call has not returned: failed, counted, published."""
        s.success = False
        s.last_error = (f"DeadlineExceededError: previous call still blocked after "
                        f"{self.clock.now() - s.blocked_since:.0f} s; not called again until it returns")
        s.overruns += 1
        s.last_run = self.clock.now()  # the tick was handled: the engine is alive, the source is not
        self._latest.pop(s.spec.name, None)
        self._publish()

    def _advance(self, s: Sampler) -> None:
        """Move ``s`` to the grid's next tick after a run (one interval on, or sooner once after the interval
        changed), skipping and counting the ticks a late or slow run missed."""
        s.next_due = self._grid(s.next_due, s.interval, before=True) + s.interval
        now = self.clock.now()
        if s.next_due >= now:
            return
        behind = now - s.next_due
        missed = math.ceil(behind / s.interval)
        s.next_due += missed * s.interval
        if behind > max(GAP_MIN, 2 * self.deadline(s)):
            # Far later than any call may take: the process or host was not running (a VM pause, SIGSTOP).
            # Counting its ticks as overruns (29,978 for an hour at 100 ms) would blame the samplers; the gap is
            # logged once per pause instead.
            if now - self._gap_logged_at > GAP_MIN:
                self._gap_logged_at = now
                _log.warning("sampling_gap", seconds=round(behind, 1), sampler=s.spec.name,
                             note="the process did not run (VM paused, SIGSTOP?); not counted as overruns")
            return
        # _record counted the ticks the run itself overran; ticks lost because the run started late (a busy
        # sampler thread, a busy event loop) are missed samples too and must be visible.
        late = missed - int(s.duration // s.interval)
        if late > 0:
            s.overruns += late

    @staticmethod
    def _call(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
        t0 = time.perf_counter()
        try:
            return fn(), None, time.perf_counter() - t0
        except Exception as e:
            return None, e, time.perf_counter() - t0

    def _timed_call(self, s: Sampler) -> tuple[Any, BaseException | None, float]:
        """:meth:`_call` of ``s``, charging the CPU time of the thread that ran it to ``s.cpu_seconds``
        (gpufeed_collector_cpu_seconds_total). A call abandoned at its deadline is charged when it returns:
        one sampler never has two calls running, so each sampler's total has one writer."""
        c0 = time.thread_time()
        try:
            return self._call(s.spec.fn)
        finally:
            s.cpu_seconds += time.thread_time() - c0

    # ---- inline and virtual-time execution -----------------------------------------------------------------

    def run_once(self, name: str) -> None:
        """Run sampler ``name`` now, inline (tests and virtual-time drivers)."""
        s = self.samplers[name]
        started = self.clock.now()
        value, err, took = self._timed_call(s)
        with self._lock:
            self._record(s, started, value, err, took)

    def run_until(self, until: float) -> None:
        """Synchronous virtual-time driver: run every sampler due up to ``until`` in time order.

        Requires a clock with ``set`` (e.g. :class:`VirtualClock`); samplers run inline. This is what
        ``diagnose --scenario`` uses to play minutes of scenario in seconds.
        """
        clock = self.clock
        if not isinstance(clock, VirtualClock):
            raise TypeError("run_until needs a VirtualClock")
        if self._started_at is None:
            self._started_at = clock.now()
            for each in self.samplers.values():
                each.next_due = clock.now()
        while self.samplers:
            s = min(self.samplers.values(), key=lambda x: (x.next_due, x.spec.name))
            if s.next_due > until:
                break
            clock.set(max(clock.now(), s.next_due))
            self.run_once(s.spec.name)
            s.next_due += s.interval
        clock.set(max(clock.now(), until))

    # ---- the event loop: non-blocking samplers, and every sampler when inline ------------------------------

    async def _sleep_until_due(self, s: Sampler) -> None:
        """Until ``s.next_due``. :meth:`set_interval` may move it earlier while the sampler sleeps (a host
        sampler slowed to 30 s while no GPU waits is wanted at 250 ms again as soon as one does): it then
        wakes the sleeper (a cancellation of that one sleep, taken back here), which sleeps again until the
        new due time. No sleeper wakes up just to look at its due time again."""
        while not self._stopping:
            if self.clock.now() >= s.next_due:
                return
            s.sleeping = True
            try:
                await self.clock.sleep_until(s.next_due)
            except asyncio.CancelledError:
                if not s.nudged or self._stopping:
                    raise
                # Taken back (Python 3.11+ counts cancellation requests; 3.10 has nothing to undo).
                uncancel = getattr(asyncio.current_task(), "uncancel", None)
                if uncancel is not None:
                    uncancel()
            finally:
                s.sleeping = s.nudged = False

    async def _loop(self, s: Sampler) -> None:
        """Run ``s`` inline at a fixed rate on the shared grid (no drift); skip and count the ticks a slow run
        overran."""
        # The grid's tick at or before now: the first run is at once (at start, or restarted after a crash).
        s.next_due = self._grid(self.clock.now(), s.interval, before=True)
        while not self._stopping:
            await self._sleep_until_due(s)
            if self._stopping:
                return
            started = self.clock.now()
            value, err, took = self._timed_call(s)
            with self._lock:
                self._record(s, started, value, err, took)
                self._advance(s)

    async def _supervise(self, s: Sampler) -> None:
        """Restart a crashed sampler loop with exponential backoff (a bug must not kill sampling)."""
        backoff = BACKOFF_START
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._loop(s)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if time.monotonic() - started > BACKOFF_RESET:
                    backoff = BACKOFF_START  # it ran fine for a while: a new, rare crash restarts quickly
                with self._lock:
                    s.restarts += 1
                    self._publish()  # make the restart visible (gpufeed_sampler_restarts_total) right away
                _log.error("sampler_crashed", sampler=s.spec.name, error=repr(e), restart_in=backoff, exc_info=e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    # ---- the sampler thread ----------------------------------------------------------------------------------

    def _due(self, now: float) -> list[Sampler]:  # under the lock
        """Threaded samplers due at ``now`` that no thread is running (an abandoned call's sampler is due: its
        tick is handled as still blocked), shortest interval first (the GPU's fast path before the 1 s host
        sources)."""
        due = [s for s in self._threaded
               if s.next_due <= now + 1e-9 and (s.running is None or s.running.abandoned)]
        if len(due) > 1:
            due.sort(key=lambda s: (s.interval, s.spec.name))
        return due

    def _sleep_for(self, now: float) -> float:  # under the lock
        """Real seconds from ``now`` to the next tick of a sampler no thread is running."""
        assert self._delay is not None
        nxt = min((s.next_due for s in self._threaded if s.running is None or s.running.abandoned),
                  default=now + WATCH_MAX)
        return max(0.0, self._delay(nxt))

    def _spawn_runner(self) -> None:  # under the lock
        """Start a sampler thread and make it the one that runs the schedule."""
        me = _Runner()
        me.thread = threading.Thread(target=self._run_samplers, args=(me,), name=f"sampler-{next(self._seq)}",
                                     daemon=False)
        self._runner = me
        self._threads += 1
        me.thread.start()

    def _run_samplers(self, me: _Runner) -> None:
        """A sampler thread: sleeps until the next tick, runs every sampler due in turn and records each
        result; until the engine stops or the watchdog gave the schedule to another thread."""
        with self._cond:
            try:
                while not self._stopping and self._runner is me:
                    now = self.clock.now()
                    due = self._due(now)
                    if not due:
                        self._cond.wait(self._sleep_for(now))
                        continue
                    ran = 0
                    for s in due:
                        if self._stopping or self._runner is not me:
                            break
                        if s.running is not None and not s.running.abandoned:
                            continue  # a replaced thread is still running it
                        ran += 1
                        self._tick(me, s)
                    self.batches += ran > 1
            finally:
                self._threads -= 1
                if self._runner is me:  # ended other than by replacement: the watchdog starts another
                    self._runner = None
                    self._cond.notify_all()

    def _tick(self, me: _Runner, s: Sampler) -> None:  # under the lock; released around the call
        """One tick of ``s`` on this thread; a crash of the engine's own code around the call (a bug) is
        logged, counted and retried after a backoff."""
        try:
            if s.blocked is not None:  # its abandoned call has not returned
                self._still_blocked(s)
                self._advance(s)
                return
            call = s.running = me.current = _Call(me, self.clock.now())
            self._cond.release()
            try:
                value, err, took = self._timed_call(s)
            finally:
                self._cond.acquire()
                s.running = me.current = None
            if call.abandoned:  # failed at its deadline meanwhile: the late return's result is dropped
                s.blocked = None
                _log.info("sampler_unblocked", collector=s.collector, sampler=s.spec.name,
                          blocked_s=round(self.clock.now() - s.blocked_since, 1))
                return
            self._record(s, call.t, value, err, took)
            self._advance(s)
        except Exception as e:
            self._crashed(s, e)

    def _crashed(self, s: Sampler, e: Exception) -> None:  # under the lock
        now = time.monotonic()
        if now - s.crashed_at > BACKOFF_RESET:
            s.backoff = BACKOFF_START  # it ran fine for a while: a new, rare crash restarts quickly
        s.crashed_at = now
        s.restarts += 1
        _log.error("sampler_crashed", sampler=s.spec.name, error=repr(e), restart_in=s.backoff, exc_info=e)
        s.next_due = self.clock.now() + s.backoff
        s.backoff = min(s.backoff * 2, BACKOFF_MAX)
        self._publish()  # make the restart visible (gpufeed_sampler_restarts_total) right away

    def _watch(self) -> None:
        """The watchdog: replaces a sampler thread that is inside one call for ``PATIENCE`` (or that ended),
        fails calls past their deadline and samplers that could not start within one. It looks ``PATIENCE``
        after each tick, or at a call's deadline, whichever comes first."""
        with self._cond:
            while not self._stopping:
                wake = self._check(time.monotonic())
                self._cond.wait(max(0.001, wake))

    def _check(self, mono: float) -> float:  # under the lock
        """One look (see :meth:`_watch`); seconds until the next."""
        wake = WATCH_MAX
        for s in self._threaded:
            c = s.running
            if c is None or c.abandoned:
                continue
            left = c.started + self.deadline(s) - mono
            if left <= 0:
                self._abandon(s, c)
            else:
                wake = min(wake, left)
        r = self._runner
        if r is None:
            self._replace("ended")
            return min(wake, PATIENCE)
        c = r.current
        if c is not None:
            left = c.started + PATIENCE - mono
            if left > 0:
                return min(wake, left)
            if self._replace("slow") is None:
                self._starved()
                return min(wake, PATIENCE)
        # Between calls (or just replaced): look again PATIENCE after the next tick starts.
        return min(wake, self._sleep_for(self.clock.now()) + PATIENCE)

    def _replace(self, why: str) -> _Runner | None:  # under the lock
        """Give the schedule to a fresh sampler thread (the old one, if inside a call, ends after it); None when
        ``1 + max_abandoned`` threads exist already."""
        if self._threads >= 1 + self.max_abandoned:
            if log.once(("sampler_thread_limit",)):
                _log.error("sampler_thread_limit", stuck=self._threads, limit=1 + self.max_abandoned,
                           note="no sampler thread started; samplers due wait for one")
            return None
        _log.debug("sampler_thread_replaced", reason=why)
        self._spawn_runner()
        return self._runner

    def _abandon(self, s: Sampler, c: _Call) -> None:  # under the lock
        """``s``'s call ``c`` passed its deadline: the sampler fails, and is not called again until it returns."""
        deadline = self.deadline(s)
        c.abandoned = True
        s.blocked, s.blocked_since = c, c.t
        self._record(s, c.t, None, DeadlineExceededError(
            f"no result within {deadline:g} s (a blocked read: hung NFS, a FIFO or a wedged driver call?); "
            "sampler thread replaced"), deadline)
        self._advance(s)

    def _starved(self) -> None:  # under the lock
        """Every sampler thread is inside a call and no more may start: a sampler due for a deadline fails."""
        now = self.clock.now()
        for s in self._threaded:
            if s.running is None and now - s.next_due >= self.deadline(s):
                self._record(s, now, None, DeadlineExceededError(
                    f"no sampler thread free within {self.deadline(s):g} s ({self._threads} inside calls)"),
                    self.deadline(s))
                self._advance(s)

    # ---- start and stop ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sampler thread and its watchdog, and one task per event-loop sampler on the running loop."""
        self._started_at = self.clock.now()
        with self._lock:
            self._publish()
        loop = asyncio.get_running_loop()
        for n, s in self.samplers.items():
            if s not in self._threaded:
                s.task = loop.create_task(self._supervise(s), name=f"sampler:{n}")
        self._tasks = [s.task for s in self.samplers.values() if s.task is not None]
        if self._threaded:
            with self._lock:
                for s in self._threaded:
                    s.next_due = self._started_at
                self._spawn_runner()
            self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
            self._watchdog.start()

    async def stop(self, timeout: float = 1.5) -> None:
        """Stop the sampler tasks and threads and release collector resources."""
        self._stopping = True
        with self._lock:
            self._cond.notify_all()
            runner = self._runner
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), timeout)
        # The sampler thread ends after its current call (one inside a blocked read is left to it).
        end = time.monotonic() + timeout
        while runner is not None and runner.thread is not None and runner.thread.is_alive() \
                and time.monotonic() < end:
            await asyncio.sleep(0.01)
        for c in self.stages:
            try:
                c.close()
            except Exception as e:
                _log.warning("collector_close_failed", collector=c.name, error=repr(e))
