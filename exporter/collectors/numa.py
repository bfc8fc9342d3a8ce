"""NUMA nodes and where each GPU process may run and allocate, relative to its GPU.

Reads /sys/devices/system/node/node<N>/cpulist (nodes), /sys/bus/pci/devices/<bdf>/{numa_node,local_cpulist}
(each GPU's affinity) and /proc/<pid>/status (``Name``, ``Cpus_allowed_list``, ``Mems_allowed_list``) --
files, not syscalls, so fixtures and the simulator can drive it.

Which pids use which GPU:

* ``ctx.targets.by_gpu()``: GPU key -> pids, published by the GPU collector (key: NVML index as a string).
* ``ctx.targets.bus_ids()``: GPU index -> PCI address in sysfs form (``0000:41:00.0``), published by the
  GPU collector; it turns an index into the sysfs device to read.
* Without NVML (no GPU collector, tests, the manual check on a fixture): a GPU key that is itself a
  PCI address is used directly, and ``--collector.numa.pids KEY=PID,...`` adds static entries (KEY: a GPU
  index resolvable through ``bus_ids``, or a PCI address). The ``gpu`` label is the key as given.

A process pinned to the other socket pays a cross-socket hop on every DMA buffer and every preprocessing
output (the field playbook's NUMA case). Hosts with one node, and GPUs whose ``numa_node`` is -1, never mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter import log, pci
from exporter.collectors import register
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.samples.topology import NumaSample, Placement
from exporter.sampling import NUMA, Collector, CollectorContext, CollectorError, NoDataError, Option
from exporter.snapshot import Snapshot
from exporter.sources import read_text

REASONS = ("cpus_remote", "memory_remote")
_NODE_DIR = re.compile(r"^node(\d+)$")
def parse_static_pids(items: tuple[str, ...]) -> dict[str, frozenset[int]]:
    """``("0000:41:00.0=4242", "0=17")`` -> {key: pids}; ValueError naming the bad item."""
    out: dict[str, set[int]] = {}
    for item in items:
        key, eq, pid_s = item.partition("=")
        key = key.strip()
        try:
            pid = int(pid_s.strip(), 10)
        except ValueError:
            pid = -1
        if not eq or not key or pid <= 0:
            raise ValueError(f"bad entry {item!r} (want GPU=PID, GPU an index or PCI address, e.g. 0000:41:00.0=4242)")
        out.setdefault(pci.normalize(key) or key, set()).add(pid)
    return {k: frozenset(v) for k, v in out.items()}


class StaticPidsOption(Option):
    """``GPU=PID[,GPU=PID...]``, checked when the settings are read: a bad entry is exit 2 naming it, not a numa
    collector that fails to construct and is silently left out of a running daemon."""

    def parse(self, value: object) -> tuple[str, ...]:
        items = tuple(str(v) for v in value) if isinstance(value, list | tuple) else tuple(
            v for v in str(value).split(",") if v.strip())
        parse_static_pids(items)
        return tuple(i.strip() for i in items)


def placement(
    gpu: str,
    pid: int,
    comm: str,
    *,
    gpu_node: int | None,
    gpu_cpus: frozenset[int],
    nodes: Mapping[int, frozenset[int]],
    cpus_allowed: frozenset[int],
    mems_allowed: frozenset[int] | None,
) -> Placement:
    """Where ``pid`` may run and allocate relative to its GPU (pure).

    ``local_cpu_ratio``: share of the allowed (existing) CPUs that are local to the GPU -- the GPU's node
    CPUs, or its ``local_cpulist`` when the node is unknown. ``memory_local``: the GPU's node is among the
    allowed memory nodes. ``cpus_remote`` when none of the allowed CPUs is local (a partly local process is
    not flagged: its ratio says how much), ``memory_remote`` when memory is bound away from the GPU's node.
    One node, or an unknown GPU node, never mismatches.
    """
    local = nodes.get(gpu_node, frozenset()) if gpu_node is not None else frozenset()
    local = local or gpu_cpus
    known = frozenset().union(*nodes.values()) if nodes else frozenset()
    # Cpus_allowed_list of an unpinned task spans every *possible* CPU; count only CPUs that exist.
    allowed = (cpus_allowed & known) if known else cpus_allowed
    ratio = len(allowed & local) / len(allowed) if local and allowed else None
    memory_local = None if gpu_node is None or mems_allowed is None else gpu_node in mems_allowed
    reasons: list[str] = []
    if len(nodes) > 1 and gpu_node is not None:
        if ratio == 0.0:
            reasons.append("cpus_remote")
        if memory_local is False:
            reasons.append("memory_remote")
    return Placement(gpu=gpu, pid=pid, comm=comm, gpu_node=gpu_node, local_cpu_ratio=ratio,
                     memory_local=memory_local, reasons=tuple(reasons))


@register
class NumaCollector(Collector):
    """NUMA nodes and the placement of every GPU process relative to its GPU's node."""

    name = NUMA
    help = "NUMA nodes (sysfs) and GPU process placement (CPU and memory affinity from /proc/<pid>/status)."
    default_interval = 5.0
    options = (
        StaticPidsOption("pids", "list", (),
               "Static GPU -> process map for hosts without the GPU collector: GPU=PID[,GPU=PID...], GPU being "
               "an NVML index or a PCI address (0000:41:00.0)."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._static = parse_static_pids(tuple(ctx.options.get("pids", ())))

    def update(self) -> NumaSample:
        nodes = self._nodes()
        placements: list[Placement] = []
        for gpu, (bdf, pids) in sorted(self._gpu_pids().items()):
            gpu_node, gpu_cpus = self._gpu_affinity(bdf)
            for pid in sorted(pids):
                status = self._status(pid)
                if status is None:
                    continue
                comm, cpus, mems = status
                placements.append(placement(gpu, pid, comm, gpu_node=gpu_node, gpu_cpus=gpu_cpus, nodes=nodes,
                                            cpus_allowed=cpus, mems_allowed=mems))
        return NumaSample(nodes=MappingProxyType(nodes), placements=tuple(placements))

    def _nodes(self) -> dict[int, frozenset[int]]:
        """Node -> CPUs from /sys/devices/system/node/node<N>/cpulist."""
        base = self.ctx.sys("devices", "system", "node")
        try:
            entries = sorted(base.iterdir())
        except FileNotFoundError as e:
            raise NoDataError(f"{base} not present (kernel without CONFIG_NUMA)") from e
        nodes: dict[int, frozenset[int]] = {}
        for entry in entries:
            m = _NODE_DIR.match(entry.name)
            if not m:
                continue
            path = entry / "cpulist"
            try:
                nodes[int(m.group(1))] = parse_cpulist(read_text(path))
            except FileNotFoundError:
                continue
            except (OSError, CpulistError) as e:
                raise CollectorError(f"{path}: {e}") from e
        if not nodes:
            raise NoDataError(f"no node*/cpulist under {base}")
        return dict(sorted(nodes.items()))

    def _gpu_pids(self) -> dict[str, tuple[str, frozenset[int]]]:
        """GPU label -> (PCI address, pids), from the GPU collector's targets and the static option."""
        bus_ids = self.ctx.targets.bus_ids()
        merged: dict[str, set[int]] = {}
        for source in (self.ctx.targets.by_gpu(), self._static):
            for key, pids in source.items():
                merged.setdefault(key, set()).update(pids)
        out: dict[str, tuple[str, frozenset[int]]] = {}
        for key, pid_set in merged.items():
            bdf = pci.normalize(bus_ids[key]) if key in bus_ids else pci.normalize(key)
            if bdf is None:
                if log.once(("numa_gpu_unresolved", key)):
                    self.log.info("numa_gpu_unresolved", gpu=key,
                                  hint="no PCI address published for this GPU; placement skipped")
                continue
            out[key] = (bdf, frozenset(pid_set))
        return out

    def _gpu_affinity(self, bdf: str) -> tuple[int | None, frozenset[int]]:
        """GPU node and local CPUs from /sys/bus/pci/devices/<bdf>/{numa_node,local_cpulist}."""
        dev = self.ctx.sys("bus", "pci", "devices", bdf)
        node: int | None = None
        cpus: frozenset[int] = frozenset()
        try:
            raw = read_text(dev / "numa_node").strip()
            node = int(raw, 10)
            node = node if node >= 0 else None
            cpus = parse_cpulist(read_text(dev / "local_cpulist"))
        except FileNotFoundError:
            if log.once(("numa_gpu_missing", bdf)):
                self.log.info("numa_gpu_missing", bdf=bdf, path=str(dev))
        except (OSError, ValueError) as e:
            if log.once(("numa_gpu_unreadable", bdf)):
                self.log.warning("numa_gpu_unreadable", bdf=bdf, error=str(e))
        return node, cpus

    def _status(self, pid: int) -> tuple[str, frozenset[int], frozenset[int] | None] | None:
        """Name, Cpus_allowed_list and Mems_allowed_list from /proc/<pid>/status; None if it is gone."""
        path = self.ctx.proc(pid, "status")
        try:
            text = read_text(path)
        except (FileNotFoundError, ProcessLookupError):
            return None  # exited between the GPU collector's listing and now
        except OSError as e:
            if log.once(("numa_status_unreadable", str(pid))):
                self.log.warning("numa_status_unreadable", pid=pid, error=e.strerror or str(e))
            return None
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("Name", "Cpus_allowed_list", "Mems_allowed_list"):
                fields[key] = value.strip()
        try:
            cpus = parse_cpulist(fields["Cpus_allowed_list"])
            mems = parse_cpulist(fields["Mems_allowed_list"]) if "Mems_allowed_list" in fields else None
        except (KeyError, CpulistError) as e:
            if log.once(("numa_status_bad", str(pid))):
                self.log.warning("numa_status_bad", pid=pid, path=str(path), error=repr(e))
            return None
        return fields.get("Name", ""), cpus, mems

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: NumaSample | None = snap.value(self.name)
        if sample is None:
            return
        # Each node's CPU count is gpufeed_cpu_node_cpus (the cpu collector: its online CPUs, what /proc/stat
        # shares out): a second family saying the same would be two more host-level series of the budget's 200.
        ratio = GaugeMetricFamily(
            "gpufeed_process_numa_local_cpu_ratio",
            "Share of the GPU process's allowed CPUs (Cpus_allowed_list) that are local to its GPU's NUMA node.",
            labels=["gpu", "pid", "comm"],
        )
        mismatch = GaugeMetricFamily(
            "gpufeed_process_numa_mismatch",
            "1 for each way the GPU process is placed away from its GPU's NUMA node: cpus_remote (no allowed CPU is "
            "local), memory_remote (memory bound to other nodes); absent for a well-placed process. Never present "
            "on single-node hosts.",
            labels=["gpu", "pid", "comm", "reason"],
        )
        for p in sample.placements:
            pid = str(p.pid)
            if p.local_cpu_ratio is not None:
                ratio.add_metric([p.gpu, pid, p.comm], p.local_cpu_ratio)
            # Active reasons only (DESIGN.md series budget): `== 1`, the alert's process list and the dashboard's
            # table read them as before; a well-placed process costs no series here.
            for reason in REASONS:
                if reason in p.reasons:
                    mismatch.add_metric([p.gpu, pid, p.comm, reason], 1.0)
        yield from (ratio, mismatch)
