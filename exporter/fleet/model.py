"""What ``collect`` reads out of Prometheus, as plain numbers: the input of the pure ``figures`` layer."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

# Grouping dimensions of ``gpufeed report --by``: the workload label of gpufeed_workload_info for each, and the
# prefix of its recording rules (alerts/generate.py, workload_rollups). ``host`` is the Prometheus instance.
BY_LABEL = {"namespace": "namespace", "job": "slurm_job_id", "host": "instance"}
BY_RULE_PREFIX = {"namespace": "namespace", "job": "slurm_job"}
SOURCE_KINDS = ("rules", "raw")


def iso(t: float) -> str:
    """Unix seconds as RFC 3339 UTC, to the second."""
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True, order=True)
class GpuId:
    """One GPU of the fleet: the scrape job and instance of its exporter, and its NVML index."""

    job: str
    instance: str
    gpu: str


@dataclass(frozen=True, slots=True)
class Window:
    """The reviewed range ``(start, end]`` cut into ``steps`` steps of ``step`` seconds (unix seconds)."""

    start: float
    end: float
    step: float

    @property
    def steps(self) -> int:
        return round((self.end - self.start) / self.step)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def step_end(self, i: int) -> float:
        """Unix time at the end of step ``i`` (a range query's i-th evaluation time)."""
        return self.start + (i + 1) * self.step

    def index(self, t: float) -> int | None:
        """The step a range query's evaluation time ``t`` belongs to, or None outside the window."""
        i = round((t - self.start) / self.step) - 1
        return i if 0 <= i < self.steps else None


@dataclass(frozen=True, slots=True)
class Source:
    """Where one family of figures came from: a recording rule, or the raw series (and why)."""

    family: str  # "gpu_state", "gpu_cause", "group_state", "group_cause"
    kind: str  # one of SOURCE_KINDS
    series: str  # the rule or metric name queried
    note: str  # why this source: "" when the rule was used as intended


@dataclass(frozen=True, slots=True)
class FindingTrack:
    """Seconds a platform finding was raised in each step, for one GPU (``gpu=""``: host-wide)."""

    gpu: GpuId
    check: str
    active_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class LinkState:
    """The PCIe link of a GPU while pcie_link_downgraded was raised: the best seen, against its maximum."""

    gpu: GpuId
    bdfs: tuple[str, ...]  # the downgraded hops (gpufeed_pcie_link_downgraded{bdf})
    gen: int | None
    width: int | None
    max_gen: int | None
    max_width: int | None


@dataclass(frozen=True, slots=True)
class GapHistogram:
    """Idle gaps completed in the range: cumulative counts per upper bound (the last is +Inf) and their sum."""

    gpu: GpuId
    bounds: tuple[float, ...]  # finite upper bounds, ascending
    cumulative: tuple[float, ...]  # len(bounds) + 1 values
    sum_s: float


@dataclass(frozen=True, slots=True)
class JobWaits:
    """One distributed job (gpufeed_workload_info's namespace and job_id), per step: the GPU-seconds its ranks spent
    in collective_wait (waiting for a slower rank), and the GPU-seconds its ranks waited on each cause of their own
    host (every waiting cause but latency_bound, as the straggler rules count it)."""

    namespace: str
    job_id: str
    collective_s: tuple[float, ...]
    own_cause_s: Mapping[str, tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class FleetData:
    """Everything the figures are computed from. Seconds are GPU-seconds per step of ``window``, except in the
    aggregated form (``fleet_state_s`` set: ``collect_aggregated``), where ``state_s`` and ``cause_s`` hold one
    value per GPU, its GPU-seconds over the whole range, and the fleet's per-step figures are in ``fleet_state_s``
    and ``fleet_cause_s`` (summed by Prometheus, so the report never holds a per-GPU series of steps)."""

    window: Window
    by: str  # a key of BY_LABEL
    state_s: Mapping[GpuId, Mapping[str, tuple[float, ...]]]
    cause_s: Mapping[GpuId, Mapping[str, tuple[float, ...]]]
    models: Mapping[GpuId, str]
    group_state_s: Mapping[str, Mapping[str, float]]  # empty for --by host
    group_cause_s: Mapping[str, Mapping[str, float]]
    findings: tuple[FindingTrack, ...]
    links: Mapping[GpuId, LinkState]
    gaps: Mapping[GpuId, GapHistogram]
    sources: tuple[Source, ...]
    notes: tuple[str, ...] = ()
    # Joules spent waiting over the whole range, by cause (gpufeed_gpu_waiting_joules_total): per GPU, and per
    # namespace / Slurm job (empty for --by host). A GPU without an energy counter is absent.
    cause_j: Mapping[GpuId, Mapping[str, float]] = field(default_factory=dict)
    group_cause_j: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # The fleet's GPU-seconds per step by state and by cause (aggregated form); empty: summed from state_s.
    fleet_state_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    fleet_cause_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    # Distributed jobs whose ranks waited in collectives, and the series that counted them (a rule or raw).
    jobs: tuple[JobWaits, ...] = ()
    jobs_source: str = ""
