"""Network adapters beside the GPUs: InfiniBand and RoCE ports from /sys/class/infiniband, Ethernet interfaces
from /sys/class/net -- link state, the negotiated rate against what the port is known to reach, traffic and
error counters.

A multi-host job moves its gradients over these adapters: a port that trained down to half its rate, or one
whose cable throws symbol errors, makes every rank wait. Which adapters matter is read from the PCIe tree: an
adapter whose PCI function shares a PCIe switch with a GPU (the GPUDirect RDMA layout of every multi-GPU
training host) is reported with those GPUs, the others only with ``--collector.nic.all``. The GPUs are the ones
the GPU collector published (``Targets.bus_ids``).

The files (Documentation/ABI/stable/sysfs-class-infiniband, Documentation/ABI/testing/sysfs-class-net):

- ``infiniband/<dev>/ports/<n>/state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate``
  (``400 Gb/sec (4X NDR)``), ``link_layer`` (``InfiniBand``, or ``Ethernet`` for RoCE) and ``counters/*``:
  ``port_rcv_data`` / ``port_xmit_data`` count **4-byte words** ("divided by 4", the ABI document and IBA's
  PortXmitData), converted to bytes here; ``symbol_error``, ``link_downed``, ``port_rcv_errors``,
  ``link_error_recovery`` are plain counts.
- ``net/<if>/operstate``, ``speed`` (Mb/s; -1 or EINVAL without a link), ``carrier_changes`` and
  ``statistics/{rx,tx}_bytes``, ``rx_errors``, ``tx_errors``, ``rx_crc_errors``.

What sysfs does not say: a port's *capability*. InfiniBand's supported widths and speeds are PortInfo fields
that ``ibstat`` reads with management datagrams; Ethernet's supported link modes come from ethtool's netlink
interface. gpufeed sends neither. A port's capable rate is therefore what it is *known* to reach: the best rate
the port itself negotiated since gpufeed started, or the best of the ports of the same model and kind on this
host (eight identical HCAs, one at half rate). A lone port that trained down before gpufeed started is not
known to be slow (docs/topology.md).

Three series a port by default (an 8-GPU host's eight compute ports are 24 of DESIGN.md's 200 host-level series):
what the port is and is known to reach (info, like the PCIe hops' max_speed), its rate now (0 while down: one
series where "up" and "rate" were two), and its error counters summed (as NVLink's are per GPU; the finding names
the counter). The byte counters are read every cycle for network_bound and nic_link_degraded, and exported with
``--collector.nic.traffic``. Sample of the exposition::

    gpufeed_nic_info{adapter="mlx5_0",port="1",kind="infiniband",bdf="0000:1b:00.0",model="MT4129",
                     gpus="0000:18:00.0",numa_node="0",capable_rate="400000000000"} 1.0
    gpufeed_nic_rate_bits_per_second{adapter="mlx5_0",port="1"} 4e+11
    gpufeed_nic_errors_total{adapter="mlx5_0",port="1"} 0.0
    gpufeed_nic_receive_bytes_total{adapter="mlx5_0",port="1"} 4.1e+12   (with --collector.nic.traffic)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import log, pci
from exporter.collectors import register
from exporter.samples.topology import NicPort, NicSample
from exporter.sampling import NIC, Collector, CollectorContext, NoDataError, Option
from exporter.snapshot import Snapshot
from exporter.sources import CHUNK, KeptFiles, read_text

INFINIBAND, ROCE, ETHERNET = "infiniband", "roce", "ethernet"
KINDS = (INFINIBAND, ROCE, ETHERNET)
# IBA PortXmitData / PortRcvData: "the number of data octets ... divided by 4" (sysfs-class-infiniband).
IB_WORD_BYTES = 4
IB_ERRORS = ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery")
NET_ERRORS = ("rx_errors", "tx_errors", "rx_crc_errors", "carrier_changes")
ARPHRD_INFINIBAND = 32  # include/uapi/linux/if_arp.h: an IPoIB interface, counted by its RDMA port instead
MBIT = 1e6
GBIT = 1e9
RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
KEPT_ATTRIBUTES = 256  # per-cycle attributes kept open: ~10 a port


@dataclass(frozen=True, slots=True)
class _Adapter:
    """One port found by enumeration: where its files are, and its identity."""

    adapter: str
    port: str
    kind: str
    bdf: str
    model: str
    path: Path  # the port's directory (IB) or the interface's (Ethernet)
    pci_path: tuple[str, ...]  # PCI addresses from the root port down to the adapter's function
    numa_node: int | None
    # Relative name -> the file's path as a string, joined once: a pathlib join per attribute per cycle was a
    # third of the collector's CPU (8 ports x 8 attributes every 5 s).
    files: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def file(self, rel: str) -> str:
        """The path of the file ``rel`` (``counters/symbol_error``) below the port's directory."""
        got = self.files.get(rel)
        if got is None:
            got = self.files[rel] = os.path.join(self.path, rel)
        return got


def parse_ib_rate(text: str) -> float | None:
    """Bits per second from an IB port's ``rate`` file (``100 Gb/sec (4X EDR)``); None when unparseable."""
    m = RATE.match(text)
    return float(m.group(1)) * GBIT if m else None


def parse_ib_state(text: str) -> str:
    """The name of a ``state`` / ``phys_state`` value (``4: ACTIVE`` -> ``ACTIVE``)."""
    return text.partition(":")[2].strip() if ":" in text else text.strip()


def pci_components(path: str) -> tuple[str, ...]:
    """The PCI addresses along a sysfs device path, root port first (``/sys/devices/pci0000:00/0000:00:01.0/...``)."""
    return tuple(p for p in path.split(os.sep) if pci.is_address(p))


def beside(adapter: tuple[str, ...], gpu: tuple[str, ...]) -> bool:
    """Whether two PCI functions share a PCIe switch: their paths share a root port *and* the switch's upstream
    port below it (only a root port in common: different switches, or none)."""
    shared = 0
    for a, b in zip(adapter, gpu, strict=False):
        if a != b:
            break
        shared += 1
    return shared >= 2


@register
class NicCollector(Collector):
    """InfiniBand, RoCE and Ethernet adapter ports beside the GPUs: state, rate vs capable rate, bytes, errors."""

    name = NIC
    help = ("Network adapters on the GPUs' PCIe switches (InfiniBand/RoCE from /sys/class/infiniband, Ethernet "
            "from /sys/class/net): link state, rate, traffic and error counters.")
    default_interval = 5.0
    options = (
        Option("all", "bool", False,
               "Report every PCI network adapter, not only those sharing a PCIe switch with a GPU."),
        Option("rescan-interval", "duration", 60.0, "Look for adapters that came or went this often."),
        Option("traffic", "bool", False,
               "Also export each port's byte counters (gpufeed_nic_{receive,transmit}_bytes_total). They are read "
               "either way -- network_bound's evidence names a port's load from them --, and node_exporter's "
               "infiniband and netdev collectors export the same counters; two series a port would put an 8-port "
               "host over DESIGN.md's 200 host-level series."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self._adapters: tuple[_Adapter, ...] | None = None
        self._cycles = 0
        self._best: dict[str, float] = {}  # the best rate each port negotiated since start, by key
        self._gpu_paths: dict[str, tuple[str, ...]] = {}
        self._kept = KeptFiles(capacity=KEPT_ATTRIBUTES)

    def close(self) -> None:
        self._kept.close()

    def update(self) -> NicSample:
        if self._adapters is None or self._cycles * self.interval >= float(self.ctx.options.get("rescan-interval",
                                                                                                  60.0)):
            self._kept.close()
            self._adapters = self._enumerate()
            self._cycles = 0
        self._cycles += 1
        gpus = self._gpus()
        every = bool(self.ctx.options.get("all", False))
        ports: list[NicPort] = []
        for a in self._adapters:
            near = tuple(sorted(b for b, p in gpus.items() if beside(a.pci_path, p)))
            if not near and not every:
                continue
            ports.append(self._read_ib(a, near) if a.kind != ETHERNET else self._read_net(a, near))
        return NicSample(ports=tuple(self._with_capability(ports)))

    def _with_capability(self, ports: list[NicPort]) -> list[NicPort]:
        """Each port's capable rate: the best of its own since start and of its up siblings of the same model."""
        siblings: dict[tuple[str, str], float] = {}
        for p in ports:
            if p.rate_bps is not None:
                best = max(self._best.get(p.key, 0.0), p.rate_bps)
                self._best[p.key] = best
                group = (p.kind, p.model)
                siblings[group] = max(siblings.get(group, 0.0), p.rate_bps)
        out = []
        for p in ports:
            known = max(self._best.get(p.key, 0.0), siblings.get((p.kind, p.model), 0.0) if p.model else 0.0)
            out.append(replace(p, capable_bps=known or None))
        return out

    # ---- enumeration --------------------------------------------------------------------------------------

    def _enumerate(self) -> tuple[_Adapter, ...]:
        """Ports of /sys/class/infiniband/*/ports/* and PCI interfaces of /sys/class/net (IPoIB and the netdevs
        of RDMA adapters excluded: their RDMA port is the adapter)."""
        ib_root, net_root = self.ctx.sys("class", "infiniband"), self.ctx.sys("class", "net")
        ib_names, net_names = _listdir(ib_root), _listdir(net_root)
        if ib_names is None and net_names is None:
            raise NoDataError(f"neither {ib_root} nor {net_root} present (sysfs not mounted?)")
        found: list[_Adapter] = []
        rdma_functions: set[str] = set()
        for dev in ib_names or ():
            where = self._device_path(ib_root / dev / "device")
            if where is None:
                continue
            bdf, comps = where
            rdma_functions.add(bdf)
            model = self._attr(ib_root / dev / "hca_type") or self._attr(ib_root / dev / "device" / "device") or ""
            for port in sorted(_listdir(ib_root / dev / "ports") or (), key=_natural):
                path = ib_root / dev / "ports" / port
                layer = (self._attr(path / "link_layer") or "InfiniBand").lower()
                kind = ROCE if layer == "ethernet" else INFINIBAND
                found.append(_Adapter(dev, port, kind, bdf, model, path, comps, self._numa(ib_root / dev)))
        for iface in net_names or ():
            path = net_root / iface
            where = self._device_path(path / "device")
            if where is None or where[0] in rdma_functions:
                continue
            if (self._attr(path / "type") or "") == str(ARPHRD_INFINIBAND):
                continue
            bdf, comps = where
            dev_dir = Path(os.path.realpath(path / "device"))
            model = ":".join(x for x in (self._attr(dev_dir / "vendor"), self._attr(dev_dir / "device")) if x)
            found.append(_Adapter(iface, "", ETHERNET, bdf, model, path, comps, self._numa(path)))
        self.log.debug("nic_enumerated", ports=len(found))
        return tuple(found)

    def _device_path(self, link: Path) -> tuple[str, tuple[str, ...]] | None:
        """The PCI function behind a class device's ``device`` link (the nearest PCI address on its path: a
        virtio NIC's ``device`` is ``virtio2`` below its PCI function) and the PCI addresses above it; None for
        a virtual device (lo, veth, bridges: no ``device`` link)."""
        try:
            target = os.readlink(link)
        except OSError:
            return None
        if os.path.isabs(target) and target.startswith("/sys/") and self.ctx.sysfs != Path("/sys"):
            target = str(self.ctx.sysfs / os.path.relpath(target, "/sys"))
        comps = pci_components(os.path.realpath(link.parent / target))
        return (comps[-1], comps) if comps else None

    def _gpus(self) -> Mapping[str, tuple[str, ...]]:
        """Each published GPU's PCI address -> the PCI addresses on its sysfs path (resolved once per GPU)."""
        out: dict[str, tuple[str, ...]] = {}
        for bdf in sorted(set(self.ctx.targets.bus_ids().values())):
            comps = self._gpu_paths.get(bdf)
            if comps is None:
                real = os.path.realpath(self.ctx.sys("bus", "pci", "devices", bdf))
                comps = pci_components(real) if os.path.isdir(real) else ()
                self._gpu_paths[bdf] = comps
            if comps:
                out[bdf] = comps
        return MappingProxyType(out)

    # ---- reading ------------------------------------------------------------------------------------------

    def _read_ib(self, a: _Adapter, gpus: tuple[str, ...]) -> NicPort:
        """An RDMA port from <port>/{state,rate,counters/*}; data counters from 4-byte words to bytes."""
        state = self._sampled(a.file("state"))
        up = None if state is None else parse_ib_state(state) == "ACTIVE"
        rate_text = self._sampled(a.file("rate")) if up else None
        rx, tx = self._int(a.file("counters/port_rcv_data")), self._int(a.file("counters/port_xmit_data"))
        errors = {name: n for name in IB_ERRORS if (n := self._int(a.file(f"counters/{name}"))) is not None}
        return NicPort(
            adapter=a.adapter, port=a.port, kind=a.kind, bdf=a.bdf, model=a.model, up=up,
            rate_bps=None if rate_text is None else parse_ib_rate(rate_text), capable_bps=None,
            rx_bytes=None if rx is None else rx * IB_WORD_BYTES, tx_bytes=None if tx is None else tx * IB_WORD_BYTES,
            errors=MappingProxyType(errors), gpus=gpus, numa_node=a.numa_node,
        )

    def _read_net(self, a: _Adapter, gpus: tuple[str, ...]) -> NicPort:
        """An Ethernet interface from <if>/{operstate,speed,carrier_changes,statistics/*}."""
        state = self._sampled(a.file("operstate"))
        up = None if state is None or state == "unknown" else state == "up"
        speed = self._int(a.file("speed")) if up else None
        errors = {name: n for name in NET_ERRORS
                  if (n := self._int(a.file(name if name == "carrier_changes" else f"statistics/{name}"))) is not None}
        return NicPort(
            adapter=a.adapter, port="", kind=ETHERNET, bdf=a.bdf, model=a.model, up=up,
            rate_bps=speed * MBIT if speed is not None and speed > 0 else None, capable_bps=None,
            rx_bytes=self._int(a.file("statistics/rx_bytes")), tx_bytes=self._int(a.file("statistics/tx_bytes")),
            errors=MappingProxyType(errors), gpus=gpus, numa_node=a.numa_node,
        )

    def _sampled(self, path: str) -> str | None:
        """An attribute read every cycle through a kept descriptor; None when absent or unreadable (an
        interface without a link answers EINVAL to ``speed``: unknown, not a failure)."""
        try:
            return self._kept.read(path).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno != 22 and log.once(("nic_attribute_unreadable", path)):  # EINVAL: no link
                self.log.warning("nic_attribute_unreadable", path=path, error=e.strerror or str(e))
            return None

    def _int(self, path: str) -> int | None:
        """A decimal counter or speed attribute."""
        raw = self._sampled(path)
        if raw is None:
            return None
        try:
            return int(raw, 10)
        except ValueError:
            if log.once(("nic_bad_value", path)):
                self.log.warning("nic_bad_value", path=path, value=raw[:40])
            return None

    @staticmethod
    def _attr(path: Path) -> str | None:
        """A static attribute read at enumeration, stripped; None when absent or unreadable."""
        try:
            return read_text(path, limit=CHUNK).strip()
        except OSError:
            return None

    def _numa(self, path: Path) -> int | None:
        """<dev>/device/numa_node; -1 (no affinity) is None."""
        raw = self._attr(path / "device" / "numa_node")
        try:
            node = int(raw or "-1", 10)
        except ValueError:
            return None
        return node if node >= 0 else None

    # ---- exposition ---------------------------------------------------------------------------------------

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: NicSample | None = snap.value(self.name)
        if sample is None:
            return
        lv = ["adapter", "port"]
        info = GaugeMetricFamily(
            "gpufeed_nic_info",
            "A network adapter port, value 1: kind (infiniband, roce, ethernet), its PCI function, model (HCA type "
            "or PCI vendor:device), the GPUs sharing its PCIe switch (comma-separated addresses), NUMA node, and "
            "capable_rate: the rate it is known to reach in bits/s (an integer), the best it negotiated since gpufeed "
            "started or the best of the ports of the same model on this host (sysfs has no port capability; "
            "docs/topology.md; '' until one is known).",
            labels=[*lv, "kind", "bdf", "model", "gpus", "numa_node", "capable_rate"])
        rate = GaugeMetricFamily(
            "gpufeed_nic_rate_bits_per_second",
            "The port's negotiated rate now (IB rate file, Ethernet speed); 0 while its link is down (IB state not "
            "ACTIVE, Ethernet operstate not up).", labels=lv)
        errors = CounterMetricFamily(
            "gpufeed_nic_errors",
            "The port's error counters summed: IB symbol_error, link_downed, port_rcv_errors, link_error_recovery; "
            "Ethernet rx_errors, tx_errors, rx_crc_errors, carrier_changes (nic_link_degraded names the counter that "
            "rose).", labels=lv)
        traffic = bool(self.ctx.options.get("traffic", False))
        rx = CounterMetricFamily("gpufeed_nic_receive_bytes",
                                 "Bytes received by the port (IB port_rcv_data x 4, Ethernet rx_bytes).", labels=lv)
        tx = CounterMetricFamily("gpufeed_nic_transmit_bytes",
                                 "Bytes sent by the port (IB port_xmit_data x 4, Ethernet tx_bytes).", labels=lv)
        for p in sample.ports:
            key = [p.adapter, p.port]
            info.add_metric([*key, p.kind, p.bdf, p.model, ",".join(p.gpus),
                             "" if p.numa_node is None else str(p.numa_node),
                             "" if p.capable_bps is None else str(round(p.capable_bps))], 1.0)
            if p.up is False:
                rate.add_metric(key, 0.0)
            elif p.rate_bps is not None:
                rate.add_metric(key, p.rate_bps)
            if p.errors:
                errors.add_metric(key, float(sum(p.errors.values())))
            if traffic and p.rx_bytes is not None:
                rx.add_metric(key, float(p.rx_bytes))
            if traffic and p.tx_bytes is not None:
                tx.add_metric(key, float(p.tx_bytes))
        yield from (info, rate, errors)
        if traffic:
            yield from (rx, tx)


def _listdir(path: Path) -> list[str] | None:
    """Sorted entries of a class directory; None when it does not exist."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None


def _natural(name: str) -> tuple[int, str]:
    """Port directories in numeric order (1, 2, ... 10)."""
    return (int(name), "") if name.isdigit() else (1 << 30, name)
