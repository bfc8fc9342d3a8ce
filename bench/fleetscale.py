"""The recording-rule history of a large simulated fleet, written directly as OpenMetrics, and its truth.

``gpufeed report --source rules`` reads only the shipped recording rules (exporter/fleet/collect.py,
``collect_aggregated``). To time it over thousands of GPUs and a month without simulating (and storing) the raw
scrapes behind them, this module writes the rule series themselves, as Prometheus would have recorded them
every ``STEP_S`` seconds:

- ``instance_gpu_state:gpufeed_gpu_state_seconds:rate5m`` and ``instance_gpu_cause:gpufeed_gpu_waiting_seconds:rate5m``
  per GPU (3 states + 5 causes: 8 series a GPU);
- ``namespace_state:...`` and ``namespace_cause:...`` per namespace: the sum of its GPUs' rates (each run of
  ``PART_HOSTS`` hosts is one namespace, but every eighth host runs none, so "(no namespace)" is not empty).

Each GPU follows one of ``PROFILES`` per ``BLOCK_S`` block, picked by a hash of (host, GPU, block): the rates
are piecewise constant, so the truth is exact: a sample stands for ``STEP_S`` seconds of its rate (what the
report assumes of a rule sample: the group's evaluation interval), and samples fall at ``OFFSET_S`` past each
``STEP_S`` boundary, never on a step boundary. No energy rule series are written (the energy figures are
absent from this benchmark's report).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.names import STATES, WAITING_CAUSES

JOB = "gpufeed"
STEP_S = 300  # the rules' evaluation interval in this benchmark: 8,640 samples a series over 30 days
OFFSET_S = 17
BLOCK_S = 6 * 3600
GPUS_PER_HOST = 8
PART_HOSTS = 16  # hosts per namespace and per file promtool converts (128 GPUs, ~10M samples over 30 days)
GPU_STATE_RULE = "instance_gpu_state:gpufeed_gpu_state_seconds:rate5m"
GPU_CAUSE_RULE = "instance_gpu_cause:gpufeed_gpu_waiting_seconds:rate5m"
NS_STATE_RULE = "namespace_state:gpufeed_gpu_state_seconds:rate5m"
NS_CAUSE_RULE = "namespace_cause:gpufeed_gpu_waiting_seconds:rate5m"

# (working, waiting, idle, cause of the waiting): GPU-seconds per second, summing to 1 (0.25-multiples: exact
# in binary, so the truth and Prometheus's sums agree to the last bit or nearly).
PROFILES: tuple[tuple[float, float, float, str | None], ...] = (
    (0.75, 0.25, 0.0, "input_bound"),
    (0.5, 0.5, 0.0, "io_bound"),
    (0.25, 0.5, 0.25, "transfer_bound"),
    (1.0, 0.0, 0.0, None),
    (0.0, 0.0, 1.0, None),
    (0.5, 0.25, 0.25, "launch_bound"),
    (0.75, 0.25, 0.0, "latency_bound"),
)


def host_name(h: int) -> str:
    return f"gpu-{h:05d}:9842"


def namespace_of(h: int) -> str | None:
    """Every eighth host runs no namespace's work."""
    return None if h % 8 == 7 else f"team-{h // PART_HOSTS:03d}"


def _rates(p: int) -> dict[str, float]:
    working, waiting, idle, cause = PROFILES[p]
    out = {"working": working, "waiting": waiting, "idle": idle}
    out.update({c: (waiting if c == cause else 0.0) for c in WAITING_CAUSES})
    return out


_RATES = tuple(_rates(p) for p in range(len(PROFILES)))
KEYS = (*STATES, *WAITING_CAUSES)


@dataclass
class Truth:
    """GPU-seconds over the range: per key (state or cause), per namespace and key, per hour and key."""

    gpus: int = 0
    hosts: int = 0
    total: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KEYS, 0.0))
    by_namespace: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: int = 0

    def merge(self, other: Truth) -> None:
        self.gpus += other.gpus
        self.hosts += other.hosts
        self.samples += other.samples
        for k in KEYS:
            self.total[k] += other.total[k]
        for ns, per in other.by_namespace.items():
            mine = self.by_namespace.setdefault(ns, dict.fromkeys(KEYS, 0.0))
            for k in KEYS:
                mine[k] += per[k]


def _profile(h: int, g: int, b: int) -> int:
    return zlib.crc32(f"{h}/{g}/{b}".encode()) % len(PROFILES)


def write_part(path: Path, hosts: Sequence[int], start: int, end: int) -> Truth:
    """The rule series of ``hosts`` over (start, end] (``end - start`` a whole number of BLOCK_S) into ``path``;
    the namespace series carry the part's hosts only (a part is whole namespaces: ``parts``)."""
    blocks = (end - start) // BLOCK_S
    per_block = BLOCK_S // STEP_S
    stamps = [[str(start + b * BLOCK_S + OFFSET_S + i * STEP_S) for i in range(per_block)] for b in range(blocks)]
    truth = Truth(gpus=len(hosts) * GPUS_PER_HOST, hosts=len(hosts))
    ns_rates: dict[str, list[dict[str, float]]] = {}
    with path.open("w") as f:
        for h in hosts:
            ns = namespace_of(h)
            if ns is not None:
                acc = ns_rates.setdefault(ns, [dict.fromkeys(KEYS, 0.0) for _ in range(blocks)])
            for g in range(GPUS_PER_HOST):
                profiles = [_profile(h, g, b) for b in range(blocks)]
                for rule, label, keys in ((GPU_STATE_RULE, "state", STATES), (GPU_CAUSE_RULE, "cause", WAITING_CAUSES)):
                    for k in keys:
                        head = f'{rule}{{job="{JOB}",instance="{host_name(h)}",gpu="{g}",{label}="{k}"}} '
                        for b, p in enumerate(profiles):
                            v = _RATES[p][k]
                            pre = f"{head}{v:g} "
                            f.write(pre + ("\n" + pre).join(stamps[b]) + "\n")
                            truth.total[k] += v * per_block * STEP_S
                            if ns is not None:
                                acc[b][k] += v
                truth.samples += len(KEYS) * blocks * per_block
        for ns, acc in ns_rates.items():
            per = truth.by_namespace.setdefault(ns, dict.fromkeys(KEYS, 0.0))
            for rule, label, keys in ((NS_STATE_RULE, "state", STATES), (NS_CAUSE_RULE, "cause", WAITING_CAUSES)):
                for k in keys:
                    head = f'{rule}{{namespace="{ns}",{label}="{k}"}} '
                    for b in range(blocks):
                        pre = f"{head}{acc[b][k]:g} "
                        f.write(pre + ("\n" + pre).join(stamps[b]) + "\n")
                        per[k] += acc[b][k] * per_block * STEP_S
                    truth.samples += blocks * per_block
        f.write("# EOF\n")
    return truth


def parts(first_host: int, hosts: int) -> list[list[int]]:
    """Hosts ``first_host`` to ``first_host + hosts - 1`` in runs of PART_HOSTS (whole namespaces each, so parts
    written in separate promtool runs never write the same series)."""
    assert first_host % PART_HOSTS == 0
    return [list(range(h, min(h + PART_HOSTS, first_host + hosts))) for h in range(first_host, first_host + hosts,
                                                                                    PART_HOSTS)]
