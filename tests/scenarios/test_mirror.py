"""The scenario files in this directory are the shared contract's files, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[2] / "shared" / "scenarios"


def test_repo_copy_has_scenarios() -> None:
    assert sorted(HERE.glob("*.yaml")), "tests/scenarios/ holds no scenario files"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present (CI without ../shared)")
def test_scenario_copies_are_byte_identical_to_shared() -> None:
    shared = {p.name: p.read_bytes() for p in SHARED.glob("*.yaml")}
    ours = {p.name: p.read_bytes() for p in HERE.glob("*.yaml")}
    assert sorted(ours) == sorted(shared), "copy tests/scenarios/*.yaml from ../shared/scenarios again"
    stale = sorted(n for n in shared if ours[n] != shared[n])
    assert not stale, f"out of sync with ../shared/scenarios: {stale}"
