"""A stack capture's word on the verdict it was taken for (docs/derived.md, "Stack captures"): its first evidence
line joins the verdict's evidence, the confidence rises when the stacks confirm the verdict and falls when they
show another wait, and a loop blocked in a host sync under latency_bound / launch_bound raises ``sync_bound``;
a capture taken for another verdict says nothing."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from exporter import names
from exporter.derived.evaluate import CAPTURE_CONFIRMED, CAPTURE_QUESTIONED, with_capture
from exporter.samples.capture import CaptureNote, CaptureStats
from exporter.samples.derived import DerivedState, Finding, GpuVerdict
from exporter.snapshot import Stamped
from tests.derived.test_analyzer import make, run
from tests.support.builders import GpuSpec, ThreadSpec, const

LINE = "main thread 54% in `synchronize` (fakecuda/__init__.py) \u2190 `train.py:120`: a host sync every step"
BUNDLE = "20261206T054100Z-gpu0-verdict"


def _verdict(cause: str, confidence: float = 0.7) -> GpuVerdict:
    return GpuVerdict(0, "GPU-0", cause, confidence, 0.6, ("the GPU's own evidence",))


def _note(cause: str, label: str | None) -> CaptureNote:
    return CaptureNote(0, BUNDLE, cause, label, LINE)


@pytest.mark.parametrize(("cause", "label", "confidence"), [
    ("input_bound", "input", 0.7 + CAPTURE_CONFIRMED),
    ("io_bound", "input", 0.7 + CAPTURE_CONFIRMED),
    ("launch_bound", "launch", 0.7 + CAPTURE_CONFIRMED),
    ("input_bound", "launch", 0.7 * CAPTURE_QUESTIONED),
    ("input_bound", "sync", 0.7 * CAPTURE_QUESTIONED),
    ("latency_bound", "input", 0.7 * CAPTURE_QUESTIONED),
    ("latency_bound", "sync", 0.7),
    ("launch_bound", "sync", 0.7),
    ("input_bound", None, 0.7),
])
def test_the_capture_s_line_joins_the_evidence_and_moves_the_confidence_by_what_it_shows(
        cause: str, label: str | None, confidence: float) -> None:
    v, _ = with_capture(_verdict(cause), _note(cause, label))
    assert v.cause == cause and v.confidence == pytest.approx(confidence, abs=0.005)
    assert v.evidence == ("the GPU's own evidence", f"stacks ({BUNDLE}): {LINE}")


def test_confirmed_confidence_stays_at_most_one() -> None:
    v, _ = with_capture(_verdict("input_bound", 0.97), _note("input_bound", "input"))
    assert v.confidence == 1.0


@pytest.mark.parametrize("cause", ["latency_bound", "launch_bound"])
def test_a_loop_blocked_in_a_host_sync_under_a_small_work_or_launch_verdict_is_sync_bound(cause: str) -> None:
    _, found = with_capture(_verdict(cause), _note(cause, "sync"))
    assert found == Finding("sync_bound", 0, "info", LINE)


@pytest.mark.parametrize(("cause", "note"), [
    ("input_bound", _note("input_bound", "sync")),  # a sync under an input wait: questioned, not sync-bound
    ("latency_bound", _note("latency_bound", "input")),
    ("latency_bound", _note("latency_bound", None)),
])
def test_no_sync_bound_without_a_sync_label_under_latency_or_launch_bound(cause: str, note: CaptureNote) -> None:
    assert with_capture(_verdict(cause), note)[1] is None


def test_a_capture_taken_for_another_verdict_says_nothing() -> None:
    v = _verdict("latency_bound")
    assert with_capture(v, _note("input_bound", "sync")) == (v, None)
    assert with_capture(v, None) == (v, None)


def _with_note(streams: dict[str, list[Stamped[object]]], t: float, note: CaptureNote) -> None:
    streams.setdefault(names.CAPTURE, []).append(
        Stamped(t, CaptureStats(newest=MappingProxyType({note.gpu: note}))))


def test_the_analyzer_publishes_the_capture_s_word_while_the_verdict_holds_and_only_on_its_copy() -> None:
    an, eng = make(GpuSpec(util=const(0.42), sm=const(0.11)), [ThreadSpec(1, 0.56, 0.43, "R")], 80.0)
    before = run(an, eng, [float(t) for t in range(1, 31)])
    assert before.gpus[0].cause == "launch_bound"
    assert not [f for f in before.findings if f.check == "sync_bound"]
    # The capture stage publishes a sync capture taken for launch_bound while every verdict is stable: the next
    # run publishes it (no UNCHANGED while the captures moved).
    _with_note(eng.streams, 30.5, _note("launch_bound", "sync"))
    eng.t = 31.0
    after = an.update()
    assert isinstance(after, DerivedState)
    v = after.gpus[0]
    assert v.evidence == (*before.gpus[0].evidence, f"stacks ({BUNDLE}): {LINE}")
    assert v.confidence == before.gpus[0].confidence
    assert Finding("sync_bound", 0, "info", LINE) in after.findings
    # Later evaluations add the line once, not once more per evaluation.
    later = run(an, eng, [float(t) for t in range(32, 50)])
    assert later.gpus[0].evidence == v.evidence
    assert [f.check for f in later.findings].count("sync_bound") == 1
    # A capture for another verdict (the stage forgets a note once its verdict changes) says nothing.
    _with_note(eng.streams, 50.5, _note("latency_bound", "sync"))
    gone = run(an, eng, [float(t) for t in range(51, 60)])
    assert gone.gpus[0].evidence == before.gpus[0].evidence
    assert not [f for f in gone.findings if f.check == "sync_bound"]
