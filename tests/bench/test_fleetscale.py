"""bench/fleetscale.py: the rule series it writes are what its truth says, a part is whole namespaces, and the
samples never fall on a step boundary (the fleet-scale benchmark checks the report against this truth)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.fleetscale import (
    BLOCK_S,
    GPU_STATE_RULE,
    KEYS,
    NS_STATE_RULE,
    OFFSET_S,
    PART_HOSTS,
    STEP_S,
    namespace_of,
    parts,
    write_part,
)
from exporter.names import STATES


def test_the_written_series_sum_to_the_truth(tmp_path: Path) -> None:
    start = 1_700_000_000 // BLOCK_S * BLOCK_S
    hosts = parts(PART_HOSTS, PART_HOSTS)[0]
    truth = write_part(tmp_path / "p.om", hosts, start, start + 2 * BLOCK_S)
    sums: dict[str, float] = defaultdict(float)
    ns_sums: dict[tuple[str, str], float] = defaultdict(float)
    per_gpu_second: dict[tuple[str, str, int], float] = defaultdict(float)
    lines = (tmp_path / "p.om").read_text().splitlines()
    assert lines[-1] == "# EOF"
    for line in lines[:-1]:
        series, value, ts = line.rsplit(" ", 2)
        t = int(ts)
        assert start < t <= start + 2 * BLOCK_S and (t - start) % STEP_S == OFFSET_S
        labels = dict(kv.split("=") for kv in series[series.index("{") + 1:-1].split(","))
        key = (labels.get("state") or labels["cause"]).strip('"')
        if series.startswith(NS_STATE_RULE) or series.startswith("namespace_cause"):
            ns_sums[(labels["namespace"].strip('"'), key)] += float(value) * STEP_S
        else:
            sums[key] += float(value) * STEP_S
            if series.startswith(GPU_STATE_RULE):
                per_gpu_second[(labels["instance"], labels["gpu"], t)] += float(value)
    assert truth.gpus == 8 * PART_HOSTS and truth.samples == len(lines) - 1
    assert sums == truth.total and set(sums) == set(KEYS)
    # A GPU's states add up to one second per second; its causes to its waiting.
    assert set(per_gpu_second.values()) == {1.0}
    assert sum(truth.total[s] for s in STATES) == truth.gpus * 2 * BLOCK_S
    # Each namespace's series is the sum of its hosts' GPUs; the host without one is left out.
    owners = {namespace_of(h) for h in hosts}
    assert None in owners and set(truth.by_namespace) == owners - {None}
    for (ns, key), v in ns_sums.items():
        assert v == truth.by_namespace[ns][key]


def test_parts_are_whole_namespaces() -> None:
    split = parts(0, 3 * PART_HOSTS)
    assert [len(p) for p in split] == [PART_HOSTS] * 3
    for p in split:
        assert len({namespace_of(h) for h in p} - {None}) == 1
