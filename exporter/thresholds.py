"""The thresholds of gpufeed's judgements, from ``exporter/thresholds.yaml`` -- the file the shipped alert rules
are generated from, so a finding the daemon raises and the alert that pages on it use one definition.

Read once at import (package data, not a host source); the derived layer gets plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from exporter.durations import parse_duration

PATH = Path(str(resources.files("exporter") / "thresholds.yaml"))
DEFAULTS: dict[str, Any] = yaml.safe_load(PATH.read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class NfsRetransmissions:
    """``nfs_retransmissions``: a share of RPCs retransmitted, with a floor on the absolute rate."""

    max_retrans_ratio: float
    min_retrans_per_second: float


@dataclass(frozen=True, slots=True)
class MemoryPressure:
    """``memory_pressure``: little MemAvailable, or tasks stalled on memory (PSI some)."""

    max_available_ratio: float
    max_memory_stall_ratio: float


@dataclass(frozen=True, slots=True)
class WorkloadChecks:
    """``cpu_quota_throttled``, ``cpu_contention`` and ``gpu_memory_full`` (DESIGN.md "Workloads")."""

    min_throttled_ratio: float
    min_run_delay_ratio: float
    min_gpu_memory_used_ratio: float


def _section(name: str, keys: tuple[str, ...]) -> dict[str, float]:
    sec = DEFAULTS[name]
    return {k: float(sec[k]) for k in keys}


NFS = NfsRetransmissions(**_section("nfs_retransmissions", ("max_retrans_ratio", "min_retrans_per_second")))
MEMORY = MemoryPressure(**_section("memory_pressure", ("max_available_ratio", "max_memory_stall_ratio")))


@dataclass(frozen=True, slots=True)
class XidErrors:
    """``gpu_xid_error``: which Xid codes are raised, at which severity, and for how long after the last one."""

    critical: frozenset[int]
    warning: frozenset[int]
    hold_s: float


_XID = DEFAULTS["gpu_xid_error"]
XID = XidErrors(critical=frozenset(int(x) for x in _XID["critical_xids"]),
                warning=frozenset(int(x) for x in _XID["warning_xids"]), hold_s=parse_duration(_XID["window"]))
WORKLOAD = WorkloadChecks(
    min_throttled_ratio=_section("cpu_quota_throttled", ("min_throttled_ratio",))["min_throttled_ratio"],
    min_run_delay_ratio=_section("cpu_contention", ("min_run_delay_ratio",))["min_run_delay_ratio"],
    min_gpu_memory_used_ratio=_section("gpu_memory_full", ("min_gpu_memory_used_ratio",))["min_gpu_memory_used_ratio"],
)
