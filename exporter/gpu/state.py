"""The NVML session's runtime state per GPU, per MIG device and per GPM stream (exporter/gpu/session.py owns
it; the sampling paths read and update it under the session lock)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu import fields as F  # noqa: N812
from exporter.gpu.binding import M64
from exporter.gpu.counters import SampleIntegrator, WrappingCounter
from exporter.gpu.pace import Pace
from exporter.samples.gpu import GpuIdentity, GpuProcess, HeldFast, MigIdentity

GPM_METRICS = (C.GPM_GRAPHICS_UTIL, C.GPM_SM_UTIL, C.GPM_SM_OCCUPANCY, C.GPM_ANY_TENSOR_UTIL,
               C.GPM_DRAM_BW_UTIL, C.GPM_PCIE_TX_PER_SEC, C.GPM_PCIE_RX_PER_SEC)
NO_FIELDS: Mapping[Any, Any] = MappingProxyType({})  # the one shared empty mapping
# Why a value NVML returned was dropped (gpufeed_nvml_values_dropped_total{reason}): a non-finite GPM metric
# with SUCCESS, a process id no process on this host can have.
DROPPED_GPM, DROPPED_PID = "gpm_not_finite", "invalid_pid"


class GpuLostError(Exception):
    """Internal: the GPU answered GPU_IS_LOST (or UNKNOWN repeatedly)."""


@dataclass
class GpmStream:
    """One GPM stream -- a GPU's, or one MIG instance's -- its sample pair and the integrals it feeds."""

    samples: list[Any] = field(default_factory=list)
    mg: Any = None
    prev: tuple[Any, float] | None = None
    last: dict[int, float | None] = field(default_factory=dict)
    sm_active_seconds: float | None = None
    graphics_seconds: float | None = None
    # Time the integrals above were integrated up to (the newer sample of the last pair; the first sample
    # before any pair): GpuFast.counter_t. A tick without a pair leaves it, like the integrals.
    t: float | None = None


@dataclass
class MigDevice:
    """One GPU instance of a GPU in MIG mode (GPM pairs, memory) with its compute instances (processes)."""

    identity: MigIdentity  # its first compute instance's (the lowest ci)
    handle: Any  # the first compute instance's MIG device handle: what the GPU instance shares (memory)
    # Every compute instance of the GPU instance -- each a MIG device with processes of its own -- ci -> handle.
    compute: dict[int, Any] = field(default_factory=dict)
    gpm: GpmStream = field(default_factory=GpmStream)
    processes: tuple[GpuProcess, ...] = ()  # as of the newest enumeration
    processes_seen: bool = False  # enumerated at least once (a new instance is enumerated on its first cycle)


@dataclass
class GpuState:
    """Runtime state of one GPU (only the backend, under its lock, touches it)."""

    index: int
    handle: Any
    identity: GpuIdentity
    lost: bool = False
    # Why NVML will not hand over this GPU's handle (exporter.gpu.binding.reason of a per-index error other than
    # GPU_IS_LOST / UNKNOWN), None once it does: not sampled, retried with the lost GPUs' backoff.
    unavailable: str | None = None
    unknown_streak: int = 0
    disabled: set[str] = field(default_factory=set)
    disabled_fields: set[int] = field(default_factory=set)
    # fast path
    gpm_ok: bool = False
    gpm: GpmStream = field(default_factory=GpmStream)
    # One unwrapping counter per counter field of the table (exporter/gpu/fields.py), by field id.
    counters: dict[int, WrappingCounter] = field(default_factory=lambda: {
        f.field_id: WrappingCounter(f.max_rate) for f in F.FIELDS if f.kind == F.COUNTER})
    # The newest value of every field, base units, per sampling path (fast / slow).
    field_values: dict[str, dict[str, float]] = field(default_factory=lambda: {F.FAST: {}, F.SLOW: {}})
    fields_prev_t: dict[str, float] = field(default_factory=dict)
    wrap_warned: bool = False
    # MIG: the instances by GPU instance id, and whether the next slow cycle must enumerate them again
    mig: dict[int, MigDevice] = field(default_factory=dict)
    mig_stale: bool = False
    # The MIG device UUIDs by slot as of the newest enumeration: a slow cycle that finds others re-enumerates
    # (nvml.h: MIG handles may be reused after a reconfiguration, answering for another instance).
    mig_slots: tuple[str, ...] = ()
    # buffered path
    util: SampleIntegrator = field(default_factory=SampleIntegrator)
    # slow path
    proc_last_seen: int = 0
    link_capacity: float | None = None
    # What the board is built for (max link generation and width, max SM clock): read at the first slow cycle and
    # again every STATIC_INTERVAL_S (exporter/gpu/slow.py), not at every one; when last read (None: next cycle).
    static: dict[str, Any] = field(default_factory=dict)
    static_t: float | None = None
    processes: tuple[GpuProcess, ...] = ()  # as of the newest enumeration (at most every PROCESS_INTERVAL_S)
    processes_t: float | None = None  # when; None: enumerate on the next slow cycle
    active: bool | None = None  # the driver's newest samples showed work (None: not known yet)
    # adaptive fast rate (exporter/gpu/pace.py): its state, the newest fast read (shown while it is not read
    # again), and per PCIe byte counter the (time, total) a rate is measured from, the newest rate and the lower
    # of the two newest (what the counter sustained), with the narrowest counter's width
    pace: Pace = field(default_factory=Pace)
    held: HeldFast | None = None
    # The newest SM clock read (MHz, None: not answered) and when (exporter/gpu/fast.py CLOCK_INTERVAL_S).
    clock: tuple[float | None, float] | None = None
    pcie_ref: dict[int, tuple[float, int]] = field(default_factory=dict)
    pcie_rates: dict[int, float] = field(default_factory=dict)
    pcie_sustained: dict[int, float] = field(default_factory=dict)
    pcie_modulus: int = M64

