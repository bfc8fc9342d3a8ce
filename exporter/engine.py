"""The sampling engine: runs every sampler at its own interval, keeps bounded history, publishes snapshots.

Blocking samplers run in a small thread pool so a slow read (a hung NFS mount behind /proc, a driver call)
never stalls the other samplers or the HTTP server. Time comes from an injectable clock: the daemon uses
the event loop's monotonic clock, tests and ``diagnose --scenario`` a virtual one.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from exporter import log
from exporter.sampling import CollectorError, NoDataError, SamplerSpec, Stage
from exporter.snapshot import SamplerStatus, Snapshot, Stamped

_log = log.get_logger(component="engine")

# Restart backoff of a crashed sampler task: doubles per crash up to the max; reset after a quiet period.
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
BACKOFF_RESET = 300.0


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
    last_error: str | None = None

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
            error=self.last_error,
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
        on_publish: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.clock: Clock = clock or RealClock()
        self.stages = list(stages)
        self.history_seconds = history_seconds
        self.inline = inline
        self._on_publish = on_publish
        self._executor = None if inline else ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sampler")
        self.samplers: dict[str, Sampler] = {}
        for c in self.stages:
            for spec in c.samplers():
                if spec.name in self.samplers:
                    raise ValueError(f"sampler {spec.name!r} defined twice")
                self.samplers[spec.name] = Sampler(
                    spec=spec, collector=c.name, buffer=deque(maxlen=self._buffer_len(spec.interval, spec.history)),
                    interval=spec.interval,
                )
        self._version = 0
        self._latest: dict[str, Stamped[Any]] = {}
        self._snapshot = Snapshot(version=0, t=self.clock.now())
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._started_at: float | None = None

    def _buffer_len(self, interval: float, history: float | None = None) -> int:
        # Bounded: enough samples to cover the history horizon (the sampler's own, when it declares a shorter
        # one than --engine.history), never fewer than 16, never more than 4096.
        horizon = self.history_seconds if history is None else min(self.history_seconds, history)
        return max(16, min(4096, math.ceil(horizon / interval) + 2))

    # ---- read side -------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The newest published snapshot."""
        return self._snapshot

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
        return tuple(x for x in s.buffer if x.t >= start)

    def now(self) -> float:
        """The engine's clock."""
        return self.clock.now()

    def interval(self, name: str) -> float | None:
        """Sampler ``name``'s current interval, or None when there is no such sampler."""
        s = self.samplers.get(name)
        return None if s is None else s.interval

    def set_interval(self, name: str, interval: float) -> None:
        """Change a sampler's interval from its next run on (adaptive depth)."""
        s = self.samplers[name]
        if interval != s.interval:
            s.interval = interval
            s.next_due = min(s.next_due, (s.last_run or self.clock.now()) + interval)
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
        if error is None:
            if s.runs > 1 and not s.success and s.available:
                _log.info("collector_recovered", collector=s.collector, sampler=name)
            s.success, s.available, s.last_error = True, True, None
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

    def _publish(self) -> None:
        self._version += 1
        self._snapshot = Snapshot(
            version=self._version,
            t=self.clock.now(),
            latest=MappingProxyType(dict(self._latest)),
            status=MappingProxyType({n: s.status() for n, s in self.samplers.items()}),
        )
        if self._on_publish is not None:
            self._on_publish(self._snapshot)

    @staticmethod
    def _call(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
        t0 = time.perf_counter()
        try:
            return fn(), None, time.perf_counter() - t0
        except Exception as e:
            return None, e, time.perf_counter() - t0

    def run_once(self, name: str) -> None:
        """Run sampler ``name`` now, inline (tests and virtual-time drivers)."""
        s = self.samplers[name]
        started = self.clock.now()
        value, err, took = self._call(s.spec.fn)
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
        if s.spec.blocking and self._executor is not None:
            loop = asyncio.get_running_loop()
            value, err, took = await loop.run_in_executor(self._executor, self._call, s.spec.fn)
        else:
            value, err, took = self._call(s.spec.fn)
        self._record(s, started, value, err, took)

    async def _loop(self, s: Sampler) -> None:
        """Run ``s`` at a fixed rate (no drift); skip and count the ticks a slow run overran."""
        s.next_due = self.clock.now()
        while not self._stopping:
            await self.clock.sleep_until(s.next_due)
            if self._stopping:
                return
            await self._run_async(s)
            s.next_due += s.interval
            now = self.clock.now()
            if s.next_due < now:
                missed = math.ceil((now - s.next_due) / s.interval)
                s.next_due += missed * s.interval
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
        self._tasks = [
            asyncio.get_running_loop().create_task(self._supervise(s), name=f"sampler:{n}")
            for n, s in self.samplers.items()
        ]

    async def stop(self, timeout: float = 1.5) -> None:
        """Stop the sampler tasks and release collector resources."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), timeout)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for c in self.stages:
            try:
                c.close()
            except Exception as e:
                _log.warning("collector_close_failed", collector=c.name, error=repr(e))
