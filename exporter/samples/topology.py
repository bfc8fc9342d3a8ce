"""Samples of the topology collectors (pcie, numa, nic)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PcieLink:
    """A link's negotiated and maximum state from sysfs (speeds in GT/s; None when absent or Unknown).

    ``max_*`` is this device's own capability (LnkCap). ``limit_*`` is the system-limited maximum of the
    link: the lower of this device's and its link partner's capability (a Gen4 GPU in a Gen3 slot has
    limit Gen3) -- compare ``current_*`` with ``limit_*`` to find a downgrade, never with ``max_*`` alone.
    None when the partner is unknown (then fall back to ``max_*``).
    """

    current_speed_gts: float | None
    current_width: int | None
    max_speed_gts: float | None
    max_width: int | None
    limit_speed_gts: float | None = None
    limit_width: int | None = None


@dataclass(frozen=True, slots=True)
class AerCounts:
    """AER totals from aer_dev_{correctable,nonfatal,fatal} (``TOTAL_ERR_*`` lines)."""

    correctable: int
    nonfatal: int
    fatal: int


@dataclass(frozen=True, slots=True)
class PcieDevice:
    """One PCI device: a GPU, a device that feeds one (nvme, nic), or a bridge on a GPU's path.

    ``gpu_bdf`` is, for a bridge, the GPU below it (a bridge above several GPUs appears once per GPU
    chain in ``PcieSample.chains`` but once here, with the first GPU in BDF order); for a GPU, its own
    BDF; None for nvme/nic. ``upstream`` is the chain of bridges from the root port down to this
    device's parent.

    ``port`` is the device's place on its link: ``root_port`` and ``downstream_port`` (their link files
    describe the link below them), ``upstream_port`` (a switch's port towards the root) and
    ``endpoint`` (both describe the link above them); ``link_peer`` is the BDF of the device on the
    other end of that link (None when unknown). ``link_changes`` counts changes of the negotiated
    speed/width seen by the collector since it first saw the device (sampled, so changes faster than
    the interval are undercounted); flapping = its increase per minute.
    """

    bdf: str
    role: str  # gpu | nvme | nic | bridge
    vendor: str
    device: str
    class_code: str
    driver: str
    numa_node: int | None
    local_cpus: frozenset[int]
    link: PcieLink | None
    aer: AerCounts | None
    gpu_bdf: str | None
    upstream: tuple[str, ...]
    port: str = "endpoint"  # root_port | upstream_port | downstream_port | endpoint
    link_peer: str | None = None
    link_changes: int = 0


@dataclass(frozen=True, slots=True)
class PcieSample:
    """Devices by BDF; ``chains`` maps each GPU's BDF to the BDFs from its root port down to the GPU."""

    devices: Mapping[str, PcieDevice]
    chains: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU process may run relative to its GPU."""

    gpu: str  # NVML index as a string, or the GPU's BDF when NVML is absent
    pid: int
    comm: str
    gpu_node: int | None
    local_cpu_ratio: float | None  # fraction of the process's allowed CPUs local to the GPU
    memory_local: bool | None  # the GPU's node is among the allowed memory nodes
    reasons: tuple[str, ...]  # cpus_remote, memory_remote

    @property
    def mismatch(self) -> bool:
        """True when the placement crosses sockets."""
        return bool(self.reasons)


@dataclass(frozen=True, slots=True)
class NumaSample:
    """NUMA nodes (node -> CPUs) and the placement of each GPU process."""

    nodes: Mapping[int, frozenset[int]]
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class NicPort:
    """One network adapter port as the nic collector read it (exporter/collectors/nic.py).

    ``adapter`` is the RDMA device (``mlx5_0``; InfiniBand and RoCE alike) or, for a plain Ethernet adapter, the
    interface (``eth2``); ``port`` its port number ("" for an interface). ``kind``: ``infiniband``, ``roce`` or
    ``ethernet``. Rates are bits per second: ``rate_bps`` the negotiated one now (None while the link has none:
    down, or Ethernet's speed -1), ``capable_bps`` what the port is known to reach -- the best of its own rate
    since gpufeed started and of its siblings' of the same model on this host (sysfs has no port capability:
    docs/topology.md). ``gpus``: the GPUs (sysfs PCI addresses) sharing a PCIe switch with the adapter.
    ``errors``: the kernel's error counters by their own file names.
    """

    adapter: str
    port: str
    kind: str
    bdf: str
    model: str
    up: bool | None
    rate_bps: float | None
    capable_bps: float | None
    rx_bytes: int | None
    tx_bytes: int | None
    errors: Mapping[str, int]
    gpus: tuple[str, ...]
    numa_node: int | None = None

    @property
    def key(self) -> str:
        """``mlx5_0/1`` for an RDMA port, the interface name otherwise."""
        return f"{self.adapter}/{self.port}" if self.port else self.adapter


@dataclass(frozen=True, slots=True)
class NicSample:
    """The network adapter ports of the host (beside its GPUs, by default), in adapter/port order."""

    ports: tuple[NicPort, ...]
