"""``serve --simulate-gpu``: the GPU side of a real host from a small file (exporter/sim/realgpu.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.sim import realgpu
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.scenario import ScenarioError

GPU = """
phases:
  - {name: waiting, duration_s: 60, gpus: {0: {gpu_util: 0.3, memory_used_bytes: 1.0e9}}}
processes:
  0: [%d, {pid_file: %s, used_memory_bytes: 5.0e8}]
"""


def test_the_fake_lists_the_real_pids_and_follows_a_pid_file(tmp_path: Path) -> None:
    pid_file = tmp_path / "trainer.pid"
    pid_file.write_text("4242\n")
    f = tmp_path / "gpu.yaml"
    f.write_text(GPU % (os.getpid(), pid_file))
    driver = realgpu.GpuDriver(FakeNvml(), realgpu.load(f))
    dev = driver.state()["devices"][0]
    assert [(p["pid"], p["used_memory_bytes"]) for p in dev["processes"]] == [(os.getpid(), 2 << 30),
                                                                            (4242, 500_000_000)]
    pid_file.write_text("4343\n")
    driver._pids.clear()  # the half-second re-read, now
    assert [p["pid"] for p in driver.state()["devices"][0]["processes"]] == [os.getpid(), 4343]


@pytest.mark.parametrize(("text", "message"), [
    ("phases: []\nhost: {cpus: 2}\n", "unknown key 'host'"),
    ("processes: {0: [1]}\n", "phases is required"),
    ("phases:\n  - {name: a, duration_s: 10}\nprocesses: {3: [1]}\n", "processes.3: no such GPU"),
    ("phases:\n  - {name: a, duration_s: 10}\nprocesses: {0: [{pid: 1, pid_file: x}]}\n", "a pid, or"),
    ("phases:\n  - {name: a, duration_s: 10, gpus: {0: {gpu_util: 2}}}\n", "out of range"),
])
def test_a_bad_gpu_file_is_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "gpu.yaml"
    f.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        realgpu.load(f)


def test_simulate_gpu_and_simulate_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "gpu.yaml"
    f.write_text("phases:\n  - {name: a, duration_s: 10}\n")
    assert main(["check-config", "--simulate-gpu", str(f)]) == 0
    assert main(["check-config", "--simulate-gpu", str(f), "--simulate", "launch_bound"]) == 2
    assert "exclude each other" in capsys.readouterr().err
