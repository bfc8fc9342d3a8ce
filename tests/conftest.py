"""Fixtures and options for the whole suite: every test gets the logging state it started with back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import structlog

from exporter import log


def pytest_addoption(parser: pytest.Parser) -> None:
    """``pytest --update-golden`` from the repository root (tests/host/conftest.py registers it too)."""
    with contextlib.suppress(ValueError):  # a package conftest registered the same option first
        parser.addoption("--update-golden", action="store_true", default=False,
                         help="rewrite golden files (tests/fixtures/host/e2e-output.txt) instead of diffing")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo whatever a test did to the process-wide logging state.

    The CLI entry points (``gpufeed diagnose``, ``run_live``) call ``log.configure`` like any command would;
    without this a later test in the same session inherits their level and stream (a capture file pytest
    has closed) and its log assertions fail depending on test order. The ``log.once`` keys are restored
    too, so a condition logged once by one test is logged again by the next.
    """
    saved_config = structlog.get_config()
    with log._once_lock:
        saved_once = set(log._once_keys)
    yield
    structlog.configure(**saved_config)
    with log._once_lock:
        log._once_keys.clear()
        log._once_keys.update(saved_once)
