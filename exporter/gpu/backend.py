"""The NVML backend: the only code in gpufeed that calls NVML.

It receives the NVML module through injection (``pynvml``, imported lazily by the caller, or the fake in
``exporter.sim.fakenvml``) and a clock, and offers three sampling paths, each returning a
:class:`~exporter.samples.gpu.GpuSample`:

- :meth:`NvmlBackend.fast` (default every 100 ms): GPM sample pairs >= 100 ms apart on Hopper and newer;
  one ``nvmlDeviceGetFieldValues`` call per GPU for the PCIe byte counters (197/198), the replay counter
  (94), instantaneous power (186) and the throttle-time counters; the current SM clock.
- :meth:`NvmlBackend.buffered` (default every 1 s): ``nvmlDeviceGetSamples`` for GPU and memory
  utilisation, carrying ``lastSeenTimeStamp`` from the returned samples (driver clock, not ours).
- :meth:`NvmlBackend.slow` (default every 5 s): PCIe link state, clock-event reasons, temperature, memory,
  power limit, max SM clock, compute processes and their utilisation, the slow fields of the table (ECC and
  row-remapping counters, one batched call), MIG mode, and the Xid counts of the event watcher
  (:mod:`exporter.gpu.events`).

MIG: a GPU whose ``nvmlDeviceGetMigMode`` is enabled is enumerated with its MIG devices
(``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``, their GPU and compute instance
ids, UUIDs and names). Its whole-GPU utilisation, samples and per-process utilisation are unsupported by the
driver, so each instance gets GPM pairs of its own (``nvmlGpmMigSampleGet``), its memory and its compute
processes (through its MIG handle, which needs no privileges). A change of MIG mode, or an instance that
answers NOT_FOUND / INVALID_ARGUMENT (destroyed), re-enumerates that GPU's instances on the next slow cycle.

Errors (nvml.h return codes): ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND`` / ``NO_PERMISSION`` disable that
call (or field) for that GPU, logged once. ``GPU_IS_LOST`` marks the GPU lost (so do three ``UNKNOWN`` in a
row: drivers answer that for a GPU that fell off the bus); the others keep sampling, and NVML is
re-initialised with exponential backoff until the GPU answers again. No NVML library (or bindings) or no GPU
raise :class:`GpuUnavailableError` (absence by design) and are retried every ``retry_unavailable_s``. Any other
``nvmlInit`` error (``NO_PERMISSION``: the daemon's user cannot open ``/dev/nvidiactl``; ``DRIVER_NOT_LOADED``:
the library is there but the kernel module is not; anything else) raises :class:`GpuInitError` naming the
NVML error and a hint, logged once, retried with exponential backoff up to ``retry_unavailable_s``. Any
other exception (a bug, or the strict fake's AssertionError) propagates. ``nvmlDeviceGetPcieThroughput`` is
never called: it blocks ~20 ms per call.

Every NVML name used here exists in the installed binding with the arity used
(``tests/gpu/test_binding_conformance.py`` reads this module's calls). Versioned calls are explicit where the
binding's unversioned wrapper can raise outside ``NVMLError``: ``nvmlDeviceGetComputeRunningProcesses`` is
wrapped in ``throwOnVersionMismatch``, which turns FUNCTION_NOT_FOUND into ``NVMLLibraryMismatchError``, so the
backend calls ``_v3`` and falls back to ``_v2`` on drivers without it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter import linkmath, log
from exporter import pci as pcimod
from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu import fields as F  # noqa: N812
from exporter.gpu.binding import (
    DISABLING,
    ERR_DRIVER_NOT_LOADED,
    ERR_GPU_IS_LOST,
    ERR_INVALID_ARGUMENT,
    ERR_NO_PERMISSION,
    ERR_NOT_FOUND,
    ERR_UNKNOWN,
    M64,
    MODULUS,
    SUCCESS,
    UNAVAILABLE,
    ArrayTypes,
    CallStats,
    code,
    describe,
    errname,
    read_field_values,
    read_gpm_metrics,
    sample_value,
)
from exporter.gpu.calls import CallTimes
from exporter.gpu.counters import SampleIntegrator, WrappingCounter
from exporter.gpu.events import XidWatcher
from exporter.gpu.pace import IDLE, Pace, classify
from exporter.samples.gpu import (
    GpuBuffered,
    GpuFast,
    GpuIdentity,
    GpuProcess,
    GpuSample,
    GpuSlow,
    HeldFast,
    MigIdentity,
    MigSlow,
    UtilPoint,
)
from exporter.samples.rows import Rows

NvmlProvider = Callable[[], Any]

# nvmlInit errors on a host that has the NVML library: a misconfiguration to report, with what to do about it.
_INIT_HINTS = {
    ERR_NO_PERMISSION: "the daemon's user cannot open /dev/nvidiactl or /dev/nvidia*: add the daemon user to "
                       "the video group (or the group owning /dev/nvidia*) and restart gpufeed",
    ERR_DRIVER_NOT_LOADED: "the NVML library is installed but the NVIDIA kernel module is not loaded: check "
                           "'lsmod | grep nvidia', dmesg and nvidia-smi",
}
_INIT_HINT_OTHER = "check nvidia-smi and dmesg on this host"

_GPM_METRICS = (C.GPM_GRAPHICS_UTIL, C.GPM_SM_UTIL, C.GPM_SM_OCCUPANCY, C.GPM_ANY_TENSOR_UTIL,
                C.GPM_DRAM_BW_UTIL, C.GPM_PCIE_TX_PER_SEC, C.GPM_PCIE_RX_PER_SEC)

# Linux's PID_MAX_LIMIT on 64-bit (include/linux/threads.h): the fallback bound when pid_max is unreadable.
PID_MAX_LIMIT = 1 << 22

# nvmlDeviceGetCpuAffinity / GetMemoryAffinity bitmask sizes in 64-bit words: 1024 CPUs, 256 nodes.
CPU_SET_WORDS = 16
NODE_SET_WORDS = 4
AFFINITY_SCOPE_NODE = 0

UNKNOWN_STREAK_LOST = 3

# Longest a fast tick waits so its GPM sample is >= 100 ms after the previous one (scheduling jitter).
GPM_MAX_WAIT_S = 0.005

MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
# Compute-process calls, newest struct first (pynvml's unversioned name raises outside NVMLError when the
# driver lacks the newest one: see the module docstring).
PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
# Process enumeration (the compute-process list and per-process utilisation) holds the driver's global lock for
# milliseconds and can stall the workload's own submission threads (MangoHud #2104): at most once per this many
# seconds per GPU whatever the slow path's interval, except on the first slow cycle after the GPU's activity
# started or stopped (a new workload is found at once). A slow cycle up to PROCESS_EARLY_S early (scheduling
# jitter of a 5 s sampler) counts as on time.
PROCESS_INTERVAL_S = 5.0
PROCESS_EARLY_S = 0.25
ACTIVE_LEVEL = 0.05  # a driver sample above this is work: the derived layer's idle level (derived/series.py)
_NO_FIELDS: Mapping[Any, Any] = MappingProxyType({})


class GpuUnavailableError(Exception):
    """NVML cannot be used on this host (no library, no driver, no GPU); the message says which."""


class GpuInitError(Exception):
    """NVML is installed but ``nvmlInit`` failed (no permission, driver not loaded, ...): a failure to report,
    not absence; the message names the NVML error and what to do about it."""


class _GpuLostError(Exception):
    """Internal: the GPU answered GPU_IS_LOST (or UNKNOWN repeatedly)."""


def _bits(words: Iterable[int]) -> frozenset[int]:
    """Set bit positions of an array of 64-bit words (bit i of word w = item 64*w + i)."""
    out: set[int] = set()
    for w, word in enumerate(words):
        v = int(word)
        while v:
            low = v & -v
            out.add(64 * w + low.bit_length() - 1)
            v ^= low
    return frozenset(out)


@dataclass
class _Gpm:
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
class _Mig:
    """One MIG device of a GPU in MIG mode."""

    identity: MigIdentity
    handle: Any
    gpm: _Gpm = field(default_factory=_Gpm)
    processes: tuple[GpuProcess, ...] = ()  # as of the newest enumeration
    processes_seen: bool = False  # enumerated at least once (a new instance is enumerated on its first cycle)


@dataclass
class _Gpu:
    """Runtime state of one GPU (only the backend, under its lock, touches it)."""

    index: int
    handle: Any
    identity: GpuIdentity
    lost: bool = False
    unknown_streak: int = 0
    disabled: set[str] = field(default_factory=set)
    disabled_fields: set[int] = field(default_factory=set)
    # fast path
    gpm_ok: bool = False
    gpm: _Gpm = field(default_factory=_Gpm)
    # One unwrapping counter per counter field of the table (exporter/gpu/fields.py), by field id.
    counters: dict[int, WrappingCounter] = field(default_factory=lambda: {
        f.field_id: WrappingCounter(f.max_rate) for f in F.FIELDS if f.kind == F.COUNTER})
    # The newest value of every field, base units, per sampling path (fast / slow).
    field_values: dict[str, dict[str, float]] = field(default_factory=lambda: {F.FAST: {}, F.SLOW: {}})
    fields_prev_t: dict[str, float] = field(default_factory=dict)
    wrap_warned: bool = False
    # MIG: the instances by GPU instance id, and whether the next slow cycle must enumerate them again
    mig: dict[int, _Mig] = field(default_factory=dict)
    mig_stale: bool = False
    # buffered path
    util: SampleIntegrator = field(default_factory=SampleIntegrator)
    mem: SampleIntegrator = field(default_factory=SampleIntegrator)
    # slow path
    proc_last_seen: int = 0
    link_capacity: float | None = None
    processes: tuple[GpuProcess, ...] = ()  # as of the newest enumeration (at most every PROCESS_INTERVAL_S)
    processes_t: float | None = None  # when; None: enumerate on the next slow cycle
    active: bool | None = None  # the driver's newest samples showed work (None: not known yet)
    # adaptive fast rate (exporter/gpu/pace.py): its state, the newest fast read (shown while it is not read
    # again), and per PCIe byte counter the (time, total) a rate is measured from, the newest rate and the lower
    # of the two newest (what the counter sustained), with the narrowest counter's width
    pace: Pace = field(default_factory=Pace)
    held: HeldFast | None = None
    pcie_ref: dict[int, tuple[float, int]] = field(default_factory=dict)
    pcie_rates: dict[int, float] = field(default_factory=dict)
    pcie_sustained: dict[int, float] = field(default_factory=dict)
    pcie_modulus: int = M64


class NvmlBackend:
    """One NVML session for every GPU of the host; thread-safe (one lock around each sampling path)."""

    def __init__(
        self,
        provider: NvmlProvider,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        pid_max: int = PID_MAX_LIMIT,
        numa_of: Callable[[str], int | None] | None = None,
        gpu_hardware: Callable[[], bool] | None = None,
        retry_unavailable_s: float = 60.0,
        lost_backoff_s: tuple[float, float] = (5.0, 300.0),
        profile: bool = False,
        event_thread: bool = False,
        process_interval: float = PROCESS_INTERVAL_S,
        fast_interval: float = 0.1,
        steady_interval: float | None = None,
    ) -> None:
        self._provider = provider
        self._clock = clock
        self._sleep = sleep
        self._pid_max = pid_max
        self._numa_of = numa_of
        self._gpu_hardware = gpu_hardware
        self._retry_unavailable_s = retry_unavailable_s
        self._backoff_min, self._backoff_max = lost_backoff_s
        self._lock = threading.RLock()
        self._nvml: Any = None
        self._initialised = False
        self._gpus: dict[int, _Gpu] = {}
        self._identity_map: Mapping[int, GpuIdentity] = _NO_FIELDS
        self._sets: dict[str, frozenset[int]] = {}  # the sets the previous sample held (see _kept)
        self._unavailable: str | None = None
        self._init_failed: str | None = None
        self._init_backoff = min(self._backoff_min, retry_unavailable_s)
        self._next_init: float = float("-inf")
        self._backoff = self._backoff_min
        self._next_reinit: float | None = None
        self._profile = profile
        self._process_s = process_interval
        # The fast path's two rates: ``fast_interval`` (its sampler's) and, when longer, the steady rate of a GPU
        # whose activity shows no dip (None or not longer: every GPU at the fast rate, every tick).
        self._fast_s = fast_interval
        self._steady_s = steady_interval if steady_interval is not None and steady_interval > fast_interval else None
        self._tick_s = fast_interval  # the fast sampler's interval now (tick_interval)
        self.calls = CallTimes()
        self.array_types = ArrayTypes()  # the hot calls' result buffer types, built once (exporter/gpu/binding.py)
        self.stats: dict[str, CallStats] = {}
        self.driver_version: str | None = None
        self._tag = f"{id(self):x}"
        self._log = log.get_logger(component="gpu_backend")
        # Xid events: a thread of their own in the daemon, drained by the slow path under an inline engine.
        self.events = XidWatcher(clock, threaded=event_thread, tag=self._tag, timed=self.calls.call)

    # ---- public sampling paths -----------------------------------------------------------------------------

    def fast(self) -> GpuSample:
        """GPM, field values (PCIe bytes, replays, power, throttle time) and SM clock of every GPU due now: all
        of them, except a steady GPU between its steady-rate reads, which appears as its newest read (HeldFast).
        ``steady`` names the GPUs at the steady rate."""
        return self._run(self._fast_tick)

    def buffered(self) -> GpuSample:
        """The driver's buffered utilisation samples since the previous call, integrated."""
        return self._run(self._buffered_one)

    def slow(self) -> GpuSample:
        """Link state, clock-event reasons, temperature, memory, limits, processes, ECC, MIG, Xid counts."""
        return self._run(self._slow_one, before=self.events.poll)

    def tick_interval(self) -> float:
        """The fast sampler's interval wanted now: the steady interval while every GPU is read at the steady
        rate (a tick in between would read none of them), else the fast one; the steady one with no GPU to
        read. Called by the engine after each run of the collector's samplers (a dip the buffered path saw
        makes the next fast tick come at the fast rate again); lock-free, so a sampler wedged in the driver
        with the session lock held cannot stall the caller."""
        if self._steady_s is None:
            return self._fast_s
        self._tick_s = self._steady_s if self.all_steady() else self._fast_s
        return self._tick_s

    def all_steady(self) -> bool:
        """Whether every GPU is read at the steady rate now (True with no GPU to read; False without a steady
        rate). Lock-free, as :meth:`tick_interval`."""
        if self._steady_s is None:
            return False
        now = self._clock()
        return all(g.pace.steady_now and g.pace.steady(now) for g in list(self._gpus.values()) if not g.lost)

    @property
    def identities(self) -> Mapping[int, GpuIdentity]:
        """Every GPU enumerated so far."""
        with self._lock:
            return self._identities()

    def _identities(self) -> Mapping[int, GpuIdentity]:  # under self._lock
        """Every GPU's identity: the previous mapping while no identity changed, as every sample holds one (a
        new one per sample would be two more objects per sample for the cycle collector to traverse)."""
        known = self._identity_map
        if len(known) != len(self._gpus) or any(known.get(i) is not g.identity for i, g in self._gpus.items()):
            known = self._identity_map = MappingProxyType({i: g.identity for i, g in self._gpus.items()})
        return known

    def close(self) -> None:
        """Stop the Xid watcher, free GPM samples and shut NVML down."""
        with self._lock:
            if self._initialised:
                self._teardown()
            self.events.disarm()

    # ---- session ------------------------------------------------------------------------------------------------

    def _run(self, one: Callable[[_Gpu, float], object], before: Callable[[], None] | None = None) -> GpuSample:
        with self._lock:
            now = self._clock()
            if self._next_reinit is None:
                self._ensure_init()
            elif now >= self._next_reinit:
                self._reinit(now)
            if before is not None:
                before()
            out: dict[int, object] = {}
            for idx, g in sorted(self._gpus.items()):
                if g.lost:
                    continue
                try:
                    out[idx] = one(g, self._clock())
                except _GpuLostError:
                    self._mark_lost(g, self._clock())
            return GpuSample(
                identities=self._identities(),
                gpus=MappingProxyType(out),
                lost=self._kept("lost", frozenset(i for i, g in self._gpus.items() if g.lost)),
                calls=self.calls.snapshot(),
                steady=self._kept("steady", frozenset(
                    i for i, g in self._gpus.items() if not g.lost and g.pace.steady_now)),
            )

    def _kept(self, name: str, value: frozenset[int]) -> frozenset[int]:  # under self._lock
        """``value``, or the equal set a previous sample holds: the cycle collector tracks every set, so a new one
        per sample would be one more object per sample in the ring buffers."""
        old = self._sets.get(name)
        if old == value:
            return old
        self._sets[name] = value
        return value

    def _ensure_init(self) -> None:
        if self._initialised:
            return
        now = self._clock()
        if now < self._next_init:
            if self._init_failed is not None:
                raise GpuInitError(self._init_failed)
            if self._unavailable is not None:
                raise GpuUnavailableError(self._unavailable)
        self._next_init = now + self._retry_unavailable_s
        try:
            self._init()
        except GpuUnavailableError as e:
            self._unavailable, self._init_failed = str(e), None
            raise
        except GpuInitError as e:
            self._unavailable, self._init_failed = None, str(e)
            self._next_init = now + self._init_backoff
            if log.once(("nvml_init_failed", self._tag, str(e))):
                self._log.error("nvml_init_failed", error=str(e), retry_in=self._init_backoff)
            self._init_backoff = min(self._init_backoff * 2, self._retry_unavailable_s)
            raise
        if self._init_failed is not None:
            log.forget(("nvml_init_failed", self._tag, self._init_failed))
        self._unavailable = self._init_failed = None
        self._init_backoff = min(self._backoff_min, self._retry_unavailable_s)

    def _init(self) -> None:
        """Load NVML, initialise, enumerate; GpuUnavailableError when there is nothing to sample."""
        try:
            nvml = self._provider()
        except ImportError as e:
            raise GpuUnavailableError(f"NVML Python bindings not importable: {e}") from e
        self._nvml = nvml
        try:
            self._timed("nvmlInit", nvml.nvmlInit)
        except nvml.NVMLError as e:
            rc = code(e)
            if rc in UNAVAILABLE:
                raise GpuUnavailableError(UNAVAILABLE[rc]) from e
            if rc == ERR_DRIVER_NOT_LOADED and self._gpu_hardware is not None and not self._gpu_hardware():
                # Images that ship the driver's user-space libraries run on CPU-only hosts too: with no NVIDIA
                # GPU on the PCI bus, an unloaded kernel module is absence, not a fault.
                raise GpuUnavailableError(
                    "NVML library installed but no NVIDIA GPU on the PCI bus (kernel module not loaded)") from e
            hint = _INIT_HINTS.get(rc, _INIT_HINT_OTHER)
            raise GpuInitError(f"nvmlInit failed: {errname(e)}: {hint}") from e
        self._initialised = True
        try:
            try:
                self.driver_version = str(self._timed("nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion))
            except nvml.NVMLError:
                self.driver_version = None
            count = int(self._timed("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount))
            if count <= 0:
                raise GpuUnavailableError("NVML reports no GPU")
            self._enumerate(count, self._clock())
        except GpuUnavailableError:
            self._teardown()
            raise
        except nvml.NVMLError as e:
            self._teardown()
            raise GpuUnavailableError(f"NVML enumeration failed: {errname(e)}") from e
        self._log.info("nvml_initialised", driver=self.driver_version, gpus=len(self._gpus),
                       gpm=",".join(str(i) for i, g in sorted(self._gpus.items()) if g.gpm_ok) or "none",
                       mig=",".join(str(i) for i, g in sorted(self._gpus.items()) if g.identity.mig_mode) or "none")

    def _teardown(self) -> None:
        nvml = self._nvml
        self.events.disarm()  # the event set goes before NVML does
        for g in self._gpus.values():
            self._free_gpm(g)
        if self._initialised:
            try:
                self._timed("nvmlShutdown", nvml.nvmlShutdown)
            except nvml.NVMLError as e:
                self._log.debug("nvml_shutdown_failed", error=errname(e))
        self._initialised = False

    def _enumerate(self, count: int, now: float, *, only_lost: bool = False) -> None:
        """(Re)acquire a handle for every index (``only_lost``: for lost GPUs only); GPUs keep their
        counters across a re-init (matched by UUID)."""
        nvml = self._nvml
        by_uuid = {g.identity.uuid: g for g in self._gpus.values() if g.identity.uuid}
        fresh: dict[int, _Gpu] = {}
        for idx in range(count):
            cur = self._gpus.get(idx)
            if only_lost and cur is not None and not cur.lost:
                fresh[idx] = cur
                continue
            try:
                handle = self._timed("nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, idx)
                uuid = str(self._timed("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle))
            except nvml.NVMLError as e:
                if code(e) not in (ERR_GPU_IS_LOST, ERR_UNKNOWN):
                    raise
                old = self._gpus.get(idx)
                g = old or _Gpu(idx, None, GpuIdentity(idx, "", "", "", False))
                g.handle = None
                if not g.lost:
                    self._mark_lost(g, now)
                fresh[idx] = g
                continue
            g = by_uuid.get(uuid) or _Gpu(idx, handle, GpuIdentity(idx, uuid, "", "", False))
            was_lost = g.lost
            g.index, g.handle, g.lost, g.unknown_streak = idx, handle, False, 0
            try:
                self._setup(g)
            except _GpuLostError:
                g.lost = was_lost
                if not g.lost:
                    self._mark_lost(g, now)
                fresh[idx] = g
                continue
            if was_lost:
                for c in g.counters.values():
                    c.rebase()
                self._log.info("gpu_recovered", gpu=idx, uuid=uuid)
                log.forget(("gpu_lost", self._tag, str(idx)))
            fresh[idx] = g
        # A GPU that left the bus may drop out of the enumeration: keep reporting it as lost.
        for old in self._gpus.values():
            if old not in fresh.values() and old.index not in fresh:
                if not old.lost:
                    self._mark_lost(old, now)
                fresh[old.index] = old
        self._gpus = fresh
        # The reachable GPUs changed (start, recovery, re-init): watch their Xid events from now on.
        self.events.arm(nvml, {i: g.handle for i, g in sorted(fresh.items()) if not g.lost and g.handle is not None})

    def _setup(self, g: _Gpu) -> None:
        """Identity, GPM support, affinity and MIG devices of a freshly acquired handle."""
        nvml, h = self._nvml, g.handle
        name = self._opt(g, "nvmlDeviceGetName", nvml.nvmlDeviceGetName, h)
        info = self._opt(g, "nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo, h)
        bdf = pcimod.from_nvml(info.busId, int(info.domain)) if info is not None else ""
        gpm = False
        if "nvmlGpmQueryDeviceSupport" not in g.disabled:
            sup = self._opt(g, "nvmlGpmQueryDeviceSupport", nvml.nvmlGpmQueryDeviceSupport, h)
            gpm = bool(sup is not None and sup.isSupportedDevice)
        self._free_gpm(g)
        g.gpm_ok = gpm
        mig_mode = self._mig_mode(g)
        if gpm and not mig_mode:
            self._alloc_gpm(g.gpm)
        cpus = None
        words = self._opt(g, "nvmlDeviceGetCpuAffinity", nvml.nvmlDeviceGetCpuAffinity, h, CPU_SET_WORDS)
        if words is not None:
            cpus = _bits(words) or None
        numa = self._numa_of(bdf) if (self._numa_of is not None and bdf) else None
        if numa is None:
            nodes = self._opt(g, "nvmlDeviceGetMemoryAffinity", nvml.nvmlDeviceGetMemoryAffinity, h,
                              NODE_SET_WORDS, AFFINITY_SCOPE_NODE)
            if nodes is not None and len(b := _bits(nodes)) == 1:
                numa = next(iter(b))
        g.identity = GpuIdentity(
            index=g.index, uuid=g.identity.uuid, name=str(name) if name is not None else "",
            pci_bus_id=bdf, gpm=gpm, numa_node=numa, cpu_affinity=cpus, mig_mode=mig_mode,
        )
        if mig_mode:
            self._enumerate_mig(g)

    def _alloc_gpm(self, gpm: _Gpm) -> None:
        """Two GPM samples and the metrics request of one stream (a GPU's or one MIG instance's)."""
        nvml = self._nvml
        s1 = self._timed("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
        s2 = self._timed("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(_GPM_METRICS)
        for i, mid in enumerate(_GPM_METRICS):
            mg.metrics[i].metricId = mid
        gpm.samples, gpm.mg, gpm.prev = [s1, s2], mg, None
        if gpm.sm_active_seconds is None:
            gpm.sm_active_seconds, gpm.graphics_seconds = 0.0, 0.0

    def _free_samples(self, gpm: _Gpm, index: int) -> None:
        for s in gpm.samples:
            try:
                self._timed("nvmlGpmSampleFree", self._nvml.nvmlGpmSampleFree, s)
            except self._nvml.NVMLError as e:
                self._log.debug("gpm_sample_free_failed", gpu=index, error=errname(e))
        gpm.samples, gpm.mg, gpm.prev = [], None, None

    def _free_gpm(self, g: _Gpu) -> None:
        self._free_samples(g.gpm, g.index)
        for m in g.mig.values():
            self._free_samples(m.gpm, g.index)

    # ---- MIG ------------------------------------------------------------------------------------------------

    def _mig_mode(self, g: _Gpu) -> bool:
        """Whether the GPU runs in MIG mode now (False where NVML has no MIG: pre-Ampere, consumer boards)."""
        mode = self._opt(g, "nvmlDeviceGetMigMode", self._nvml.nvmlDeviceGetMigMode, g.handle)
        return mode is not None and int(mode[0]) == MIG_ENABLED

    def _enumerate_mig(self, g: _Gpu) -> None:
        """(Re)acquire the GPU's MIG devices; instances that stay (same GPU instance id and UUID) keep their GPM
        integrals, so a re-enumeration never makes a counter jump."""
        nvml, h = self._nvml, g.handle
        g.mig_stale = False
        g.processes_t = None  # the instances changed: enumerate their processes on this slow cycle
        n = self._opt(g, "nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        found: dict[int, _Mig] = {}
        for i in range(int(n)):
            try:
                mh = self._timed("nvmlDeviceGetMigDeviceHandleByIndex", nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
                gi = int(self._timed("nvmlDeviceGetGpuInstanceId", nvml.nvmlDeviceGetGpuInstanceId, mh))
                ci = int(self._timed("nvmlDeviceGetComputeInstanceId", nvml.nvmlDeviceGetComputeInstanceId, mh))
                uuid = str(self._timed("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, mh))
                name = str(self._timed("nvmlDeviceGetName", nvml.nvmlDeviceGetName, mh))
            except nvml.NVMLError as e:
                if code(e) == ERR_NOT_FOUND:  # an unpopulated slot: fewer instances than the maximum
                    continue
                self._failed(g, "nvmlDeviceGetMigDeviceHandleByIndex", e)
                if "nvmlDeviceGetMigDeviceHandleByIndex" in g.disabled:
                    break
                continue
            ident = MigIdentity(gi=gi, ci=ci, uuid=uuid, name=name)
            old = g.mig.get(gi)
            if old is not None and old.identity.uuid == uuid:
                old.identity, old.handle = ident, mh
                found[gi] = old
            else:
                if old is not None:
                    self._free_samples(old.gpm, g.index)
                found[gi] = _Mig(ident, mh)
        for gi, old in g.mig.items():
            if gi not in found:
                self._free_samples(old.gpm, g.index)
        for m in found.values():
            if g.gpm_ok and not m.gpm.samples:
                self._alloc_gpm(m.gpm)
        g.mig = found
        g.identity = dataclasses.replace(
            g.identity, mig_mode=True, mig=tuple(m.identity for _, m in sorted(found.items())))
        self._log.info("gpu_mig_enumerated", gpu=g.index, instances=",".join(map(str, sorted(found))) or "none")

    def _leave_mig(self, g: _Gpu) -> None:
        """MIG mode was turned off: back to whole-GPU GPM."""
        for m in g.mig.values():
            self._free_samples(m.gpm, g.index)
        g.mig, g.mig_stale = {}, False
        g.processes_t = None
        g.identity = dataclasses.replace(g.identity, mig_mode=False, mig=())
        if g.gpm_ok and not g.gpm.samples:
            self._alloc_gpm(g.gpm)
        self._log.info("gpu_mig_disabled", gpu=g.index)

    def _mig_gone(self, g: _Gpu, e: BaseException) -> bool:
        """An instance call failed because the instance is gone (destroyed, reconfigured): re-enumerate."""
        if code(e) in (ERR_NOT_FOUND, ERR_INVALID_ARGUMENT):
            g.mig_stale = True
            return True
        return False

    def _mark_lost(self, g: _Gpu, now: float) -> None:
        g.lost = True
        g.pace.reset()
        g.held = None
        g.pcie_ref.clear()
        g.pcie_rates.clear()
        g.pcie_sustained.clear()
        g.gpm.prev = None
        for m in g.mig.values():
            m.gpm.prev = None
        if log.once(("gpu_lost", self._tag, str(g.index))):
            self._log.warning("gpu_lost", gpu=g.index, uuid=g.identity.uuid, retry_in=self._backoff)
        if self._next_reinit is None:
            self._next_reinit = now + self._backoff

    def _reinit(self, now: float) -> None:
        """Try to get lost GPUs back; back off exponentially while any stays lost.

        With healthy GPUs left, only the lost ones are re-acquired (handle, UUID, setup), so the healthy
        ones keep their GPM pairs and counters undisturbed; with every GPU lost, NVML itself is shut down
        and initialised again.
        """
        nvml = self._nvml
        healthy = any(not g.lost for g in self._gpus.values())
        try:
            if not healthy or not self._initialised:
                self._teardown()
                self._timed("nvmlInit", nvml.nvmlInit)
                self._initialised = True
            count = int(self._timed("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount))
            self._enumerate(count, now, only_lost=healthy)
        except nvml.NVMLError as e:
            self._log.warning("nvml_reinit_failed", error=errname(e), retry_in=self._backoff)
            if not self._initialised:
                # Keep the last enumeration; every GPU is unreachable until the next attempt.
                for g in self._gpus.values():
                    g.lost, g.handle = True, None
        if any(g.lost for g in self._gpus.values()):
            self._backoff = min(self._backoff * 2, self._backoff_max)
            self._next_reinit = now + self._backoff
        else:
            self._backoff = self._backoff_min
            self._next_reinit = None

    # ---- calling NVML ---------------------------------------------------------------------------------------

    def _timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML, timing the call for gpufeed_nvml_call_duration_seconds (and, profiling, CallStats)."""
        t0 = time.perf_counter()
        if not self._profile:
            try:
                return fn(*args)
            finally:
                self.calls.observe(name, time.perf_counter() - t0)
        st = self.stats.setdefault(name, CallStats())
        try:
            out = fn(*args)
        except Exception as e:
            st.errors[errname(e)] = st.errors.get(errname(e), 0) + 1
            raise
        finally:
            took = time.perf_counter() - t0
            self.calls.observe(name, took)
            st.calls += 1
            st.total_us += took * 1e6
            st.max_us = max(st.max_us, took * 1e6)
        st.last = describe(out)
        return out

    def _opt(self, g: _Gpu, name: str, fn: Callable[..., Any], *args: Any, raising: bool = False) -> Any:
        """Call an NVML function for GPU ``g``: None when unsupported (disabled from now on) or failing.

        ``raising`` (MIG instance calls): NOT_FOUND and INVALID_ARGUMENT -- the instance is gone -- are raised
        to the caller instead, which re-enumerates the GPU's instances.
        """
        if name in g.disabled:
            return None
        try:
            out = self._timed(name, fn, *args)
        except self._nvml.NVMLError as e:
            if raising and code(e) in (ERR_NOT_FOUND, ERR_INVALID_ARGUMENT):
                raise
            return self._failed(g, name, e)
        g.unknown_streak = 0
        return out

    def _failed(self, g: _Gpu, name: str, e: BaseException) -> None:
        rc = code(e)
        if rc == ERR_GPU_IS_LOST:
            raise _GpuLostError() from e
        if rc == ERR_UNKNOWN:
            g.unknown_streak += 1
            if g.unknown_streak >= UNKNOWN_STREAK_LOST:
                raise _GpuLostError() from e
        if rc in DISABLING:
            g.disabled.add(name)
            if log.once(("gpu_call_disabled", self._tag, str(g.index), name)):
                self._log.info("gpu_call_disabled", gpu=g.index, call=name, reason=DISABLING[rc])
            return None
        if rc != ERR_NOT_FOUND and log.once(("gpu_call_failed", self._tag, str(g.index), name, str(rc))):
            self._log.warning("gpu_call_failed", gpu=g.index, call=name, error=errname(e))
        return None

    # ---- fast path ---------------------------------------------------------------------------------------------

    def _fast_tick(self, g: _Gpu, now: float) -> GpuFast | HeldFast:
        """Read GPU ``g``'s fast path if it is due (exporter/gpu/pace.py), else show its newest read."""
        pace = g.pace
        if self._steady_s is not None and g.held is not None and not pace.due(now, self._steady_s, self._tick_s):
            return g.held
        value = self._fast_one(g, now)
        pace.last_read = now
        g.held = HeldFast(value, now)
        if self._steady_s is not None:
            if g.pcie_modulus < M64 and g.pcie_sustained:
                pace.traffic(max(g.pcie_sustained.values()), g.pcie_modulus, self._steady_s)
            steady = pace.steady(now)
            if steady != pace.steady_now:
                pace.steady_now = steady
                self._log.info("gpu_fast_rate_changed", gpu=g.index,
                               interval_s=self._steady_s if steady else self._fast_s,
                               reason="steady" if steady else pace.reason)
        return value

    def _fast_one(self, g: _Gpu, now: float) -> GpuFast:
        nvml, h = self._nvml, g.handle
        mig: dict[int, GpuFast] = {}
        if g.identity.mig_mode:
            now = self._wait_for_pair([m.gpm for m in g.mig.values()], now)
            for gi, m in sorted(g.mig.items()):
                self._gpm_pair(g, m.gpm, now, functools.partial(nvml.nvmlGpmMigSampleGet, h, gi),
                               "nvmlGpmMigSampleGet", source=f"gpm:{gi}")
                mig[gi] = self._gpm_values(g, m.gpm)
        else:
            self._gpm(g, now)
        values = self._fields(g, now, F.FAST)
        clock = self._opt(g, "nvmlDeviceGetClockInfo", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        power = F.BY_KEY["power"]
        if "power" not in values and power.field_id in g.disabled_fields:
            # No instantaneous field (pre-Ampere boards): the getter's value, 1 s averaged on Ampere+.
            power_mw = self._opt(g, "nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, h)
            if power_mw is not None:
                values["power"] = float(power_mw) * power.scale
        # The dict itself, not a proxy over it: see GpuFast.fields.
        return self._gpm_values(g, None if g.identity.mig_mode else g.gpm, fields=values,
                                sm_clock_hz=float(clock) * 1e6 if clock is not None else None,
                                mig=MappingProxyType(mig) if mig else _NO_FIELDS)

    def _gpm_values(self, g: _Gpu, gpm: _Gpm | None, *, fields: Mapping[str, float] = _NO_FIELDS,
                    sm_clock_hz: float | None = None, mig: Mapping[int, GpuFast] = _NO_FIELDS) -> GpuFast:
        """A GpuFast with the GPM values of one stream (None everywhere without GPM, or for ``gpm`` None: a GPU
        in MIG mode has GPM per instance only) and the given fields, clock and instances."""
        if not g.gpm_ok or gpm is None:
            return GpuFast(sm_active=None, sm_occupancy=None, tensor_active=None, dram_active=None,
                           pcie_tx_bytes_per_s=None, pcie_rx_bytes_per_s=None, fields=fields, sm_clock_hz=sm_clock_hz,
                           sm_active_seconds=None, busy_seconds=None, mig=mig)
        last = gpm.last
        return GpuFast(
            sm_active=_scaled(last.get(C.GPM_SM_UTIL), 0.01),
            sm_occupancy=_scaled(last.get(C.GPM_SM_OCCUPANCY), 0.01),
            tensor_active=_scaled(last.get(C.GPM_ANY_TENSOR_UTIL), 0.01),
            dram_active=_scaled(last.get(C.GPM_DRAM_BW_UTIL), 0.01),
            pcie_tx_bytes_per_s=_scaled(last.get(C.GPM_PCIE_TX_PER_SEC), C.MIB),
            pcie_rx_bytes_per_s=_scaled(last.get(C.GPM_PCIE_RX_PER_SEC), C.MIB),
            fields=fields,
            sm_clock_hz=sm_clock_hz,
            sm_active_seconds=gpm.sm_active_seconds,
            busy_seconds=gpm.graphics_seconds,
            counter_t=gpm.t,
            mig=mig,
        )

    def _gpm(self, g: _Gpu, now: float) -> None:
        """The whole GPU's GPM stream: one sample, and the metrics of the pair when it is old enough."""
        if not g.gpm_ok:
            return
        now = self._wait_for_pair([g.gpm], now)
        self._gpm_pair(g, g.gpm, now, functools.partial(self._nvml.nvmlGpmSampleGet, g.handle), "nvmlGpmSampleGet")

    def _wait_for_pair(self, streams: list[_Gpm], now: float) -> float:
        """The time to sample at: ``now``, or a few ms later when the newest previous sample of ``streams`` is
        short of 100 ms only by scheduling jitter (else every other 100 ms pair would be skipped)."""
        prevs = [s.prev[1] for s in streams if s.prev is not None and s.samples]
        if not prevs:
            return now
        deficit = C.GPM_MIN_PAIR_SECONDS - (now - max(prevs))
        if deficit <= 1e-6 or deficit > GPM_MAX_WAIT_S:
            return now
        self._sleep(deficit)
        return float(self._clock())

    def _gpm_pair(self, g: _Gpu, gpm: _Gpm, now: float, take: Callable[[Any], Any], name: str,
                  *, source: str = "gpm") -> None:
        """Take a GPM sample with ``take``; with the previous one >= 100 ms old, read the pair's metrics and
        integrate. Too close a pair is skipped: the next tick spans the whole interval."""
        if not g.gpm_ok or not gpm.samples:
            return
        prev = gpm.prev
        if prev is not None and now - prev[1] < C.GPM_MIN_PAIR_SECONDS - 1e-6:
            return
        cur = gpm.samples[1] if prev is not None and prev[0] is gpm.samples[0] else gpm.samples[0]
        try:
            got = self._opt(g, name, take, cur, raising=g.identity.mig_mode)
        except self._nvml.NVMLError as e:  # only for MIG instances: the instance is gone
            self._mig_gone(g, e)
            gpm.prev = None
            return
        if got is None:
            if name in g.disabled:
                g.gpm_ok = False
                gpm.last = {}
                g.identity = dataclasses.replace(g.identity, gpm=False)
            gpm.prev = None
            return
        if prev is None:
            gpm.prev = (cur, now)
            if gpm.t is None:  # the integrals start here (a later re-anchor keeps the last integrated time)
                gpm.t = now
            return
        nvml = self._nvml
        mg = gpm.mg
        mg.sample1, mg.sample2 = prev[0], cur
        res = self._opt(g, "nvmlGpmMetricsGet", nvml.nvmlGpmMetricsGet, mg)
        gpm.prev = (cur, now)
        if res is None:
            gpm.last = {}
            return
        dt = now - prev[1]
        vals: dict[int, float | None] = {}
        for mid, (got_id, ret, value) in zip(_GPM_METRICS, read_gpm_metrics(mg, len(_GPM_METRICS)), strict=True):
            vals[mid] = value if ret == SUCCESS and got_id == mid else None
        gpm.last = vals
        sm, gr = vals.get(C.GPM_SM_UTIL), vals.get(C.GPM_GRAPHICS_UTIL)
        if gr is not None and not math.isnan(gr):
            # Kernels resident over the pair: the adaptive rate's GPM source (one per stream: GPU or instance).
            g.pace.observe(source, classify([min(max(gr, 0.0), 100.0) / 100.0]), now)
        if sm is not None and gpm.sm_active_seconds is not None:
            gpm.sm_active_seconds += min(max(sm, 0.0), 100.0) / 100.0 * dt
            gpm.t = now
        if gr is not None and gpm.graphics_seconds is not None:
            gpm.graphics_seconds += min(max(gr, 0.0), 100.0) / 100.0 * dt
            gpm.t = now

    def _fields(self, g: _Gpu, now: float, path: str) -> dict[str, float]:
        """One nvmlDeviceGetFieldValues call for every still-supported field of the table on ``path``; every
        such field's newest value in base units by key (counters unwrapped; a field that failed this once
        keeps its last)."""
        nvml = self._nvml
        ids = [f.field_id for f in F.ON_PATH[path] if f.field_id not in g.disabled_fields]
        if not ids:
            return {}
        arr = self._opt(g, "nvmlDeviceGetFieldValues", nvml.nvmlDeviceGetFieldValues, g.handle, ids)
        self.array_types.hold(arr)
        out = g.field_values[path]
        if arr is None:
            if "nvmlDeviceGetFieldValues" in g.disabled:
                g.disabled_fields.update(f.field_id for f in F.FIELDS)
            return {k: v for k, v in out.items() if F.BY_KEY[k].kind == F.COUNTER}
        prev_t = g.fields_prev_t.get(path)
        spacing = None if prev_t is None else now - prev_t
        g.fields_prev_t[path] = now
        for fid, ret, vt, raw in read_field_values(arr):
            f = F.BY_ID.get(fid)
            if f is None:
                continue
            if ret != SUCCESS:
                if f.kind == F.GAUGE:
                    out.pop(f.key, None)  # an instantaneous value not read now is unknown, not the last one
                if ret in DISABLING or ret == ERR_NOT_FOUND:
                    g.disabled_fields.add(fid)
                    out.pop(f.key, None)
                    if log.once(("gpu_field_disabled", self._tag, str(g.index), str(fid))):
                        self._log.info("gpu_field_disabled", gpu=g.index, field=fid, key=f.key,
                                       reason=DISABLING.get(ret, ret))
                elif ret == ERR_GPU_IS_LOST:
                    raise _GpuLostError()
                continue
            if raw is None:
                continue
            if f.kind == F.COUNTER:
                modulus = MODULUS.get(vt, M64)
                total = g.counters[fid].update(raw, modulus, now)
                out[f.key] = total * f.scale
                if f.value_type == F.PCIE:
                    self._pcie_rate(g, fid, total, modulus, now)
                    # Only reads at the configured rate say whether that rate is too slow for the counter (a
                    # steady GPU is read at the steady rate only while the guard above allows it).
                    if not g.wrap_warned and spacing is not None and spacing <= 1.5 * self._fast_s:
                        self._check_wrap_window(g, modulus, spacing)
            else:
                out[f.key] = raw * f.scale
        return dict(out)

    def _pcie_rate(self, g: _Gpu, fid: int, total: int, modulus: int, now: float) -> None:
        """The adaptive rate's guard input: a byte counter's mean rate over at least a steady interval (a
        driver, or the simulator, may update the counter in steps coarser than 100 ms: a rate over one fast
        interval would read those steps as bursts), and the lower of the two newest such rates (one late
        update makes one span short and the next one long: only both together say the traffic stayed there).
        The first rate stands for both."""
        ref = g.pcie_ref.get(fid)
        if ref is None or total < ref[1] or now < ref[0]:
            g.pcie_ref[fid] = (now, total)
            return
        span = now - ref[0]
        if span >= (self._steady_s or self._fast_s):
            rate = (total - ref[1]) / span
            g.pcie_sustained[fid] = min(rate, g.pcie_rates.get(fid, rate))
            g.pcie_rates[fid] = rate
            g.pcie_modulus = min(g.pcie_modulus, modulus)
            g.pcie_ref[fid] = (now, total)

    def _check_wrap_window(self, g: _Gpu, modulus: int, spacing: float | None) -> None:
        """Warn once if the link could move a whole counter period between two reads (wraps would be missed)."""
        cap = g.link_capacity
        if g.wrap_warned or cap is None or spacing is None or spacing <= 0:
            return
        if cap * spacing >= modulus:
            g.wrap_warned = True
            self._log.info("gpu_pcie_counter_may_wrap_unseen", gpu=g.index, interval_s=round(spacing, 3),
                              link_bytes_per_s=cap, counter_modulus=modulus,
                              hint="shorten --collector.gpu.interval")

    # ---- buffered path -------------------------------------------------------------------------------------

    def _buffered_one(self, g: _Gpu, now: float) -> GpuBuffered:
        util = self._samples(g, C.GPU_UTILIZATION_SAMPLES, g.util, now)
        mem = self._samples(g, C.MEMORY_UTILIZATION_SAMPLES, g.mem, now)
        if util is not None:
            # Activity started or stopped (an empty buffer is an idle GPU): a workload came or went, so the next
            # slow cycle enumerates the processes whenever the last enumeration was.
            active = any(p.value > ACTIVE_LEVEL for p in util)
            # The adaptive rate's driver-sample source: nothing new (the buffer ran dry) is an idle GPU; a stretch
            # without samples between two (the GPU went idle in between) is a gap, hence a dip.
            if g.util.gapped and f"nvmlDeviceGetSamples:{C.GPU_UTILIZATION_SAMPLES}" not in g.disabled:
                g.pace.heat("samples:gap")
                g.pace.classes["samples"] = classify(p.value for p in util)
            else:
                g.pace.observe("samples", classify(p.value for p in util) if util else IDLE, now)
            if g.active is not None and active != g.active:
                g.processes_t = None
            g.active = active
        # An empty buffer (NOT_FOUND) is an idle GPU: busy time stays where it was (0 at start).
        busy = g.util.seconds if util is not None else None
        return GpuBuffered(gpu_util=util or (), memory_util=mem or (), busy_seconds=busy)

    def _samples(self, g: _Gpu, kind: int, integ: SampleIntegrator, now: float) -> Rows[UtilPoint] | None:
        """New samples of one kind since the last seen timestamp; None when the GPU gives none at all."""
        nvml = self._nvml
        name = "nvmlDeviceGetSamples"
        key = f"{name}:{kind}"
        if key in g.disabled:
            return self._rates_fallback(g, kind, integ, now)
        try:
            _vt, raw = self._timed(name, nvml.nvmlDeviceGetSamples, g.handle, kind, integ.last_ts or 0)
        except nvml.NVMLError as e:
            if code(e) == ERR_NOT_FOUND:  # empty buffer: normal on an idle GPU
                g.unknown_streak = 0
                integ.gapped = False
                return Rows(UtilPoint)
            self._failed(g, key, e)
            if key in g.disabled:
                return self._rates_fallback(g, kind, integ, now)
            return None
        g.unknown_streak = 0
        self.array_types.hold(raw)
        pts = [(int(s.timeStamp), float(sample_value(s.sampleValue, _vt))) for s in raw]
        new = integ.add(pts)
        return Rows(UtilPoint, ((ts / 1e6, min(max(v, 0.0), 100.0) / 100.0) for ts, v in new))

    def _rates_fallback(self, g: _Gpu, kind: int, integ: SampleIntegrator, now: float) -> Rows[UtilPoint] | None:
        """Without buffered samples: nvmlDeviceGetUtilizationRates, integrated on our clock (sample-and-hold)."""
        rates = self._opt(g, "nvmlDeviceGetUtilizationRates", self._nvml.nvmlDeviceGetUtilizationRates, g.handle)
        if rates is None:
            return None
        pct = float(rates.gpu if kind == C.GPU_UTILIZATION_SAMPLES else rates.memory)
        ts = int(now * 1e6)
        new = integ.add([(ts, pct)])
        return Rows(UtilPoint, ((t / 1e6, min(max(v, 0.0), 100.0) / 100.0) for t, v in new))

    # ---- slow path ----------------------------------------------------------------------------------------------

    def _slow_one(self, g: _Gpu, now: float) -> GpuSlow:
        nvml, h = self._nvml, g.handle
        self._check_mig(g)

        def get(name: str, *args: Any) -> Any:
            return self._opt(g, name, getattr(nvml, name), h, *args)

        link = {k: get(f) for k, f in (
            ("gen", "nvmlDeviceGetCurrPcieLinkGeneration"), ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"), ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
            ("gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration"))}
        if link["max_gen"] and link["max_width"]:
            g.link_capacity = _link_bytes_per_s(int(link["max_gen"]), int(link["max_width"]))
        mask = None
        supported = False
        if "nvmlDeviceGetCurrentClocksEventReasons" not in g.disabled:
            mask = get("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None and "nvmlDeviceGetCurrentClocksEventReasons" in g.disabled:
            mask = get("nvmlDeviceGetCurrentClocksThrottleReasons")  # drivers before R535
        if mask is not None:
            supported = True
        temp = get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
        mem = get("nvmlDeviceGetMemoryInfo")
        limit_mw = get("nvmlDeviceGetEnforcedPowerLimit")
        max_clock = get("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
        enumerate_now = g.processes_t is None or now - g.processes_t >= self._process_s - PROCESS_EARLY_S
        if g.identity.mig_mode:
            processes, mig = self._mig_slow(g, enumerate_now)
        else:
            processes, mig = (self._processes(g) if enumerate_now else g.processes), {}
        if enumerate_now:
            g.processes, g.processes_t = processes, now
        xids, xid_seen = self.events.counts(g.index)
        return GpuSlow(
            link_gen=_int(link["gen"]), link_width=_int(link["width"]),
            max_link_gen=_int(link["max_gen"]), max_link_width=_int(link["max_width"]),
            gpu_max_link_gen=_int(link["gpu_max_gen"]),
            clock_event_reasons=C.decode_reasons(int(mask)) if mask is not None else frozenset(),
            temperature_c=float(temp) if temp is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            power_limit_w=float(limit_mw) / 1000.0 if limit_mw is not None else None,
            max_sm_clock_hz=float(max_clock) * 1e6 if max_clock is not None else None,
            processes=processes,
            numa_node=g.identity.numa_node,
            clock_event_reasons_supported=supported,
            # As on the fast path: the fields dict itself, and the one shared empty mapping for what is empty
            # (a proxy per GPU per slow tick is one more object for the cycle collector to traverse).
            fields=self._fields(g, now, F.SLOW),
            xid_errors=xids or _NO_FIELDS, xid_last_seen=xid_seen or _NO_FIELDS,
            mig=MappingProxyType(mig) if mig else _NO_FIELDS,
        )

    def _check_mig(self, g: _Gpu) -> None:
        """Follow MIG reconfiguration: mode switched (it takes effect at a GPU reset) or instances changed."""
        if "nvmlDeviceGetMigMode" in g.disabled and not g.identity.mig_mode:
            return
        mode = self._mig_mode(g)
        if mode and (not g.identity.mig_mode or g.mig_stale):
            if not g.identity.mig_mode:
                self._free_samples(g.gpm, g.index)  # whole-GPU GPM is unsupported in MIG mode
            self._enumerate_mig(g)
        elif not mode and g.identity.mig_mode and "nvmlDeviceGetMigMode" not in g.disabled:
            self._leave_mig(g)

    def _mig_slow(self, g: _Gpu, enumerate_now: bool) -> tuple[tuple[GpuProcess, ...], dict[int, MigSlow]]:
        """Per MIG instance: memory, and its compute processes through its own handle (the whole GPU's list
        needs privileges in MIG mode; enumerated only when ``enumerate_now``, else as last enumerated). The
        GPU's processes are the union, each tagged with its instance."""
        nvml = self._nvml
        procs: list[GpuProcess] = []
        out: dict[int, MigSlow] = {}
        for gi, m in sorted(g.mig.items()):
            try:
                mem = self._opt(g, "nvmlDeviceGetMemoryInfo:mig", nvml.nvmlDeviceGetMemoryInfo, m.handle, raising=True)
                if enumerate_now or not m.processes_seen:
                    m.processes = self._processes(g, m.handle, raising=True)
                    m.processes_seen = True
                found = m.processes
            except nvml.NVMLError as e:
                if not self._mig_gone(g, e):
                    self._failed(g, "nvmlDeviceGetMigDeviceHandleByIndex", e)
                continue
            out[gi] = MigSlow(memory_used_bytes=int(mem.used) if mem is not None else None,
                              memory_total_bytes=int(mem.total) if mem is not None else None)
            procs.extend(dataclasses.replace(p, mig=gi, sm_ratio=None) for p in found)
        return tuple(sorted(procs, key=lambda p: (p.pid, p.mig or 0))), out

    def _processes(self, g: _Gpu, handle: Any = None, *, raising: bool = False) -> tuple[GpuProcess, ...]:
        """Compute processes of the GPU (or of one MIG device) with validated pids (driver/binding skew returns
        garbage) and their SM share."""
        nvml = self._nvml
        h = g.handle if handle is None else handle
        procs = None
        for name in PROCESS_CALLS:
            if name not in g.disabled:
                procs = self._opt(g, name, getattr(nvml, name), h, raising=raising)
                if name not in g.disabled:
                    break
        if not procs:
            return ()
        mem: dict[int, int | None] = {}
        bad = 0
        for p in procs:
            pid = _valid_pid(getattr(p, "pid", None), self._pid_max)
            if pid is None:
                bad += 1
                continue
            used = getattr(p, "usedGpuMemory", None)
            used_i = int(used) if isinstance(used, int) and 0 <= used < (1 << 62) else None
            if pid in mem and mem[pid] is not None and used_i is not None:
                mem[pid] = int(mem[pid] or 0) + used_i  # the same process listed twice (several contexts)
            elif pid not in mem:
                mem[pid] = used_i
        if bad and log.once(("gpu_bad_pids", self._tag, str(g.index))):
            self._log.warning("gpu_process_pids_invalid", gpu=g.index, dropped=bad, pid_max=self._pid_max,
                              hint="nvidia-ml-py and driver versions may not match")
        sm = self._process_util(g, set(mem)) if handle is None else None
        return tuple(GpuProcess(pid=pid, used_memory_bytes=mem[pid],
                                sm_ratio=None if sm is None else sm.get(pid, 0.0))
                     for pid in sorted(mem))

    def _process_util(self, g: _Gpu, pids: set[int]) -> dict[int, float] | None:
        """Latest SM share per pid since the last call; None when unsupported (MIG). Absent pid = 0."""
        nvml = self._nvml
        name = "nvmlDeviceGetProcessUtilization"
        if name in g.disabled:
            return None
        try:
            samples = self._timed(name, nvml.nvmlDeviceGetProcessUtilization, g.handle, g.proc_last_seen)
        except nvml.NVMLError as e:
            # NOT_FOUND: no process had non-zero utilisation since lastSeen. SUCCESS: the binding raises
            # NVMLError(NVML_SUCCESS) when the sizing call finds nothing to return (it expects
            # INSUFFICIENT_SIZE): the same answer.
            if code(e) in (ERR_NOT_FOUND, SUCCESS):
                return {}
            self._failed(g, name, e)
            return None
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            pid, ts = _valid_pid(s.pid, self._pid_max), int(s.timeStamp)
            g.proc_last_seen = max(g.proc_last_seen, ts)
            if pid is None or pid not in pids:
                continue
            if pid not in latest or ts >= latest[pid][0]:
                latest[pid] = (ts, min(max(float(s.smUtil), 0.0), 100.0) / 100.0)
        return {pid: v for pid, (_, v) in latest.items()}


# ---- helpers ----------------------------------------------------------------------------------------------------



def _scaled(v: float | None, k: float) -> float | None:
    return None if v is None else max(0.0, v) * k


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _valid_pid(v: object, pid_max: int) -> int | None:
    """A pid that can exist on this host (0 < pid < pid_max), else None."""
    if not isinstance(v, int) or isinstance(v, bool):
        return None
    return v if 0 < v < pid_max else None


def _link_bytes_per_s(gen: int, width: int) -> float | None:
    """The link's encoded data rate (an upper bound of what it moves: the counter-wrap check errs early)."""
    try:
        return linkmath.encoded_bytes_per_second(gen, width)
    except ValueError:
        return None
