"""The capture stage on the engine: a GPU whose verdict has waited --capture.after gets one capture of its real
workload, a bundle that names the right frames, counted and exported; one capture at a time; nothing at all
when disabled."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from exporter import names, pipeline
from exporter.capture.options import CaptureConfig
from exporter.capture.stage import CAPTURE, BusyError, CaptureStage, Judged
from exporter.capture.take import TRIGGER_HTTP, TRIGGER_VERDICT, CaptureContext
from exporter.config import ConfigError, resolve
from exporter.engine import Engine, VirtualClock
from exporter.samples.capture import CaptureNote, CaptureStats
from exporter.samples.derived import DerivedState, GpuVerdict
from exporter.sampling import SamplerSpec, Stage, Targets
from exporter.snapshot import Snapshot
from tests.capture.conftest import line_of

Start = Callable[..., subprocess.Popen[bytes]]


class _Verdicts(Stage):
    """The derived layer's place in the engine, answering a fixed verdict for GPU 0."""

    name = names.DERIVED
    help = "test verdicts"

    def __init__(self, cause: str) -> None:
        self.cause = cause

    def samplers(self) -> list[SamplerSpec]:
        return [SamplerSpec(names.DERIVED, 1.0, self.evaluate, blocking=False)]

    def evaluate(self) -> DerivedState:
        v = GpuVerdict(index=0, uuid="GPU-0", cause=self.cause, confidence=0.9, waiting_ratio=0.7,
                       evidence=("CPU-side work between launches",))
        return DerivedState(t=0.0, gpus={0: v}, findings=())

    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        return ()


def _engine(stage: CaptureStage, cause: str | _Verdicts) -> Engine:
    verdicts = cause if isinstance(cause, _Verdicts) else _Verdicts(cause)
    engine = Engine([verdicts, stage], VirtualClock(0.0), inline=True)
    stage.bind(engine)
    return engine


def _samples(stage: CaptureStage, engine: Engine) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in stage.metrics(engine.snapshot)
            for s in m.samples}


def test_gpu_waiting_past_capture_after_gets_one_capture_naming_the_sync_line(
        workload: Start, tmp_path: Path) -> None:
    proc = workload("sync_wait")
    targets = Targets()
    targets.publish({"0": [proc.pid]})
    out = tmp_path / "captures"
    stage = CaptureStage(CaptureConfig(enabled=True, after=3.0, interval=3600.0, duration=2.0, dir=out), targets)
    verdicts = _Verdicts("latency_bound")
    engine = _engine(stage, verdicts)
    # The stage first sees the verdict at its check of t=1 (the derived sample of t=0): due at t=4.
    engine.run_until(3.5)
    assert not stage.running and not out.exists()
    engine.run_until(4.0)
    assert stage.running
    stage.wait(30)
    engine.run_until(10.0)
    (b,) = list(out.iterdir())
    assert b.name.endswith("-gpu0-verdict")
    assert sorted(p.name for p in b.iterdir()) == ["capture.json", "host.json", "samples.json", "stacks.raw",
                                                   "stacks.speedscope.json", "summary.md"]
    record = json.loads((b / "capture.json").read_text())
    assert record["label"] == "sync"
    assert record["assessment"] == ("sync-bound: the GPU process blocks in a host sync every step (the verdict "
                                    "reads it as latency_bound)")
    assert [h["cause"] for h in record["history"]] == ["latency_bound"]
    line = line_of("sync_wait", "fakecuda.synchronize()")
    summary = (b / "summary.md").read_text()
    assert f"in `synchronize` (fakecuda/__init__.py) \u2190 `sync_wait.py:{line}`: a host sync every step" in summary
    assert "**GPU 0: latency_bound**" in summary
    scope = json.loads((b / "stacks.speedscope.json").read_text())
    assert any(f["name"] == "synchronize" for f in scope["shared"]["frames"])
    samples = _samples(stage, engine)
    assert samples[("gpufeed_captures_total", (("gpu", "0"), ("trigger", TRIGGER_VERDICT)))] == 1.0
    assert samples[("gpufeed_capture_in_progress", ())] == 0.0
    assert samples[("gpufeed_capture_cpu_seconds_total", ())] > 0.0
    assert ("gpufeed_capture_last_timestamp_seconds", ()) in samples
    # Once per workload per interval: still waiting, no second capture.
    engine.run_until(60.0)
    assert not stage.running and len(list(out.iterdir())) == 1
    # The stage's sample carries the capture for the analyzer while the verdict it was taken for holds ...
    stats = engine.snapshot.value(CAPTURE)
    assert isinstance(stats, CaptureStats)
    assert stats.newest == {0: CaptureNote(0, b.name, "latency_bound", "sync", record["evidence"][0])}
    # ... and forgets it once the verdict changes, for good.
    verdicts.cause = "healthy"
    engine.run_until(63.0)
    verdicts.cause = "latency_bound"
    engine.run_until(66.0)
    stats = engine.snapshot.value(CAPTURE)
    assert isinstance(stats, CaptureStats) and stats.newest == {}


def test_one_capture_at_a_time(workload: Start, tmp_path: Path) -> None:
    proc = workload("queue_wait")
    targets = Targets()
    targets.publish({"0": [proc.pid]})
    stage = CaptureStage(CaptureConfig(enabled=True, duration=2.0, dir=tmp_path), targets)
    engine = _engine(stage, "input_bound")
    engine.run_until(1.0)
    name = stage.start(0, TRIGGER_HTTP)
    assert name is not None and name.endswith("-gpu0-http")
    assert stage.start(0, TRIGGER_HTTP) is None
    with pytest.raises(BusyError):
        stage.take(0, TRIGGER_HTTP)
    stage.wait(30)
    out = stage.take(0, TRIGGER_HTTP)  # free again
    assert out.label == "input" and out.assessment == "the stacks confirm input_bound"
    assert out.path is not None and out.path.is_dir()
    listing = stage.listing()
    assert [r["trigger"] for r in listing["recent"]] == [TRIGGER_HTTP, TRIGGER_HTTP]
    assert len(listing["bundles"]) in (1, 2)  # two in the same second share a name


def test_a_gpu_without_processes_is_not_captured_until_they_are_known(tmp_path: Path) -> None:
    targets = Targets()
    out = tmp_path / "c"
    stage = CaptureStage(CaptureConfig(enabled=True, after=1.0, duration=1.0, dir=out), targets)
    engine = _engine(stage, "input_bound")
    engine.run_until(5.0)
    assert not stage.running and not out.exists()
    targets.publish({"0": [999_999_999]})  # known now (and gone: the capture says so)
    engine.run_until(6.0)
    stage.wait(30)
    (b,) = list(out.iterdir())
    record = json.loads((b / "capture.json").read_text())
    assert record["unavailable"].startswith("stacks unavailable: pid 999999999: ")


class _SlowToGather(CaptureStage):
    """A capture thread that gathers its context only once the test lets it (a busy host delays a thread)."""

    go = threading.Event()

    def context(self, gpu: int | None, trigger: str, judged: Judged | None = None) -> CaptureContext:
        assert self.go.wait(30)
        return super().context(gpu, trigger, judged)


def test_a_capture_records_the_verdict_it_was_taken_for_when_a_newer_one_is_published_before_it_gathers(
        tmp_path: Path) -> None:
    targets = Targets()
    targets.publish({"0": [999_999_999]})
    out = tmp_path / "c"
    stage = _SlowToGather(CaptureConfig(enabled=True, after=3.0, interval=3600.0, duration=1.0, dir=out), targets)
    verdicts = _Verdicts("latency_bound")
    engine = _engine(stage, verdicts)
    engine.run_until(4.0)
    assert stage.running  # started on latency_bound; its thread has not gathered anything yet
    verdicts.cause = "io_bound"
    engine.run_until(6.0)  # the analyzer publishes io_bound, the trigger records it
    stage.go.set()
    stage.wait(30)
    (b,) = list(out.iterdir())
    record = json.loads((b / "capture.json").read_text())
    assert record["verdict"]["cause"] == "latency_bound"
    assert [h["cause"] for h in record["history"]] == ["latency_bound"]
    assert "**GPU 0: latency_bound**" in (b / "summary.md").read_text()


def test_disabled_by_default_nothing_is_built_or_run() -> None:
    settings = resolve(pipeline.registry(), {}, {"collector.kubernetes": False})
    assert settings["capture.enabled"] is False
    before = {t.name for t in threading.enumerate()}
    pipe = pipeline.build(settings, clock=VirtualClock(0.0), inline=True)
    try:
        assert pipe.capture is None
        assert CAPTURE not in pipe.engine.samplers
        assert all(not isinstance(s, CaptureStage) for s in pipe.stages)
        assert "gpufeed-capture" not in {t.name for t in threading.enumerate()} - before
    finally:
        pipe.close()


def test_enabled_builds_the_stage_after_the_analyzer(tmp_path: Path) -> None:
    settings = resolve(pipeline.registry(), {}, {"capture.enabled": True, "capture.dir": str(tmp_path),
                                                 "capture.after": "30s", "collector.kubernetes": False})
    pipe = pipeline.build(settings, clock=VirtualClock(0.0), inline=True)
    try:
        assert isinstance(pipe.capture, CaptureStage) and pipe.stages[-1] is pipe.capture
        assert pipe.capture.config == CaptureConfig(enabled=True, after=30.0, dir=tmp_path)
        assert CAPTURE in pipe.engine.samplers
    finally:
        pipe.close()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("capture.duration", "2m", "--capture.duration must be above 0 and at most 1m"),
    ("capture.rate", "0", "--capture.rate must be between 1 and 1000"),
    ("capture.max-count", "0", "--capture.max-count must be at least 1"),
    ("capture.max-bytes", "1000", "--capture.max-bytes must be at least 1048576"),
])
def test_bad_capture_settings_name_the_flag(flag: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(pipeline.registry(), {}, {flag: value})


def test_closing_the_stage_cancels_a_running_capture_at_once(workload: Start, tmp_path: Path) -> None:
    proc = workload("sync_wait")
    targets = Targets()
    targets.publish({"0": [proc.pid]})
    stage = CaptureStage(CaptureConfig(enabled=True, duration=30.0, dir=tmp_path / "c"), targets)
    _engine(stage, "latency_bound").run_until(1.0)
    assert stage.start(0, TRIGGER_HTTP) is not None
    time.sleep(1.0)
    started = time.monotonic()
    stage.close()
    stage.wait(10)
    assert time.monotonic() - started < 5 and not stage.running
    (b,) = list((tmp_path / "c").iterdir())
    record = json.loads((b / "capture.json").read_text())
    assert record["problems"] == [f"pid {proc.pid}: cancelled (gpufeed stopping)"]
    assert stage.start(0, TRIGGER_HTTP) is None  # none after close
