"""``gpufeed diagnose --stacks`` on this machine's /proc and /sys with a real workload (a loop waiting on a
multiprocessing queue fed by slow workers) and the fake NVML showing its GPU waiting: once sampling ends, the
waiting GPU's processes are captured, the report (JSON, valid against the schema, and text) says what the stacks
show and where the bundle is, and the capture's line joins the GPU's evidence; without --stacks nothing is
captured and the report has no ``captures``."""

from __future__ import annotations

import argparse
import functools
import io
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import pytest
import structlog

from exporter import names, pipeline
from exporter.diagnose import report
from exporter.diagnose.command import run_diagnose
from exporter.sim.fakenvml import FakeNvml
from tests.capture.conftest import line_of
from tests.test_workload_real import gpu_driver

Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture(autouse=True)
def _keep_logging_config() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _diagnose(workload: Start, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              **flags: object) -> tuple[int, str]:
    proc = workload("queue_wait", seconds=90.0)
    fake = FakeNvml()
    gpu = gpu_driver(fake, proc.pid)
    monkeypatch.setattr(pipeline, "build", functools.partial(pipeline.build, nvml=fake))
    ns = argparse.Namespace(**{"scenario": None, "duration": "8s", "json": True, "check": False,
                               "timeline": False, "path.procfs": "/proc", "path.sysfs": "/sys", "log.level": None,
                               **flags})
    gpu.start()
    try:
        code = run_diagnose(ns)
    finally:
        gpu.stop()
    return code, capsys.readouterr().out


def test_diagnose_stacks_names_the_waiting_loop_s_line_and_writes_the_bundle(
        workload: Start, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "captures"
    code, text = _diagnose(workload, monkeypatch, capsys, **{"stacks": True, "stacks.dir": str(out)})
    doc = json.loads(text)
    jsonschema.validate(doc, report.schema())
    (gpu,) = doc["phases"][0]["gpus"]
    assert gpu["cause"] in names.WAITING_CAUSES and code == report.EXIT_ATTENTION
    (cap,) = doc["captures"]
    assert cap["gpu"] == 0 and cap["trigger"] == "diagnose" and cap["label"] == "input", cap
    assert cap["unavailable"] is None and cap["error"] is None
    line = line_of("queue_wait", "return int(q.get())")
    assert f"\u2190 `queue_wait.py:{line}`: waiting on the workers" in cap["evidence"][0]
    bundle = Path(cap["path"])
    assert bundle.parent == out and bundle.name == cap["name"] and bundle.name.endswith("-gpu0-diagnose")
    assert (bundle / "summary.md").read_text().startswith(f"# gpufeed capture {cap['name']}")
    # The capture has its word on the verdict it was taken for, as in the daemon.
    assert gpu["evidence"][-1] == f"stacks ({cap['name']}): {cap['evidence'][0]}"
    # The text report says the same.
    text_out = io.StringIO()
    report.print_text(doc, text_out)
    lines = text_out.getvalue().splitlines()
    at = lines.index("Stacks:")
    assert lines[at + 1] == f"  GPU 0: {cap['assessment']}"
    assert lines[at + 2] == f"  - {cap['evidence'][0]}"
    assert f"  bundle: {bundle}" in lines[at:]


def test_without_stacks_nothing_is_captured(
        workload: Start, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    code, text = _diagnose(workload, monkeypatch, capsys, duration="3s")
    doc = json.loads(text)
    assert "captures" not in doc and list(tmp_path.iterdir()) == []
    assert code == report.EXIT_ATTENTION
