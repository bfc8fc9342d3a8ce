"""Real workload programs for the capture tests, started and stopped around each test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.capture.runner import pyspy_binary

PROGRAMS = Path(__file__).parent / "programs"


def line_of(program: str, text: str) -> int:
    """The line number of ``text`` in a test program (what the capture should name)."""
    for n, line in enumerate((PROGRAMS / f"{program}.py").read_text().splitlines(), 1):
        if text in line:
            return n
    raise AssertionError(f"{text!r} not in {program}.py")


@pytest.fixture
def workload() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a test program (it prints "ready" once its loop is about to run); killed after the test with every
    process it started: each runs in a session of its own, and the whole group goes (queue_wait's worker
    processes outlived a killed parent for good, blocked on a full queue)."""
    if pyspy_binary() is None:
        pytest.fail("py-spy is a test dependency (pip install -e '.[test]')")
    started: list[subprocess.Popen[bytes]] = []

    def start(program: str, seconds: float = 30.0) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, str(PROGRAMS / f"{program}.py"), str(seconds)],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        return proc

    yield start
    for p in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # the session's group id is the leader's pid, alive or a zombie
        p.wait(10)
        assert p.stdout is not None
        p.stdout.close()
    deadline = time.monotonic() + 10.0  # the orphaned workers die and are reaped by init, not by us
    while (left := [p.pid for p in started if _group_alive(p.pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the test programs' groups {left} outlived SIGKILL"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
