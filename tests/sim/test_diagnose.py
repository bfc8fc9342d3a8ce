"""``gpufeed diagnose --scenario``: every scenario of the contract plays in virtual time and reports every
phase and every GPU; --check and --timeline; exit 2 naming the file and key on an invalid scenario."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main
from exporter.report import check, scenario_document
from exporter.sim.player import play
from exporter.sim.scenario import load

HERE = Path(__file__).resolve().parent
CONTRACT = sorted((HERE.parent / "scenarios").glob("*.yaml"))
OWN = HERE / "scenarios"


@cache
def _report(path: Path) -> dict[str, Any]:
    return scenario_document(play(load(path), timeline=True), timeline=True)


@pytest.mark.parametrize("path", CONTRACT, ids=lambda p: p.stem)
def test_every_contract_scenario_reports_every_phase_and_gpu(path: Path) -> None:
    sc = load(path)
    doc = _report(path)
    assert doc["scenario"] == sc.name
    assert [p["name"] for p in doc["phases"]] == [p.name for p in sc.phases]
    assert [p["end_s"] for p in doc["phases"]] == [p.end_s for p in sc.phases]
    for ph in doc["phases"]:
        assert [(g["index"], g["uuid"]) for g in ph["gpus"]] == [(g.index, g.uuid) for g in sc.gpus]
        for g in ph["gpus"]:
            assert set(g) >= {"index", "uuid", "cause", "waiting_ratio", "evidence"}
            assert g["cause"] is not None, f"{path.name} {ph['name']}: GPU {g['index']} has no verdict"
        for f in ph["findings"]:
            assert set(f) == {"check", "gpu", "severity", "detail"}
    assert "sampler_errors" not in doc, doc.get("sampler_errors")
    json.dumps(doc)  # serialisable as is


def test_riser_scenario_detects_transfer_bound_within_15_s_of_onset() -> None:
    doc = _report(HERE.parent / "scenarios" / "transfer_bound_riser.yaml")
    onset = 30.0  # the copying phase starts
    hits = [row["t"] for row in doc["timeline"] if row["t"] >= onset and row["cause"] == "transfer_bound"]
    assert hits, "transfer_bound never reported"
    assert hits[0] - onset <= 15.0
    idle = [row["cause"] for row in doc["timeline"] if 15.0 <= row["t"] < onset]
    assert idle and set(idle) == {"idle"}


def test_check_passes_on_the_riser_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "--scenario", str(HERE.parent / "scenarios" / "transfer_bound_riser.yaml"), "--json",
                 "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["phases"][1]["gpus"][0]["cause"] == "transfer_bound"
    assert "all 2 expectations hold" in err


def test_check_prints_each_failed_expectation_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "--scenario", str(OWN / "wrong_expectation.yaml"), "--check"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "FAIL phase 'nothing': GPU 0: expected healthy, got" in out
    assert "FAIL phase 'nothing': expected finding gpu_lost on GPU 0, not reported" in out


def test_check_logic_on_a_played_result() -> None:
    res = play(load(OWN / "wrong_expectation.yaml"))
    failures = check(res)
    assert len(failures) == 2


def test_invalid_scenario_exits_2_naming_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nhost: {cpus: 4}\ngpus: [{pci_bus_id: '0000:01:00.0'}]\n"
                   "phases: [{name: a, duration_s: 5, gpus: {0: {gpu_util: 2}}}]\n")
    code = main(["diagnose", "--scenario", str(bad), "--json"])
    _, err = capsys.readouterr()
    assert code == 2
    assert f"{bad}: phases[0].gpus.0.gpu_util: 2 out of range" in err


def test_timeline_human_output_lists_evaluations(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "--scenario", str(OWN / "wrong_expectation.yaml"), "--timeline"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "phase nothing (ends at 30 s)" in out
    assert "GPU 0 NVIDIA H100 80GB HBM3: IDLE" in out


@pytest.mark.slow
def test_eight_gpus_two_minutes_plays_through() -> None:
    doc = _report(OWN / "eight_gpus.yaml")
    assert [g["index"] for g in doc["phases"][0]["gpus"]] == list(range(8))


def test_lost_gpu_reports_gpu_lost_and_the_other_gpu_keeps_its_verdict() -> None:
    res = play(load(OWN / "lost_gpu.yaml"))
    assert check(res) == []
    lost = res.phases[1].state
    assert lost is not None and 1 not in lost.gpus and lost.gpus[0].cause == "healthy"


def test_with_the_derived_layer_off_the_structure_stays_and_causes_are_null() -> None:
    res = play(load(OWN / "wrong_expectation.yaml"), flags={"collector.derived": False})
    doc = scenario_document(res)
    assert [(g["index"], g["cause"], g["evidence"]) for g in doc["phases"][0]["gpus"]] == [(0, None, [])]
    assert "derived" not in res.collectors
    assert any("expected healthy, got no verdict" in f for f in check(res))


def test_a_host_without_gpus_plays_and_reports_empty_gpu_lists(tmp_path: Path) -> None:
    f = tmp_path / "nogpu.yaml"
    f.write_text("version: 1\nname: no-gpus\nhost: {cpus: 2}\ngpus: []\nphases: [{name: only, duration_s: 5}]\n")
    doc = scenario_document(play(load(f)))
    assert [(p["name"], p["gpus"]) for p in doc["phases"]] == [("only", [])]
    assert "sampler_errors" not in doc
