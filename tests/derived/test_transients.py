"""Startup and phase-edge transients (issue 40, P7): what a verdict based on part of a window says, and what
the waiting-seconds counters book while a window spans a phase change.

Played in virtual time through the real simulator, collectors, engine and analyzer: the shipped launch-bound
scenario with its phases swapped -- a GPU starved by its launch thread from the start, then healthy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.derived.findings import nfs_retransmissions
from exporter.derived.hostshape import io_signals
from exporter.samples.derived import DerivedState
from exporter.samples.host import NfsSample
from exporter.sim.player import PlayResult
from exporter.sim.scenario import load
from exporter.snapshot import Stamped
from tests.support.plays import play

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
WINDOW = 15.0


@pytest.fixture(scope="module")
def starved_then_healthy(tmp_path_factory: pytest.TempPathFactory) -> PlayResult:
    text = (SCENARIOS / "launch_bound.yaml").read_text()
    warm, starved, expect = (text.index(k) for k in ("  - name: warmup", "  - name: starved", "expect:"))
    path = tmp_path_factory.mktemp("transients") / "starved_then_healthy.yaml"
    path.write_text(text[:warm] + text[starved:expect] + text[warm:starved] + "expect: []\n")
    return play(load(path))


def _causes(res: PlayResult) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    for t, st in res.timeline:
        v = st.gpus.get(0)
        if v is not None and (not out or out[-1][1] != v.cause):
            out.append((t, v.cause))
    return out


def test_seconds_of_a_verdict_that_never_held_a_window_are_not_booked_to_its_cause(
        starved_then_healthy: PlayResult) -> None:
    # The window's mix at the start (~4 s) and at the phase change (~6 s) reads latency_bound between two real
    # verdicts; those seconds went to gpufeed_gpu_waiting_seconds_total{cause="latency_bound"}.
    res = starved_then_healthy
    causes = _causes(res)
    assert [c for _, c in causes if c != "latency_bound"] == ["launch_bound", "healthy"], causes
    assert "latency_bound" in [c for _, c in causes], "the transient this test is about did not happen"
    healthy_at = next(t for t, c in causes if c == "healthy")
    for t, st in res.timeline:
        a = st.activity.get(0)
        if a is not None and t < healthy_at + WINDOW - 1.0:  # before the healthy GPU's own seconds are booked
            assert a.waiting_seconds["latency_bound"] == 0.0, (t, dict(a.waiting_seconds))
    end = res.timeline[-1][1].activity[0]
    assert sum(end.waiting_seconds.values()) == pytest.approx(end.state_seconds["waiting"], abs=1e-6)


def test_a_verdict_based_on_part_of_the_window_says_how_much(starved_then_healthy: PlayResult) -> None:
    # The first verdict, a second after start, claimed "of the last 15 s".
    t, st = next((t, st) for t, st in starved_then_healthy.timeline if isinstance(st, DerivedState) and st.gpus)
    ev = st.gpus[0].evidence
    assert t < 3.0
    assert "of the last 15 s" not in ev[0] and f"of the last {t:.0f} s" in ev[0], ev
    assert any("first reading" in e for e in ev), ev


def test_the_first_nfs_rate_is_per_second_of_the_samples_and_says_over_how_long() -> None:
    # Two seconds after start: 70 retransmissions of 80,000 calls in the 2 s the samples cover. The detail
    # claimed "over the last 15 s" (and a live run showed 17/s for a true 35/s).
    nfs = [Stamped(0.5, NfsSample(rpc_calls=1_000_000, retransmissions=100, ops={})),
           Stamped(2.5, NfsSample(rpc_calls=1_080_000, retransmissions=170, ops={}))]
    io = io_signals((), (), nfs)
    assert io.nfs_retrans_per_s == pytest.approx(35.0) and io.nfs_span_s == pytest.approx(2.0)
    f = nfs_retransmissions(io, WINDOW)
    assert f is not None
    assert "35.0 RPCs/s" in f.detail and "over the last 2 s" in f.detail, f.detail
