"""Shared helpers of the rule, dashboard and deployment tests: repo paths and the promtool binary."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
GRAFANA = REPO / "deploy" / "grafana"


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool (Debian package ``prometheus``); a missing binary fails, it does not skip."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's prometheus package (tools/ensure-test-deps.sh)")
    return path


def starter(tmp: Path, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> Callable[[str, list[str]], None]:
    """``start(name, argv)``: run ``argv`` in ``tmp`` with its output in ``tmp/<name>.log``, kept in ``procs`` (to
    stop) and ``logs`` (to show on failure)."""
    def start(name: str, argv: list[str]) -> None:
        log = tmp / f"{name}.log"
        logs.append(log)
        with log.open("wb") as fh:
            procs.append(subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=tmp))
    return start
