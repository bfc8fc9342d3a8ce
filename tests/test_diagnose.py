"""``gpufeed diagnose`` on a live host: a GPU-less host still gets a report, usage errors exit 2."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import structlog

from exporter.diagnose import report
from exporter.diagnose.command import run_diagnose

FIXTURES = Path(__file__).parent / "fixtures" / "hosts" / "capture"


@pytest.fixture(autouse=True)
def _keep_logging_config() -> Iterator[None]:
    """diagnose configures logging for its process like any CLI command; give the next tests theirs back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _ns(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"scenario": None, "duration": "2s", "json": True, "check": False, "timeline": False,
                               "path.procfs": str(FIXTURES / "proc"), "path.sysfs": str(FIXTURES / "sys"),
                               "log.level": None}
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


def test_live_and_scenario_reports_have_one_shape(capsys: pytest.CaptureFixture[str]) -> None:
    run_diagnose(_ns())
    live = json.loads(capsys.readouterr().out)
    scenario = Path(__file__).parent / "scenarios" / "launch_bound.yaml"
    run_diagnose(_ns(scenario=str(scenario), duration=None))
    played = json.loads(capsys.readouterr().out)
    assert set(live) - {"note"} == set(played) - {"note"}
    (ph,) = live["phases"]
    assert set(ph) == set(played["phases"][0])
    gpu_keys = set(played["phases"][0]["gpus"][0])
    assert gpu_keys == {"index", "uuid", "name", "cause", "confidence", "waiting_ratio", "waiting_share", "evidence",
                        "next_check", "workload"}


# ---- exit codes that do not lie ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_a_procfs_that_is_missing_empty_or_a_file_is_exit_3_and_the_json_says_why(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    procfs = tmp_path / "proc"
    if kind == "empty":
        procfs.mkdir()
    elif kind == "file":
        procfs.write_text("not a procfs\n")
    rc = run_diagnose(_ns(**{"path.procfs": str(procfs)}))
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 3
    assert str(procfs) in doc["error"] and doc["phases"] == []
    assert "cannot see the host" in err and "Findings: none" not in out
    jsonschema.validate(doc, report.schema())


def test_a_host_where_no_source_can_be_read_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "stat").write_text("garbage\n")  # looks like a procfs, reads like none
    rc = run_diagnose(_ns(**{"path.procfs": str(procfs), "path.sysfs": str(tmp_path), "duration": "1s"}))
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and "no source could be read" in doc["error"] and "cpu" in doc["sampler_errors"]


def test_text_report_of_a_blind_run_says_so_instead_of_findings_none(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run_diagnose(_ns(json=False, **{"path.procfs": str(tmp_path / "nope")})) == 3
    out = capsys.readouterr().out
    assert "cannot see the host: --path.procfs" in out and "Findings" not in out


def test_live_json_validates_against_the_published_schema_and_window_is_what_was_sampled(
        capsys: pytest.CaptureFixture[str]) -> None:
    run_diagnose(_ns(duration="2s"))
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, report.schema())
    # 2 s sampled: the verdicts cannot look back 15 s, and the JSON says what the text says.
    assert doc["window_s"] is None or doc["window_s"] <= 2.0
    run_diagnose(_ns(duration="2s", json=False))
    text = capsys.readouterr().out
    if doc["window_s"] is not None:
        assert f"verdicts over the last {doc['window_s']:g} s" in text


def test_failing_collectors_are_in_the_report_not_log_lines_in_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", procfs, symlinks=True)
    (procfs / "diskstats").write_text("this is not diskstats\n")
    rc = run_diagnose(_ns(duration="2s", **{"path.procfs": str(procfs)}))
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert "level=" not in err and "level=" not in out
    assert "disk" in doc["sampler_errors"] and "diskstats" in doc["sampler_errors"]["disk"]
    assert rc in (0, 1)
    jsonschema.validate(doc, report.schema())


def test_log_level_flag_brings_the_log_back_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", procfs, symlinks=True)
    (procfs / "diskstats").write_text("this is not diskstats\n")
    run_diagnose(_ns(duration="1s", **{"path.procfs": str(procfs), "log.level": "error"}))
    out, err = capsys.readouterr()
    assert "event=collector_failed" in err and "level=" not in out


def test_go_style_duration_is_taken_and_a_scenario_refuses_one(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    assert run_diagnose(_ns(duration="1m30s", **{"path.procfs": str(tmp_path / "none")})) == 3  # parsed, then blind
    scenario = Path(__file__).parent / "scenarios" / "launch_bound.yaml"
    assert run_diagnose(_ns(scenario=str(scenario), duration="10s")) == 2
    assert "--duration is for a live host" in capsys.readouterr().err


def test_the_schema_file_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(report.schema())
