"""Samples of the host-side collectors (cpu, proc, cpufreq, memory, pressure, disk, nfs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PressureTotals:
    """Cumulative stall time of one PSI resource, seconds (``full`` is None for cpu on older kernels)."""

    some: float
    full: float | None


@dataclass(frozen=True, slots=True)
class PressureSample:
    """``/proc/pressure/{cpu,io,memory}`` totals, keyed by resource name."""

    resources: Mapping[str, PressureTotals]
