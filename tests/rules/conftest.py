"""Shared helpers of the rule, dashboard and deployment tests: repo paths and the promtool binary."""

from __future__ import annotations

import shutil
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
