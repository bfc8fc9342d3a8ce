"""Invalid scenarios: every error names the file and the key path, and says what is wrong."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.sim.scenario import Noise, ScenarioError, Square, load, loads

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
BASE: dict[str, Any] = {
    "version": 1,
    "name": "base",
    "host": {"cpus": 8, "numa_nodes": [{"cpus": "0-3"}, {"cpus": "4-7"}], "disks": ["sda"]},
    "gpus": [{"index": 0, "pci_bus_id": "0000:82:00.0"}],
    "processes": [{"pid": 100, "gpus": [0], "threads": 4}],
    "phases": [{"name": "p", "duration_s": 10, "gpus": {0: {"gpu_util": 0.5}}}],
}


def _doc(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        node: Any = d
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return d


def _error(doc: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as e:
        loads(yaml.safe_dump(doc), "bad.yaml")
    return str(e.value)


def test_base_document_is_valid() -> None:
    sc = loads(yaml.safe_dump(BASE), "base.yaml")
    assert sc.phases[0].gpus[0].gpu_util == 0.5


@pytest.mark.parametrize(
    ("doc", "key", "why"),
    [
        (_doc(colour="red"), "colour", "unknown key"),
        (_doc(host__cpus="eight"), "host.cpus", "must be an integer"),
        (_doc(version=3), "version", "unsupported version"),
        (_doc(phases__0__gpus={0: {"gpu_util": 1.5}}), "phases[0].gpus.0.gpu_util", "out of range"),
        (_doc(phases__0__gpus={0: {"gpu_utilisation": 0.5}}), "phases[0].gpus.0.gpu_utilisation", "unknown key"),
        (_doc(phases__0__gpus={3: {"gpu_util": 0.5}}), "phases[0].gpus.3", "unknown GPU 3"),
        (_doc(phases__0__processes={999: {}}), "phases[0].processes.999", "unknown pid 999"),
        (_doc(processes__0__gpus=[1]), "processes[0].gpus[0]", "unknown GPU index 1"),
        (_doc(processes=[{"pid": 100, "gpus": [0], "threads": 4}, {"pid": 103, "gpus": [0]}]),
         "processes[1].pid", "overlap process 100"),
        (_doc(processes__0__cpus_allowed="0-3,x"), "processes[0].cpus_allowed", "bad cpulist"),
        (_doc(processes__0__cpus_allowed="0-9"), "processes[0].cpus_allowed", "CPU 8 does not exist"),
        (_doc(host__numa_nodes=[{"cpus": "0-3"}, {"cpus": "3-7"}]), "host.numa_nodes[1].cpus", "already in node 0"),
        (_doc(gpus__0__pci_bus_id="82:00.0"), "gpus[0].pci_bus_id", "bad PCI address"),
        (_doc(phases__0__gpus={0: {"gpu_util": {"square": {"high": 1, "low": 0, "period_s": 1}}}}),
         "phases[0].gpus.0.gpu_util.square.duty", "required key missing"),
        (_doc(phases__0__gpus={0: {"gpu_util": {"noise": {"mean": 0.5, "sd": -1}}}}),
         "phases[0].gpus.0.gpu_util.noise.sd", "out of range"),
        (_doc(phases__0__gpus={0: {"gpu_util": {"sine": {}}}}), "phases[0].gpus.0.gpu_util.sine", "unknown key"),
        (_doc(phases__0__gpus={0: {"link": {"gen": 7}}}), "phases[0].gpus.0.link.gen", "generation must be 1-6"),
        (_doc(phases__0__host={"nfs": {"retrans_per_s": 1}}), "phases[0].host.nfs", "host.nfs: true"),
        (_doc(phases__0__host={"disks": {"nvme0n1": {"await_ms": 1}}}), "phases[0].host.disks.nvme0n1",
         "unknown disk"),
        (_doc(phases__0__processes={100: {"threads_cpu": [{"count": 5, "user": 0.1}]}}),
         "phases[0].processes.100.threads_cpu[0].count", "has 4"),
        (_doc(phases__0__processes={100: {"threads_cpu": [{"count": 1, "state": "Z"}]}}),
         "phases[0].processes.100.threads_cpu[0].state", "R, S or D"),
        (_doc(phases=[{"name": "a", "duration_s": 1}, {"name": "a", "duration_s": 1}]), "phases[1].name",
         "used twice"),
        (_doc(phases=[]), "phases", "at least one phase"),
        (_doc(expect=[{"phase": "nope"}]), "expect[0].phase", "unknown phase"),
        (_doc(expect=[{"phase": "p", "gpus": {0: "cpu_bound"}}]), "expect[0].gpus.0", "unknown verdict"),
        (_doc(expect=[{"phase": "p", "findings": [{"check": "numa_mismatch", "gpu": 4}]}]),
         "expect[0].findings[0].gpu", "unknown GPU index 4"),
        (_doc(expect=[{"phase": "p", "no_findings": ["slow_disk"]}]), "expect[0].no_findings[0]", "unknown finding"),
        # F14: 40 processes x 100,000 threads reached 6.6 GB in diagnose; 1 x 100,000 wrote 400,204 files.
        (_doc(processes__0__threads=100_000), "processes[0].threads", "at most 8192 threads"),
        (_doc(processes=[{"pid": 100 + 3000 * i, "gpus": [0], "threads": 3000} for i in range(3)]),
         "processes[2].threads", "more than 8192 threads in all processes"),
        (_doc(processes=[{"pid": 100 + i, "gpus": [0]} for i in range(1025)]), "processes",
         "more than 1024 processes"),
    ],
)
def test_invalid_scenario_error_names_file_and_key(doc: dict[str, Any], key: str, why: str) -> None:
    msg = _error(doc)
    assert msg.startswith("bad.yaml: "), msg
    assert f": {key}: " in msg, msg
    assert why in msg, msg


def test_missing_required_key_is_named() -> None:
    doc = _doc()
    del doc["host"]
    assert "bad.yaml: host: required key missing" in _error(doc)


def test_duplicate_yaml_key_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="duplicate key 'name'"):
        loads("version: 1\nname: a\nname: b\nhost: {cpus: 1}\ngpus: []\nphases: [{name: x, duration_s: 1}]\n",
              "dup.yaml")


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"nothere\.yaml: cannot read"):
        load(tmp_path / "nothere.yaml")


def test_exponent_floats_without_a_dot_are_numbers() -> None:
    # YAML 1.1 reads 6e9 and 1.5e9 as strings; the shared scenarios use them as numbers.
    d = _doc()
    text = yaml.safe_dump(d).replace("gpu_util: 0.5", "pcie_rx_bytes_per_s: 6e9")
    sc = loads(text, "f.yaml")
    assert sc.phases[0].gpus[0].pcie_rx_bytes_per_s == 6e9


def test_state_carries_over_key_by_key_between_phases() -> None:
    d = _doc(phases=[
        {"name": "a", "duration_s": 5, "gpus": {0: {"gpu_util": 0.9, "link": {"gen": 3, "width": 8}}},
         "host": {"disks": {"sda": {"reads_per_s": 100, "await_ms": 2}}, "cpu_background": {"iowait": 0.3}}},
        {"name": "b", "duration_s": 5, "gpus": {0: {"link": {"gen": 5}}},
         "host": {"disks": {"sda": {"await_ms": 9}}}},
    ])
    sc = loads(yaml.safe_dump(d), "carry.yaml")
    a, b = sc.phases
    assert b.gpus[0].gpu_util == 0.9
    assert (b.gpus[0].link.gen, b.gpus[0].link.width) == (5, 8)
    assert (b.host.disks["sda"].reads_per_s, b.host.disks["sda"].await_ms) == (100, 9)
    # cpu_background keeps the default user/system and adds iowait.
    assert (a.host.cpu_background.user, a.host.cpu_background.iowait) == (0.02, 0.3)
    assert b.start_s == 5 and sc.duration_s == 10


def test_patterns_and_defaults_of_spec() -> None:
    sc = load(SCENARIOS / "input_bound.yaml")
    st = sc.phases[0].gpus[0]
    assert st.gpu_util == Square(high=0.98, low=0.0, period_s=1.2, duty=0.35)
    g = sc.gpus[0]
    assert (g.name, g.uuid, g.gpm, g.max_sm_clock_mhz) == (
        "NVIDIA H100 80GB HBM3", "GPU-00000000-0000-0000-0000-000000000000", True, 1980)
    assert (g.pcie.max_gen, g.pcie.max_width, g.pcie.gpu_max_gen) == (5, 16, 5)
    assert sc.host.governor == "performance" and sc.host.mem_total_bytes == 549755813888
    noisy = load(SCENARIOS / "latency_bound_inference.yaml").phases[0].gpus[0].gpu_util
    assert noisy == Noise(mean=0.24, sd=0.06)


def test_diagnose_refuses_a_scenario_past_the_thread_limit_with_exit_2(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.cli import main

    f = tmp_path / "threads.yaml"
    f.write_text(yaml.safe_dump(_doc(processes=[{"pid": 100 + 100_000 * i, "gpus": [0], "threads": 100_000}
                                                for i in range(40)])))
    assert main(["diagnose", "--scenario", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "processes[0].threads" in err, err
