"""The diagnose report (exporter/diagnose/report.py): exit codes and the text a person reads, for either mode."""

from __future__ import annotations

import io

from exporter.diagnose import report


def _report(cause: str, findings: list[dict[str, object]]) -> dict[str, object]:
    gpu = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100", "cause": cause, "confidence": 0.9,
           "waiting_ratio": 0.71, "waiting_share": 0.6,
           "evidence": ["GPU 0 waited 71% of the last 15 s", "thread 4242 (python) at 0.98 core, 44% system"],
           "next_check": "top -H -p 4242"}
    return {"scenario": None, "host": "h", "duration_s": 30.0, "window_s": 15.0,
            "phases": [{"name": "live", "end_s": 30.0, "gpus": [gpu], "findings": findings}]}


def test_waiting_gpu_or_any_finding_exits_1_and_a_healthy_host_exits_0() -> None:
    assert report.exit_code(_report("launch_bound", [])) == 1
    assert report.exit_code(_report("healthy", [{"check": "numa_mismatch", "gpu": 0, "severity": "warning",
                                               "detail": "x"}])) == 1
    assert report.exit_code(_report("healthy", [])) == 0
    assert report.exit_code(_report("idle", [])) == 0


def test_text_report_leads_with_the_verdict_waiting_share_and_next_check() -> None:
    out = io.StringIO()
    report.print_text(_report("launch_bound", []), out)
    text = out.getvalue()
    assert "GPU 0 NVIDIA H100: LAUNCH_BOUND  waiting 71%" in text
    assert "thread 4242" in text and "next: top -H -p 4242" in text
    assert "Findings: none" in text


def test_next_check_names_the_hot_process_and_the_gpu_address() -> None:
    assert report.next_check("launch_bound", (4242, 4243), "0000:82:00.0").startswith("top -H -p 4242")
    assert "lspci -vv -s 0000:82:00.0" in report.next_check("transfer_bound", (), "0000:82:00.0")
    assert report.next_check(None, (), "") == report.NO_VERDICT_CHECK
