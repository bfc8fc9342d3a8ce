"""A distributed job across simulated hosts against the shipped rules in a real Prometheus.

Five ``gpufeed serve --simulate`` daemons, one per host: job ``llm-7`` runs one rank on each of three hosts, and
the host of rank 1 copies every batch through a riser that negotiated Gen3 x8 under a Gen4 x16 GPU
(transfer_bound, pcie_link_downgraded); ranks 0 and 2 spin in collectives waiting for it (collective_wait).
Job ``llm-8`` runs two healthy ranks. A real ``prometheus`` scrapes them every second and evaluates the SHIPPED
alert and recording rules with every duration divided by 60 (tests/rules/test_integration.py's shrink).
Asserted: GpufeedJobStraggler fires within 3 minutes naming rank 1's host, its GPU, transfer_bound and the
host's pcie_link_downgraded finding, and nothing of the kind fires for the rest of either job.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.rules import test_integration as shrinking
from tests.rules.conftest import starter
from tests.rules.test_integration import _binary, free_port, http_get, shrunk_rule_files, stop, wait_until

pytestmark = pytest.mark.integration

SPEED = 2.0  # scenario seconds per real second
# Rule durations are divided by this (not test_integration's 60): the 5 m waiting window becomes 15 s, which
# rides out a daemon that misses a few evaluations on a loaded machine (a 5 s window then reads 0/0 and the
# alert's for: restarts); 5 m for: + 1 m rule interval still fire well within FIRE_WITHIN_S.
SCALE = 20
FIRE_WITHIN_S = 180.0

STRAGGLER_GPU = {
    "index": 0, "name": "NVIDIA A100 80GB PCIe", "pci_bus_id": "0000:82:00.0", "numa_node": 0, "gpm": False,
    "max_sm_clock_mhz": 1410, "power_limit_w": 300, "pcie": {"max_gen": 4, "max_width": 16},
    "upstream": [{"bdf": "0000:80:03.1", "max_gen": 4, "max_width": 16},
                 {"bdf": "0000:81:00.0", "max_gen": 4, "max_width": 16}]}
STRAGGLING = {"link": {"gen": 3, "width": 8}, "gpu_util": {"noise": {"mean": 0.3, "sd": 0.04}},
              "pcie_rx_bytes_per_s": {"noise": {"mean": 7.2e9, "sd": 1.0e8}}, "pcie_tx_bytes_per_s": 1.0e8,
              "memory_used_bytes": 4.0e10}
SPINNING = {"gpu_util": 0.97, "sm_active": {"noise": {"mean": 0.18, "sd": 0.02}}, "sm_occupancy": 0.03,
            "tensor_active": 0.0, "dram_active": 0.02, "memory_used_bytes": 6.0e10}
WORKING = {"gpu_util": 0.95, "sm_active": {"noise": {"mean": 0.8, "sd": 0.03}}, "sm_occupancy": 0.4,
           "tensor_active": 0.5, "dram_active": 0.4, "memory_used_bytes": 6.0e10}
# host key -> (job, rank, world size, GPU state)
HOSTS = {
    "a": ("llm-7", 0, 3, SPINNING),
    "b": ("llm-7", 1, 3, STRAGGLING),
    "c": ("llm-7", 2, 3, SPINNING),
    "d": ("llm-8", 0, 2, WORKING),
    "e": ("llm-8", 1, 2, WORKING),
}


def scenario(key: str) -> dict[str, Any]:
    """One host of a job: its rank's process (under a torchrun launcher) on GPU 0, in one long phase."""
    job, rank, world, state = HOSTS[key]
    gpu = STRAGGLER_GPU if state is STRAGGLING else {"index": 0, "pci_bus_id": "0000:41:00.0"}
    return {
        "version": 2, "name": f"{job}-rank-{rank}", "seed": 43 + rank,
        "host": {"cpus": 32, "numa_nodes": [{"cpus": "0-31"}]},
        "gpus": [gpu],
        "processes": [
            {"pid": 4000, "comm": "torchrun", "gpus": []},
            {"pid": 4100, "comm": "python", "gpus": [0], "ppid": 4000, "threads": 8,
             "job": {"id": job, "rank": rank, "world_size": world}},
        ],
        "phases": [{"name": "training", "duration_s": 1200, "gpus": {0: state}, "processes": {
            4000: {"threads_cpu": [{"count": 1, "user": 0.01, "system": 0.0, "state": "S"}]},
            4100: {"threads_cpu": [{"count": 1, "user": 0.1, "system": 0.03, "state": "S"}]}}}],
    }


def _shrunk(tmp: Path) -> list[str]:
    """The shipped rules with their durations divided by SCALE (test_integration's shrink, another factor)."""
    saved = shrinking.SCALE
    shrinking.SCALE = SCALE
    try:
        return shrunk_rule_files(tmp)
    finally:
        shrinking.SCALE = saved


class Prom:
    def __init__(self, url: str, instances: dict[str, str]) -> None:
        self.url, self.instances = url, instances

    def alerts(self) -> list[dict[str, Any]]:
        doc = json.loads(http_get(f"{self.url}/api/v1/alerts"))
        return [a for a in doc["data"]["alerts"] if a["labels"]["alertname"] == "GpufeedJobStraggler"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        import urllib.parse
        doc = json.loads(http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    prometheus = _binary("prometheus")
    tmp = tmp_path_factory.mktemp("straggler")
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    start = starter(tmp, procs, logs)

    try:
        instances: dict[str, str] = {}
        for key in HOSTS:
            path = tmp / f"host-{key}.yaml"
            path.write_text(yaml.safe_dump(scenario(key), sort_keys=False))
            instances[key] = f"127.0.0.1:{free_port()}"
            start(f"gpufeed-{key}", [sys.executable, "-m", "exporter", "serve", "--simulate", str(path),
                                     "--simulate-speed", str(SPEED), "--web.listen-address", instances[key],
                                     "--log.level", "warn"])
        deadline = time.monotonic() + 120
        try:
            for inst in instances.values():
                wait_until(f"gpufeed at {inst} serving", lambda inst=inst: b"gpufeed_gpu_state_seconds_total"
                           in http_get(f"http://{inst}/metrics"), deadline)
        except BaseException:
            print("\n".join(p.name + ":\n" + p.read_text(errors="replace")[-2000:] for p in logs))
            raise
        port = free_port()
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": _shrunk(tmp),
            "scrape_configs": [{"job_name": "gpufeed", "static_configs": [
                {"targets": [inst], "labels": {"host": key}} for key, inst in instances.items()]}],
        }))
        start("prometheus", [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'prom-data'}", f"--web.listen-address=127.0.0.1:{port}"])
        p = Prom(f"http://127.0.0.1:{port}", instances)
        wait_until("Prometheus ready", lambda: http_get(f"{p.url}/-/ready"), time.monotonic() + 30)
        yield p
    finally:
        stop(procs)


def test_the_straggler_is_named_with_its_host_and_cause_and_no_other_rank_is(prom: Prom) -> None:
    start = time.monotonic()
    firing = wait_until("GpufeedJobStraggler firing",
                        lambda: [a for a in prom.alerts() if a["state"] == "firing"], start + FIRE_WITHIN_S, 1.0)
    assert len(firing) == 1, firing
    labels, description = firing[0]["labels"], firing[0]["annotations"]["description"]
    assert labels["instance"] == prom.instances["b"]
    assert (labels["job_id"], labels["rank"], labels["gpu"]) == ("llm-7", "1", "0")
    assert labels["cause"] == "transfer_bound"
    assert "pcie_link_downgraded" in description, description
    # The other ranks of llm-7 wait in collectives; they and the healthy job llm-8 raise nothing.
    waiting = prom.query('gpufeed_gpu_bottleneck{cause="collective_wait"} == 1')
    assert {s["metric"]["host"] for s in waiting} == {"a", "c"}
    time.sleep(15)  # five shrunk minutes more: still only the straggler
    assert {(a["labels"]["instance"], a["labels"]["job_id"]) for a in prom.alerts()} == {(prom.instances["b"], "llm-7")}
