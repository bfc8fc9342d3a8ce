"""The project's GPU scenario keys (docs/simulator.md "MIG, Xid events and ECC"): MIG instances, Xid events,
ECC and row remapping. Valid ones load and reach the fake NVML; invalid ones name the file and key."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from exporter.sim.model import Model
from exporter.sim.render import nvml_state
from exporter.sim.scenario import ScenarioError, loads

MIG: dict[str, Any] = {
    "version": 1,
    "name": "mig",
    "host": {"cpus": 8},
    "gpus": [{"index": 0, "pci_bus_id": "0000:82:00.0", "mig": [{"gi": 1}, {"gi": 2, "name": "1g.10gb"}]},
             {"index": 1, "pci_bus_id": "0000:83:00.0"}],
    "processes": [{"pid": 100, "gpus": [0], "mig": 1}, {"pid": 200, "gpus": [1]}],
    "phases": [
        {"name": "p", "duration_s": 10, "gpus": {
            0: {"mig": {1: {"gpu_util": 0.9, "sm_active": 0.6, "pcie_rx_bytes_per_s": 1e9}, 2: {"gpu_util": 0.2}},
                "xid_events": [{"at_s": 4, "xid": 48, "mig": 1}], "ecc_uncorrected_per_s": 0.5},
            1: {"gpu_util": 0.5, "row_remap_pending": True, "remapped_rows_correctable": 2}}},
        {"name": "q", "duration_s": 10},
    ],
    "expect": [{"phase": "p", "mig": {0: {1: "healthy", 2: "latency_bound"}}, "gpus": {1: "latency_bound"}}],
}


def _load(doc: dict[str, Any]) -> Any:
    return loads(yaml.safe_dump(doc), "mig.yaml")


def _with(**edits: Any) -> dict[str, Any]:
    d = copy.deepcopy(MIG)
    for path, value in edits.items():
        node: Any = d
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) or (k.isdigit() and int(k) in node) else node[k]
        node[int(keys[-1]) if isinstance(node, list) or keys[-1].isdigit() else keys[-1]] = value
    return d


def test_mig_xid_and_ecc_keys_load_and_reach_the_fake_nvml() -> None:
    sc = _load(MIG)
    g = sc.gpus[0]
    assert [(x.gi, x.name, x.uuid) for x in g.mig or ()] == [
        (1, "NVIDIA H100 80GB HBM3 MIG 1", "MIG-00000000-0000-0000-0000-000000000000-1"),
        (2, "1g.10gb", "MIG-00000000-0000-0000-0000-000000000000-2")]
    assert sc.processes[0].mig == 1 and sc.expect[0].mig == {(0, 1): "healthy", (0, 2): "latency_bound"}
    model = Model(sc)
    state = nvml_state(model, 8.0)
    dev0, dev1 = state["devices"]
    i1 = dev0["mig"][0]
    assert i1["graphics_active_integral"] == pytest.approx(0.9 * 8.0)
    assert i1["processes"] == [{"pid": 100, "used_memory_bytes": 0}] and dev0["processes"] == []
    # The GPU's own activity is its busiest instance's (clocks, power); PCIe is the instances' sum.
    assert dev0["graphics_active_integral"] == pytest.approx(0.9 * 8.0)
    assert dev0["pcie_rx_bytes"] == i1["pcie_rx_bytes"] == int(1e9 * 8.0)
    assert dev0["xid_events"] == [{"t": 4.0, "xid": 48, "gi": 1}]
    assert dev0["ecc"]["uncorrected_volatile"] == 4
    assert dev1["remapped_rows"] == {"correctable": 2, "uncorrectable": 0, "pending": 1, "failure": 0}
    # Events happen once: the next phase does not repeat them, but a looped timeline does.
    later = nvml_state(model, 19.0)["devices"][0]
    assert later["xid_events"] == [{"t": 4.0, "xid": 48, "gi": 1}]
    assert nvml_state(model, 25.0)["devices"][0]["xid_events"] == [
        {"t": 4.0, "xid": 48, "gi": 1}, {"t": 24.0, "xid": 48, "gi": 1}]
    assert nvml_state(model, 15.0)["devices"][1]["remapped_rows"]["pending"] == 1, "flags carry over"


@pytest.mark.parametrize(
    ("doc", "key", "why"),
    [
        (_with(gpus__0__mig=[{"gi": 1}, {"gi": 1}]), "gpus[0].mig[1].gi", "listed twice"),
        (_with(gpus__0__mig=[{"gi": i} for i in range(8)]), "gpus[0].mig", "at most 7"),
        (_with(gpus__0__mig=[{"gi": 1, "profile": "3g"}]), "gpus[0].mig[0].profile", "unknown key"),
        (_with(processes__0={"pid": 100, "gpus": [0]}), "processes[0]", "name the instance"),
        (_with(processes__0={"pid": 100, "gpus": [0], "mig": 9}), "processes[0].mig", "no GPU instance 9"),
        (_with(processes__1={"pid": 200, "gpus": [1], "mig": 1}), "processes[1].mig", "GPU 1 is not in MIG mode"),
        (_with(phases__0__gpus={0: {"gpu_util": 0.5}}), "phases[0].gpus.0.gpu_util", "set gpu_util per instance"),
        (_with(phases__0__gpus={0: {"mig": {3: {"gpu_util": 0.5}}}}), "phases[0].gpus.0.mig.3",
         "unknown GPU instance 3"),
        (_with(phases__0__gpus={0: {"mig": {1: {"sm_clock_mhz": 100}}}}), "phases[0].gpus.0.mig.1.sm_clock_mhz",
         "unknown key"),
        (_with(phases__0__gpus={1: {"mig": {1: {}}}}), "phases[0].gpus.1.mig", "not in MIG mode"),
        (_with(phases__0__gpus={0: {"xid_events": [{"at_s": 12, "xid": 79}]}}), "phases[0].gpus.0.xid_events",
         "past the phase's duration_s 10"),
        (_with(phases__0__gpus={0: {"xid_events": [{"xid": 79}]}}), "phases[0].gpus.0.xid_events[0].at_s",
         "required key missing"),
        (_with(phases__0__gpus={1: {"xid_events": [{"at_s": 1, "xid": 79, "mig": 1}]}}),
         "phases[0].gpus.1.xid_events[0].mig", "no GPU instance 1"),
        (_with(phases__0__gpus={1: {"ecc_uncorrected_per_s": -1}}), "phases[0].gpus.1.ecc_uncorrected_per_s",
         "out of range"),
        (_with(expect=[{"phase": "p", "gpus": {0: "healthy"}}]), "expect[0].gpus.0", "judged per instance"),
        (_with(expect=[{"phase": "p", "mig": {1: {1: "healthy"}}}]), "expect[0].mig.1", "unknown MIG-mode GPU 1"),
        (_with(expect=[{"phase": "p", "mig": {0: {1: "busy"}}}]), "expect[0].mig.0.1", "unknown verdict"),
    ],
)
def test_invalid_gpu_keys_name_the_file_and_key(doc: dict[str, Any], key: str, why: str) -> None:
    with pytest.raises(ScenarioError) as e:
        _load(doc)
    msg = str(e.value)
    assert msg.startswith("mig.yaml: ") and f": {key}: " in msg and why in msg, msg
