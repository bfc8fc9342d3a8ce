"""When to render the payload: shortly before the next scrape, not at every publish.

The samplers publish ~25 times a second on an 8-GPU host; a Prometheus reads the payload every 15-60 s.
Rendering at every publish (at most once per ``--web.render-interval``) formats about 15-60 payloads per
scrape that nobody reads. Instead each scraper's next scrape is forecast from its last ones (Prometheus
scrapes a target at a fixed interval and a fixed offset within it), and the payload is rendered ``LEAD``
seconds before the earliest forecast -- never twice within ``--web.render-interval``; with no scraper whose
rhythm is known, every ``MAX_AGE`` seconds while samples change.

A scrape that arrives where no forecast put it (the first ones of a new scraper, an ad-hoc ``curl``) and
finds the payload older than ``stale_after`` (two render intervals) while newer samples exist asks for a
render and waits for it (at most ``exporter.web.RENDER_WAIT`` s): as before, the payload a scrape gets is
never older than that while newer samples exist. A scrape on time only copies pre-rendered bytes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.engine import Clock, RealClock

LEAD = 0.25  # seconds before a forecast scrape the payload is rendered (a render takes ~10 ms, GIL waits more)
MAX_AGE = 15.0  # seconds between renders while samples change and no scraper's rhythm is known
MAX_PEERS = 64  # scrapers remembered (bounded: the least recently seen is forgotten first)
GAPS_KEPT = 4  # intervals remembered per scraper; the forecast uses their median (one odd gap does not move it)
FORGET_AFTER = 4.0  # a scraper silent for this many of its intervals is forgotten
TOLERANCE = 0.1  # seconds a scrape may miss its forecast and still count as on time (no re-plan)


@dataclass
class _Peer:
    last: float
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))
    forecast: float | None = None  # the next scrape, as forecast at the last one

    def interval(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None


class ScrapeForecast:
    """Scrape times per scraper and the next scrape of each; safe to call from any thread.

    A scraper is its address and User-Agent: a Prometheus and an ad-hoc ``curl`` on the same host are two
    scrapers, each with its own rhythm.
    """

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self._max_peers = max_peers
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._peers)

    def record(self, peer: str, now: float) -> bool:
        """A scrape by ``peer`` at ``now``; whether it came where its forecast said (False: re-plan)."""
        with self._lock:
            p = self._peers.get(peer)
            if p is None:
                self._peers[peer] = _Peer(last=now)
                while len(self._peers) > self._max_peers:
                    self._peers.popitem(last=False)
                return False
            self._peers.move_to_end(peer)
            on_time = p.forecast is not None and abs(now - p.forecast) <= TOLERANCE
            p.gaps.append(max(0.0, now - p.last))
            p.last = now
            interval = p.interval()
            p.forecast = None if interval is None else now + interval
            return on_time

    def next_scrape(self, now: float) -> float | None:
        """The earliest scrape expected at or after ``now`` (None: no scraper with a known rhythm).

        A scraper that missed its forecast is expected one interval later (a missed scrape); one silent for
        ``FORGET_AFTER`` of its intervals is forgotten."""
        best: float | None = None
        with self._lock:
            for key in list(self._peers):
                p = self._peers[key]
                interval = p.interval()
                if interval is None:
                    continue
                if now - p.last > FORGET_AFTER * interval + TOLERANCE:
                    del self._peers[key]
                    continue
                nxt = p.last + interval
                if nxt < now - TOLERANCE and interval > 0:
                    nxt += interval * ((now - TOLERANCE - nxt) // interval + 1)
                best = nxt if best is None else min(best, nxt)
        return best


class RenderPacer:
    """Renders the payload (``render``, on the event loop that owns the snapshot) about once per scrape.

    ``changed()`` is called at every publish, from the thread that published; ``scraped()`` from the HTTP
    thread at every scrape of the metrics path. ``version()`` is the newest published version and
    ``rendered()`` the version of the payload served now: a render is only ever done when they differ.
    """

    def __init__(
        self,
        render: Callable[[], None],
        *,
        interval: float,
        version: Callable[[], int],
        rendered: Callable[[], int],
        clock: Clock | None = None,
        max_age: float = MAX_AGE,
        lead: float = LEAD,
    ) -> None:
        self._render = render
        self.interval = interval
        self.max_age = max(max_age, interval)
        self.stale_after = 2 * interval
        self.lead = lead
        self._version = version
        self._rendered = rendered
        self.clock: Clock = clock or RealClock()
        self.forecast = ScrapeForecast()
        self.renders = 0
        self.on_demand = 0  # renders a scrape asked for (it found the payload stale)
        self.last_render = self.clock.now()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._idle = False  # run() waits for a change: changed() must wake it
        self._loop_thread: int | None = None
        self._wake = asyncio.Event()
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future[None] | None = None  # the render stale scrapes wait for
        self._urgent = False

    def changed(self) -> None:
        """A new snapshot version exists (any thread: the engine's sampler thread records most of them). Wakes
        the pacer only while it waits for a change -- once per render at most; otherwise the version it reads
        when it is due says what changed."""
        if not self._idle:
            return
        self._idle = False
        loop = self._loop
        if loop is None:
            return
        if self._loop_thread == threading.get_ident():
            self._changed.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(self._changed.set)

    async def _wait_for_change(self) -> None:
        """Until a version newer than the rendered one is published."""
        while self._version() == self._rendered():
            self._changed.clear()
            self._idle = True
            try:
                # Read again after announcing: a publish between the first look and here would not wake us.
                if self._version() == self._rendered():
                    await self._changed.wait()
            finally:
                self._idle = False

    def due(self, now: float) -> float:
        """When the next render should start: before the earliest forecast scrape, within the spacing rules."""
        nxt = self.forecast.next_scrape(now)
        want = self.last_render + self.max_age if nxt is None else nxt - self.lead
        return max(self.last_render + self.interval, want)

    def scraped(self, peer: str) -> concurrent.futures.Future[None] | None:
        """A scrape of the metrics path by ``peer`` (HTTP thread). A future to wait on (a bounded time) when
        the payload is stale and a render was asked for; None when the payload can be served as it is."""
        now = self.clock.now()
        on_time = self.forecast.record(peer, now)
        loop = self._loop
        if loop is None:
            return None
        if now - self.last_render > self.stale_after and self._version() != self._rendered():
            with self._lock:  # every scrape that finds it stale waits for the same render
                if self._pending is not None:
                    return self._pending
                fut: concurrent.futures.Future[None] = concurrent.futures.Future()
                try:
                    loop.call_soon_threadsafe(self._asked)
                except RuntimeError:  # the loop is closing: serve what there is
                    return None
                self._pending = fut
                return fut
        if not on_time:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)  # the forecast moved: plan the next render again
        return None

    def _asked(self) -> None:
        self._urgent = True
        self._wake.set()

    async def _sleep(self, until: float) -> None:
        """Until ``until`` on the pacer's clock, or until woken (a re-plan or a stale scrape)."""
        if self._wake.is_set():
            return
        sleeper = asyncio.ensure_future(self.clock.sleep_until(until))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, waker):
                t.cancel()

    def _done(self) -> None:
        with self._lock:
            fut, self._pending = self._pending, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def run(self) -> None:
        """Render when due (or asked for by a stale scrape) while something new was published; forever."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        try:
            while True:
                await self._wait_for_change()
                now = self.clock.now()
                if not self._urgent:
                    due = self.due(now)
                    if due > now:
                        await self._sleep(due)
                        self._wake.clear()
                        if not self._urgent and self.clock.now() < self.due(self.clock.now()):
                            continue  # re-planned: the forecast moved
                self._wake.clear()
                if self._urgent:
                    self.on_demand += 1
                self._urgent = False
                try:
                    self._render()
                finally:
                    self.renders += 1
                    self.last_render = self.clock.now()
                    self._done()
        finally:
            self._loop = None
            self._done()
