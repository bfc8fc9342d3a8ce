"""Every edge-case scenario of the derived layer holds through the real simulator, collectors and engine.

Each scenario plays in virtual time (``gpufeed diagnose --scenario FILE --check`` in-process), once per session
(tests.support.plays); beyond the phase-end expectations, the timeline is checked for what must never happen at
any evaluation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.diagnose.report import check
from exporter.samples.derived import DerivedState
from exporter.sim.player import PlayResult
from tests.support.plays import played

HERE = Path(__file__).parent / "scenarios"
FILES = sorted(HERE.glob("*.yaml"))
# The repository's copy of the shared contract scenarios (shared/scenarios/*.yaml).
CONTRACT = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))


def _play(name: str) -> PlayResult:
    return played(HERE / f"{name}.yaml")


def _phase_span(res: PlayResult, prefix: str) -> list[tuple[float, float]]:
    spans, start = [], 0.0
    for ph in res.scenario.phases:
        if ph.name.startswith(prefix):
            spans.append((start, ph.end_s))
        start = ph.end_s
    return spans


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_edge_case_scenario_expectations_hold(path: Path) -> None:
    res = played(path)
    assert check(res) == []


@pytest.mark.parametrize("path", CONTRACT, ids=[p.stem for p in CONTRACT])
def test_contract_scenario_expectations_hold(path: Path) -> None:
    res = played(path)
    assert check(res) == []


def assert_settled_within(path: Path, seconds: float = 15.0) -> None:
    """Every expected verdict of ``path`` holds at every evaluation from ``seconds`` after its phase's onset."""
    res = played(path)
    start = 0.0
    for ph in res.scenario.phases:
        for exp in res.scenario.expect:
            if exp.phase != ph.name:
                continue
            for gpu, want in exp.gpus.items():
                seen = [(t, s.gpus[gpu].cause) for t, s in res.timeline if start < t <= ph.end_s and gpu in s.gpus]
                late = [c for t, c in seen if t > start + seconds]
                assert late and set(late) <= set(want), (path.name, ph.name, gpu, seen)
        start = ph.end_s


def test_every_verdict_settles_within_15_s_of_its_phase_onset_and_does_not_flap() -> None:
    for path in (HERE / "multi_gpu_mixed.yaml", HERE / "single_core_host.yaml"):
        assert_settled_within(path)


def test_flapping_idle_link_never_raises_a_downgrade_at_any_evaluation() -> None:
    res = _play("flapping_idle_link")
    idle = _phase_span(res, "idle_flap_")
    states: list[DerivedState] = [s for t, s in res.timeline if any(a < t <= b for a, b in idle)]
    assert states, "the timeline covers the idle phases"
    assert not [f for s in states for f in s.findings if f.check == "pcie_link_downgraded"]
    assert {s.gpus[0].cause for s in states if 0 in s.gpus} == {"idle"}


def test_losing_one_gpu_leaves_the_others_verdict_alone() -> None:
    res = _play("gpu_lost")
    (lost_from, _), = _phase_span(res, "one_lost")
    after = [s for t, s in res.timeline if t > lost_from + 10]
    assert after
    assert all(s.gpus[0].cause == "healthy" for s in after)
    assert all(any(f.check == "gpu_lost" and f.gpu == 1 for f in s.findings) for s in after)
    assert all(1 not in s.gpus for s in after)
