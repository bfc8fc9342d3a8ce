"""HTTP under load and abuse against a real daemon process (127.0.0.1, bounded, seconds not minutes).

The full-size run (200 scrapers x 60 s, 500 slowloris, 500 idle) is ``python -m bench.load``; its figures
are in docs/reliability.md. These tests check behaviour, not speed: every request answered or refused
cleanly, slow clients cut off by the read timeout, the connection cap holding, hostile requests getting
the right status, sampling continuing, threads and memory bounded.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import pytest

from bench import load

from .test_lifecycle import Daemon, child

_OVERRUNS = re.compile(r'^gpufeed_sampler_overruns_total\{sampler="ticks"\} (\S+)$', re.M)
_RAN = re.compile(r'^gpufeed_sampler_last_success_timestamp_seconds\{sampler="ticks"\} ', re.M)


def ticks(d: Daemon) -> tuple[float, float]:
    """(runs, overruns) of the test daemon's 50 ms sampler.

    The payload served before the engine's first publish has the collector's own family but no sampler
    status yet (nothing has run); wait, bounded, for a payload rendered after the sampler started.
    """
    deadline = time.monotonic() + 5.0
    code, body = d.get()
    while not (code == 200 and _RAN.search(body)) and time.monotonic() < deadline:
        time.sleep(0.05)
        code, body = d.get()
    assert code == 200 and "test_ticks" in body, (code, body[:500])
    runs = float(re.search(r"^test_ticks (\S+)$", body, re.M).group(1))  # type: ignore[union-attr]
    m = _OVERRUNS.search(body)
    return runs, float(m.group(1)) if m else 0.0  # the series appears with the first missed tick


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon(child(flags=("--web.read-timeout=1s", "--web.idle-timeout=2s", "--web.render-interval=20ms")))
    yield d
    d.stop()


def test_200_back_to_back_scrapers_are_all_answered_and_sampling_keeps_its_ticks(daemon: Daemon) -> None:
    before = load.proc_stats(daemon.proc.pid)
    t0 = time.monotonic()
    runs0, over0 = ticks(daemon)
    seconds = 5.0
    r = asyncio.run(load.flood(daemon.port, 200, seconds))
    runs1, over1 = ticks(daemon)
    elapsed = time.monotonic() - t0
    after = load.proc_stats(daemon.proc.pid)
    assert r["load"]["errors"] == {}, r
    assert set(r["load"]["status"]) <= {200, 503} and r["load"]["status"].get(200, 0) > 1000, r
    assert r["probe"]["status"] == {200: r["probe"]["requests"]}, r  # the real scraper is never refused
    assert r["probe"]["p99_ms"] < 1000, r  # loose: this box is shared; measured figures are in the docs
    # Every 50 ms tick either ran or was counted as an overrun: nothing silently lost.
    print(f"ticks in {elapsed:.1f} s: {runs1 - runs0:.0f} run, {over1 - over0:.0f} counted as overruns; {r}")
    assert (runs1 - runs0) + (over1 - over0) >= 0.9 * (elapsed - 0.1) / 0.05, (runs1 - runs0, over1 - over0, elapsed)
    # main + web + at most 4 sampler workers + the web loop's default executor: no thread per connection
    assert after["threads"] <= 8, after
    assert after["rss_mib"] - before["rss_mib"] < 50


def test_slowloris_connections_are_cut_at_the_read_timeout_and_scrapes_go_on(daemon: Daemon) -> None:
    r = asyncio.run(load.hold_connections(daemon.port, 300, 3.5, drip=0.25))
    assert r["closed_by_server"] >= 300, r
    assert 0.8 <= r["closed_after_s_p50"] <= 2.0, r  # --web.read-timeout=1s
    assert r["probe"]["status"] == {200: r["probe"]["requests"]}, r
    deadline = time.monotonic() + 3.0  # the last ones are cut one read timeout after the attack stops
    while load.proc_stats(daemon.proc.pid)["fds"] >= 100:
        assert time.monotonic() < deadline, "connections not released"
        time.sleep(0.1)


def test_idle_connections_are_closed_and_do_not_block_scrapes(daemon: Daemon) -> None:
    r = asyncio.run(load.hold_connections(daemon.port, 300, 3.5, drip=None))
    assert r["closed_by_server"] >= 300 and r["closed_after_s_p50"] <= 2.0, r
    assert r["probe"]["status"] == {200: r["probe"]["requests"]}, r


def test_hostile_and_malformed_requests_get_a_clean_error_and_the_daemon_keeps_serving(daemon: Daemon) -> None:
    results = asyncio.run(load.abuse(daemon.port, timeout=3.0))
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad
    assert daemon.get()[0] == 200
    assert daemon.get("/nope")[0] == 404


def test_connections_over_the_cap_are_closed_and_the_rest_served() -> None:
    d = Daemon(child(flags=("--web.max-connections=50",)))
    try:
        assert d.get()[0] == 200
        idle_fds = load.proc_stats(d.proc.pid)["fds"]
        r = asyncio.run(load.connection_cap(d.port, 80))
        assert r["closed_immediately"] >= 30, r
        # The client has closed its 50 connections, but the server frees a slot only when it reads that
        # connection's EOF and closes the socket: a scrape connecting before then meets a full cap and is
        # closed (the ConnectionResetError CI saw). Wait, bounded, until the daemon holds no more sockets than
        # before the attack -- every slot freed -- and then one scrape must be served at once.
        deadline = time.monotonic() + 10.0
        while load.proc_stats(d.proc.pid)["fds"] > idle_fds:
            assert time.monotonic() < deadline, ("held connections not released", load.proc_stats(d.proc.pid))
            time.sleep(0.05)
        assert d.get()[0] == 200  # freed slots serve scrapes again
    finally:
        d.stop()
