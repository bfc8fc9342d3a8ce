"""``gpufeed diagnose`` on a live host: a GPU-less host still gets a report, usage errors exit 2."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from exporter.diagnose import run_diagnose

FIXTURES = Path(__file__).parent / "fixtures" / "hosts" / "capture"


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


def test_live_and_scenario_reports_have_one_shape(capsys: pytest.CaptureFixture[str]) -> None:
    run_diagnose(_ns())
    live = json.loads(capsys.readouterr().out)
    scenario = Path(__file__).parent / "scenarios" / "launch_bound.yaml"
    run_diagnose(_ns(scenario=str(scenario)))
    played = json.loads(capsys.readouterr().out)
    assert set(live) - {"note"} == set(played) - {"note"}
    (ph,) = live["phases"]
    assert set(ph) == set(played["phases"][0])
    gpu_keys = set(played["phases"][0]["gpus"][0])
    assert gpu_keys == {"index", "uuid", "name", "cause", "confidence", "waiting_ratio", "waiting_share", "evidence",
                        "next_check", "workload"}
