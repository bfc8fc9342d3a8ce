"""A GPU whose verdict holds is evaluated every --collector.derived.stable-interval, not every run.

"Sampling that pays only for what it learns" (DESIGN.md): the analyzer's 1 s run reads only the samples taken
since a stable GPU's last evaluation (the tripwire) and evaluates it again only when its activity moved, at
its next stable interval, or at every run while it waits or its verdict is changing. Played in virtual time
through the real simulator, collectors and engine, next to the same scenario evaluated every second: the
verdicts change at the same evaluations, the state counters are the same integrals, and far fewer
evaluations run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.derived import evaluate
from exporter.diagnose.report import check
from exporter.sim.player import PlayResult, play
from exporter.sim.scenario import load
from exporter.snapshot import Snapshot, Stamped

SCENARIO = Path(__file__).parent / "scenarios" / "stable_then_starved.yaml"


def _play(monkeypatch: pytest.MonkeyPatch, stable: str) -> tuple[PlayResult, dict[int, int]]:
    """The scenario with ``stable-interval`` at ``stable``; and how many evaluations each GPU had."""
    calls: dict[int, int] = {}
    real = evaluate.evaluate_gpu

    def counting(index: int, *args: Any, **kwargs: Any) -> Any:
        calls[index] = calls.get(index, 0) + 1
        return real(index, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr("exporter.derived.analyzer.evaluate_gpu", counting)  # the name analyzer calls
        # The analyzer at its interval whatever the GPUs' rate: this test counts evaluations per run.
        res = play(load(SCENARIO), timeline=True, flags={"collector.derived.stable-interval": stable,
                                                          "collector.derived.steady-interval": "1s"})
    return res, calls


def _changes(res: PlayResult) -> list[tuple[float, int, str]]:
    seen: dict[int, str] = {}
    out = []
    for t, s in res.timeline:
        for gpu, v in s.gpus.items():
            if seen.get(gpu) != v.cause:
                seen[gpu] = v.cause
                out.append((t, gpu, v.cause))
    return out


@pytest.fixture(scope="module")
def both() -> tuple[tuple[PlayResult, dict[int, int]], tuple[PlayResult, dict[int, int]]]:
    with pytest.MonkeyPatch.context() as m:
        return _play(m, "1s"), _play(m, "5s")


def test_both_cadences_meet_the_scenario_expectations(both: Any) -> None:
    (every, _), (stable, _) = both
    assert check(every) == []
    assert check(stable) == []


def test_a_stable_gpu_is_evaluated_at_most_every_stable_interval_plus_its_changes(both: Any) -> None:
    (every, every_calls), (_stable, stable_calls) = both
    runs = every.sampler_runs["derived"]
    # The first run (t = 0) has no GPU sample yet; every later run evaluates both GPUs.
    assert every_calls == {0: runs - 1, 1: runs - 1}, "with stable-interval 1s every run evaluates every GPU"
    # GPU 0 trains steadily all along: one evaluation per 5 s after its verdict settled (the first window),
    # plus the runs around the start. GPU 1 changes twice, and is evaluated every run while it waits.
    assert stable_calls[0] <= 15 + runs / 5 + 2, (stable_calls, runs)
    assert stable_calls[0] < runs / 3
    assert stable_calls[1] < every_calls[1]


def test_a_dip_is_seen_at_the_next_run_so_the_verdict_changes_when_it_would_every_second(both: Any) -> None:
    (every, _), (stable, _) = both
    a, b = _changes(every), _changes(stable)
    assert [(g, c) for _, g, c in a] == [(g, c) for _, g, c in b]
    for (ta, g, c), (tb, _, _) in zip(a, b, strict=True):
        assert abs(ta - tb) <= 1.0 + 1e-6, (g, c, ta, tb)


def test_state_counters_are_the_same_integrals_at_either_cadence(both: Any) -> None:
    (every, _), (stable, _) = both
    for phase_a, phase_b in zip(every.phases, stable.phases, strict=True):
        assert phase_a.state is not None and phase_b.state is not None
        for gpu in (0, 1):
            sa = phase_a.state.activity[gpu].state_seconds
            sb = phase_b.state.activity[gpu].state_seconds
            # The stable run splits the last <= 5 s of the phase at its next evaluation: it may lag by that.
            assert abs(sum(sa.values()) - sum(sb.values())) <= 5.0 + 1e-6, (phase_a.name, gpu, sa, sb)
            for state in sa:
                assert abs(sa[state] - sb[state]) <= 0.02 * phase_a.end_s + 5.0, (phase_a.name, gpu, state, sa, sb)


def test_an_unchanged_run_publishes_nothing_and_keeps_the_previous_state() -> None:
    """The engine side: UNCHANGED is a success that buffers and publishes nothing."""
    from exporter.engine import Engine, VirtualClock
    from exporter.sampling import UNCHANGED, SamplerSpec, Stage

    values: list[Any] = [1, UNCHANGED, UNCHANGED, 2]

    class Once(Stage):
        name = "once"
        help = "test"

        def samplers(self) -> list[SamplerSpec]:
            return [SamplerSpec("once", 1.0, lambda: values.pop(0), blocking=False)]

        def metrics(self, snap: Snapshot) -> list[Any]:
            return []

    published: list[int] = []
    clock = VirtualClock(0.0)
    eng = Engine([Once()], clock, inline=True, on_publish=lambda: published.append(1))
    eng.run_until(0.0)
    first = eng.snapshot.latest["once"]
    eng.run_until(2.0)
    assert len(published) == 1, "two UNCHANGED runs published nothing"
    assert eng.snapshot.latest["once"] is first
    st = eng.samplers["once"]
    assert (st.runs, st.success, st.last_success) == (3, True, 2.0)
    assert [x.value for x in eng.history("once")] == [1]
    eng.run_until(3.0)
    latest: Stamped[Any] = eng.snapshot.latest["once"]
    assert latest.value == 2 and len(published) == 2


def test_the_analyzer_runs_every_steady_interval_while_every_gpu_is_steady_and_none_waits(both: Any) -> None:
    # healthy-then-waiting scenario above: GPU 0 steady all along, GPU 1 waits in the middle. At the default
    # --collector.derived.steady-interval (2 s) the runs thin out while both GPUs are steady, and the
    # expectations hold as at one run a second.
    (every, _), _ = both
    paced = play(load(SCENARIO), timeline=True)
    assert check(paced) == []
    assert paced.sampler_runs["derived"] < 0.85 * every.sampler_runs["derived"], (
        paced.sampler_runs["derived"], every.sampler_runs["derived"])
