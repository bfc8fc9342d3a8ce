"""Output of the derived layer: per-GPU verdicts and platform findings (produced by exporter.analysis)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

VERDICTS = (
    "healthy", "idle", "launch_bound", "input_bound", "io_bound", "transfer_bound",
    "gpu_throttled", "gpu_inefficient", "latency_bound",
)
WAITING_CAUSES = ("launch_bound", "input_bound", "io_bound", "transfer_bound", "latency_bound")
STATES = ("working", "waiting", "idle")
FINDINGS = (
    "pcie_link_downgraded", "pcie_errors", "numa_mismatch", "cpu_governor_powersave",
    "gpu_clock_throttled", "memory_pressure", "nfs_retransmissions", "gpu_lost",
)
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """The verdict on one GPU over the classifier's window."""

    index: int
    uuid: str
    cause: str  # one of VERDICTS
    confidence: float  # 0..1
    waiting_ratio: float  # share of the window the GPU was waiting (0..1)
    evidence: tuple[str, ...]  # sentences a human can act on, strongest first


@dataclass(frozen=True, slots=True)
class Finding:
    """A platform finding; ``gpu`` is None for host-wide findings."""

    check: str  # one of FINDINGS
    gpu: int | None
    severity: str  # one of SEVERITIES
    detail: str


@dataclass(frozen=True, slots=True)
class DerivedState:
    """The derived layer's newest evaluation at monotonic time ``t``."""

    t: float
    gpus: Mapping[int, GpuVerdict]
    findings: tuple[Finding, ...]
