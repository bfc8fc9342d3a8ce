"""The interconnect's scenario keys (exporter/sim/interconnect.py): validated with the key named, rendered as the
fake NVML's links and /sys/class/infiniband ports the collectors read, and absent from scenarios without them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.sim.model import Model
from exporter.sim.render import Renderer, nvml_state
from exporter.sim.scenario import ScenarioError, loads

SWITCH = [{"bdf": "0000:15:01.0"}, {"bdf": "0000:16:00.0"}, {"bdf": "0000:17:00.0"}]


def doc(**host: Any) -> dict[str, Any]:
    return {
        "version": 1, "name": "ic", "host": {"cpus": 4, **host},
        "gpus": [{"index": 0, "pci_bus_id": "0000:18:00.0", "nvlinks": 4, "upstream": SWITCH},
                 {"index": 1, "pci_bus_id": "0000:98:00.0"}],
        "phases": [{"name": "a", "duration_s": 10, "gpus": {0: {"gpu_util": 0.9, "nvlink": {
            "down": [2], "tx_bytes_per_s": 3 * 1024 * 1000, "replays_per_s": 2}}},
            "host": {"nics": {"mlx5_0": {"rate_gbps": 200, "rx_bytes_per_s": 4000}}}} if host else
            {"name": "a", "duration_s": 10}],
    }


def test_links_and_ports_reach_the_fake_and_the_tree(tmp_path: Path) -> None:
    sc = loads(yaml.safe_dump(doc(nics=[{"name": "mlx5_0", "gpus": [0]}])), "ic.yaml")
    model = Model(sc)
    links = nvml_state(model, 10.0)["devices"][0]["nvlink"]
    assert [ln["up"] for ln in links] == [True, True, False, True]
    assert [ln["tx_kib"] for ln in links] == [10000, 10000, 0, 10000], "spread over the up links"
    assert links[0]["replay"] == 20 and links[1]["replay"] == 0
    assert nvml_state(model, 10.0)["devices"][1]["nvlink"] == [], "a PCIe-only GPU"
    rd = Renderer(model, tmp_path, atomic=False)
    rd.render(10.0)
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    assert (port / "rate").read_text().startswith("200 Gb/sec")
    assert (port / "counters" / "port_rcv_data").read_text() == "10000\n", "4-byte words, as the kernel counts"
    dev = (tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "device").resolve()
    assert "0000:16:00.0" in dev.parts, "on the GPU's switch"


def test_a_scenario_without_the_keys_renders_no_adapter(tmp_path: Path) -> None:
    model = Model(loads(yaml.safe_dump(doc()), "ic.yaml"))
    Renderer(model, tmp_path, atomic=False).render(1.0)
    assert not (tmp_path / "sys" / "class" / "infiniband").exists()


@pytest.mark.parametrize(("nics", "key"), [
    ([{"name": "mlx5_0", "gpus": [1]}], "host.nics[0].gpus"),  # GPU 1 has no switch above it
    ([{"name": "mlx5_0", "gpus": [7]}], "host.nics[0].gpus"),
    ([{"name": "mlx5_0", "gpus": [0], "kind": "omnipath"}], "host.nics[0].kind"),
    ([{"name": "mlx5_0", "gpus": [0]}, {"name": "mlx5_0", "gpus": [0]}], "host.nics[1].name"),
])
def test_bad_adapters_name_the_key(nics: list[dict[str, Any]], key: str) -> None:
    with pytest.raises(ScenarioError, match=key.replace("[", r"\[").replace("]", r"\]")):
        loads(yaml.safe_dump(doc(nics=nics)), "ic.yaml")


def test_nvlink_state_on_a_gpu_without_nvlink_is_an_error() -> None:
    d = doc()
    d["phases"] = [{"name": "a", "duration_s": 10, "gpus": {1: {"nvlink": {"down": "all"}}}}]
    with pytest.raises(ScenarioError, match="has no NVLink"):
        loads(yaml.safe_dump(d), "ic.yaml")
