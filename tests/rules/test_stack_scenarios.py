"""The integration stack's own scenarios (tests/rules/scenarios/) mean what they say: each plays in virtual
time and its expectations hold, so a panel or alert they feed is fed by the situation their description
names (a Slurm-owned GPU, a MIG instance's Xid), not by an accident of the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.diagnose.report import check
from tests.support.plays import played

FILES = sorted((Path(__file__).resolve().parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_stack_scenario_expectations_hold(path: Path) -> None:
    assert check(played(path)) == []
