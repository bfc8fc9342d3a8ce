"""``gpufeed diagnose`` on a live host: a GPU-less host still gets a report, usage errors exit 2."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from exporter.diagnose import live_exit_code, print_live, run_diagnose

FIXTURES = Path(__file__).parent.parent / "fixtures" / "host" / "capture"


@pytest.fixture(autouse=True)
def _keep_logging_config() -> Iterator[None]:
    """diagnose configures logging for its process like any CLI command; give the next tests theirs back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _ns(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"scenario": None, "duration": "2s", "json": True, "check": False, "timeline": False,
                               "path.procfs": str(FIXTURES / "proc"), "path.sysfs": str(FIXTURES / "sys")}
    base.update(kw)
    return argparse.Namespace(**base)


def test_gpu_less_host_says_so_and_still_reports_host_findings(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_diagnose(_ns())
    doc = json.loads(capsys.readouterr().out)
    (live,) = doc["phases"]
    assert live["name"] == "live" and live["gpus"] == []
    assert "no GPU on this host" in doc["note"]
    assert isinstance(live["findings"], list)
    assert rc == (1 if live["findings"] else 0)


@pytest.mark.parametrize("bad", ["abc", "-3s", "0"])
def test_bad_duration_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_diagnose(_ns(duration=bad)) == 2
    assert "--duration" in capsys.readouterr().err


def test_check_without_a_scenario_is_a_usage_error() -> None:
    assert run_diagnose(_ns(check=True)) == 2


def _report(cause: str, findings: list[dict[str, object]]) -> dict[str, object]:
    gpu = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100", "cause": cause, "confidence": 0.9,
           "waiting_ratio": 0.71, "waiting_share_of_run": 0.6,
           "evidence": ["GPU 0 waited 71% of the last 15 s", "thread 4242 (python) at 0.98 core, 44% system"],
           "next_check": "top -H -p 4242"}
    return {"scenario": None, "host": "h", "duration_s": 30.0, "window_s": 15.0,
            "phases": [{"name": "live", "end_s": 30.0, "gpus": [gpu], "findings": findings}]}


def test_waiting_gpu_or_any_finding_exits_1_and_a_healthy_host_exits_0() -> None:
    assert live_exit_code(_report("launch_bound", [])) == 1
    assert live_exit_code(_report("healthy", [{"check": "numa_mismatch", "gpu": 0, "severity": "warning",
                                               "detail": "x"}])) == 1
    assert live_exit_code(_report("healthy", [])) == 0
    assert live_exit_code(_report("idle", [])) == 0


def test_text_report_leads_with_the_verdict_waiting_share_and_next_check() -> None:
    import io

    out = io.StringIO()
    print_live(_report("launch_bound", []), out)
    text = out.getvalue()
    assert "GPU 0 NVIDIA H100: LAUNCH_BOUND  waiting 71%" in text
    assert "thread 4242" in text and "next: top -H -p 4242" in text
    assert "Findings: none" in text
