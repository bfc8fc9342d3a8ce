"""Samples of the GPU collector (NVML). Every value is optional: an unsupported call gives None."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter.clockevents import TIME_KEYS

# One empty mapping for every sample that has nothing there: a default_factory building one per sample left a
# tracked proxy per GPU per tick in the ring buffers, for the cycle collector to traverse (issue 14).
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _empty() -> Mapping[Any, Any]:
    return _EMPTY


@dataclass(frozen=True, slots=True, order=True)
class GpuKey:
    """What the derived layer judges: a whole GPU (``mig`` None) or one MIG instance of it (``mig`` is the GPU
    instance id). Its labels are ``gpu`` (the NVML index) and, for an instance, ``mig`` (DESIGN.md)."""

    gpu: int
    mig: int | None = None

    def labels(self) -> dict[str, str]:
        """The Prometheus labels naming this GPU or instance."""
        return {"gpu": str(self.gpu)} if self.mig is None else {"gpu": str(self.gpu), "mig": str(self.mig)}

    def __str__(self) -> str:
        return f"GPU {self.gpu}" if self.mig is None else f"GPU {self.gpu} MIG {self.mig}"


@dataclass(frozen=True, slots=True)
class MigIdentity:
    """One MIG device of a GPU in MIG mode: its GPU instance (``gi``, the ``mig`` label), compute instance,
    UUID (``MIG-...``) and name."""

    gi: int
    ci: int
    uuid: str
    name: str


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Static identity of a GPU. ``pci_bus_id`` is in sysfs form (``0000:82:00.0``, lower case)."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    gpm: bool
    # NUMA node of the GPU (sysfs numa_node, else NVML memory affinity when it names one node) and the
    # CPUs NVML calls ideal for it (nvmlDeviceGetCpuAffinity); None when unknown.
    numa_node: int | None = None
    cpu_affinity: frozenset[int] | None = None
    # MIG mode (nvmlDeviceGetMigMode current) and its MIG devices; a GPU in MIG mode is judged per instance.
    mig_mode: bool = False
    mig: tuple[MigIdentity, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuFast:
    """Fast path (default 100 ms) of one GPU. Ratios 0..1; ``*_total`` are cumulative and unwrapped.

    ``sm_active_seconds`` / ``busy_seconds`` integrate SM activity / utilisation over time, so a
    ``rate()`` of them equals the average over any range. Both come from GPM pairs (Hopper and newer:
    SM_UTIL and GRAPHICS_UTIL, "time any compute/graphics app was active") and are None without GPM; the
    driver-sample integral of utilisation, available on every GPU, is ``GpuBuffered.busy_seconds``.
    ``fields`` holds every NVML field of the table in ``exporter/gpu/fields.py`` by key, in base units
    (counters unwrapped and cumulative); the properties below name the ones the derived layer reads. The
    backend passes a plain dict, never changed after: a dict of floats is not tracked by the cycle collector,
    while a MappingProxyType around it would be one more tracked object per GPU per tick (issue 14).

    ``counter_t`` is the time (the backend's clock: engine time) up to which the GPM integrals
    ``sm_active_seconds`` / ``busy_seconds`` were integrated -- the time of the newer GPM sample of the
    last pair -- and the time the GPM ratios (``sm_active`` ...) end at. NVML needs GPM pairs >= 100 ms
    apart, so a fast tick that comes too soon after the previous GPM sample republishes the same integrals
    and ratios with the same ``counter_t``: pair values with ``counter_t``, not with the sample's stamp,
    and drop repeats (paired with the stamp, a repeat reads as an idle interval followed by one above
    100%). None without GPM, and from producers that do not set it (then the stamp is the best time).

    ``mig`` maps each MIG instance (GPU instance id) of a GPU in MIG mode to that instance's own GPM values,
    as a GpuFast with only the GPM fields set (nvmlGpmMigSampleGet pairs); the whole GPU's GPM fields are
    then None (the driver judges a MIG-mode GPU per instance).
    """

    sm_active: float | None
    sm_occupancy: float | None
    tensor_active: float | None
    dram_active: float | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    fields: Mapping[str, float]
    sm_clock_hz: float | None
    sm_active_seconds: float | None
    busy_seconds: float | None
    counter_t: float | None = None
    mig: Mapping[int, GpuFast] = field(default_factory=_empty)

    def _int(self, key: str) -> int | None:
        v = self.fields.get(key)
        return None if v is None else int(v)

    @property
    def pcie_tx_bytes_total(self) -> int | None:
        """Bytes sent device -> host (NVML field 197, unwrapped)."""
        return self._int("pcie_tx_bytes")

    @property
    def pcie_rx_bytes_total(self) -> int | None:
        """Bytes received host -> device (NVML field 198, unwrapped)."""
        return self._int("pcie_rx_bytes")

    @property
    def pcie_replays_total(self) -> int | None:
        """PCIe replays (NVML field 94)."""
        return self._int("pcie_replays")

    @property
    def power_w(self) -> float | None:
        """Power draw, watts."""
        return self.fields.get("power")

    @property
    def throttle_seconds(self) -> Mapping[str, float]:
        """Clock-event reason -> cumulative seconds the clocks were held down for it."""
        return {r: v for r, key in TIME_KEYS.items() if (v := self.fields.get(key)) is not None}


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU."""

    pid: int
    used_memory_bytes: int | None
    sm_ratio: float | None
    comm: str = ""  # /proc/<pid>/comm, "" when unreadable (another pid namespace, already gone)
    mig: int | None = None  # the GPU instance it runs on, on a GPU in MIG mode


@dataclass(frozen=True, slots=True)
class MigSlow:
    """Slow path of one MIG instance: its share of the GPU's memory (its processes are the GPU's with
    ``GpuProcess.mig`` set to it)."""

    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True, slots=True)
class NvLink:
    """One NVLink of a GPU on one slow cycle (exporter/gpu/nvlink.py): whether it is active, its NVLink version
    (nvmlNvlinkVersion_t) and far end (``gpu``, ``switch``, ``ibmnpu``, ``unknown``; "" until known), its speed
    per direction in bytes/s (None while down or unknown), the payload it moved (unwrapped totals, bytes) and its
    data-link error counters (``replay``, ``recovery``, ``crc``)."""

    link: int
    up: bool | None
    version: int | None
    remote: str
    speed_bytes_per_s: float | None
    tx_bytes: int | None
    rx_bytes: int | None
    errors: Mapping[str, int] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class GpuSlow:
    """Slow path (default 5 s) of one GPU."""

    link_gen: int | None
    link_width: int | None
    max_link_gen: int | None
    max_link_width: int | None
    gpu_max_link_gen: int | None  # NVML has no call for the GPU's own maximum width
    clock_event_reasons: frozenset[str]
    temperature_c: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_limit_w: float | None
    max_sm_clock_hz: float | None
    processes: tuple[GpuProcess, ...]
    numa_node: int | None
    # False when the driver does not report clock-event reasons (then clock_event_reasons is empty).
    clock_event_reasons_supported: bool = True
    # The slow-path NVML fields of exporter/gpu/fields.py (ECC, row remapping) by key, in base units (a plain
    # dict from the backend, as GpuFast.fields).
    fields: Mapping[str, float] = field(default_factory=_empty)
    # Xid errors NVML reported since gpufeed started (nvmlEventTypeXidCriticalError): count and newest time
    # (the backend's clock) per Xid code; code -1 counts the codes past the per-GPU cap on distinct codes.
    xid_errors: Mapping[int, int] = field(default_factory=_empty)
    xid_last_seen: Mapping[int, float] = field(default_factory=_empty)
    mig: Mapping[int, MigSlow] = field(default_factory=_empty)
    nvlink: tuple[NvLink, ...] = ()  # the GPU's NVLinks; () on a GPU without NVLink


class UtilPoint(NamedTuple):
    """One driver-buffered utilisation sample (timestamp from the driver, seconds; value 0..1).

    A row type (exporter/samples/rows.py): GpuBuffered keeps its points in a Rows table.
    """

    t: float
    value: float


@dataclass(frozen=True, slots=True)
class GpuBuffered:
    """Buffered samples (default 1 s) of one GPU since the previous read, from nvmlDeviceGetSamples (the
    backend gives Rows(UtilPoint, ...) tables, or () when there are none)."""

    gpu_util: Sequence[UtilPoint]
    # Integral of the utilisation samples over driver time (seconds a kernel was executing), monotonic;
    # None when the GPU gives no samples.
    busy_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class HeldFast:
    """The fast path's entry for a GPU it did not read on this tick: the GPU is steadily busy or idle and read
    at its steady rate only (DESIGN.md "Sampling that pays only for what it learns"). ``value`` is its newest
    read, taken at ``t`` (engine time). Exposition shows it; it is not a new sample, so the derived layer, which
    takes only GpuFast entries from the fast window, never counts it twice."""

    value: GpuFast
    t: float


class CallTotals(NamedTuple):
    """One kind of NVML call since the backend started: how many were made and their summed duration.

    A row type (exporter/samples/rows.py): GpuSample.calls is a RowMap of them.
    """

    calls: int
    sum_s: float


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One sampler's view of every GPU: ``gpus`` maps NVML index -> that sampler's per-GPU value
    (GpuFast or HeldFast, GpuSlow or GpuBuffered); ``identities``, ``lost`` and ``unavailable`` are shared by
    all three samplers; ``steady`` (fast path only) names the GPUs read at the steady rate.
    ``calls`` is the NVML call-duration histogram per call kind (exporter/gpu/calls.py) when the sample was
    taken: one accumulator behind every sampler's sample, so the newest sample has the most calls (a RowMap of
    CallTotals from the backend). ``identities`` is the same mapping from sample to sample while no GPU's
    identity changes."""

    identities: Mapping[int, GpuIdentity]
    gpus: Mapping[int, object]
    lost: frozenset[int]
    calls: Mapping[str, CallTotals] = field(default_factory=_empty)
    steady: frozenset[int] = frozenset()
    # GPUs NVML counts but will not hand over (a per-index NO_PERMISSION, INSUFFICIENT_POWER, IRQ_ISSUE ...):
    # index -> the NVML error's name. Not lost (they are retried with the same backoff), not sampled.
    unavailable: Mapping[int, str] = field(default_factory=_empty)
    # Values NVML returned that cannot be true and were dropped, so far, by reason (exporter/gpu/state.py).
    dropped: Mapping[str, int] = field(default_factory=_empty)
