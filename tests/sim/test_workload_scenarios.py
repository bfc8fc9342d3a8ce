"""Version-2 scenarios (tests/scenarios/workloads/): every workload case of the playbook through the real
simulator, collectors, kubelet socket, engine and derived layer -- and the version-2 report and expect forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.diagnose.report import check, scenario_document
from exporter.sim.player import play
from exporter.sim.scenario import ScenarioError, load, loads
from tests.support import plays
from tests.support.plays import played

HERE = Path(__file__).resolve().parents[1] / "scenarios" / "workloads"
FILES = sorted(HERE.glob("*.yaml"))


@pytest.fixture(autouse=True)
def _one_play_per_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpufeed diagnose --scenario`` here plays each scenario once per session (tests.support.plays)."""
    monkeypatch.setattr("exporter.sim.player.play", plays.play)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_workload_scenario_expectations_hold(path: Path) -> None:
    assert load(path).version == 2
    assert check(played(path)) == []


def test_json_names_each_gpus_workload_and_the_timeline_has_finding_events(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "--scenario", str(HERE / "k8s_cpu_quota_v2.yaml"), "--json", "--timeline"])
    assert code == 1  # a waiting GPU and a raised finding: exit 1 (docs/derived.md, exit codes)
    doc = json.loads(capsys.readouterr().out)
    gpu = doc["phases"][0]["gpus"][0]
    assert gpu["workload"]["namespace"] == "vision" and gpu["workload"]["pod"] == "trainer-0"
    raised = [e for e in doc["finding_events"] if e["check"] == "cpu_quota_throttled"]
    assert raised and raised[0]["event"] == "raised" and raised[0]["gpu"] == 0
    assert 0 < raised[0]["t"] <= 15.0


def test_a_gpu_with_no_workload_reports_no_labels() -> None:
    res = played(HERE / "pod_without_nvml_process.yaml")
    doc = scenario_document(res)
    by_index = {g["index"]: g for g in doc["phases"][0]["gpus"]}
    assert by_index[1]["workload"] == {}
    assert by_index[0]["workload"] == {"namespace": "infer", "pod": "embedder-0", "container": "server",
                                       "container_id": "7" * 64}


WRONG = """
version: 2
name: wrong-expectations
host: {cpus: 4}
gpus: [{pci_bus_id: "0000:41:00.0"}]
processes: [{pid: 100, gpus: [0], threads: 2}]
phases:
  - name: p
    duration_s: 40
    gpus: {0: {gpu_util: 0.95, sm_active: 0.8}}
    processes: {100: {threads_cpu: [{count: 1, user: 0.5, comm: main}]}}
expect:
  - phase: p
    gpus: {0: [launch_bound, input_bound]}
    within_s: 15
    no_findings_anytime: [gpu_memory_full]
    evidence_contains: {0: ["no such words"]}
    workload: {0: {pod: nobody}}
"""


def test_failed_version2_expectations_are_each_reported() -> None:
    failures = check(play(loads(WRONG)))
    text = "\n".join(failures)
    assert "expected one of launch_bound, input_bound, got healthy" in text
    assert "from 15 s on, got healthy" in text
    assert "no evidence line contains 'no such words'" in text
    assert "workload pod expected 'nobody', got None" in text


@pytest.mark.parametrize("key,doc", [
    ("host.cgroups", {"host": {"cpus": 4, "cgroups": {}}}),
    ("processes[0].ppid", {"processes": [{"pid": 10, "gpus": [], "ppid": 2}]}),
    ("phases[0].processes.10.storage_read_bytes_per_s",
     {"processes": [{"pid": 10, "gpus": []}],
      "phases": [{"name": "p", "duration_s": 30, "processes": {10: {"storage_read_bytes_per_s": 1}}}]}),
])
def test_a_version2_key_in_a_version1_file_names_the_key_and_the_version(key: str, doc: dict[str, object]) -> None:
    base: dict[str, object] = {"version": 1, "name": "v1", "host": {"cpus": 4}, "gpus": [],
                               "phases": [{"name": "p", "duration_s": 30}]}
    base.update(doc)
    with pytest.raises(ScenarioError, match=rf"{key.replace('[', '.').replace(']', '.')}.*needs version: 2"):
        from exporter.sim.scenario import from_dict
        from_dict(base, "v1.yaml")


@pytest.mark.parametrize("snippet,where", [
    ("host: {cpus: 4, cgroups: {a: {path: relative/path}}}", "host.cgroups.a.path"),
    ("host: {cpus: 4, cgroups: {a: {path: /a/../b}}}", "host.cgroups.a.path"),
    ("host: {cpus: 4, cgroup_version: 3}", "host.cgroup_version"),
    ("host: {cpus: 4, cgroups: {a: {path: /a, cpu_quota_cores: 0}}}", "host.cgroups.a.cpu_quota_cores"),
])
def test_bad_cgroups_are_errors_naming_the_key(snippet: str, where: str) -> None:
    text = f"version: 2\nname: bad\n{snippet}\ngpus: []\nphases: [{{name: p, duration_s: 30}}]\n"
    with pytest.raises(ScenarioError, match=where.replace(".", r"\.")):
        loads(text, "bad.yaml")


def test_a_ppid_cycle_is_an_error() -> None:
    text = ("version: 2\nname: cyc\nhost: {cpus: 4}\ngpus: []\n"
            "processes: [{pid: 10, gpus: [], ppid: 20}, {pid: 20, gpus: [], ppid: 10}]\n"
            "phases: [{name: p, duration_s: 30}]\n")
    with pytest.raises(ScenarioError, match="own ancestor"):
        loads(text, "cyc.yaml")


def test_without_the_kubelet_a_pod_keeps_its_container_id_and_the_evidence_says_why_names_are_missing() -> None:
    text = (HERE / "k8s_cpu_quota_v2.yaml").read_text()
    start, end = text.index("  kubernetes:"), text.index("gpus:\n")
    sc = loads(text[:start] + text[end:], "no-kubelet.yaml")
    res = play(sc)
    st = res.phases[0].state
    assert st is not None
    ctr = "3b2a1c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809"
    assert st.workloads[0].labels == {"container_id": ctr}
    assert any("namespace and name unknown" in e for e in st.gpus[0].evidence)
    assert st.gpus[0].cause == "launch_bound"
