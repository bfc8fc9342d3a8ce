"""The series budget of DESIGN.md, at default settings: at most 60 series per GPU and 200 host-level ones.

Counted on the benchmark's 8-GPU / 192-CPU host (``bench/scenarios/host8x192_waiting.yaml``: two GPUs waiting,
so the deep evidence is on) and on the ``dgx`` fixture (8 GPUs behind 4 PCIe switches, the deepest chains),
with the whole daemon -- every collector and the derived layer -- on a virtual clock, and attributed as
``bench/series.py`` does: a series belongs to a GPU when it carries its ``gpu`` label, its address as
``gpu_bdf`` or the address of a hop of its chain as ``bdf``. Not timed: the counts depend on nothing but the
code and the host.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from bench.series import BUDGET_PER_GPU, BUDGET_PER_HOST, attribute_families
from exporter import pipeline, yamlsafe
from exporter.config import resolve
from exporter.engine import VirtualClock
from exporter.exposition import Renderer
from exporter.sim import scenario
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.model import Model
from exporter.sim.player import kubelet_socket
from exporter.sim.render import Renderer as TreeRenderer
from exporter.sim.render import nvml_state
from tests.support.golden import run as run_fixture_host

REPO = Path(__file__).resolve().parent.parent
BENCH_HOST = REPO / "bench" / "scenarios" / "host8x192_waiting.yaml"
SECONDS = 16.0  # past the derived layer's first verdicts and the slow samplers' first runs (5 s)
PCIE_SECONDS = 6.0  # past the PCIe collector's second pass (link changes need two)
STEP = 0.1
TREE_STEP = 0.5


@cache
def bench_payload(*flags: tuple[str, Any], seconds: float = SECONDS, nics: bool = True) -> str:
    """``/metrics`` of the benchmark host after ``seconds`` of scenario time (the fake NVML advanced every STEP,
    the simulated tree re-rendered every TREE_STEP), with extra settings ``flags``; without ``nics``, the host's
    InfiniBand ports left out (see :func:`test_network_adapters_cost_three_series_a_port_whatever_their_traffic`)."""
    doc = yamlsafe.load(BENCH_HOST)
    if not nics:
        doc["host"].pop("nics", None)
        for ph in doc["phases"]:
            (ph.get("host") or {}).pop("nics", None)
    sc = scenario.from_dict(doc, str(BENCH_HOST))
    with tempfile.TemporaryDirectory(prefix="gpufeed-budget-") as tmp:
        root = Path(tmp)
        model = Model(sc)
        tree = TreeRenderer(model, root, atomic=False)
        tree.setup()
        tree.render(0.0)
        fake = FakeNvml(nvml_state(model, 0.0))
        settings = resolve(pipeline.registry(), {}, {
            "path.procfs": str(root / "proc"), "path.sysfs": str(root / "sys"),
            "collector.kubernetes.socket": str(kubelet_socket(root)), **dict(flags)})
        pipe = pipeline.build(settings, clock=VirtualClock(0.0), nvml=fake, inline=True)
        try:
            t = 0.0
            pipe.engine.run_until(0.0)
            while t < seconds - 1e-9:
                t += STEP
                # The fake's state every 100 ms, as the GPU's fast path sees it (GPM pairs need moving counters);
                # the tree of 8 x 150 threads every 0.5 s.
                if round(t / TREE_STEP, 6).is_integer():
                    tree.render(t)
                fake.set_state(nvml_state(model, t))
                pipe.engine.run_until(t)
            out = Renderer(pipe.stages)
            out.render(pipe.engine.snapshot)
            return out.text().body.decode()
        finally:
            pipe.close()


def _worst(per: Counter[str]) -> tuple[str, int]:
    gpu = max(per, key=lambda g: per[g])
    return gpu, per[gpu]


def _where(fams: dict[str, Counter[str]], gpu: str) -> str:
    return ", ".join(f"{f} {n}" for f, n in fams[gpu].most_common(12))


def test_the_8_gpu_benchmark_host_stays_within_60_series_per_gpu_and_200_host_level() -> None:
    # With its eight InfiniBand ports, one on each GPU's PCIe switch, as an 8-H100 host has them.
    per, host, _total, fams = attribute_families(bench_payload())
    assert sorted(per) == [str(i) for i in range(8)], "every GPU must be described"
    # The run is long and fine enough for every kind of series to be there (a short run would undercount).
    for fam in ("gpufeed_gpu_sm_occupancy_ratio", "gpufeed_gpu_process_memory_bytes", "gpufeed_workload_cpu_cores",
                "gpufeed_gpu_bottleneck", "gpufeed_pcie_link_capacity_bytes_per_second", "gpufeed_gpu_idle_ratio"):
        assert all(fams[g][fam] for g in per), fam
    assert fams[""]["gpufeed_process_threads"] and fams[""]["gpufeed_disk_io_time_seconds_total"]
    gpu, most = _worst(per)
    assert most <= BUDGET_PER_GPU, f"GPU {gpu}: {most} series > {BUDGET_PER_GPU}: {_where(fams, gpu)}"
    assert host <= BUDGET_PER_HOST, f"{host} host-level series > {BUDGET_PER_HOST}: {_where(fams, '')}"


def test_eighteen_nvlinks_per_gpu_stay_within_the_budget() -> None:
    """NVLink series are per GPU, summed over its links: an H100's 18 links add the same four as one would. (The
    benchmark host's GPUs have 18 each: its payload is the one the budget test counts.)"""
    assert {g["nvlinks"] for g in yamlsafe.load(BENCH_HOST)["gpus"]} == {18}
    per, host, _total, fams = attribute_families(bench_payload())
    nvlink = {g: sum(n for f, n in fams[g].items() if f.startswith("gpufeed_gpu_nvlink")) for g in per}
    assert set(nvlink.values()) == {4}, nvlink
    gpu, most = _worst(per)
    assert most <= BUDGET_PER_GPU, f"GPU {gpu}: {most} series > {BUDGET_PER_GPU}: {_where(fams, gpu)}"
    assert host <= BUDGET_PER_HOST


def test_network_adapters_cost_three_series_a_port_whatever_their_traffic() -> None:
    """Each adapter port beside a GPU adds three host-level series (info with its capable rate, the rate now --
    0 while down --, its error counters summed), bounded by the ports, not by traffic or errors: at ten (up,
    capable rate, two byte counters and four error counters apart) the eight ports of the benchmark host put it
    at 279 host-level series against DESIGN.md's 200. The byte counters come back with --collector.nic.traffic."""
    per, host, _total, fams = attribute_families(bench_payload())
    _, without, _, _ = attribute_families(bench_payload(nics=False))
    nic = {f: n for f, n in fams[""].items() if f.startswith("gpufeed_nic_")}
    assert nic == {"gpufeed_nic_info": 8, "gpufeed_nic_rate_bits_per_second": 8, "gpufeed_nic_errors_total": 8}, nic
    # ... and the collector's own: its success and last-success series instead of the one saying it has no data.
    assert host - without == 8 * 3 + 1
    assert all(not f.startswith("gpufeed_nic_") for g in per for f in fams[g])
    _, with_traffic, _, traffic_fams = attribute_families(bench_payload(("collector.nic.traffic", True)))
    assert with_traffic - host == 8 * 2 and traffic_fams[""]["gpufeed_nic_receive_bytes_total"] == 8


def test_the_dgx_fixture_with_four_hop_chains_stays_within_the_budget() -> None:
    per, host, _total, fams = attribute_families(run_fixture_host("dgx"))
    assert len(per) == 8
    gpu, most = _worst(per)
    assert most <= BUDGET_PER_GPU, f"GPU {gpu}: {most} series > {BUDGET_PER_GPU}: {_where(fams, gpu)}"
    assert host <= BUDGET_PER_HOST, f"{host} host-level series > {BUDGET_PER_HOST}: {_where(fams, '')}"


def test_the_whole_pcie_chain_is_opt_in_and_adds_every_hop_back() -> None:
    default = attribute_families(bench_payload())[3]
    # The PCIe families are there from the collector's second pass (5 s): no need for the verdicts' 16 s.
    whole = attribute_families(bench_payload(("collector.pcie.chain", True), seconds=PCIE_SECONDS))[3]
    for gpu in (str(i) for i in range(8)):
        # Each GPU of the benchmark host sits below a root port and a PCIe switch (its upstream and downstream
        # ports): 4 devices x (info, 4 link series, 3 AER counters) with the flag, instead of the GPU's own link
        # and one AER total per severity.
        assert default[gpu]["gpufeed_pcie_device_info"] == 1
        assert whole[gpu]["gpufeed_pcie_device_info"] == 4
        for fam in ("gpufeed_pcie_link_current_speed_transfers_per_second", "gpufeed_pcie_link_current_width",
                    "gpufeed_pcie_link_capacity_bytes_per_second", "gpufeed_pcie_link_changes_total"):
            assert (default[gpu][fam], whole[gpu][fam]) == (1, 4), fam
        assert (default[gpu]["gpufeed_pcie_aer_errors_total"], whole[gpu]["gpufeed_pcie_aer_errors_total"]) == (0, 12)
        assert default[gpu]["gpufeed_pcie_chain_aer_errors_total"] == 3
        assert whole[gpu]["gpufeed_pcie_chain_aer_errors_total"] == 0


@pytest.mark.parametrize("family", ["gpufeed_gpu_bottleneck", "gpufeed_gpu_clock_event_reason",
                                    "gpufeed_process_numa_mismatch"])
def test_families_of_several_values_export_only_the_values_that_hold(family: str) -> None:
    body = bench_payload()
    values = [line.rpartition(" ")[2] for line in body.splitlines() if line.startswith(family + "{")]
    assert set(values) <= {"1.0"}, f"{family} exports values other than 1: {sorted(set(values))}"
    if family == "gpufeed_gpu_bottleneck":
        assert len(values) == 8  # exactly one current verdict per GPU
