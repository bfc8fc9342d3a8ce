"""PCIe link state of GPUs, the devices that feed them (NVMe, NICs) and every bridge on a GPU's path.

Reads /sys/bus/pci/devices/<bdf> (symlinks into /sys/devices/pci<dom>:<bus>/...). Enumerating the devices
(listing the bus, reading classes, resolving paths, walking each GPU's chain of bridges up to its root
port) costs far more than reading a few link files, so it runs only at start, when the hotplug watcher
(exporter/hotplug.py) reports a udev event, and every ``rescan-interval`` when udev is unavailable. The
link and AER files are re-read every cycle.

The collector records evidence only -- current vs maximum vs system-limited maximum per hop, and how
often each link renegotiated. Idle NVIDIA GPUs drop to Gen1 by design and some links flap while idle:
"current below max" is not a fault by itself. Judging "downgraded while busy, sustained" is the derived
layer's job (see docs/topology.md), over every hop of the sample.

The exposition, by default, carries every GPU, NVMe and NIC and only the narrowest hop of each GPU's chain
of bridges (the one that caps its transfers, where a downgrade under load shows), and the chain's AER totals
summed (root port to GPU); ``--collector.pcie.chain`` exports every hop. The static maxima (max and
system-limited speed and width) are labels of ``gpufeed_pcie_device_info``, not gauges.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import linkmath, log, pci
from exporter.collectors import register
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.samples.topology import AerCounts, PcieDevice, PcieLink, PcieSample
from exporter.sampling import PCIE, Collector, CollectorContext, NoDataError, Option
from exporter.snapshot import Snapshot
from exporter.sources import CHUNK, KeptFiles, read_text

# PCI class codes (PCI Code and ID Assignment Specification), upper 16 bits of the 24-bit class.
GPU_CLASSES = frozenset({0x0300, 0x0302})  # VGA-compatible controller, 3D controller
NVME_CLASSES = frozenset({0x0108})  # non-volatile memory controller
NIC_CLASSES = frozenset({0x0200, 0x0207})  # Ethernet, InfiniBand
NVIDIA = "0x10de"

ROLES = ("gpu", "nvme", "nic", "bridge")
PORTS = ("root_port", "upstream_port", "downstream_port", "endpoint")
AER_FILES = (  # sysfs file, its total line, severity label (Documentation/ABI/testing/sysfs-bus-pci-devices-aer)
    ("aer_dev_correctable", "TOTAL_ERR_COR", "correctable"),
    ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL", "nonfatal"),
    ("aer_dev_fatal", "TOTAL_ERR_FATAL", "fatal"),
)
KEPT_ATTRIBUTES = 1024  # per-cycle attributes kept open: 7 per device, ~140 devices before reads go by path
GTS = 1e9  # sysfs speeds are in GT/s; exported as transfers per second
# With udev, events drive re-enumeration; a slow safety net still catches a dropped netlink message.
HOTPLUG_SAFETY_FACTOR = 10



@dataclass(frozen=True, slots=True)
class _Topology:
    # Each device found by enumeration, with its static identity and place in the tree (link, aer and
    # link_changes are read each cycle), and its sysfs directory by BDF.
    nodes: tuple[PcieDevice, ...]
    paths: Mapping[str, Path]
    chains: Mapping[str, tuple[str, ...]]
    peer_paths: Mapping[str, Path]  # link peers that are not themselves tracked (parents of nvme/nic)


def role_of(class_code: int) -> str | None:
    """gpu / nvme / nic from a 24-bit PCI class code; None for anything else."""
    base = class_code >> 8
    if base in GPU_CLASSES:
        return "gpu"
    if base in NVME_CLASSES:
        return "nvme"
    if base in NIC_CLASSES:
        return "nic"
    return None


def parse_aer_total(text: str, key: str) -> int:
    """The ``<key> N`` line of an aer_dev_* file; ValueError when absent or not a number. The kernel writes the
    total last (drivers/pci/pcie/aer.c), so the lines are searched from the end."""
    for line in reversed(text.splitlines()):
        name, _, value = line.strip().partition(" ")
        if name == key:
            return int(value.strip(), 10)
    raise ValueError(f"no {key} line")


@register
class PcieCollector(Collector):
    """Link speed/width (current, max, system limit), AER totals and link changes along each GPU's path."""

    name = PCIE
    help = "PCIe link state and AER errors of GPUs, NVMe, NICs and the bridges above GPUs, from sysfs."
    default_interval = 5.0
    options = (
        Option("rescan-interval", "duration", 60.0,
               "Re-enumerate PCI devices this often when udev hotplug events are unavailable."),
        Option("feeders", "bool", True, "Also report NVMe and network devices (not only GPUs and their bridges)."),
        Option("chain", "bool", False,
               "Export every hop of each GPU's PCIe chain (root port, switch ports) with its link state and AER "
               "counters; by default only the narrowest hop of each chain and the chain's AER totals."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._rescan = threading.Event()
        self._rescan.set()
        self._topology: _Topology | None = None
        self._cycles_since_scan = 0
        self._hotplug_active = False
        self._links: dict[str, tuple[tuple[float | None, int | None], int]] = {}
        # Link state and AER counters are read every cycle (7 attributes of each of ~24 devices on an 8-GPU
        # host) through kept descriptors: a sysfs attribute read again from offset 0 is generated again
        # (Documentation/filesystems/sysfs.rst), so one pread replaces open, read and close. Closed at each
        # re-enumeration, which is when devices come and go.
        self._kept = KeptFiles(capacity=KEPT_ATTRIBUTES)
        # Each device's max_link_{speed,width} (its Link Capabilities register: what it is built for, fixed while
        # it is present), read once per enumeration instead of every cycle.
        self._max: dict[str, tuple[float | None, int | None]] = {}
        self._devices: dict[str, tuple[PcieDevice, PcieDevice]] = {}
        self.scans = 0

    def close(self) -> None:
        self._kept.close()

    # ---- hotplug interface (called from the event loop thread) ------------------------------------------

    def request_rescan(self, reason: str = "") -> None:
        """Re-enumerate devices on the next cycle (a udev add/remove/change event arrived)."""
        if not self._rescan.is_set():
            self.log.debug("pcie_rescan_requested", reason=reason)
        self._rescan.set()

    def set_hotplug(self, active: bool) -> None:
        """Tell the collector whether udev events drive re-enumeration (else it rescans periodically)."""
        self._hotplug_active = active

    @property
    def rescan_interval(self) -> float:
        """Seconds between re-enumerations without udev events."""
        return float(self.ctx.options.get("rescan-interval", 60.0))

    def _scan_due(self) -> bool:
        if self._rescan.is_set() or self._topology is None:
            return True
        every = self.rescan_interval
        if self._hotplug_active:
            every *= HOTPLUG_SAFETY_FACTOR
        return self._cycles_since_scan * self.interval >= every

    # ---- sampling -----------------------------------------------------------------------------------------

    def update(self) -> PcieSample:
        if self._scan_due():
            self._rescan.clear()
            self._kept.close()
            self._max.clear()
            try:
                self._topology = self._enumerate()
            except BaseException:
                self._rescan.set()  # retry next cycle instead of sampling a stale device set for a minute
                raise
            self._cycles_since_scan = 0
            self.scans += 1
            live = {n.bdf for n in self._topology.nodes}
            self._links = {k: v for k, v in self._links.items() if k in live}
        self._cycles_since_scan += 1
        topo = self._topology
        assert topo is not None
        links: dict[str, PcieLink | None] = {}
        aers: dict[str, AerCounts | None] = {}
        for node in topo.nodes:
            path = topo.paths[node.bdf]
            if not path.is_dir():
                # Removed between enumeration and now (surprise removal before udev told us): drop it.
                self.request_rescan(f"{node.bdf} vanished")
                continue
            links[node.bdf] = self._read_link(path)
            aers[node.bdf] = self._read_aer(path)
        peer_max = {b: self._read_max(p) for b, p in topo.peer_paths.items()}
        devices: dict[str, PcieDevice] = {}
        # Each device's enumerated node and the sample's copy of it: a node from a new enumeration never matches.
        kept: dict[str, tuple[PcieDevice, PcieDevice]] = {}
        for node in topo.nodes:
            if node.bdf not in links:
                continue
            link = links[node.bdf]
            if link is not None:
                link = self._with_limit(link, node.link_peer, links, peer_max)
            changes = self._count_change(node.bdf, link)
            aer = aers[node.bdf]
            prev = self._devices.get(node.bdf)
            if prev is not None and prev[0] is node and prev[1].link == link and prev[1].aer == aer \
                    and prev[1].link_changes == changes:
                dev = prev[1]  # nothing moved (the usual cycle): the same object, no 16-field copy
            else:
                dev = replace(node, link=link, aer=aer, link_changes=changes)
            devices[node.bdf] = dev
            kept[node.bdf] = (node, dev)
        self._devices = kept
        chains = {g: c for g, c in topo.chains.items() if all(b in devices for b in c)}
        return PcieSample(devices=MappingProxyType(devices), chains=MappingProxyType(chains))

    def _count_change(self, bdf: str, link: PcieLink | None) -> int:
        """Count renegotiations: the (current speed, current width) pair differs from the previous cycle."""
        state = (None, None) if link is None else (link.current_speed_gts, link.current_width)
        prev = self._links.get(bdf)
        changes = 0 if prev is None else prev[1] + (prev[0] != state)
        self._links[bdf] = (state, changes)
        return changes

    @staticmethod
    def _with_limit(
        link: PcieLink, peer: str | None, links: Mapping[str, PcieLink | None],
        peer_max: Mapping[str, tuple[float | None, int | None]],
    ) -> PcieLink:
        """The system-limited maximum: the lower capability of the two ends of the link."""
        if peer is None:
            return link
        other = links.get(peer)
        p_speed, p_width = (other.max_speed_gts, other.max_width) if other is not None else peer_max.get(
            peer, (None, None))
        speed = None if p_speed is None or link.max_speed_gts is None else min(p_speed, link.max_speed_gts)
        width = None if p_width is None or link.max_width is None else min(p_width, link.max_width)
        return PcieLink(link.current_speed_gts, link.current_width, link.max_speed_gts, link.max_width, speed, width)

    # ---- enumeration --------------------------------------------------------------------------------------

    def _enumerate(self) -> _Topology:
        """Devices from /sys/bus/pci/devices: classify, resolve real paths, walk GPU chains to the root port."""
        bus = self.ctx.sys("bus", "pci", "devices")
        try:
            names = sorted(os.listdir(bus))
        except FileNotFoundError as e:
            raise NoDataError(f"{bus} not present (no PCI bus, or sysfs not mounted)") from e
        if not names:
            raise NoDataError(f"{bus} is empty (no PCI devices)")
        found: list[tuple[str, str, Path]] = []
        for bdf in names:
            path = self._resolve(bus / bdf)
            if path is None:
                continue
            try:
                cls = int(self._read(path / "class"), 16)
            except (OSError, ValueError) as e:
                self._once_warn("pcie_device_skipped", str(path / "class"), bdf=bdf, error=_err(e))
                continue
            role = role_of(cls)
            if role is None or (role != "gpu" and not self.ctx.options.get("feeders", True)):
                continue
            found.append((bdf, role, path))
        gpus = sorted((f for f in found if f[1] == "gpu"), key=lambda f: (self._vendor(f[2]) != NVIDIA, f[0]))
        feeders = [f for f in found if f[1] != "gpu"]
        nodes: list[PcieDevice] = []
        bridges: dict[str, PcieDevice] = {}
        paths: dict[str, Path] = {}
        chains: dict[str, tuple[str, ...]] = {}
        for bdf, role, path in gpus:
            ups = self._upstream(path)
            chains[bdf] = (*(b for b, _ in ups), bdf)
            nodes.append(self._node(bdf, role, path, ups, gpu_bdf=bdf, child=None))
            paths[bdf] = path
            for i, (b, bpath) in enumerate(ups):
                if b in bridges:
                    continue
                child = ups[i + 1][0] if i + 1 < len(ups) else bdf
                bridges[b] = self._node(b, "bridge", bpath, ups[:i], gpu_bdf=bdf, child=child,
                                        hops_below=len(ups) - 1 - i)
                paths[b] = bpath
        # The first GPU (in BDF order) below a shared bridge names it, whatever the vendor order.
        for b, node in bridges.items():
            first = min(g for g, c in chains.items() if b in c)
            if first != node.gpu_bdf:
                bridges[b] = replace(node, gpu_bdf=first)
        ordered_bridges = sorted(bridges.values(), key=lambda n: (n.upstream, n.bdf))
        peer_paths: dict[str, Path] = {}
        tracked = {n.bdf for n in nodes} | set(bridges)
        feeder_nodes = []
        for bdf, role, path in feeders:
            ups = self._upstream(path)
            node = self._node(bdf, role, path, ups, gpu_bdf=None, child=None)
            feeder_nodes.append(node)
            paths[bdf] = path
            if ups and ups[-1][0] not in tracked:
                peer_paths[ups[-1][0]] = ups[-1][1]
        all_nodes = (*nodes, *ordered_bridges, *sorted(feeder_nodes, key=lambda n: (n.role, n.bdf)))
        self.log.debug("pcie_enumerated", gpus=len(gpus), bridges=len(bridges), feeders=len(feeder_nodes))
        return _Topology(nodes=all_nodes, paths=MappingProxyType(paths), chains=MappingProxyType(chains),
                         peer_paths=MappingProxyType(peer_paths))

    def _resolve(self, link: Path) -> Path | None:
        """Real path of /sys/bus/pci/devices/<bdf>, kept under --path.sysfs even for an absolute link."""
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            return None  # removed while listing
        except OSError:
            target = str(link)  # a plain directory (some captures, some container sysfs)
        if os.path.isabs(target) and self.ctx.sysfs != Path("/sys") and target.startswith("/sys/"):
            target = str(self.ctx.sysfs / os.path.relpath(target, "/sys"))
        real = Path(os.path.realpath(link.parent / target))
        if not real.is_dir():
            self._once_warn("pcie_dangling_device", str(link), target=target)
            return None
        return real

    def _upstream(self, path: Path) -> list[tuple[str, Path]]:
        """Bridges from the root port down to the parent of ``path``, read from the directory names."""
        out: list[tuple[str, Path]] = []
        root = Path(os.path.realpath(self.ctx.sysfs))
        p = path.parent
        while p not in (root, p.parent):
            if pci.is_address(p.name):
                out.append((p.name, p))
            elif not pci.HOST_BRIDGE.match(p.name):
                break  # reached /sys/devices (or a non-PCI parent such as a platform device)
            p = p.parent
        out.reverse()
        return out

    def _node(
        self, bdf: str, role: str, path: Path, ups: list[tuple[str, Path]], *, gpu_bdf: str | None,
        child: str | None, hops_below: int = 0,
    ) -> PcieDevice:
        """Identity, NUMA affinity and link position of one device (read once per enumeration); its link and
        AER counters are read each cycle.

        ``hops_below``: for a bridge, how many bridges sit between it and the GPU (0: directly above it).
        """
        parent_is_bdf = pci.is_address(path.parent.name)
        if role != "bridge":
            port = "endpoint"
        elif not parent_is_bdf:
            port = "root_port"
        else:
            # An endpoint always hangs off a downstream-facing port (root or switch downstream port), and
            # upstream/downstream ports alternate above it: count from the GPU, so the link nearest the GPU
            # is right even in a tree that hides a switch's upstream port (some VMs, the simulator).
            port = "downstream_port" if hops_below % 2 == 0 else "upstream_port"
        # Root and downstream ports' link files describe the link below them; the others, the link above.
        below = port in ("root_port", "downstream_port")
        peer = child if below else (ups[-1][0] if ups and parent_is_bdf else None)
        return PcieDevice(
            bdf=bdf, role=role, vendor=self._vendor(path), device=self._hex(path / "device"),
            class_code=self._hex(path / "class"), driver=self._driver(path), numa_node=self._numa_node(path),
            local_cpus=self._local_cpus(path), gpu_bdf=gpu_bdf, upstream=tuple(b for b, _ in ups), port=port,
            link_peer=peer, link=None, aer=None,
        )

    # ---- small readers ------------------------------------------------------------------------------------

    @staticmethod
    def _read(path: Path) -> str:
        """One sysfs attribute, stripped."""
        return read_text(path, limit=CHUNK).strip()

    def _attr(self, path: Path) -> str | None:
        """An optional attribute: None when absent; unreadable ones are logged once and also None."""
        try:
            return self._read(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._once_warn("pcie_attribute_unreadable", str(path), error=_err(e))
            return None

    def _vendor(self, path: Path) -> str:
        """Vendor id from <dev>/vendor (``0x10de``)."""
        return self._hex(path / "vendor")

    def _hex(self, path: Path) -> str:
        """A hex id attribute (vendor, device, class) normalised to lower-case ``0x..``; "" when unknown."""
        raw = self._attr(path)
        if raw is None:
            return ""
        try:
            int(raw, 16)
        except ValueError:
            self._once_warn("pcie_bad_value", str(path), value=raw[:40])
            return ""
        return raw.lower() if raw.lower().startswith("0x") else "0x" + raw.lower()

    def _driver(self, path: Path) -> str:
        """Bound driver: basename of the <dev>/driver symlink; "" when unbound."""
        try:
            return os.path.basename(os.readlink(path / "driver"))
        except OSError:
            return ""

    def _numa_node(self, path: Path) -> int | None:
        """NUMA node from <dev>/numa_node; -1 (no affinity, single-node or VM) is None."""
        raw = self._attr(path / "numa_node")
        if raw is None:
            return None
        try:
            node = int(raw, 10)
        except ValueError:
            self._once_warn("pcie_bad_value", str(path / "numa_node"), value=raw[:40])
            return None
        return node if node >= 0 else None

    def _local_cpus(self, path: Path) -> frozenset[int]:
        """CPUs local to the device from <dev>/local_cpulist."""
        raw = self._attr(path / "local_cpulist")
        if raw is None:
            return frozenset()
        try:
            return parse_cpulist(raw)
        except CpulistError:
            self._once_warn("pcie_bad_value", str(path / "local_cpulist"), value=raw[:40])
            return frozenset()

    def _sampled(self, path: str) -> str | None:
        """An attribute read every cycle (through a kept descriptor), like :meth:`_attr`."""
        try:
            return self._kept.read(path).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._once_warn("pcie_attribute_unreadable", path, error=_err(e))
            return None

    def _speed(self, path: str) -> float | None:
        """A *_link_speed attribute in GT/s ("16.0 GT/s PCIe", "Unknown")."""
        raw = self._sampled(path)
        if raw is None:
            return None
        try:
            return linkmath.parse_speed(raw)
        except linkmath.LinkParseError:
            self._once_warn("pcie_bad_value", path, value=raw[:40])
            return None

    def _width(self, path: str) -> int | None:
        """A *_link_width attribute in lanes."""
        raw = self._sampled(path)
        if raw is None:
            return None
        try:
            return linkmath.parse_width(raw)
        except linkmath.LinkParseError:
            self._once_warn("pcie_bad_value", path, value=raw[:40])
            return None

    def _read_link(self, path: Path) -> PcieLink | None:
        """Negotiated and maximum link state from <dev>/{current,max}_link_{speed,width}; None without PCIe."""
        base = f"{path}/"
        max_speed, max_width = self._read_max(path)
        link = PcieLink(
            current_speed_gts=self._speed(base + "current_link_speed"),
            current_width=self._width(base + "current_link_width"),
            max_speed_gts=max_speed,
            max_width=max_width,
        )
        if link == PcieLink(None, None, None, None):
            return None  # no link files (VM, integrated endpoint, conventional PCI)
        return link

    def _read_max(self, path: Path) -> tuple[float | None, int | None]:
        """A device's link capability, from <dev>/max_link_{speed,width}: read at its first cycle after each
        enumeration (until both answer), then kept."""
        key = str(path)
        got = self._max.get(key)
        if got is None or None in got:
            got = self._max[key] = (self._speed(f"{key}/max_link_speed"), self._width(f"{key}/max_link_width"))
        return got

    def _read_aer(self, path: Path) -> AerCounts | None:
        """AER totals from <dev>/aer_dev_{correctable,nonfatal,fatal}; None without AER (or any unreadable)."""
        totals: list[int] = []
        for fname, key, _ in AER_FILES:
            raw = self._sampled(f"{path}/{fname}")
            if raw is None:
                return None
            try:
                totals.append(parse_aer_total(raw, key))
            except ValueError:
                self._once_warn("pcie_bad_value", f"{path}/{fname}", value=f"no valid {key} line")
                return None
        return AerCounts(correctable=totals[0], nonfatal=totals[1], fatal=totals[2])

    def _once_warn(self, event: str, key: str, **kw: object) -> None:
        """Warn once per (event, file): a bad item is skipped every cycle but reported one time."""
        if log.once((event, key)):
            self.log.warning(event, path=key, **kw)

    # ---- exposition ---------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: PcieSample | None = snap.value(self.name)
        if sample is None:
            return
        whole_chain = bool(self.ctx.options.get("chain", False))
        link_labels = ["bdf", "role", "gpu_bdf"]
        info = GaugeMetricFamily(
            "gpufeed_pcie_device_info",
            "PCI device identity, value 1: role (gpu, nvme, nic, bridge on a GPU's path), ids, driver, the GPU "
            "below a bridge (gpu_bdf), its NUMA node, port type, and the link's static maxima: max_speed/max_width "
            "(the device's own capability, sysfs max_link_*), limit_speed/limit_width (system-limited: the lower "
            "capability of the link's two ends); '' when unknown.",
            labels=["bdf", "role", "vendor", "device", "class", "driver", "gpu_bdf", "numa_node", "port",
                    "max_speed", "max_width", "limit_speed", "limit_width"],
        )
        cur_speed = GaugeMetricFamily(
            "gpufeed_pcie_link_current_speed_transfers_per_second",
            "Negotiated PCIe link speed (sysfs current_link_speed). Idle GPUs drop to Gen1 by design.",
            labels=link_labels,
        )
        cur_width = GaugeMetricFamily(
            "gpufeed_pcie_link_current_width", "Negotiated PCIe link width in lanes (sysfs current_link_width).",
            labels=link_labels,
        )
        capacity = GaugeMetricFamily(
            "gpufeed_pcie_link_capacity_bytes_per_second",
            "Achievable unidirectional payload throughput of the current link (line encoding and TLP/DLLP "
            "overhead deducted, 256-byte payloads).", labels=link_labels,
        )
        changes = CounterMetricFamily(
            "gpufeed_pcie_link_changes",
            "Changes of the negotiated link speed or width seen between samples (flapping: rate per minute).",
            labels=link_labels,
        )
        aer = CounterMetricFamily(
            "gpufeed_pcie_aer_errors",
            "PCIe Advanced Error Reporting totals (sysfs aer_dev_*, TOTAL_ERR_* lines) by severity, per NVMe and "
            "NIC (per GPU and bridge too with --collector.pcie.chain).",
            labels=["bdf", "role", "severity"],
        )
        chain_aer = CounterMetricFamily(
            "gpufeed_pcie_chain_aer_errors",
            "AER totals (sysfs aer_dev_*) summed over a GPU's PCIe chain -- root port, switch ports and the GPU "
            "itself -- by severity; per device instead with --collector.pcie.chain.",
            labels=["gpu_bdf", "severity"],
        )
        shown = set(sample.devices) if whole_chain else exported_hops(sample)
        for d in sample.devices.values():
            if d.bdf not in shown:
                continue
            gpu = d.gpu_bdf or ""
            lv = [d.bdf, d.role, gpu]
            ln = d.link
            maxima = ["", "", "", ""] if ln is None else [
                _speed_label(ln.max_speed_gts), _width_label(ln.max_width),
                _speed_label(ln.limit_speed_gts), _width_label(ln.limit_width)]
            info.add_metric(
                [d.bdf, d.role, d.vendor, d.device, d.class_code, d.driver, gpu,
                 "" if d.numa_node is None else str(d.numa_node), d.port, *maxima], 1.0,
            )
            if ln is not None:
                if ln.current_speed_gts is not None:
                    cur_speed.add_metric(lv, ln.current_speed_gts * GTS)
                if ln.current_width is not None:
                    cur_width.add_metric(lv, float(ln.current_width))
                cap = linkmath.capacity_from_speed(ln.current_speed_gts, ln.current_width)
                if cap is not None:
                    capacity.add_metric(lv, cap)
                changes.add_metric(lv, float(d.link_changes))
        for d in sample.devices.values():
            if d.aer is not None and (whole_chain or d.gpu_bdf is None):
                for sev, n in _severities(d.aer):
                    aer.add_metric([d.bdf, d.role, sev], float(n))
        if not whole_chain:
            for gpu_bdf, chain in sorted(sample.chains.items()):
                # Devices without AER capability (no aer_dev_* files) add nothing; a total that drops because a
                # file turned unreadable is withheld by the exposition's counter guard, never exported lower.
                known = [a for b in chain for a in (sample.devices[b].aer,) if a is not None]
                if not known:
                    continue
                total = AerCounts(correctable=sum(a.correctable for a in known),
                                  nonfatal=sum(a.nonfatal for a in known), fatal=sum(a.fatal for a in known))
                for sev, n in _severities(total):
                    chain_aer.add_metric([gpu_bdf, sev], float(n))
        yield from (info, cur_speed, cur_width, capacity, changes, aer, chain_aer)


def exported_hops(sample: PcieSample) -> set[str]:
    """The devices exported by default: every GPU and feeder, and of each GPU's bridges only the narrowest hop.

    The narrowest hop is the one whose current link has the lowest achievable capacity -- the one that caps the
    GPU's transfers, and the one a downgrade under load shows up at. Ties go to the hop nearest the GPU, so a
    healthy chain exports only the GPU's own link, and a bridge appears only while its link is really slower
    than every hop below it. A hop without a known capacity is never chosen over one with.
    """
    keep = {b for b, d in sample.devices.items() if d.role != "bridge"}
    for chain in sample.chains.values():
        best: tuple[float, int] | None = None
        pick: str | None = None
        for pos, b in enumerate(chain):
            ln = sample.devices[b].link
            cap = None if ln is None else linkmath.capacity_from_speed(ln.current_speed_gts, ln.current_width)
            if cap is None:
                continue
            key = (cap, -pos)
            if best is None or key < best:
                best, pick = key, b
        if pick is not None:
            keep.add(pick)
    return keep


def _severities(a: AerCounts) -> tuple[tuple[str, int], ...]:
    return (("correctable", a.correctable), ("nonfatal", a.nonfatal), ("fatal", a.fatal))


def _speed_label(gts: float | None) -> str:
    """A speed label in the kernel's own wording ("16.0 GT/s", as sysfs writes it without the " PCIe")."""
    return "" if gts is None else f"{gts:.1f} GT/s"


def _width_label(width: int | None) -> str:
    return "" if width is None else str(width)


def _err(e: BaseException) -> str:
    return (e.strerror if isinstance(e, OSError) and e.strerror else None) or str(e)
