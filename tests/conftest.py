"""Fixtures and options for the whole suite: logging state restored after every test, fixture hosts, faults."""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from exporter import log
from tests.support.deny import Deny, deny_reads
from tests.support.gpurig import Rig
from tests.support.hosts import LARGE, SAMPLERS, host


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files (tests/fixtures/hosts/*/golden.prom) instead of diffing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo whatever a test did to the process-wide logging state.

    The CLI entry points (``gpufeed diagnose``, ``run_live``) call ``log.configure`` like any command would;
    without this a later test in the same session inherits their level and stream (a capture file pytest
    has closed) and its log assertions fail depending on test order. The ``log.once`` keys are restored
    too, and each test sees the first occurrence of a persistent sampler condition.
    """
    saved_config = structlog.get_config()
    with log._once_lock:
        saved_once = set(log._once_keys)
    for name in SAMPLERS:
        log.forget(("sampler_failed", name))
        log.forget(("sampler_nodata", name))
    # log.configure also routes Python's own reports (stdlib logging, thread and unraisable hooks) through
    # structlog; pytest's own capture relies on those, so they are put back too.
    root = logging.getLogger()
    saved_hooks = (list(root.handlers), root.level, threading.excepthook, sys.unraisablehook, sys.excepthook)
    yield
    root.handlers[:], root.level = saved_hooks[0], saved_hooks[1]
    threading.excepthook, sys.unraisablehook, sys.excepthook = saved_hooks[2:]
    logging.captureWarnings(False)
    structlog.configure(**saved_config)
    with log._once_lock:
        log._once_keys.clear()
        log._once_keys.update(saved_once)


@pytest.fixture
def large(tmp_path: Path) -> Path:
    """A private, writable copy of the large fixture host (symlinks kept)."""
    dst = tmp_path / "large"
    shutil.copytree(LARGE, dst, symlinks=True)
    return dst


@pytest.fixture
def copy_box(tmp_path: Path) -> Callable[[str], Path]:
    """Copy a fixture host into tmp_path (symlinks kept relative) so a test can mutate it."""

    def _copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(host(name), dst, symlinks=True)
        return dst

    return _copy


@pytest.fixture
def rig(tmp_path: Path) -> Callable[..., Rig]:
    """The GPU collector over the strict fake NVML on a virtual clock (tests/support/gpurig.py)."""

    def make(devices: list[dict[str, Any]], **kw: Any) -> Rig:
        return Rig(tmp_path, devices, **kw)

    return make


@pytest.fixture
def deny(monkeypatch: pytest.MonkeyPatch) -> Deny:
    """Make reads of one path fail (EACCES unless told another errno), as for a non-root daemon."""
    return deny_reads(monkeypatch)
