"""The NVML session: init and shutdown, enumeration and handles, MIG discovery, lost and unavailable GPUs, on
the calling conventions every NVML call goes through (exporter/gpu/calling.py: ``_timed``, ``_opt``,
``_failed``, ``_drop``). The sampling paths (exporter/gpu/fast.py, buffered.py, slow.py) build on it, and
:class:`~exporter.gpu.backend.NvmlBackend` puts them together.

Enumeration acquires each index on its own (:meth:`NvmlSession._acquire`: handle, UUID, setup); a GPU that
answers GPU_IS_LOST or UNKNOWN there is marked lost, and one that answers any other error (NO_PERMISSION for a
GPU this process may not open, INSUFFICIENT_POWER, IRQ_ISSUE) unavailable with that error as its reason, while
the others are sampled; both are retried with the same backoff.

MIG: a GPU whose ``nvmlDeviceGetMigMode`` is enabled is enumerated with its MIG devices
(``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``, their GPU and compute instance
ids, UUIDs and names), grouped by GPU instance: several compute instances of one GPU instance are several MIG
devices, each with its own processes. Its whole-GPU utilisation, samples and per-process utilisation are
unsupported by the driver, so each GPU instance gets GPM pairs of its own (``nvmlGpmMigSampleGet``), its memory
and the compute processes of each of its compute instances (through their MIG handles, which need no
privileges). A change of MIG mode, an instance that answers NOT_FOUND / INVALID_ARGUMENT (destroyed), or MIG
device UUIDs that differ from the enumeration's (compared each slow cycle: nvml.h says MIG handles may be
reused after a reconfiguration) re-enumerate that GPU's instances on the next slow cycle.

Errors (nvml.h return codes): ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND`` / ``NO_PERMISSION`` disable that
call (or field) for that GPU, logged once. ``GPU_IS_LOST`` marks the GPU lost (so do three ``UNKNOWN`` in a
row: drivers answer that for a GPU that fell off the bus); the others keep sampling, and NVML is
re-initialised with exponential backoff until the GPU answers again. No NVML library (or bindings) or no GPU
raise :class:`GpuUnavailableError` (absence by design) and are retried every ``retry_unavailable_s`` -- except
where ``gpu_hardware`` sees NVIDIA GPUs on the PCI bus: then no library (LIBRARY_NOT_FOUND: a container the
toolkit gave no driver libraries) or no bindings is a :class:`GpuInitError` with a hint. Any other
``nvmlInit`` error (``NO_PERMISSION``: the daemon's user cannot open ``/dev/nvidiactl``; ``DRIVER_NOT_LOADED``:
the library is there but the kernel module is not; anything else) raises :class:`GpuInitError` naming the
NVML error and a hint, logged once, retried with exponential backoff up to ``retry_unavailable_s``. Any
other exception (a bug, or the strict fake's AssertionError) propagates.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from exporter import log
from exporter import pci as pcimod
from exporter.gpu.binding import (
    ERR_DRIVER_NOT_LOADED,
    ERR_GPU_IS_LOST,
    ERR_INVALID_ARGUMENT,
    ERR_LIBRARY_NOT_FOUND,
    ERR_NO_PERMISSION,
    ERR_NOT_FOUND,
    ERR_UNKNOWN,
    UNAVAILABLE,
    ArrayTypes,
    CallStats,
    code,
    errname,
    reason,
)
from exporter.gpu.calling import NvmlCalls
from exporter.gpu.calls import CallTimes
from exporter.gpu.events import XidWatcher
from exporter.gpu.state import GPM_METRICS, NO_FIELDS, GpmStream, GpuLostError, GpuState, MigDevice
from exporter.samples.gpu import GpuIdentity, MigIdentity

NvmlProvider = Callable[[], Any]

# nvmlInit errors on a host that has the NVML library: a misconfiguration to report, with what to do about it.
_INIT_HINTS = {
    ERR_NO_PERMISSION: "the daemon's user cannot open /dev/nvidiactl or /dev/nvidia*: add the daemon user to "
                       "the video group (or the group owning /dev/nvidia*) and restart gpufeed",
    ERR_DRIVER_NOT_LOADED: "the NVML library is installed but the NVIDIA kernel module is not loaded: check "
                           "'lsmod | grep nvidia', dmesg and nvidia-smi",
}
_INIT_HINT_OTHER = "check nvidia-smi and dmesg on this host"
_MIG_PRIVILEGE_HINT = ("seeing MIG devices from a container needs the MIG monitor capability: run it privileged "
                       "with NVIDIA_MIG_MONITOR_DEVICES=all (docs/deployment.md, MIG and privileges)")
_NO_LIBRARY_HINT = (
    "NVIDIA GPUs are on the PCI bus but libnvidia-ml.so.1 is not visible to gpufeed. In a container the NVIDIA "
    "container toolkit did not inject the driver libraries: an unprivileged pod's NVIDIA_VISIBLE_DEVICES is "
    "ignored where accept-nvidia-visible-devices-envvar-when-unprivileged=false (Bottlerocket's default, a "
    "common GPU-operator hardening). Request the GPUs through CDI or the device plugin, or run the pod "
    "privileged (docs/deployment.md). On a host: install the driver's NVML library or set LD_LIBRARY_PATH")
# Per-GPU handle errors (nvmlDeviceGetHandleByIndex / GetUUID): what each one usually means.
_UNAVAILABLE_HINTS = {
    "no_permission": "this process may not open the GPU's /dev/nvidiaN (a cgroup device rule, Slurm "
                     "ConstrainDevices, or a container given a subset of the GPUs); expected if so",
    "insufficient_power": "the GPU's auxiliary power cables are not connected or not enough: check the board",
    "irq_issue": "the GPU's interrupts do not work (NVRM in dmesg): check the slot and the kernel's IOMMU/MSI setup",
}

# nvmlDeviceGetCpuAffinity / GetMemoryAffinity bitmask sizes in 64-bit words: 1024 CPUs, 256 nodes.
CPU_SET_WORDS = 16
NODE_SET_WORDS = 4
AFFINITY_SCOPE_NODE = 0


MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


class GpuUnavailableError(Exception):
    """NVML cannot be used on this host (no library, no driver, no GPU); the message says which."""


class GpuInitError(Exception):
    """NVML is installed but ``nvmlInit`` failed (no permission, driver not loaded, ...): a failure to report,
    not absence; the message names the NVML error and what to do about it."""


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


class NvmlSession(NvmlCalls):
    """One NVML session for every GPU of the host: the GPUs, their handles and state, under one lock."""

    def __init__(
        self,
        provider: NvmlProvider,
        *,
        clock: Callable[[], float],
        numa_of: Callable[[str], int | None] | None,
        gpu_hardware: Callable[[], bool | None] | None,
        retry_unavailable_s: float,
        lost_backoff_s: tuple[float, float],
        profile: bool,
        event_thread: bool,
    ) -> None:
        super().__init__()
        self._provider = provider
        self._clock = clock
        self._numa_of = numa_of
        self._gpu_hardware = gpu_hardware
        self._retry_unavailable_s = retry_unavailable_s
        self._backoff_min, self._backoff_max = lost_backoff_s
        self._lock = threading.RLock()
        self._nvml: Any = None
        self._initialised = False
        self._gpus: dict[int, GpuState] = {}
        self._identity_map: Mapping[int, GpuIdentity] = NO_FIELDS
        self._unavailable_map: Mapping[int, str] = NO_FIELDS
        self._unavailable: str | None = None
        self._init_failed: str | None = None
        self._init_backoff = min(self._backoff_min, retry_unavailable_s)
        self._next_init: float = float("-inf")
        self._backoff = self._backoff_min
        self._next_reinit: float | None = None
        self._profile = profile
        self.calls = CallTimes()
        self.array_types = ArrayTypes()  # the hot calls' result buffer types, built once (exporter/gpu/binding.py)
        self.stats: dict[str, CallStats] = {}
        self.driver_version: str | None = None
        self._tag = f"{id(self):x}"
        self._log = log.get_logger(component="gpu_backend")
        # Xid events: a thread of their own in the daemon, drained by the slow path under an inline engine.
        self.events = XidWatcher(clock, threaded=event_thread, tag=self._tag, timed=self.calls.call)

    @property
    def identities(self) -> Mapping[int, GpuIdentity]:
        """Every GPU enumerated so far."""
        with self._lock:
            return self._identities()

    def _identities(self) -> Mapping[int, GpuIdentity]:  # under self._lock
        """Every GPU's identity: the previous mapping while no identity changed, as every sample holds one (a
        new one per sample would be two more objects per sample for the cycle collector to traverse)."""
        known = self._identity_map
        gpus = {i: g for i, g in self._gpus.items() if g.unavailable is None}
        if len(known) != len(gpus) or any(known.get(i) is not g.identity for i, g in gpus.items()):
            known = self._identity_map = MappingProxyType({i: g.identity for i, g in gpus.items()})
        return known

    def _unavailable_now(self) -> Mapping[int, str]:  # under self._lock
        """The GPUs NVML will not hand over, with the reason (the previous mapping while it is the same)."""
        now = {i: g.unavailable for i, g in self._gpus.items() if g.unavailable is not None}
        if now != self._unavailable_map:
            self._unavailable_map = MappingProxyType(now) if now else NO_FIELDS
        return self._unavailable_map

    def close(self) -> None:
        """Stop the Xid watcher, free GPM samples and shut NVML down."""
        with self._lock:
            if self._initialised:
                self._teardown()
            self.events.disarm()

    # ---- session ------------------------------------------------------------------------------------------------

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
        hardware = self._gpu_hardware() if self._gpu_hardware is not None else None
        try:
            nvml = self._provider()
        except ImportError as e:
            if hardware:
                raise GpuInitError(f"NVML Python bindings not importable ({e}) on a host with NVIDIA GPUs on "
                                   "the PCI bus: install nvidia-ml-py (pip install gpufeed pulls it in)") from e
            raise GpuUnavailableError(f"NVML Python bindings not importable: {e}") from e
        self._nvml = nvml
        try:
            self._timed("nvmlInit", nvml.nvmlInit)
        except nvml.NVMLError as e:
            rc = code(e)
            if rc == ERR_LIBRARY_NOT_FOUND and hardware:
                # NVIDIA GPUs on the PCI bus but no libnvidia-ml.so.1 here: a container the toolkit gave no
                # driver libraries (hardened clusters), not a host without GPUs.
                raise GpuInitError(f"nvmlInit failed: {errname(e)}: {_NO_LIBRARY_HINT}") from e
            if rc in UNAVAILABLE:
                raise GpuUnavailableError(UNAVAILABLE[rc]) from e
            if rc == ERR_DRIVER_NOT_LOADED and hardware is False:
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
        by_uuid = {g.identity.uuid: g for g in self._gpus.values() if g.identity.uuid}
        fresh: dict[int, GpuState] = {}
        for idx in range(count):
            cur = self._gpus.get(idx)
            if only_lost and cur is not None and not cur.lost and cur.unavailable is None:
                fresh[idx] = cur
                continue
            fresh[idx] = self._acquire(idx, by_uuid, now)
        # A GPU that left the bus may drop out of the enumeration: keep reporting it as lost.
        for old in self._gpus.values():
            if old not in fresh.values() and old.index not in fresh:
                if not old.lost:
                    self._mark_lost(old, now)
                fresh[old.index] = old
        self._gpus = fresh
        # The reachable GPUs changed (start, recovery, re-init): watch their Xid events from now on.
        reachable = {i: g.handle for i, g in sorted(fresh.items())
                     if not g.lost and g.unavailable is None and g.handle is not None}
        self.events.arm(self._nvml, reachable)

    def _acquire(self, idx: int, by_uuid: Mapping[str, GpuState], now: float) -> GpuState:
        """One index of the enumeration: its handle, UUID and setup; the GPU it was before (matched by UUID in
        ``by_uuid``, keeping its counters), or a new one; lost when the driver says so."""
        nvml = self._nvml
        try:
            handle = self._timed("nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, idx)
            uuid = str(self._timed("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle))
        except nvml.NVMLError as e:
            old = self._gpus.get(idx)
            g = old or GpuState(idx, None, GpuIdentity(idx, "", "", "", False))
            g.handle = None
            if code(e) not in (ERR_GPU_IS_LOST, ERR_UNKNOWN):
                # nvml.h (nvmlDeviceGetCount_v2): the count includes GPUs whose handle answers NO_PERMISSION (a
                # cgroup or Slurm ConstrainDevices hiding it); INSUFFICIENT_POWER and IRQ_ISSUE are a GPU's own
                # fault. Either way this GPU alone is unavailable: the others are sampled.
                g.lost = False
                self._mark_unavailable(g, reason(e), now)
            elif not g.lost:
                g.unavailable = None
                self._mark_lost(g, now)
            return g
        g = by_uuid.get(uuid) or GpuState(idx, handle, GpuIdentity(idx, uuid, "", "", False))
        was_lost = g.lost
        if g.unavailable is not None:
            self._log.info("gpu_available", gpu=idx, uuid=uuid, was=g.unavailable)
            log.forget(("gpu_unavailable", self._tag, str(idx), g.unavailable))
        g.index, g.handle, g.lost, g.unavailable, g.unknown_streak = idx, handle, False, None, 0
        try:
            self._setup(g)
        except GpuLostError:
            g.lost = was_lost
            if not g.lost:
                self._mark_lost(g, now)
            return g
        if was_lost:
            for c in g.counters.values():
                c.rebase()
            self._log.info("gpu_recovered", gpu=idx, uuid=uuid)
            log.forget(("gpu_lost", self._tag, str(idx)))
        return g

    def _setup(self, g: GpuState) -> None:
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
        if gpm:  # in MIG mode too: nvml.h's nvmlGpmSampleGet "supports the device handle and MIG device handle"
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

    def _alloc_gpm(self, gpm: GpmStream) -> None:
        """Two GPM samples and the metrics request of one stream (a GPU's or one MIG instance's)."""
        nvml = self._nvml
        s1 = self._timed("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
        s2 = self._timed("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_METRICS)
        for i, mid in enumerate(GPM_METRICS):
            mg.metrics[i].metricId = mid
        gpm.samples, gpm.mg, gpm.prev = [s1, s2], mg, None
        if gpm.sm_active_seconds is None:
            gpm.sm_active_seconds, gpm.graphics_seconds = 0.0, 0.0

    def _free_samples(self, gpm: GpmStream, index: int) -> None:
        for s in gpm.samples:
            try:
                self._timed("nvmlGpmSampleFree", self._nvml.nvmlGpmSampleFree, s)
            except self._nvml.NVMLError as e:
                self._log.debug("gpm_sample_free_failed", gpu=index, error=errname(e))
        gpm.samples, gpm.mg, gpm.prev = [], None, None

    def _free_gpm(self, g: GpuState) -> None:
        self._free_samples(g.gpm, g.index)
        for m in g.mig.values():
            self._free_samples(m.gpm, g.index)

    # ---- MIG ------------------------------------------------------------------------------------------------

    def _mig_mode(self, g: GpuState) -> bool:
        """Whether the GPU runs in MIG mode now (False where NVML has no MIG: pre-Ampere, consumer boards)."""
        mode = self._opt(g, "nvmlDeviceGetMigMode", self._nvml.nvmlDeviceGetMigMode, g.handle)
        return mode is not None and int(mode[0]) == MIG_ENABLED

    def _enumerate_mig(self, g: GpuState) -> None:
        """(Re)acquire the GPU's MIG devices, grouped by GPU instance (several compute instances of one GPU
        instance are one MigDevice with a handle per compute instance: GPM and memory are the GPU instance's,
        processes each compute instance's). Instances that stay (same GPU instance id and first UUID) keep
        their GPM integrals, so a re-enumeration never makes a counter jump."""
        g.mig_stale = False
        g.processes_t = None  # the instances changed: enumerate their processes on this slow cycle
        slots = self._mig_devices(g)
        found: dict[int, MigDevice] = {}
        for gi, ci, uuid, name, mh in sorted(slots, key=lambda d: (d[0], d[1])):
            if gi in found:
                found[gi].compute[ci] = mh
                continue
            ident = MigIdentity(gi=gi, ci=ci, uuid=uuid, name=name)
            old = g.mig.get(gi)
            if old is not None and old.identity.uuid == uuid:
                old.identity, old.handle, old.compute = ident, mh, {ci: mh}
                found[gi] = old
            else:
                if old is not None:
                    self._free_samples(old.gpm, g.index)
                found[gi] = MigDevice(ident, mh, {ci: mh})
        for gi, old in g.mig.items():
            if gi not in found:
                self._free_samples(old.gpm, g.index)
        for m in found.values():
            if g.gpm_ok and not m.gpm.samples:
                self._alloc_gpm(m.gpm)
        g.mig = found
        g.mig_slots = tuple(d[2] for d in slots)
        g.identity = dataclasses.replace(
            g.identity, mig_mode=True, mig=tuple(m.identity for _, m in sorted(found.items())))
        self._log.info("gpu_mig_enumerated", gpu=g.index, instances=",".join(map(str, sorted(found))) or "none",
                       compute_instances=",".join(f"{gi}.{ci}" for gi, m in sorted(found.items())
                                                  for ci in sorted(m.compute)) or "none")

    def _mig_devices(self, g: GpuState, *, full: bool = True) -> list[tuple[int, int, str, str, Any]]:
        """The GPU's MIG devices by slot: (GPU instance id, compute instance id, UUID, name, handle); with
        ``full`` False only the UUIDs are asked for (ids -1, name "")."""
        nvml, h = self._nvml, g.handle
        n = self._opt(g, "nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        out: list[tuple[int, int, str, str, Any]] = []
        for i in range(int(n)):
            try:
                mh = self._timed("nvmlDeviceGetMigDeviceHandleByIndex", nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
                uuid = str(self._timed("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, mh))
                if not full:
                    out.append((-1, -1, uuid, "", mh))
                    continue
                gi = int(self._timed("nvmlDeviceGetGpuInstanceId", nvml.nvmlDeviceGetGpuInstanceId, mh))
                ci = int(self._timed("nvmlDeviceGetComputeInstanceId", nvml.nvmlDeviceGetComputeInstanceId, mh))
                name = str(self._timed("nvmlDeviceGetName", nvml.nvmlDeviceGetName, mh))
            except nvml.NVMLError as e:
                if code(e) == ERR_NOT_FOUND:  # an unpopulated slot: fewer instances than the maximum
                    continue
                if code(e) == ERR_NO_PERMISSION and log.once(("gpu_mig_no_permission", self._tag, str(g.index))):
                    self._log.warning("gpu_mig_no_permission", gpu=g.index, hint=_MIG_PRIVILEGE_HINT)
                self._failed(g, "nvmlDeviceGetMigDeviceHandleByIndex", e)
                if "nvmlDeviceGetMigDeviceHandleByIndex" in g.disabled:
                    break
                continue
            out.append((gi, ci, uuid, name, mh))
        return out

    def _leave_mig(self, g: GpuState) -> None:
        """MIG mode was turned off: back to whole-GPU GPM."""
        for m in g.mig.values():
            self._free_samples(m.gpm, g.index)
        g.mig, g.mig_stale, g.mig_slots = {}, False, ()
        g.processes_t = None
        g.identity = dataclasses.replace(g.identity, mig_mode=False, mig=())
        if g.gpm_ok and not g.gpm.samples:
            self._alloc_gpm(g.gpm)
        self._log.info("gpu_mig_disabled", gpu=g.index)

    def _mig_gone(self, g: GpuState, e: BaseException) -> bool:
        """An instance call failed because the instance is gone (destroyed, reconfigured): re-enumerate."""
        if code(e) in (ERR_NOT_FOUND, ERR_INVALID_ARGUMENT):
            g.mig_stale = True
            return True
        return False

    def _check_mig(self, g: GpuState) -> None:
        """Follow MIG reconfiguration: mode switched (it takes effect at a GPU reset) or instances changed."""
        if "nvmlDeviceGetMigMode" in g.disabled and not g.identity.mig_mode:
            return
        mode = self._mig_mode(g)
        if mode and g.identity.mig_mode and not g.mig_stale and "nvmlDeviceGetMigDeviceHandleByIndex" not in g.disabled:
            # Destroyed and created again, a MIG device may answer through a handle the old one had: only its
            # UUID tells (a slot's handle and UUID per MIG device, each slow cycle; microseconds).
            g.mig_stale = tuple(d[2] for d in self._mig_devices(g, full=False)) != g.mig_slots
        if mode and (not g.identity.mig_mode or g.mig_stale):
            self._enumerate_mig(g)
        elif not mode and g.identity.mig_mode and "nvmlDeviceGetMigMode" not in g.disabled:
            self._leave_mig(g)

    def _mark_lost(self, g: GpuState, now: float) -> None:
        g.lost = True
        g.pace.reset()
        g.held = g.clock = None
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

    def _mark_unavailable(self, g: GpuState, why: str, now: float) -> None:
        """NVML counts GPU ``g`` but refuses its handle (``why``): skip it, retry with the lost GPUs' backoff."""
        g.unavailable = why
        if log.once(("gpu_unavailable", self._tag, str(g.index), why)):
            self._log.warning("gpu_unavailable", gpu=g.index, reason=why, retry_in=self._backoff,
                              hint=_UNAVAILABLE_HINTS.get(why, _INIT_HINT_OTHER))
        if self._next_reinit is None:
            self._next_reinit = now + self._backoff

    def _reinit(self, now: float) -> None:
        """Try to get lost GPUs back; back off exponentially while any stays lost.

        With healthy GPUs left, only the lost ones are re-acquired (handle, UUID, setup), so the healthy
        ones keep their GPM pairs and counters undisturbed; with every GPU lost, NVML itself is shut down
        and initialised again.
        """
        nvml = self._nvml
        healthy = any(not g.lost and g.unavailable is None for g in self._gpus.values())
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
        if any(g.lost or g.unavailable is not None for g in self._gpus.values()):
            self._backoff = min(self._backoff * 2, self._backoff_max)
            self._next_reinit = now + self._backoff
        else:
            self._backoff = self._backoff_min
            self._next_reinit = None
