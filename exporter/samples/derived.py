"""Output of the derived layer: per-GPU verdicts and platform findings (produced by exporter.derived.analyzer).

The vocabulary (verdicts, states, findings, severities) is in :mod:`exporter.names`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.samples.gpu import GpuKey


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """The verdict on one GPU over the classifier's window."""

    index: int
    uuid: str
    cause: str  # one of exporter.names.VERDICTS
    confidence: float  # 0..1
    waiting_ratio: float  # share of the window the GPU was waiting (0..1)
    evidence: tuple[str, ...]  # sentences a human can act on, strongest first
    mig: int | None = None  # the MIG instance (GPU instance id) judged; uuid is then the instance's

    @property
    def key(self) -> GpuKey:
        """The GPU or MIG instance this verdict is about."""
        return GpuKey(self.index, self.mig)


@dataclass(frozen=True, slots=True)
class Finding:
    """A platform finding; ``gpu`` is None for host-wide findings."""

    check: str  # one of exporter.names.FINDINGS
    gpu: int | None
    severity: str  # one of exporter.names.SEVERITIES
    detail: str


def _no_activity() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """Counters and windowed shape of one GPU, as exported (counters cumulative since the daemon started).

    ``gap_buckets`` are non-cumulative counts of completed idle gaps per ``GAP_BUCKETS`` upper bound plus a
    final +Inf slot; ``burstiness`` is the coefficient of variation of activity over the window (None when
    the GPU was never active); ``links`` maps each PCIe hop (BDF) of the GPU's chain to whether it is
    downgraded while busy. ``waiting_joules`` is the energy spent waiting, by cause, apportioned over the same
    evaluations as ``waiting_seconds`` (only the causes seen; empty on a GPU without an energy counter and on a
    MIG instance).
    """

    state_seconds: Mapping[str, float]  # working / waiting / idle
    waiting_seconds: Mapping[str, float]  # by cause (WAITING_CAUSES)
    gap_buckets: tuple[int, ...]
    gap_seconds_sum: float
    burstiness: float | None
    idle_ratio: float | None
    periodic_gaps: bool
    links: Mapping[str, bool]
    waiting_joules: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


# Buckets of gpufeed_gpu_idle_gap_seconds, one per kind of stall the playbook tells apart (5 series per GPU
# with +Inf, plus _sum and _count: the series budget): <= 250 ms launch/sync gaps (the sampler's floor is
# 100 ms), <= 1 s gaps at batch boundaries, <= 2.5 s data-loader stalls, <= 10 s IO stalls; longer is a pause.
GAP_BUCKETS = (0.25, 1.0, 2.5, 10.0)
# Below this share of an interval the GPU counts as idle in that interval: the derived layer's gaps and the GPU
# collector's steady pace (exporter/gpu/pace.py) agree on it. 5%: the driver's utilisation samples are quantised
# to 1% and a memset or a tiny kernel between batches must not split a gap.
IDLE_LEVEL = 0.05


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    """What feeds one GPU, as exported: the attribution labels of ``gpufeed_workload_info`` (only those
    known), how many processes its workload has, the CPU they use and may use (cores; None when unknown)."""

    labels: Mapping[str, str]
    processes: int
    cpu_cores: float | None
    capacity_cores: float | None


def _no_workloads() -> Mapping[int, WorkloadSummary]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DerivedState:
    """The derived layer's newest evaluation at monotonic time ``t``.

    ``gpus`` / ``activity`` are the whole GPUs, by NVML index. A GPU in MIG mode is judged per MIG instance
    instead (DESIGN.md): its instances are in ``mig`` / ``mig_activity`` by :class:`GpuKey` (``gpu``, ``mig``),
    and it has no entry in ``gpus``. ``unjudged`` names the instances nothing measures (MIG without GPM) and
    why: they have no verdict rather than a made-up ``idle``.
    """

    t: float
    gpus: Mapping[int, GpuVerdict]
    findings: tuple[Finding, ...]
    activity: Mapping[int, GpuActivity] = field(default_factory=_no_activity)
    window_s: float = 15.0
    mig: Mapping[GpuKey, GpuVerdict] = field(default_factory=_no_activity)
    mig_activity: Mapping[GpuKey, GpuActivity] = field(default_factory=_no_activity)
    unjudged: Mapping[GpuKey, str] = field(default_factory=_no_activity)

    def verdicts(self) -> dict[GpuKey, GpuVerdict]:
        """Every verdict, whole GPUs and MIG instances, by key, in key order."""
        out = {GpuKey(i): v for i, v in self.gpus.items()} | dict(self.mig)
        return dict(sorted(out.items()))
    workloads: Mapping[int, WorkloadSummary] = field(default_factory=_no_workloads)
