"""Render pacing: about one render per scrape, shortly before it, in virtual time (renders counted, not timed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from exporter.engine import VirtualClock
from exporter.pacing import LEAD, MAX_AGE, MAX_PEERS, RenderPacer, ScrapeForecast

PROMETHEUS = "10.0.0.5 Prometheus/2.53.0"


def test_a_scraper_at_a_fixed_interval_is_expected_one_interval_after_its_last_scrape() -> None:
    f = ScrapeForecast()
    assert f.next_scrape(0.0) is None
    f.record(PROMETHEUS, 3.0)
    assert f.next_scrape(3.0) is None  # one scrape says nothing about the rhythm
    f.record(PROMETHEUS, 18.0)
    assert f.next_scrape(18.0) == pytest.approx(33.0)
    assert f.record(PROMETHEUS, 33.0) is True  # where the forecast put it
    assert f.next_scrape(40.0) == pytest.approx(48.0)


def test_a_missed_scrape_moves_the_forecast_one_interval_on_and_a_silent_scraper_is_forgotten() -> None:
    f = ScrapeForecast()
    f.record(PROMETHEUS, 0.0)
    f.record(PROMETHEUS, 15.0)
    assert f.next_scrape(31.0) == pytest.approx(45.0)
    assert f.next_scrape(15.0 + 15.0 * 5) is None
    assert len(f) == 0


def test_one_odd_gap_does_not_move_the_forecast_and_a_curl_on_the_same_host_is_its_own_scraper() -> None:
    f = ScrapeForecast()
    for t in (0.0, 15.0, 30.0, 45.0):
        f.record(PROMETHEUS, t)
    f.record(PROMETHEUS, 52.0)  # an odd one (a manual reload of the target page, say)
    assert f.next_scrape(52.0) == pytest.approx(67.0)  # median of 15, 15, 15, 7
    f.record("10.0.0.5 curl/8.5.0", 53.0)
    f.record("10.0.0.5 curl/8.5.0", 54.0)
    assert f.next_scrape(54.0) == pytest.approx(55.0)


def test_the_scrapers_remembered_are_bounded() -> None:
    f = ScrapeForecast()
    for i in range(MAX_PEERS + 10):
        f.record(f"10.0.0.{i} Prometheus", float(i))
    assert len(f) == MAX_PEERS


@dataclass
class Rig:
    clock: VirtualClock
    pacer: RenderPacer
    version: list[int] = field(default_factory=lambda: [0])
    rendered: list[int] = field(default_factory=lambda: [0])
    render_times: list[float] = field(default_factory=list)

    def publish(self) -> None:
        self.version[0] += 1
        self.pacer.changed()

    async def run(self, seconds: float, *, publish_every: float = 0.1, scrape_every: float | None = None,
                  scrape_at: float = 0.0, peer: str = PROMETHEUS) -> list[float]:
        """Publish every ``publish_every`` s for ``seconds`` s, scraping every ``scrape_every`` s from
        ``scrape_at`` on; the age of the payload each scrape got."""
        ages: list[float] = []
        end = self.clock.now() + seconds
        next_scrape = self.clock.now() + scrape_at
        while self.clock.now() < end - 1e-9:
            self.publish()
            await settle(self.clock, publish_every)
            if scrape_every is not None and self.clock.now() >= next_scrape - 1e-9:
                fut = self.pacer.scraped(peer)
                if fut is not None:
                    await settle(self.clock, 0.0)
                    assert fut.done(), "a stale scrape's render was not done"
                ages.append(self.clock.now() - self.render_times[-1])
                next_scrape += scrape_every
        return ages


async def settle(clock: VirtualClock, dt: float) -> None:
    await clock.advance(dt)
    for _ in range(20):  # the pacer's wake-ups take a few loop iterations
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def running(interval: float = 1.0) -> AsyncIterator[Rig]:
    clock = VirtualClock(100.0)
    rig: Rig

    def render() -> None:
        rig.rendered[0] = rig.version[0]
        rig.render_times.append(clock.now())

    pacer = RenderPacer(render, interval=interval, version=lambda: rig.version[0], rendered=lambda: rig.rendered[0],
                        clock=clock)
    rig = Rig(clock, pacer)
    rig.render_times.append(clock.now())
    task = asyncio.get_running_loop().create_task(pacer.run())
    await settle(clock, 0.0)
    try:
        yield rig
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_prometheus_every_15s_gets_about_one_render_per_scrape_rendered_just_before_it() -> None:
    async with running() as rig:
        ages = await rig.run(150.0, scrape_every=15.0, scrape_at=1.0)
        # Ten scrapes while the samples changed ten times a second: rendering at every publish (at most once per
        # render interval) would have been 150 renders.
        assert len(ages) == 10
        assert rig.pacer.renders <= 10 + 150 / MAX_AGE + 2
        # After the two scrapes that teach the rhythm, each scrape finds a payload rendered just before it.
        assert all(age <= LEAD + 0.1 + 1e-9 for age in ages[2:]), ages
        assert rig.pacer.on_demand <= 2


async def test_a_scrape_that_finds_the_payload_stale_waits_for_a_render_of_the_newest_samples() -> None:
    async with running() as rig:
        await rig.run(8.0)  # nobody scrapes: nothing forces a render before MAX_AGE
        assert rig.version[0] != rig.rendered[0]
        fut = rig.pacer.scraped("127.0.0.1 curl/8.5.0")
        assert fut is not None
        await settle(rig.clock, 0.0)
        assert fut.done()
        assert rig.rendered[0] == rig.version[0]
        assert rig.pacer.on_demand == 1


async def test_every_scrape_that_finds_the_payload_stale_waits_for_one_and_the_same_render() -> None:
    async with running() as rig:
        await rig.run(8.0)
        futs = [rig.pacer.scraped(f"127.0.0.1 scraper-{i}") for i in range(50)]
        assert futs[0] is not None and all(f is futs[0] for f in futs)
        await settle(rig.clock, 0.0)
        assert futs[0].done() and rig.pacer.renders == 1


async def test_a_fresh_payload_is_served_as_it_is() -> None:
    async with running() as rig:
        await rig.run(0.5)
        assert rig.pacer.scraped("127.0.0.1 curl/8.5.0") is None  # younger than two render intervals


async def test_with_nobody_scraping_the_payload_is_rendered_every_max_age_while_samples_change() -> None:
    async with running() as rig:
        await rig.run(MAX_AGE * 4 + 0.5)
        assert rig.pacer.renders == 4


async def test_back_to_back_scrapers_get_at_most_one_render_per_render_interval() -> None:
    async with running(interval=1.0) as rig:
        ages = await rig.run(20.0, scrape_every=0.1)
        assert 18 <= rig.pacer.renders <= 21
        assert max(ages) <= 2.0 + 1e-9  # never older than stale_after while newer samples exist


async def test_nothing_published_nothing_rendered() -> None:
    async with running() as rig:
        await settle(rig.clock, MAX_AGE * 3)
        assert rig.pacer.scraped(PROMETHEUS) is None
        assert rig.pacer.renders == 0
