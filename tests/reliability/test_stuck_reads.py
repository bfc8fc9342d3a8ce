"""Stuck reads on a whole simulated host, in real time with the daemon's worker threads: a FIFO in place of a
procfs file stands in for a hung NFS mount or driver call (open() blocks until a writer comes).

Round 2 found: a blocked read kept exporting frozen values with ``collector_success 1``, and four of them
exhausted the pool of four workers, so every collector froze while /metrics answered 200. Now each call has a
deadline: the sampler fails, its samples leave the exposition, ``gpufeed_sampler_last_success_timestamp_seconds``
stops, a fresh worker replaces the stuck one, and the sampler recovers once the read returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter import names
from exporter.derived.cadence import QUIET_INTERVALS

from .faults import Host, scratch_dir

STUCK = {"cpu": "proc/stat", "memory": "proc/meminfo", "disk": "proc/diskstats", "pressure": "proc/pressure/cpu"}


@pytest.fixture
def root() -> Iterator[Path]:
    d = scratch_dir()
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


async def _until(cond: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _release(fifo: Path, content: bytes) -> None:
    """The hung server answers: a writer opens the FIFO (unblocking the reader's open), writes, closes."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


async def test_four_reads_blocked_on_fifos_fail_their_collectors_and_the_others_keep_sampling(root: Path) -> None:
    host = Host(root, live=True)
    eng = host.engine
    eng.min_deadline, eng.deadline_intervals = 0.5, 1.0  # the daemon's are 5 s and 5 intervals
    saved = {}
    for rel in STUCK.values():
        path = host.root / rel
        saved[rel] = path.read_bytes()
        path.unlink()
        os.mkfifo(path)
    eng.start()
    try:
        # Each stuck collector fails at its deadline; nothing it read before is exported as if fresh.
        await _until(lambda: all(not eng.snapshot.status[c].success and eng.snapshot.status[c].runs >= 1
                                 for c in STUCK))
        for c in STUCK:
            assert "DeadlineExceededError" in (eng.snapshot.status[c].error or "")
            assert eng.snapshot.value(c) is None
        assert eng.abandoned_threads == len(STUCK)  # four stuck workers, every one replaced
        # The rest of the host keeps its rhythm: more than the old pool of four was ever stuck.
        runs = {n: st.runs for n, st in eng.snapshot.status.items() if n not in STUCK and st.interval <= 1.0}
        await asyncio.sleep(2.5)
        for name, st in eng.snapshot.status.items():
            if name not in runs:
                continue
            assert st.runs > runs[name], name
            assert st.success or not st.available, (name, st.error)
        series = host.series()
        for c in STUCK:
            assert series[f'gpufeed_collector_success{{collector="{c}"}}'] == 0.0
        assert series['gpufeed_collector_success{collector="proc"}'] == 1.0
        assert series["gpufeed_sampler_abandoned_threads"] == len(STUCK)
        # The server comes back: the blocked reads return (their results are dropped), the files are whole again.
        for rel, content in saved.items():
            path = host.root / rel
            _release(path, content)
            path.unlink()
            path.write_bytes(content)
        await _until(lambda: all(eng.snapshot.status[c].success for c in STUCK))
        await _until(lambda: eng.abandoned_threads == 0)
        assert host.series()['gpufeed_collector_success{collector="cpu"}'] == 1.0
    finally:
        for rel in STUCK.values():  # never leave a thread blocked on a FIFO
            path = host.root / rel
            if path.is_fifo():
                with contextlib.suppress(OSError):
                    _release(path, b"")
        await eng.stop()
        host.pipeline.close()


async def test_last_success_freezes_while_a_sampler_is_blocked(root: Path) -> None:
    host = Host(root, live=True)
    eng = host.engine
    eng.min_deadline, eng.deadline_intervals = 0.3, 1.0
    eng.start()
    fifo = host.root / "proc" / "meminfo"
    try:
        await _until(lambda: eng.snapshot.status["memory"].success)
        fifo.unlink()
        os.mkfifo(fifo)
        await _until(lambda: not eng.snapshot.status["memory"].success)
        key = 'gpufeed_sampler_last_success_timestamp_seconds{sampler="%s"}'
        before = host.series()
        await asyncio.sleep(QUIET_INTERVALS[names.CPU] + 0.5)
        series = host.series()
        # The blocked sampler's last success stays put (time() minus it, the alert's age, grows); the others'
        # keep moving. The age itself is not a series of its own (the host-level series budget).
        assert series[key % "memory"] == before[key % "memory"]
        # cpu runs at its quiet pace while no GPU waits: at least one success in that interval and a half second.
        assert series[key % "cpu"] > before[key % "cpu"]
        assert series[key % "memory"] < series[key % "cpu"]
        assert not [k for k in series if k.startswith("gpufeed_sample_age_seconds")]
    finally:
        if fifo.is_fifo():
            with contextlib.suppress(OSError):
                _release(fifo, b"")
        await eng.stop()
        host.pipeline.close()
