"""Real workload programs for the capture tests, started and stopped around each test."""

from __future__ import annotations

import subprocess
import sys
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
    """Start a test program (it prints "ready" once its loop is about to run); killed after the test."""
    if pyspy_binary() is None:
        pytest.fail("py-spy is a test dependency (pip install -e '.[test]')")
    started: list[subprocess.Popen[bytes]] = []

    def start(program: str, seconds: float = 30.0) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, str(PROGRAMS / f"{program}.py"), str(seconds)],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        return proc

    yield start
    for p in started:
        p.kill()
        p.wait(10)
