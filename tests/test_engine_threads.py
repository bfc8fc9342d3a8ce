"""Engine on real threads: a sampler stuck in a read (hung NFS, slow driver) stalls neither other samplers nor
the HTTP server, and its overrun is counted; past its deadline it is failed and its worker replaced (bounded);
a forward jump of the monotonic clock is a gap, not overruns; a slow call hands the schedule to a fresh thread
and is still recorded; a bug around a call is retried with backoff."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from structlog.testing import capture_logs

from exporter.engine import Engine, RealClock, VirtualClock
from exporter.exposition import Renderer
from exporter.sampling import Collector, CollectorContext, SamplerSpec
from exporter.snapshot import Snapshot
from exporter.web import WebServer, WebSettings
from tests.support.engine import crash_records


class Stuck(Collector):
    name = "stuck"
    help = "blocks in update until released"
    default_interval = 0.05

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.release = threading.Event()
        self.calls = 0

    def update(self) -> int:
        self.calls += 1
        self.release.wait(10)
        return self.calls

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


class Fast(Collector):
    name = "fast"
    help = "returns at once"
    default_interval = 0.05

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.calls = 0

    def update(self) -> int:
        self.calls += 1
        return self.calls

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


def _ctx() -> CollectorContext:
    return CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent"))


async def _scrape(port: int) -> float:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 200")
    return time.perf_counter() - t0


async def test_blocked_sampler_stalls_neither_other_samplers_nor_scrapes() -> None:
    stuck, fast = Stuck(_ctx()), Fast(_ctx())
    renderer = Renderer([stuck, fast])
    eng: Engine = Engine([stuck, fast], RealClock(), on_publish=lambda: renderer.render(eng.snapshot))
    web = WebServer(renderer, WebSettings(host="127.0.0.1", port=0), eng.alive)
    await web.start()
    eng.start()
    try:
        await asyncio.sleep(0.6)
        latencies = [await _scrape(web.port) for _ in range(5)]
        assert stuck.calls == 1  # still inside its first read
        assert fast.calls >= 5, fast.calls  # kept its 50 ms rhythm meanwhile (loosely: the machine is shared)
        assert eng.snapshot.value("fast") >= 5  # and its samples were published while the other was stuck
        assert max(latencies) < 0.5, latencies
        assert renderer.version > 1
        stuck.release.set()
        for _ in range(100):
            if eng.snapshot.status["stuck"].runs >= 1:
                break
            await asyncio.sleep(0.01)
        st = eng.snapshot.status["stuck"]
        assert st.success and st.overruns >= 5  # ~0.6 s run on a 50 ms interval
    finally:
        stuck.release.set()
        await eng.stop()
        await web.stop()


class Blocking(Collector):
    """A read that blocks until released (a FIFO, a hung NFS server); counts its calls."""

    name = "blocking"
    help = "blocks until released"
    default_interval = 0.05

    def __init__(self, ctx: CollectorContext, name: str = "blocking") -> None:
        super().__init__(ctx)
        self.name = name  # type: ignore[misc]
        self.release = threading.Event()
        self.calls = 0

    def samplers(self) -> list[SamplerSpec]:
        return [SamplerSpec(self.name, self.interval, self.update)]

    def update(self) -> int:
        self.calls += 1
        if not self.release.is_set():
            self.release.wait(30)
        return self.calls

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


async def _until(cond: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_read_blocked_past_its_deadline_fails_the_sampler_and_its_thread_is_replaced() -> None:
    blocked, fast = Blocking(_ctx()), Fast(_ctx())
    eng = Engine([blocked, fast], RealClock(), min_deadline=0.3)
    eng.start()
    try:
        await _until(lambda: eng.snapshot.status["blocking"].runs >= 1)
        st = eng.snapshot.status["blocking"]
        assert not st.success and st.error is not None and "DeadlineExceededError" in st.error
        assert eng.abandoned_threads == 1 and eng.snapshot.abandoned_threads == 1
        # The sampler thread was stuck; its replacement keeps the other sampler going.
        calls = fast.calls
        await _until(lambda: fast.calls >= calls + 5)
        assert eng.snapshot.status["fast"].success
        assert blocked.calls == 1  # not called again while its first call is still blocked
        assert eng.snapshot.value("blocking") is None  # nothing frozen is exported
        # Its ticks are still handled (failed, counted as overruns): /healthz reports the engine, which is fine.
        ran = eng.snapshot.status["blocking"].last_run
        await _until(lambda: (eng.snapshot.status["blocking"].last_run or 0) > (ran or 0))
        assert eng.alive() and eng.snapshot.status["blocking"].overruns >= 1
        blocked.release.set()  # the NFS server is back: the abandoned call returns, its result is dropped
        await _until(lambda: eng.snapshot.status["blocking"].success)
        assert eng.abandoned_threads == 0 and blocked.calls >= 2
    finally:
        blocked.release.set()
        await eng.stop()


async def test_threads_left_in_blocked_reads_are_bounded_and_the_limit_is_logged() -> None:
    stuck = [Blocking(_ctx(), f"blocking{i}") for i in range(5)]
    fast = Fast(_ctx())
    eng = Engine([*stuck, fast], RealClock(), min_deadline=0.2, max_abandoned=2)
    with capture_logs() as logs:
        eng.start()
        try:
            await _until(lambda: "sampler_thread_limit" in [e["event"] for e in logs])
            await asyncio.sleep(0.5)
            alive = [t for t in threading.enumerate() if t.name.startswith("sampler-")]
            assert eng.abandoned_threads <= 1 + 2 and len(alive) <= 1 + 2  # 1 + max_abandoned, in all
        finally:
            for b in stuck:
                b.release.set()
            await eng.stop()


async def test_a_forward_clock_jump_is_one_logged_gap_not_thousands_of_overruns() -> None:
    # A VM paused for an hour: CLOCK_MONOTONIC jumps. 29,978 overruns were counted for one such pause.
    fast = Fast(_ctx())
    clock = VirtualClock(0.0)
    eng = Engine([fast], clock, inline=True)
    with capture_logs() as logs:
        eng.start()
        await clock.advance(1.0)
        clock.set(clock.now() + 3000.0)
        await clock.advance(1.0)
        await eng.stop()
    st = eng.snapshot.status["fast"]
    assert st.overruns < 5, st.overruns
    assert [e["event"] for e in logs].count("sampling_gap") == 1


class Named(Fast):
    """A fast sampler under a name of its own (several due at the same instant)."""

    def __init__(self, ctx: CollectorContext, name: str) -> None:
        super().__init__(ctx)
        self.name = name  # type: ignore[misc]


async def test_samplers_due_at_the_same_instant_run_in_one_wake_up_of_the_sampler_thread() -> None:
    fast = [Named(_ctx(), f"fast{i}") for i in range(4)]
    eng = Engine(fast, RealClock())
    eng.start()
    try:
        await _until(lambda: min(f.calls for f in fast) >= 6)
    finally:
        await eng.stop()
    # Every tick of the four is one wake-up (a tick may split when the thread woke late: loosely).
    assert eng.batches >= 4, eng.batches
    assert all(eng.snapshot.status[f.name].success for f in fast)


async def test_a_read_blocked_in_a_tick_delays_the_samplers_due_with_it_but_never_fails_them() -> None:
    blocked = Blocking(_ctx())
    fast = [Named(_ctx(), f"fast{i}") for i in range(3)]
    eng = Engine([blocked, *fast], RealClock(), min_deadline=0.3)  # run first in the tick, as here
    eng.start()
    try:
        await _until(lambda: eng.snapshot.status["blocking"].runs >= 1)
        assert "DeadlineExceededError" in (eng.snapshot.status["blocking"].error or "")
        calls = [f.calls for f in fast]
        await _until(lambda: all(f.calls >= c + 5 for f, c in zip(fast, calls, strict=True)))
        for f in fast:
            st = eng.snapshot.status[f.name]
            assert st.success and st.failures == 0, (f.name, st)
    finally:
        blocked.release.set()
        await eng.stop()


async def test_every_interval_ticks_on_one_grid_from_the_start_also_after_it_changes() -> None:
    clock = VirtualClock(100.0)
    every = {"quick": 0.25, "slow": 1.0}
    quick, slow = (Named(CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent"),
                                          options={"interval": every[n]}), n) for n in every)
    eng = Engine([quick, slow], clock, inline=True)
    eng.start()
    await clock.advance(1.3)
    eng.set_interval("quick", 1.0)  # slowed (no GPU waits): on the 1 s ticks of the other, not 1.3 + 1.0
    await clock.advance(3.0)
    await eng.stop()
    assert [s.t for s in eng.history("quick")][-3:] == [102.0, 103.0, 104.0]
    assert [s.t for s in eng.history("slow")][-3:] == [102.0, 103.0, 104.0]


class Slow(Fast):
    """A call slower than the engine's patience but well within its deadline (a big deep pass); notes how many
    calls ``other`` got while it ran."""

    name = "slow"
    default_interval = 0.5

    def __init__(self, ctx: CollectorContext, other: Fast) -> None:
        super().__init__(ctx)
        self.other = other
        self.meanwhile: list[int] = []

    def update(self) -> int:
        self.calls += 1
        before = self.other.calls
        time.sleep(0.3)
        self.meanwhile.append(self.other.calls - before)
        return self.calls


async def test_a_slow_call_hands_the_schedule_to_a_fresh_thread_and_is_still_recorded() -> None:
    fast = Fast(_ctx())
    slow = Slow(_ctx(), fast)
    eng = Engine([slow, fast], RealClock())
    eng.start()
    try:
        await _until(lambda: eng.snapshot.status["slow"].runs >= 3)
        st = eng.snapshot.status["slow"]
        assert st.success and st.failures == 0 and eng.snapshot.value("slow") is not None
        # The fast sampler (50 ms) kept running while each slow call slept 0.3 s: another thread took over.
        assert all(n >= 1 for n in slow.meanwhile), slow.meanwhile
        assert eng.snapshot.status["fast"].success
        # A replaced thread ends after its call: the runner, and at most the one inside the slow call now.
        alive = [t for t in threading.enumerate() if t.name.startswith("sampler-")]
        assert 1 <= len(alive) <= 2, alive
        assert eng.abandoned_threads == 0
    finally:
        await eng.stop()
    await _until(lambda: not [t for t in threading.enumerate() if t.name.startswith("sampler-")])


async def test_a_bug_around_a_call_on_the_sampler_thread_is_retried_with_backoff_and_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fast = Fast(_ctx())
    eng = Engine([fast], RealClock())
    crash_records(monkeypatch, eng, 2, "bug in the engine around a call")
    t0 = time.monotonic()
    with capture_logs() as logs:
        eng.start()
        try:
            await _until(lambda: eng.snapshot.status["fast"].runs >= 1)
            assert time.monotonic() - t0 >= 0.05 + 0.1  # backed off 0.05 s, then 0.1 s
            st = eng.snapshot.status["fast"]
            assert st.restarts == 2 and st.success
            assert eng.alive()
        finally:
            await eng.stop()
    assert [e["event"] for e in logs].count("sampler_crashed") == 2
