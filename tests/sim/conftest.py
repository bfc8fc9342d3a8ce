"""Simulator tests: leave the process-wide log configuration pointing at a stream that stays open."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from exporter import log


@pytest.fixture(autouse=True)
def _log_to_real_stderr() -> Iterator[None]:
    # `gpufeed diagnose` configures logging on the stderr it finds, which under capsys is a capture file
    # that pytest closes after the test; later log lines would then fail with "I/O operation on closed file".
    yield
    log.configure("warn", "logfmt", stream=sys.__stderr__)
