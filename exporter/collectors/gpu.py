"""NVIDIA GPUs over NVML (exporter/gpu/backend.py): activity, PCIe traffic, clocks, power, link, processes.

Three samplers share one NVML session: ``gpu`` (fast, default 100 ms: GPM pairs, field-value counters,
SM clock, power; a GPU whose driver samples and GPM show it steadily busy or steadily idle is read at
``steady-interval``, 1 s, until its first dip or gap: exporter/gpu/pace.py), ``gpu_samples`` (default 1 s:
the driver's buffered utilisation samples) and ``gpu_slow`` (default 5 s: link state, clock-event reasons,
temperature, memory, limits, processes).
The NVML module is ``ctx.nvml`` when set (the simulator's strict fake NVML), else ``pynvml``, imported on
first use. Time is ``ctx.clock``: the engine's (virtual time under ``diagnose --scenario``).

On every slow cycle the collector publishes to ``ctx.targets`` the pids per GPU (the ``proc`` and ``numa``
collectors inspect exactly those) and each GPU's PCI address in sysfs form. No driver, no library or no GPU
is "not available" (NoDataError), quietly.

A GPU in MIG mode is described per MIG instance as well: ``gpufeed_gpu_mig_info{gpu,mig,...}`` and the
instance's GPM counters and gauges, memory and processes with a ``mig`` label (the GPU instance id) next to
``gpu``; series of a GPU that is not in MIG mode have no ``mig`` label. Xid errors are counted from NVML events
(``gpufeed_gpu_xid_errors_total{gpu,xid}``, exporter/gpu/events.py), ECC and row remapping come from the slow
fields of exporter/gpu/fields.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.samples import Sample

from exporter import pci
from exporter.collectors import register
from exporter.gpu import calls, fields
from exporter.gpu.backend import PID_MAX_LIMIT, GpuInitError, GpuUnavailableError, NvmlBackend
from exporter.gpu.constants import CLOCK_EVENT_REASONS
from exporter.gpu.events import OTHER as XID_OTHER
from exporter.gpu.nvlink import nvlink_families
from exporter.samples.gpu import GpuBuffered, GpuFast, GpuIdentity, GpuKey, GpuSample, GpuSlow, HeldFast
from exporter.sampling import (
    GPU_FAST,
    GPU_SAMPLES,
    GPU_SLOW,
    UNCHANGED,
    Collector,
    CollectorContext,
    CollectorError,
    NoDataError,
    Option,
    SamplerSpec,
    Unchanged,
)
from exporter.snapshot import Snapshot
from exporter.sources import read_bytes, read_text

FAST, BUFFERED, SLOW = GPU_FAST, GPU_SAMPLES, GPU_SLOW
COMM_MAX = 64  # /proc/<pid>/comm is at most TASK_COMM_LEN (16) bytes; bound hostile input anyway


@register
class GpuCollector(Collector):
    """Per-GPU signals from NVML, sampled at three rates."""

    name = FAST
    help = "NVIDIA GPUs over NVML: activity, PCIe traffic, clocks, power, link state, processes."
    default_interval = 0.1
    sampler_intervals = MappingProxyType({FAST: "interval", BUFFERED: "samples-interval", SLOW: "slow-interval"})
    options = (
        Option("steady-interval", "duration", 1.0,
               "Interval at which the fast path reads a GPU whose driver samples and GPM show it steadily busy or "
               "steadily idle (back to --collector.gpu.interval at the first dip or gap, for at least 10 s); "
               "not longer than --collector.gpu.interval reads every GPU at that interval. Counters stay exact "
               "at either rate."),
        Option("samples-interval", "duration", 1.0,
               "Interval of the driver's buffered utilisation samples (sampler gpu_samples)."),
        Option("samples-steady-interval", "duration", 4.0,
               "Interval of the buffered samples while every GPU is read at --collector.gpu.steady-interval (the "
               "driver buffers them: a longer interval reads more per call, none is lost -- a buffer that ran over "
               "shows as a gap, which is a dip: back to --collector.gpu.samples-interval); "
               "--collector.gpu.samples-interval again at the first dip. Not longer than that one: always it."),
        Option("slow-interval", "duration", 5.0,
               "Interval of link state, clock-event reasons, temperature, memory and processes (sampler gpu_slow)."),
        Option("hostname", "str", "",
               "Value of gpufeed_gpu_info's Hostname label, for joins with dcgm-exporter (default: $NODE_NAME, "
               "else the host name)."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._lock = threading.Lock()
        self._backend: NvmlBackend | None = None
        self._pid_max = self._read_pid_max()
        self._hostname = identity_hostname(str(ctx.options.get("hostname", "") or ""))
        self._last_fast: GpuSample | None = None
        self._samples_s = float(ctx.options.get("samples-interval", 1.0))
        self._samples_steady_s = float(ctx.options.get("samples-steady-interval", 4.0))

    # ---- sampling --------------------------------------------------------------------------------------------

    def samplers(self) -> list[SamplerSpec]:
        opts = self.ctx.options
        return [
            SamplerSpec(FAST, self.interval, self.update, pace=self._fast_pace),
            SamplerSpec(BUFFERED, self._samples_s, self.update_samples, pace=self._samples_pace),
            SamplerSpec(SLOW, float(opts.get("slow-interval", 5.0)), self.update_slow),
        ]

    def _fast_pace(self) -> float:
        """The fast sampler's interval now: --collector.gpu.steady-interval while every GPU is steady (no tick
        in between would read one), --collector.gpu.interval otherwise."""
        backend = self._backend
        return self.interval if backend is None else backend.tick_interval()

    def _samples_pace(self) -> float:
        """The buffered sampler's interval now: --collector.gpu.samples-steady-interval while every GPU is at the
        steady rate, --collector.gpu.samples-interval otherwise. A dip a fast read's GPM pair sees sends the
        fast path to its fast rate, and this one back, at once; without GPM the buffered samples are what see
        it, up to this interval after it came."""
        backend = self._backend
        if backend is None or self._samples_steady_s <= self._samples_s or not backend.all_steady():
            return self._samples_s
        return self._samples_steady_s

    def update(self) -> GpuSample | Unchanged:
        """The fast path; UNCHANGED on a tick that read no GPU (all steady between their reads): nothing new to
        buffer, render or derive."""
        sample = self._sample(NvmlBackend.fast)
        prev, self._last_fast = self._last_fast, sample
        if (prev is not None and sample.gpus and all(isinstance(g, HeldFast) for g in sample.gpus.values())
                and sample.lost == prev.lost and sample.identities == prev.identities
                and sample.unavailable == prev.unavailable
                and sample.steady == prev.steady):
            return UNCHANGED
        return sample

    def update_samples(self) -> GpuSample:
        """Buffered utilisation samples since the previous call."""
        return self._sample(NvmlBackend.buffered)

    def update_slow(self) -> GpuSample:
        """Slow-path sample, with process names; publishes GPU pids and PCI addresses for other collectors."""
        try:
            sample = self._sample(NvmlBackend.slow)
        except NoDataError:
            self.ctx.targets.publish({})
            raise
        gpus: dict[int, object] = {}
        pids: dict[str, list[int]] = {}
        for idx, g in sample.gpus.items():
            if isinstance(g, GpuSlow):
                procs = tuple(dataclasses.replace(p, comm=self._comm(p.pid)) for p in g.processes)
                gpus[idx] = dataclasses.replace(g, processes=procs)
                pids[str(idx)] = [p.pid for p in procs]
            else:
                gpus[idx] = g
        self.ctx.targets.publish(pids, {str(i): ident.pci_bus_id for i, ident in sorted(sample.identities.items())})
        return GpuSample(identities=sample.identities, gpus=MappingProxyType(gpus), lost=sample.lost,
                         calls=sample.calls, unavailable=sample.unavailable, dropped=sample.dropped)

    def _sample(self, path: Callable[[NvmlBackend], GpuSample]) -> GpuSample:
        try:
            return path(self._get_backend())
        except GpuUnavailableError as e:
            raise NoDataError(f"GPU not available: {e}") from e
        except GpuInitError as e:  # NVML is installed but cannot be used: a failure, not absence
            raise CollectorError(str(e)) from e

    def _get_backend(self) -> NvmlBackend:
        with self._lock:
            if self._backend is None:
                self._backend = NvmlBackend(
                    self._nvml_module, clock=self.ctx.clock, pid_max=self._pid_max, numa_of=self._sysfs_numa_node,
                    gpu_hardware=self._sysfs_has_nvidia_gpu, event_thread=self.ctx.background,
                    fast_interval=self.interval,
                    steady_interval=float(self.ctx.options.get("steady-interval", 1.0)),
                )
            return self._backend

    def _nvml_module(self) -> Any:
        """The injected NVML module (simulator/tests) or the real bindings, imported on first use."""
        if self.ctx.nvml is not None:
            return self.ctx.nvml
        return importlib.import_module("pynvml")

    def _read_pid_max(self) -> int:
        """Upper bound of pids on this host, from /proc/sys/kernel/pid_max."""
        try:
            v = int(read_text(self.ctx.proc("sys", "kernel", "pid_max")).strip())
        except (OSError, ValueError):
            return PID_MAX_LIMIT
        return v if 0 < v <= PID_MAX_LIMIT else PID_MAX_LIMIT

    def _comm(self, pid: int) -> str:
        """Process name from /proc/<pid>/comm; "" when unreadable (gone, other pid namespace)."""
        try:
            raw = read_bytes(self.ctx.proc(pid, "comm"), limit=COMM_MAX)
        except OSError:
            return ""
        return raw.decode("utf-8", errors="replace").strip()

    def _sysfs_has_nvidia_gpu(self) -> bool | None:
        """Whether /sys/bus/pci/devices lists an NVIDIA (0x10de) display or 3D controller; None when sysfs
        cannot be read (then neither an init failure is explained away as absence nor a missing library taken
        for a failure)."""
        root = self.ctx.sys("bus", "pci", "devices")
        try:
            devices = list(root.iterdir())
        except OSError:
            return None
        for dev in devices:
            try:
                vendor = read_text(dev / "vendor").strip().lower()
                klass = read_text(dev / "class").strip().lower()
            except OSError:
                continue
            if vendor == "0x10de" and klass.startswith("0x03"):
                return True
        return False

    def _sysfs_numa_node(self, bdf: str) -> int | None:
        """The GPU's NUMA node from /sys/bus/pci/devices/<bdf>/numa_node (-1, absent: unknown)."""
        try:
            v = int(read_text(self.ctx.sys("bus", "pci", "devices", bdf, "numa_node")).strip())
        except (OSError, ValueError):
            return None
        return v if v >= 0 else None

    def close(self) -> None:
        with self._lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None

    # ---- exposition ------------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        fast: GpuSample | None = snap.value(FAST)
        buffered: GpuSample | None = snap.value(BUFFERED)
        slow: GpuSample | None = snap.value(SLOW)
        samples = [s for s in (fast, slow, buffered) if s is not None]
        if not samples:
            return
        identities: Mapping[int, GpuIdentity] = max((s.identities for s in samples), key=len)
        lost = samples[0].lost
        yield from _identity_families(identities, lost, self._hostname)
        yield from _unavailable_family(samples[0].unavailable)
        yield from _dropped_family(max((s.dropped for s in samples), key=lambda d: sum(d.values())))
        if fast is not None:
            yield from _fast_families(fast)
        if buffered is not None:
            yield from _buffered_families(buffered)
        if slow is not None:
            yield from _slow_families(slow)
            yield from nvlink_families(slow)
        yield from _call_families(max(samples, key=lambda s: sum(h.calls for h in s.calls.values())))


def _per_gpu(sample: GpuSample, kind: type[Any]) -> Iterator[tuple[str, Any]]:
    for idx, g in sorted(sample.gpus.items()):
        if isinstance(g, kind):
            yield str(idx), g


def identity_hostname(configured: str) -> str:
    """The Hostname label: the configured value, else ``$NODE_NAME`` (the node's name, as dcgm-exporter's
    DaemonSet passes it through the downward API; a pod's own hostname is the pod name), else this host's."""
    return configured or os.environ.get("NODE_NAME", "") or socket.gethostname()


# The join keys dcgm-exporter puts on every per-GPU series (internal/pkg/rendermetrics/render_metrics.go):
# UUID, pci_bus_id in NVML's form and Hostname -- hostname after 4.5.3-4.8.2 ("Rename Hostname label to
# hostname", #655), so both, with the same value. gpufeed carries them on its info series, beside its own uuid,
# name and gpu_bdf (the sysfs form of the address, as on gpufeed_pcie_device_info), so both exporters'
# series join as they are (docs/dcgm-exporter.md). Not modelName: promtool's lint refuses camelCase label
# names, and the model comes along with a UUID join (group_left (modelName)); gpufeed's name is the same string.
INFO_LABELS = ["gpu", "uuid", "name", "pci_bus_id", "gpu_bdf", "numa_node", "UUID", "Hostname", "hostname"]


def _identity_families(
    identities: Mapping[int, GpuIdentity], lost: frozenset[int], hostname: str
) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "gpufeed_gpu_info", "GPU identity from NVML (value 1): pci_bus_id in NVML's form, UUID and Hostname (and "
        "hostname, its newer name) as dcgm-exporter writes them; gpu_bdf in sysfs form; numa_node from sysfs "
        "(or NVML memory affinity), '' when unknown.", labels=INFO_LABELS)
    lost_f = GaugeMetricFamily(
        "gpufeed_gpu_lost", "1 while the GPU answers NVML with GPU_IS_LOST (fell off the bus); gpufeed retries "
        "with backoff. Absent while it answers.", labels=["gpu"])
    mig_mode = GaugeMetricFamily(
        "gpufeed_gpu_mig_mode", "1 while the GPU runs in MIG mode: it is judged per MIG instance (the mig label). "
        "Absent for a GPU not in MIG mode.", labels=["gpu"])
    mig_info = GaugeMetricFamily(
        "gpufeed_gpu_mig_info", "A MIG device of a GPU in MIG mode (value 1): mig is its GPU instance id.",
        labels=["gpu", "mig", "compute_instance", "uuid", "name"])
    for idx, ident in sorted(identities.items()):
        numa = "" if ident.numa_node is None else str(ident.numa_node)
        bus_id = pci.to_nvml(ident.pci_bus_id) if pci.normalize(ident.pci_bus_id) else ident.pci_bus_id
        info.add_metric([str(idx), ident.uuid, ident.name, bus_id, ident.pci_bus_id, numa, ident.uuid, hostname,
                         hostname], 1.0)
        # Flags as 1 or absent (the series budget, DESIGN.md): the alerts and queries read `== 1`.
        if idx in lost:
            lost_f.add_metric([str(idx)], 1.0)
        elif ident.mig_mode:
            mig_mode.add_metric([str(idx)], 1.0)
        for m in ident.mig:
            mig_info.add_metric([str(idx), str(m.gi), str(m.ci), m.uuid, m.name], 1.0)
    yield from (info, lost_f, mig_mode, mig_info)


def _unavailable_family(unavailable: Mapping[int, str]) -> Iterator[Metric]:
    """``gpufeed_gpu_unavailable{gpu,reason}``: only while some GPU is (a family without samples would be one more
    HELP/TYPE pair on every host whose GPUs all answer)."""
    if not unavailable:
        return
    fam = GaugeMetricFamily(
        "gpufeed_gpu_unavailable", "1 while NVML counts the GPU but refuses its handle; reason is the NVML error "
        "(no_permission: this process may not open it, e.g. a cgroup or Slurm hiding it; insufficient_power; "
        "irq_issue). Not sampled, retried with backoff; the other GPUs are sampled. Absent once it answers.",
        labels=["gpu", "reason"])
    for idx, why in sorted(unavailable.items()):
        fam.add_metric([str(idx), why], 1.0)
    yield fam


def _dropped_family(dropped: Mapping[str, int]) -> Iterator[Metric]:
    """``gpufeed_nvml_values_dropped_total{reason}``: from the first value dropped (none on a sane driver)."""
    if not dropped:
        return
    fam = CounterMetricFamily(
        "gpufeed_nvml_values_dropped", "Values NVML returned that cannot be true, dropped rather than exported: "
        "reason gpm_not_finite (a GPM metric NaN or infinite with SUCCESS), invalid_pid (a process id outside "
        "1..pid_max: driver and nvidia-ml-py struct sizes disagree). The log's nvml_value_dropped names the GPU.",
        labels=["reason"])
    for why, n in sorted(dropped.items()):
        fam.add_metric([why], float(n))
    yield fam


def _fast_families(sample: GpuSample) -> Iterator[Metric]:
    sm_s = CounterMetricFamily(
        "gpufeed_gpu_sm_active_seconds", "Integral of GPM SM utilisation (share of SMs busy) over time: rate() is "
        "the mean SM activity over any range. Hopper and newer only.", labels=["gpu"])
    occ = GaugeMetricFamily("gpufeed_gpu_sm_occupancy_ratio",
                            "GPM SM occupancy (resident warps / theoretical max) over the last >=100 ms pair.",
                            labels=["gpu"])
    tensor = GaugeMetricFamily("gpufeed_gpu_tensor_active_ratio",
                               "GPM any-tensor-pipe utilisation over the last >=100 ms pair.", labels=["gpu"])
    dram = GaugeMetricFamily("gpufeed_gpu_dram_active_ratio",
                             "GPM DRAM bandwidth utilisation over the last >=100 ms pair.", labels=["gpu"])
    clock = GaugeMetricFamily("gpufeed_gpu_sm_clock_hertz", "Current SM clock.", labels=["gpu"])
    families = _field_families(fields.FAST)
    fast_rate = GaugeMetricFamily(
        "gpufeed_gpu_fast_rate_gpus", "GPUs whose fast path is read at --collector.gpu.interval (a dip or gap "
        "in their activity within the last 10 s, or activity unknown); the others, steadily busy or idle, are read "
        "at --collector.gpu.steady-interval.")
    fast_rate.add_metric([], float(len(sample.gpus) - len(sample.steady & sample.gpus.keys())))
    shown = {i: g.value if isinstance(g, HeldFast) else g for i, g in sample.gpus.items()}
    for gpu, g in _per_gpu(dataclasses.replace(sample, gpus=shown), GpuFast):
        # A GPU in MIG mode has GPM per instance only: its series carry the instance as the mig label.
        for key, v in ((GpuKey(int(gpu)), g), *((GpuKey(int(gpu), gi), m) for gi, m in sorted(g.mig.items()))):
            labels = key.labels()
            _put(sm_s, labels, v.sm_active_seconds)
            _put(occ, labels, v.sm_occupancy)
            _put(tensor, labels, v.tensor_active)
            _put(dram, labels, v.dram_active)
        _add(clock, [gpu], g.sm_clock_hz)
        _add_fields(families, gpu, fields.FAST, g.fields)
    yield from (sm_s, occ, tensor, dram, clock, fast_rate, *families.values())


def _field_families(path: str) -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """The NVML field table's families of one sampling path: one per metric, its entries' labels after gpu."""
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for f in fields.ON_PATH[path]:
        if f.metric not in families:
            kind = CounterMetricFamily if f.kind == fields.COUNTER else GaugeMetricFamily
            families[f.metric] = kind(f.metric, f.help, labels=["gpu", *f.labels])
    return families


def sparse(f: fields.Field) -> bool:
    """Whether the field's series is exported only once its value is non-zero (the series budget, DESIGN.md).

    Throttle time per reason (5 counters, 0 on almost every GPU for its whole life), the lifetime ECC totals
    (``counter="aggregate"``, read as a level: the errors a GPU ever had; the volatile totals carry the rates
    the alerts use) and the row-remap flags (pending, failure: 1 or absent, as the alerts' ``== 1`` reads
    them). A throttle counter that starts moving appears with the time of its first sample: ``rate()`` misses
    that first increment once per GPU, reason and exporter life, while ``gpufeed_gpu_clock_event_reason``
    shows the reason active from its first slow-path sample.
    """
    return f.metric in SPARSE_METRICS or (
        f.metric == "gpufeed_gpu_ecc_errors" and f.labels.get("counter") == "aggregate")


SPARSE_METRICS = frozenset({"gpufeed_gpu_throttle_seconds", "gpufeed_gpu_row_remap_pending",
                            "gpufeed_gpu_row_remap_failure"})


def _add_fields(families: Mapping[str, GaugeMetricFamily | CounterMetricFamily], gpu: str, path: str,
                values: Mapping[str, float]) -> None:
    for f in fields.ON_PATH[path]:
        v = values.get(f.key)
        if v is not None and v == 0 and sparse(f):
            continue
        _add(families[f.metric], [gpu, *f.labels.values()], v)


def _buffered_families(sample: GpuSample) -> Iterator[Metric]:
    busy = CounterMetricFamily(
        "gpufeed_gpu_busy_seconds", "Time a kernel was executing: integral of the driver's buffered utilisation "
        "samples (nvmlDeviceGetSamples) over driver time; rate() is the mean utilisation over any range.",
        labels=["gpu"])
    for gpu, g in _per_gpu(sample, GpuBuffered):
        _add(busy, [gpu], g.busy_seconds)
    yield busy


def _slow_families(sample: GpuSample) -> Iterator[Metric]:
    max_clock = GaugeMetricFamily("gpufeed_gpu_sm_clock_max_hertz", "Maximum SM clock.", labels=["gpu"])
    limit = GaugeMetricFamily("gpufeed_gpu_power_limit_watts", "Enforced power limit.", labels=["gpu"])
    temp = GaugeMetricFamily("gpufeed_gpu_temperature_celsius", "GPU core temperature.", labels=["gpu"])
    reason = GaugeMetricFamily(
        "gpufeed_gpu_clock_event_reason", "1 for each clock-event (throttle) reason NVML reports now, absent for "
        "the others; gpu_idle is normal on an idle GPU. Time per reason: gpufeed_gpu_throttle_seconds_total.",
        labels=["gpu", "reason"])
    used = GaugeMetricFamily("gpufeed_gpu_memory_used_bytes", "Device memory in use.", labels=["gpu"])
    total = GaugeMetricFamily("gpufeed_gpu_memory_total_bytes", "Device memory size.", labels=["gpu"])
    gen = GaugeMetricFamily(
        "gpufeed_gpu_pcie_link_generation", "Current PCIe link generation as NVML sees it (kind=\"current\"; drops "
        "at idle by design); the maxima are labels of gpufeed_gpu_pcie_link_info.", labels=["gpu", "kind"])
    width = GaugeMetricFamily("gpufeed_gpu_pcie_link_width", "Current PCIe link width as NVML sees it "
                              "(kind=\"current\"); the maximum is a label of gpufeed_gpu_pcie_link_info.",
                              labels=["gpu", "kind"])
    # The static maxima as labels of one info series, not three gauges (the series budget, DESIGN.md).
    link_info = GaugeMetricFamily(
        "gpufeed_gpu_pcie_link_info", "The GPU's PCIe link maxima as NVML sees them (value 1): max_generation and "
        "max_width what the GPU and slot allow together, gpu_max_generation the GPU's own; '' when unknown.",
        labels=["gpu", "max_generation", "gpu_max_generation", "max_width"])
    pmem = GaugeMetricFamily("gpufeed_gpu_process_memory_bytes", "Device memory used by a compute process "
                             "(mig: the MIG instance it runs on).", labels=["gpu", "pid", "comm"])
    psm = GaugeMetricFamily("gpufeed_gpu_process_sm_ratio", "Share of the GPU's SM time used by the process in "
                            "its latest driver sample (0 when it had none).", labels=["gpu", "pid", "comm"])
    xid = CounterMetricFamily(
        "gpufeed_gpu_xid_errors", "Xid errors NVML reported for the GPU since gpufeed started (critical-error "
        "events; xid=\"other\" past 32 distinct codes).", labels=["gpu", "xid"])
    families = _field_families(fields.SLOW)
    for gpu, g in _per_gpu(sample, GpuSlow):
        _add(max_clock, [gpu], g.max_sm_clock_hz)
        _add(limit, [gpu], g.power_limit_w)
        _add(temp, [gpu], g.temperature_c)
        if g.clock_event_reasons_supported:
            # Active reasons only (DESIGN.md series budget): `== 1` and the alert's reason list read them as before.
            for r in CLOCK_EVENT_REASONS:
                if r in g.clock_event_reasons:
                    reason.add_metric([gpu, r], 1.0)
        _add(used, [gpu], g.memory_used_bytes)
        _add(total, [gpu], g.memory_total_bytes)
        for gi, m in sorted(g.mig.items()):
            labels = GpuKey(int(gpu), gi).labels()
            _put(used, labels, m.memory_used_bytes)
            _put(total, labels, m.memory_total_bytes)
        _add(gen, [gpu, "current"], g.link_gen)
        _add(width, [gpu, "current"], g.link_width)
        maxima = (g.max_link_gen, g.gpu_max_link_gen, g.max_link_width)
        if any(v is not None for v in maxima):
            link_info.add_metric([gpu, *("" if v is None else str(int(v)) for v in maxima)], 1.0)
        for p in g.processes:
            labels = {**GpuKey(int(gpu), p.mig).labels(), "pid": str(p.pid), "comm": p.comm}
            _put(pmem, labels, p.used_memory_bytes)
            _put(psm, labels, p.sm_ratio)
        for code, n in sorted(g.xid_errors.items()):
            xid.add_metric([gpu, "other" if code == XID_OTHER else str(code)], float(n))
        _add_fields(families, gpu, fields.SLOW, g.fields)
    yield from (max_clock, limit, temp, reason, used, total, gen, width, link_info, pmem, psm, xid,
                *families.values())


def _call_families(sample: GpuSample) -> Iterator[Metric]:
    """gpufeed_nvml_call_duration_seconds from the sample that has seen the most calls (one accumulator behind
    all three samplers' samples, so the newest); the kinds are exporter/gpu/calls.py's fixed set."""
    if not sample.calls:
        return
    fam = SummaryMetricFamily(
        "gpufeed_nvml_call_duration_seconds", "Wall-clock duration of gpufeed's NVML calls by kind of call "
        "(reads: field values, GPM, utilisation samples; processes; device), counted and summed (the mean per "
        "call is _sum / _count); NVML serialises calls on the driver's global lock, so this is also time the "
        "workload's own driver calls may have waited.",
        labels=["call"])
    for kind in calls.KINDS:
        h = sample.calls.get(kind)
        if h is not None:
            fam.add_metric([kind], h.calls, h.sum_s)
    yield fam


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))


def _put(family: GaugeMetricFamily | CounterMetricFamily, labels: Mapping[str, str], value: float | None) -> None:
    """A sample with its own label set: ``mig`` appears only on a MIG instance's series (a family's samples
    may have different label names; Prometheus treats an absent label as the empty one)."""
    if value is None:
        return
    name = family.name + "_total" if isinstance(family, CounterMetricFamily) else family.name
    family.samples.append(Sample(name, dict(labels), float(value), None))
