"""bench/gpu_real.py end to end in its dry run: CPU workloads, the real daemon, NVML through the real pynvml over
bench/nvmlstub (the C stand-in for libnvidia-ml). Nothing here needs a GPU or torch; no timing is asserted --
the point is that the first run on a lent GPU machine does not fail on a typo, and that what the stub lacks
(functions a real driver has) is recorded as an error in the results, not raised.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_real, nvmlstub, procstat
from bench.gpu_workloads import WORKLOADS
from exporter.gpu.fields import FIELDS

REPO = Path(__file__).resolve().parent.parent.parent
SECTIONS = ("## Host", "## NVML calls", "## The backend's own calls", "## Fields", "## GPM", "## Workloads",
            "## A/B", "## Errors")


def test_the_dry_run_writes_every_section_and_records_what_the_stub_lacks(tmp_path: Path) -> None:
    try:
        nvmlstub.build()
    except nvmlstub.StubError as e:
        pytest.skip(f"the NVML stub library cannot be built here: {e}")
    out = tmp_path / "results"
    before = set(procstat.children(os.getpid()))
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_real.py"), "--dry-run", "--out", str(out), "--seconds", "1.5",
         "--ab-seconds", "0.5", "--trace-seconds", "0.5", "--gpm-seconds", "0.5", "--reps", "3", "--budget", "50"],
        capture_output=True, text=True, timeout=100, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not set(procstat.children(os.getpid())) - before

    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["dry_run"] is True
    host = res["host"]
    assert host["driver_version"] and host["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    # The stub has no nvmlSystemGetCudaDriverVersion_v2 nor GSP calls: recorded, the run went on.
    assert host["cuda_driver_version"] == {"error": "FUNCTION_NOT_FOUND"}
    assert host["gpus"][0]["gsp_firmware_mode"] == {"error": "FUNCTION_NOT_FOUND"}
    calls = res["calls"]["0"]
    assert calls["nvmlDeviceGetFieldValues(fast)"]["returns"] == {"SUCCESS": 3}
    assert calls["nvmlDeviceGetFieldValues(fast)"]["p99_us"] is not None
    assert calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"]["returns"] == {"FUNCTION_NOT_FOUND": 3}
    assert "nvmlDeviceGetFieldValues" in res["backend_calls"]["calls"]
    traced = res["fields"]["per_gpu"]["0"]
    assert set(traced) == {str(f.field_id) for f in FIELDS} | {str(i) for i in gpu_real.EXTRA_FIELD_IDS}
    assert traced["198"]["value_types"] == ["uint"] and traced["198"]["refresh_ms"] is not None
    assert set(res["fields"]["load"]) == {"matmul", "h2d_pinned"}
    assert res["gpm"]["0"]["samples"] >= 2
    assert set(res["workloads"]) == set(WORKLOADS)
    for name, w in res["workloads"].items():
        assert "error" not in w and "skipped" not in w, (name, w)
        assert w["expected"] == WORKLOADS[name] and w["timeline"], name
        if name != "idle":
            assert w["truth"]["steps"] > 0 and w["truth"]["rc"] == 0, (name, w["truth"])
    assert (out / "h2d_pinned.prom").read_text().startswith("# HELP")
    for arm in ("running", "stopped"):
        for name in gpu_real.AB_WORKLOADS:
            assert res["ab"][arm][name]["step_ms"]["p50"] is not None, (arm, name)
    assert res["daemon"]["rc"] is not None  # stopped
    assert res["errors"] == []
    assert (out / "fields_trace.json").exists() and (out / "daemon.log").exists()
    summary = (out / "summary.md").read_text()
    for header in SECTIONS:
        assert header in summary, header


def test_a_section_that_no_longer_fits_the_budget_is_skipped_and_one_that_fails_is_recorded(tmp_path: Path) -> None:
    run = gpu_real.Run(gpu_real.Plan.dry(), tmp_path, nvml=None, env={})
    run.budget = gpu_real.Budget(10.0)
    assert run.section("late", 60.0, lambda: {"ran": True}) is None
    assert run.results["late"]["skipped"].startswith("budget: ")

    def broken() -> None:
        raise ValueError("typo")
    run.section("broken", 1.0, broken)
    assert run.results["broken"] == {"error": "ValueError('typo')"}
    assert run.results["errors"][0]["section"] == "broken"
    assert "- broken: ValueError('typo')" in gpu_real.summary_md(run.results)  # a partial run still summarises


def test_the_device_scripts_parse_and_the_carried_wheels_stay_out_of_git() -> None:
    for shell, script in (("sh", "bench/gpu_real_device.sh"), ("bash", "tools/gpu-real-wheels.sh")):
        r = subprocess.run([shell, "-n", str(REPO / script)], capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, (script, r.stderr)
        assert os.access(REPO / script, os.X_OK), script
    # The device tool's command (docs/benchmarks.md) is the script's name: far inside its 2,000 characters.
    assert "bench/gpu_real.py" in (REPO / "bench" / "gpu_real_device.sh").read_text()
    assert "/.whl/" in (REPO / ".gitignore").read_text().splitlines()


def test_without_a_driver_every_nvml_section_says_why_and_the_workloads_fail_on_their_own(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("an NVML library is installed here: this is the no-driver path")
    out = tmp_path / "results"
    before = set(procstat.children(os.getpid()))
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_real.py"), "--out", str(out), "--seconds", "0.5",
         "--ab-seconds", "0.2", "--budget", "90"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not set(procstat.children(os.getpid())) - before
    res = json.loads((out / "results.json").read_text())
    assert res["errors"][0] == {"section": "init", "error": "LIBRARY_NOT_FOUND"}
    for section in ("host", "calls", "backend_calls", "fields", "gpm"):
        assert res[section] == {"skipped": "nvmlInit failed: LIBRARY_NOT_FOUND"}, section
    # No GPU: each workload's child exits saying so, recorded per workload; idle still ran against the daemon.
    assert res["workloads"]["matmul"]["error"] == "workload never started"
    assert "cuda mode needs PyTorch" in res["workloads"]["matmul"]["truth"]["log_tail"]
    assert res["workloads"]["idle"]["timeline"]
    assert "## Workloads" in (out / "summary.md").read_text()
