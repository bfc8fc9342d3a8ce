"""The whole daemon pipeline on this machine's /proc and /sys with a real workload (a training loop waiting on a
multiprocessing queue fed by slow worker processes) and the strict fake NVML showing its GPU waiting: the capture
stage fires on the verdict after --capture.after, the bundle is complete and names the right frames, and the
samplers keep their schedule while py-spy runs (overruns measured across the capture)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from exporter import names, pipeline
from exporter.capture.stage import CAPTURE, CaptureStage
from exporter.capture.take import TRIGGER_DIAGNOSE
from exporter.config import resolve
from exporter.engine import Engine, RealClock
from exporter.samples.derived import DerivedState
from exporter.sim.fakenvml import FakeNvml
from tests.capture.conftest import line_of
from tests.test_workload_real import gpu_driver

Start = Callable[..., subprocess.Popen[bytes]]
RUN_S = 40.0  # engine time at most; the test ends once the capture is written and its line published


def test_waiting_gpu_is_captured_on_its_verdict_and_sampling_stays_on_time(workload: Start, tmp_path: Path) -> None:
    proc = workload("queue_wait", seconds=90.0)
    out = tmp_path / "captures"
    fake = FakeNvml()
    gpu = gpu_driver(fake, proc.pid)
    # capture.after 8 s: past the onset, whose first evaluation judges 1 s of GPU data alone (latency_bound) until
    # the workers' CPU, about 5 s in, makes it input_bound. At 3 s the capture was taken for that first verdict,
    # which then changed, and the analyzer's use of the capture (below) went untested.
    settings = resolve(pipeline.registry(), {}, {
        "path.procfs": "/proc", "path.sysfs": "/sys",
        "collector.derived.window": "6s", "collector.proc.threads-interval": "1s",
        "collector.workload.interval": "1s", "collector.gpu.slow-interval": "1s",
        "collector.kubernetes": False,
        "capture.enabled": True, "capture.after": "8s", "capture.duration": "3s", "capture.dir": str(out),
    })
    pipe = pipeline.build(settings, clock=RealClock(), nvml=fake, history_seconds=60.0)
    stage = pipe.capture
    assert isinstance(stage, CaptureStage)
    overruns: list[tuple[bool, int, int]] = []  # (a capture running, overruns of every sampler, runs)

    async def run() -> None:
        pipe.engine.start()
        try:
            end = time.monotonic() + RUN_S
            while time.monotonic() < end:
                await asyncio.sleep(0.25)
                st = pipe.engine.snapshot.status
                overruns.append((stage.running, sum(s.overruns for s in st.values()),
                                 sum(s.runs for s in st.values())))
                if out.is_dir() and any(out.iterdir()) and not stage.running and _stacks_line(pipe.engine):
                    break  # the capture is written and the analyzer published its word on the verdict
        finally:
            await pipe.engine.stop(timeout=2.0)

    with contextlib.ExitStack() as cleanup:  # in reverse: stop the fake GPU's driver, then close the pipeline
        cleanup.callback(pipe.close)
        cleanup.callback(gpu.stop)
        gpu.start()
        asyncio.run(run())
    bundles = list(out.iterdir()) if out.is_dir() else []
    assert len(bundles) == 1, "no capture within the run"
    (b,) = bundles
    assert b.name.endswith("-gpu0-verdict")
    record = json.loads((b / "capture.json").read_text())
    assert record["verdict"]["cause"] in names.WAITING_CAUSES
    assert record["history"][-1]["cause"] == record["verdict"]["cause"]
    assert record["label"] == "input", record["evidence"]
    assert record["unavailable"] is None and record["problems"] == []
    line = line_of("queue_wait", "return int(q.get())")
    assert f"\u2190 `queue_wait.py:{line}`: waiting on the workers" in record["evidence"][0]
    samples = json.loads((b / "samples.json").read_text())
    assert samples[names.GPU_FAST] and all(s["value"]["identity"]["index"] == 0 for s in samples[names.GPU_FAST])
    assert samples[names.PROC]
    host = json.loads((b / "host.json").read_text())
    assert names.WORKLOAD in host and names.PCIE in host and names.MEMORY in host
    assert "queue_wait.py" in (b / "stacks.raw").read_text()
    # The samplers kept their schedule while py-spy sampled (3 s) and the bundle was written.
    state = pipe.engine.snapshot.status[CAPTURE]
    assert state.success
    first = next(i for i, o in enumerate(overruns) if o[0])
    last = max(i for i, o in enumerate(overruns) if o[0])
    before, after = overruns[max(0, first - 1)], overruns[min(len(overruns) - 1, last + 1)]
    missed, runs = after[1] - before[1], after[2] - before[2]
    assert runs > 20, "the samplers ran during the capture"
    assert missed <= max(3, runs // 20), f"{missed} overruns in {runs} runs around the capture"
    # The analyzer appends the capture's first line to the verdict it was taken for (input confirms input_bound).
    derived = pipe.engine.snapshot.value(names.DERIVED)
    assert isinstance(derived, DerivedState)
    if derived.gpus[0].cause == record["verdict"]["cause"]:
        assert derived.gpus[0].evidence[-1] == f"stacks ({b.name}): {record['evidence'][0]}"
    # diagnose --stacks: the same stage takes every waiting GPU now, synchronously.
    if derived.gpus[0].cause in names.WAITING_CAUSES:
        (taken,) = stage.take_waiting(TRIGGER_DIAGNOSE)
        assert taken.trigger == TRIGGER_DIAGNOSE and taken.path is not None and taken.label == "input"


def _stacks_line(engine: Engine) -> bool:
    """The published verdict of GPU 0 carries a capture's line."""
    derived = engine.snapshot.value(names.DERIVED)
    return isinstance(derived, DerivedState) and 0 in derived.gpus and any(
        e.startswith("stacks (") for e in derived.gpus[0].evidence)
