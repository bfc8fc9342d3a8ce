"""The sampling engine: runs every sampler at its own interval, keeps bounded history, publishes snapshots.

Blocking samplers run in a small pool of worker threads (:class:`Workers`) so a slow read (a hung NFS mount
behind /proc, a wedged driver call) never stalls the other samplers or the HTTP server. A sampler never
blocks forever: each call has a deadline (``DEADLINE_INTERVALS`` x its interval, at least ``DEADLINE_MIN``).
Past it the engine stops waiting, records the sampler as failed (``gpufeed_collector_success`` 0, its
samples dropped from exposition, ``gpufeed_sampler_last_success_timestamp_seconds`` frozen), and the
worker -- a Python thread cannot be killed -- is abandoned to finish the call on its own while a fresh
thread takes its place in the pool. A sampler whose abandoned call is still blocked is not called again
until that call returns (a second call would block on the same hung source and pile up threads); never more
than the pool's size plus ``MAX_ABANDONED`` sampler threads exist (``gpufeed_sampler_abandoned_threads``
counts the stuck ones).

Samplers due at the same instant are handed to one worker together (:meth:`Engine._flush`): every
interval is laid on one grid from the engine's start, so the 1 s samplers, the 5 s ones and every fourth
250 ms tick fall due together, and each hand-off costs two thread wake-ups and a few loop callbacks (~70 us of
CPU a wake-up measured on a 2-CPU VM; 8 of the 10 hand-offs a second of an 8-GPU host with every GPU working
ran at the same instant). A batch still running after ``BATCH_PATIENCE`` (one slow or blocked call in it)
hands its calls not yet started to other workers, one each: a hung read delays the samplers due with it by
that long, never fails them.
``alive()`` (``/healthz``) keeps reporting the engine, not the sources: a sampler whose ticks keep being
handled is alive even while its source is blocked -- that is ``gpufeed_collector_success 0`` and
``GpufeedSamplesStale``, not a restart (a process with a thread in uninterruptible sleep cannot even exit
until the read returns).

Time comes from an injectable clock: the daemon uses the monotonic clock, tests and ``diagnose --scenario``
a virtual one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import itertools
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from exporter import log
from exporter.sampling import UNCHANGED, CollectorError, NoDataError, SamplerSpec, Stage
from exporter.snapshot import SamplerStatus, Snapshot, Stamped

_log = log.get_logger(component="engine")

# Restart backoff of a crashed sampler task: doubles per crash up to the max; reset after a quiet period.
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
BACKOFF_RESET = 300.0
# A call may take this long before it counts as stuck: DEADLINE_INTERVALS of its sampler's interval, and never
# less than DEADLINE_MIN (a first nvmlInit on a host without persistence mode takes seconds).
DEADLINE_MIN = 5.0
DEADLINE_INTERVALS = 5.0
# Threads that may be left inside calls past their deadline, beyond the pool's own: never more than
# workers + MAX_ABANDONED sampler threads exist (with every sampler stuck, the rest queue for the pool).
MAX_ABANDONED = 8
# A tick this late (and far later than any call may take) means the process or the host did not run: a VM
# pause, SIGSTOP. Its ticks are not "overruns" of a slow sampler; the gap is logged once instead.
GAP_MIN = 30.0
# A batch of samplers due together that is still running after this long gives its calls not yet started to
# other workers (each a hand-off of its own), and the loop picks up the results already in.
BATCH_PATIENCE = 0.1


class DeadlineExceededError(CollectorError):
    """A sampler call did not return within its deadline (a blocked read); the sampler is marked failed."""


class Job:
    """One blocking call: the function, the future its result goes to, when a thread started it (monotonic
    seconds; None while queued) and whether it was abandoned."""

    __slots__ = ("abandoned", "fn", "future", "started")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.started: float | None = None
        self.abandoned = False


class Batch:
    """Calls one worker runs in turn (:meth:`Workers.submit_batch`); ``on_done`` runs on that worker once
    none is left (after the last, or after the rest was given to other workers)."""

    __slots__ = ("jobs", "on_done")

    def __init__(self, jobs: Iterable[Job], on_done: Callable[[], None] | None = None) -> None:
        self.jobs: deque[Job] = deque(jobs)
        self.on_done = on_done


class Workers:
    """Threads that run blocking sampler calls, replaceable when one is stuck (see the module docstring).

    Up to ``size`` threads take calls from one queue, started on demand. :meth:`abandon` takes a thread stuck
    in a call out of the pool and starts a replacement, as long as there are fewer than ``size +
    max_abandoned`` threads in all; when the call finally returns, the thread rejoins the pool if it has room,
    else ends.
    """

    def __init__(self, size: int, *, max_abandoned: int = MAX_ABANDONED, name: str = "sampler") -> None:
        self.size = size
        self.max_abandoned = max_abandoned
        self.name = name
        self._jobs: queue.SimpleQueue[Job | Batch | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live = 0  # threads in the pool (taking calls)
        self._idle = 0  # of those, waiting for a call
        self._queued = 0  # calls submitted and not yet taken by a thread
        self._abandoned = 0  # threads out of the pool, still inside an abandoned call
        self._running: dict[concurrent.futures.Future[Any], Job] = {}
        self._seq = itertools.count(1)
        self._closed = False

    @property
    def abandoned(self) -> int:
        """Threads currently stuck in abandoned calls."""
        return self._abandoned

    def submit(self, fn: Callable[[], Any]) -> Job:
        """Queue ``fn``; the job's future gets the result (``fn`` must not raise)."""
        job = Job(fn)
        self.submit_job(job)
        return job

    def submit_job(self, job: Job) -> None:
        """Queue ``job``, to run on a thread of its own."""
        with self._lock:
            self._put(job)

    def submit_batch(self, jobs: Sequence[Job], on_done: Callable[[], None] | None = None) -> Batch:
        """Queue ``jobs`` to run in turn on one thread (one wake-up); :meth:`spread` gives the ones not yet
        started to other threads."""
        batch = Batch(jobs, on_done)
        with self._lock:
            self._put(batch)
        return batch

    def spread(self, batch: Batch) -> list[Job]:
        """Take the calls of ``batch`` not yet started off its thread and queue each on its own."""
        with self._lock:
            rest = list(batch.jobs)
            batch.jobs.clear()
            if not self._closed:
                for job in rest:
                    self._put(job)
        return rest

    def _put(self, item: Job | Batch) -> None:  # under self._lock
        if self._closed:
            raise RuntimeError("workers closed")
        self._jobs.put(item)
        self._queued += 1
        # An idle thread may not have taken the call queued before this one yet: spawn unless there are more
        # idle threads than calls waiting (else a call can queue behind one that blocks).
        if self._queued > self._idle and self._live < self.size and self._room():
            self._spawn()

    def _room(self) -> bool:  # under self._lock
        """Whether one more thread may start: never more than ``size + max_abandoned`` threads in all."""
        return self._live + self._abandoned < self.size + self.max_abandoned

    def abandon(self, future: concurrent.futures.Future[Any]) -> bool:
        """Stop waiting for ``future``: cancelled if still queued (False), else its thread leaves the pool and a
        fresh one takes its place (True: a thread is now stuck on its own)."""
        if future.cancel():
            return False
        with self._lock:
            job = self._running.get(future)
            if job is None or job.abandoned:  # finished meanwhile
                return False
            job.abandoned = True
            self._live -= 1
            self._abandoned += 1
            if self._closed:
                return True
            if self._room():
                self._spawn()
                return True
        if log.once(("sampler_thread_limit", self.name)):
            _log.error("sampler_thread_limit", stuck=self._abandoned, limit=self.size + self.max_abandoned,
                       note="no replacement thread started; samplers queue for the remaining ones")
        return True

    def shutdown(self) -> None:
        """Let idle threads end; threads inside a call end when it returns."""
        with self._lock:
            self._closed = True
            n = self._live
        for _ in range(n):
            self._jobs.put(None)

    def _spawn(self) -> None:  # under self._lock
        self._live += 1
        threading.Thread(target=self._work, name=f"{self.name}-{next(self._seq)}", daemon=False).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._jobs.get()
            with self._lock:
                self._idle -= 1
                if item is None:
                    self._live -= 1
                    return
                self._queued -= 1
            if isinstance(item, Job):
                if self._run(item):
                    return
                continue
            leave = False
            while not leave:
                with self._lock:
                    job = item.jobs.popleft() if item.jobs else None
                if job is None:
                    break
                leave = self._run(job)
            if item.on_done is not None:
                item.on_done()
            if leave:
                return

    def _run(self, job: Job) -> bool:
        """Run one job on this thread; True when the thread must leave the pool (its call was abandoned and
        the pool is full again)."""
        with self._lock:
            if not job.future.set_running_or_notify_cancel():
                return False  # abandoned while queued
            self._running[job.future] = job
            job.started = time.monotonic()
        try:
            result = job.fn()
        except BaseException as e:  # fn is the engine's _call, which catches Exception; be safe anyway
            result = (None, e, 0.0)
        with self._lock:
            del self._running[job.future]
            leave = False
            if job.abandoned:
                self._abandoned -= 1
                leave = self._closed or self._live >= self.size
                if not leave:
                    self._live += 1  # rejoin the pool
        job.future.set_result(result)
        return leave


class _Waiter:
    """Waits on the event loop for a worker's job: :meth:`finished` is the job future's done callback (any
    thread), :meth:`poll` the loop's look at it (a batch's end), :meth:`wait` the loop side, with a timeout."""

    __slots__ = ("_done", "_fut", "_job", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, job: concurrent.futures.Future[Any]) -> None:
        self._loop = loop
        self._job = job
        self._done = False
        self._fut: asyncio.Future[None] | None = None

    def poll(self) -> None:
        """On the loop: wake the waiting side if the job is done."""
        if self._job.done():
            self._wake()

    def finished(self, _future: concurrent.futures.Future[Any]) -> None:
        # A closed loop: an abandoned call returned after the engine stopped.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._done = True
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """True once the job is done; False when ``timeout`` seconds passed first."""
        if self._done or self._job.done():
            return True
        fut = self._fut = self._loop.create_future()
        timer = None if math.isinf(timeout) else self._loop.call_later(max(0.0, timeout), self._expire, fut)
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._fut = None
        return self._done or self._job.done()

    @staticmethod
    def _expire(fut: asyncio.Future[None]) -> None:
        if not fut.done():
            fut.set_result(None)


class Clock(Protocol):
    """Monotonic seconds and a way to wait for a point in time."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class RealClock:
    """Monotonic wall time."""

    def now(self) -> float:
        return time.monotonic()

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
    """Runtime state of one sampler (mutable; only the engine touches it)."""

    spec: SamplerSpec
    collector: str
    buffer: deque[Stamped[Any]]
    interval: float
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
    # The call abandoned at its deadline and still running, and when it started: no new call meanwhile.
    blocked: concurrent.futures.Future[Any] | None = None
    blocked_since: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the threads that ran it (time.thread_time), all runs
    # Its task, whether that task is asleep until next_due, and whether set_interval has woken it early.
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
        history_seconds: float = 120.0,
        inline: bool = False,
        workers: int = 4,
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
        self._on_publish = on_publish
        self._workers = None if inline else Workers(workers, max_abandoned=max_abandoned)
        self._gap_logged_at = -math.inf
        self.samplers: dict[str, Sampler] = {}
        for c in self.stages:
            for spec in c.samplers():
                if spec.name in self.samplers:
                    raise ValueError(f"sampler {spec.name!r} defined twice")
                self.samplers[spec.name] = Sampler(
                    spec=spec, collector=c.name, buffer=deque(maxlen=self._buffer_len(spec.interval, spec.history)),
                    interval=spec.interval,
                )
        # Samplers that say their own interval (SamplerSpec.pace), by stage: asked after each run of the stage.
        self._paced: dict[str, list[Sampler]] = {}
        for each in self.samplers.values():
            if each.spec.pace is not None:
                self._paced.setdefault(each.collector, []).append(each)
        self._version = 0
        self._latest: dict[str, Stamped[Any]] = {}
        self._snapshot = Snapshot(version=0, t=self.clock.now())
        self._stale = False  # a sampler ran since _snapshot was built: build it again when it is read
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._started_at: float | None = None
        # Hand-offs of this loop iteration, flushed together (_flush): (interval, job, waiter).
        self._pending: list[tuple[float, Job, _Waiter]] | None = None
        self.batches = 0  # hand-offs of more than one call (tests, bench)

    def _buffer_len(self, interval: float, history: float | None = None) -> int:
        # Bounded: enough samples to cover the history horizon (the sampler's own, when it declares a shorter
        # one than --engine.history), never fewer than 16, never more than 4096.
        horizon = self.history_seconds if history is None else min(self.history_seconds, history)
        return max(16, min(4096, math.ceil(horizon / interval) + 2))

    def deadline(self, s: Sampler) -> float:
        """How long one call of ``s`` may take before it is abandoned (its spec's, else the default rule)."""
        if s.spec.deadline is not None:
            return s.spec.deadline
        return max(self.min_deadline, self.deadline_intervals * s.interval)

    @property
    def abandoned_threads(self) -> int:
        """Worker threads stuck in calls that passed their deadline."""
        return 0 if self._workers is None else self._workers.abandoned

    # ---- read side -------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The newest snapshot: every sampler's newest sample and status as of the last run.

        Built when read, not at every run (25 runs a second on an 8-GPU host; a reader -- the renderer, the
        analyzer -- looks once a second or once a scrape). Read on the event loop's thread, which is the one
        that records runs."""
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
        return () if s is None else tuple(s.buffer)

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
        together are handed off together."""
        origin = self._started_at
        if origin is None or interval <= 0:
            return t
        k = (t - origin) / interval
        return origin + (math.floor(k + 1e-6) if before else math.ceil(k - 1e-6)) * interval

    def set_interval(self, name: str, interval: float) -> None:
        """Change a sampler's interval from its next run on (adaptive depth)."""
        s = self.samplers[name]
        if interval != s.interval:
            s.interval = interval
            due = min(s.next_due, self._grid((s.last_run or self.clock.now()) + interval, interval))
            if due < s.next_due and s.sleeping and s.task is not None and not s.nudged:
                s.nudged = True
                s.task.cancel()  # wake it: it sleeps again until the new due time (_sleep_until_due)
            s.next_due = due
            want = self._buffer_len(interval, s.spec.history)
            if s.buffer.maxlen is not None and s.buffer.maxlen < want:
                s.buffer = deque(s.buffer, maxlen=want)

    def alive(self, now: float | None = None) -> bool:
        """True while every sampler task is running and none is stuck far past its interval."""
        now = self.clock.now() if now is None else now
        if self._tasks and any(t.done() for t in self._tasks) and not self._stopping:
            return False
        for s in self.samplers.values():
            started = self._started_at if self._started_at is not None else now
            ref = s.last_run if s.last_run is not None else started
            if now - ref > max(10 * s.interval, 30.0):
                return False
        return True

    # ---- execution ---------------------------------------------------------------------------------------

    def _record(self, s: Sampler, started: float, value: Any, error: BaseException | None, took: float) -> None:
        """Store the outcome of one run of ``s`` and publish a new snapshot."""
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
            if took > s.interval:
                s.overruns += int(took // s.interval)
            return
        if error is None:
            if s.runs > 1 and not s.success and s.available:
                _log.info("collector_recovered", collector=s.collector, sampler=name)
            s.success, s.available, s.last_error = True, True, None
            s.last_success = started
            stamped = Stamped(started, value)
            s.buffer.append(stamped)
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
        if took > s.interval:
            s.overruns += int(took // s.interval)
        self._publish()

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
        """A new version exists; the snapshot itself is built when it is next read."""
        self._version += 1
        self._stale = True
        if self._on_publish is not None:
            self._on_publish()

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

    def run_once(self, name: str) -> None:
        """Run sampler ``name`` now, inline (tests and virtual-time drivers)."""
        s = self.samplers[name]
        started = self.clock.now()
        value, err, took = self._timed_call(s)
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

    async def _run_async(self, s: Sampler) -> None:
        started = self.clock.now()
        if not (s.spec.blocking and self._workers is not None):
            value, err, took = self._timed_call(s)
            self._record(s, started, value, err, took)
            return
        if s.blocked is not None:
            if not s.blocked.done():
                self._still_blocked(s)
                return
            s.blocked = None
            _log.info("sampler_unblocked", collector=s.collector, sampler=s.spec.name,
                      blocked_s=round(self.clock.now() - s.blocked_since, 1))
        value, err, took = await self._call_with_deadline(s, started)
        self._record(s, started, value, err, took)

    async def _call_with_deadline(self, s: Sampler, started: float) -> tuple[Any, BaseException | None, float]:
        """Run ``s`` on a worker; the deadline counts from when a thread starts the call (time spent queued
        behind busy workers is lateness, counted as overruns), and a call never started within one deadline
        fails too (every thread is stuck).

        One hand-off costs one loop future and one timer: the worker's completion wakes the loop with
        ``call_soon_threadsafe`` (``asyncio.wait_for(asyncio.shield(asyncio.wrap_future(...)))`` made three
        futures and seven callbacks of each of the ~20 hand-offs a second)."""
        assert self._workers is not None
        job = Job(lambda: self._timed_call(s))
        waiter = _Waiter(asyncio.get_running_loop(), job.future)
        if self._pending is None:
            self._pending = []
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((s.interval, job, waiter))
        deadline = self.deadline(s)
        wait = deadline
        while True:
            if await waiter.wait(wait):
                result: tuple[Any, BaseException | None, float] = job.future.result()
                return result
            if job.started is not None:
                wait = job.started + deadline - time.monotonic()
                if wait > 0:
                    continue  # it waited in the queue first: its own deadline is not over yet
            if self._workers.abandon(job.future):
                s.blocked, s.blocked_since = job.future, started
                return None, DeadlineExceededError(
                    f"no result within {deadline:g} s (a blocked read: hung NFS, a FIFO or a wedged driver call?);"
                    " worker thread replaced"), deadline
            if job.future.cancelled():
                return None, DeadlineExceededError(
                    f"no worker thread free within {deadline:g} s ({self._workers.abandoned} stuck in blocked "
                    "reads)"), deadline
            wait = math.inf  # it finished just now: its result is on the way

    def _flush(self) -> None:
        """Hand this loop iteration's calls to the workers: one alone, several as one batch, shortest interval
        first (the GPU's fast path before the 1 s host sources). One completion wakes the loop for the whole
        batch; a batch still running after ``BATCH_PATIENCE`` gives what it has not started to other workers
        (a blocked read must not hold the samplers due with it) and the loop takes the results already in."""
        pending, self._pending = self._pending or [], None
        assert self._workers is not None
        if len(pending) == 1:
            _, job, waiter = pending[0]
            job.future.add_done_callback(waiter.finished)
            self._workers.submit_job(job)
            return
        if not pending:
            return
        pending.sort(key=lambda p: p[0])
        loop = asyncio.get_running_loop()
        waiters = {id(job): waiter for _, job, waiter in pending}
        timer: asyncio.TimerHandle | None = None

        def finish() -> None:  # on the loop
            if timer is not None:
                timer.cancel()
            for w in waiters.values():
                w.poll()

        def done() -> None:  # on the worker, after the batch's last call
            with contextlib.suppress(RuntimeError):  # the loop closed (engine stopped meanwhile)
                loop.call_soon_threadsafe(finish)

        def impatient() -> None:  # on the loop
            assert self._workers is not None
            for job in self._workers.spread(batch):
                job.future.add_done_callback(waiters[id(job)].finished)
            for w in waiters.values():
                w.poll()

        self.batches += 1
        batch = self._workers.submit_batch([job for _, job, _ in pending], on_done=done)
        timer = loop.call_later(BATCH_PATIENCE, impatient)

    def _still_blocked(self, s: Sampler) -> None:
        """A tick skipped because the sampler's abandoned call has not returned: failed, counted, published."""
        s.success = False
        s.last_error = (f"DeadlineExceededError: previous call still blocked after "
                        f"{self.clock.now() - s.blocked_since:.0f} s; not called again until it returns")
        s.overruns += 1
        s.last_run = self.clock.now()  # the tick was handled: the engine is alive, the source is not
        self._latest.pop(s.spec.name, None)
        self._publish()

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
        """Run ``s`` at a fixed rate on the shared grid (no drift); skip and count the ticks a slow run
        overran."""
        # The grid's tick at or before now: the first run is at once (at start, or restarted after a crash).
        s.next_due = self._grid(self.clock.now(), s.interval, before=True)
        while not self._stopping:
            await self._sleep_until_due(s)
            if self._stopping:
                return
            await self._run_async(s)
            # The grid's next tick: one interval on, or sooner once after the interval changed.
            s.next_due = self._grid(s.next_due, s.interval, before=True) + s.interval
            now = self.clock.now()
            if s.next_due < now:
                behind = now - s.next_due
                missed = math.ceil(behind / s.interval)
                s.next_due += missed * s.interval
                if behind > max(GAP_MIN, 2 * self.deadline(s)):
                    # Far later than any call may take: the process or host was not running (a VM pause,
                    # SIGSTOP). Counting its ticks as overruns (29,978 for an hour at 100 ms) would blame the
                    # samplers; the gap is logged once per pause instead.
                    if now - self._gap_logged_at > GAP_MIN:
                        self._gap_logged_at = now
                        _log.warning("sampling_gap", seconds=round(behind, 1), sampler=s.spec.name,
                                     note="the process did not run (VM paused, SIGSTOP?); not counted as overruns")
                    continue
                # _record counted the ticks the run itself overran; ticks lost because the run started late
                # (a busy event loop, a full worker pool) are missed samples too and must be visible.
                late = missed - int(s.duration // s.interval)
                if late > 0:
                    s.overruns += late

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
                s.restarts += 1
                self._publish()  # make the restart visible (gpufeed_sampler_restarts_total) right away
                _log.error("sampler_crashed", sampler=s.spec.name, error=repr(e), restart_in=backoff, exc_info=e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def start(self) -> None:
        """Start one task per sampler on the running event loop."""
        self._started_at = self.clock.now()
        self._publish()
        loop = asyncio.get_running_loop()
        for n, s in self.samplers.items():
            s.task = loop.create_task(self._supervise(s), name=f"sampler:{n}")
        self._tasks = [s.task for s in self.samplers.values() if s.task is not None]

    async def stop(self, timeout: float = 1.5) -> None:
        """Stop the sampler tasks and release collector resources."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), timeout)
        if self._workers is not None:
            self._workers.shutdown()
        for c in self.stages:
            try:
                c.close()
            except Exception as e:
                _log.warning("collector_close_failed", collector=c.name, error=repr(e))
