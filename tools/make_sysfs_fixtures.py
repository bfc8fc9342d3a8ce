#!/usr/bin/env python3
"""Generate the topology fixture trees under tests/fixtures/hosts/<box>/{sys,proc}.

The trees have the real sysfs structure: ``sys/bus/pci/devices/<bdf>`` are relative symlinks into
``sys/devices/pci<dom>:<bus>/<root port>/.../<bdf>``, ``driver`` links point into ``sys/bus/pci/drivers``,
NUMA nodes live in ``sys/devices/system/node/node<N>``. The generated trees are committed; re-run this
script after changing it and review the diff::

    python tools/make_sysfs_fixtures.py            # rewrite every box
    python tools/make_sysfs_fixtures.py riser      # only some

Boxes: ``dgx`` (8 GPUs behind 4 PCIe switches, 2 sockets, one GPU idling at Gen1), ``riser`` (one GPU
behind a riser that negotiated Gen3 x8 under a Gen4 x16 slot, plus processes pinned near and far),
``switch_riser`` (the GPU's own link is fine; the switch's uplink is degraded), ``workstation`` (one
socket, one discrete GPU, an integrated GPU with no link files), ``vm`` (no link files at all, like a
cloud VM), ``garbage`` (malformed, missing and dangling entries).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hosts"

SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe",
         6: "64.0 GT/s PCIe"}

AER_COR = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
AER_UNCOR = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
             "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
             "PoisonTLPBlocked")


@dataclass
class Dev:
    """One PCI function in a fixture: where it sits and what its attribute files say."""

    path: str  # e.g. "pci0000:00/0000:00:01.0/0000:01:00.0"
    vendor: str
    device: str
    cls: str
    driver: str | None = None
    numa_node: int = -1
    local_cpulist: str = ""
    link: tuple[int, int, int, int] | None = None  # cur gen, cur width, max gen, max width
    aer: tuple[int, int, int] | None = (0, 0, 0)
    extra: dict[str, str] = field(default_factory=dict)  # raw attribute overrides (garbage)
    omit: tuple[str, ...] = ()  # attribute files to leave out

    @property
    def bdf(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _aer(kind: str, total: int) -> str:
    names = AER_COR if kind == "cor" else AER_UNCOR
    key = {"cor": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}[kind]
    lines = [f"{n} {total if i == 0 else 0}" for i, n in enumerate(names)]
    return "\n".join([*lines, f"{key} {total}"]) + "\n"


def write_dev(sys_root: Path, d: Dev) -> None:
    """Create the device directory, its attributes, its bus symlink and its driver link."""
    real = sys_root / "devices" / d.path
    real.mkdir(parents=True, exist_ok=True)
    attrs: dict[str, str] = {
        "vendor": d.vendor, "device": d.device, "class": d.cls, "numa_node": str(d.numa_node),
        "local_cpulist": d.local_cpulist, "subsystem_vendor": d.vendor, "subsystem_device": "0x0000",
        "enable": "1", "power_state": "D0",
    }
    if d.link is not None:
        cg, cw, mg, mw = d.link
        attrs.update({"current_link_speed": SPEED[cg], "current_link_width": str(cw),
                      "max_link_speed": SPEED[mg], "max_link_width": str(mw)})
    if d.aer is not None:
        attrs.update({"aer_dev_correctable": _aer("cor", d.aer[0]), "aer_dev_nonfatal": _aer("nonfatal", d.aer[1]),
                      "aer_dev_fatal": _aer("fatal", d.aer[2])})
    attrs.update(d.extra)
    for name, value in attrs.items():
        if name in d.omit:
            continue
        if value == "<dir>":
            (real / name).mkdir(exist_ok=True)  # a directory where a file belongs: reading fails (EISDIR)
            continue
        (real / name).write_text(value if value.endswith("\n") or value == "" else value + "\n")
    bus = sys_root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, bus), bus / d.bdf)
    if d.driver:
        drv = sys_root / "bus" / "pci" / "drivers" / d.driver
        drv.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drv, real), real / "driver")
        link = drv / d.bdf
        if not link.is_symlink():
            os.symlink(os.path.relpath(real, drv), link)


def write_nodes(sys_root: Path, nodes: dict[int, str]) -> None:
    """sys/devices/system/node/node<N>/cpulist and the online/possible masks."""
    base = sys_root / "devices" / "system" / "node"
    for n, cpus in nodes.items():
        (base / f"node{n}").mkdir(parents=True, exist_ok=True)
        (base / f"node{n}" / "cpulist").write_text(cpus + "\n")
    mask = ",".join(str(n) for n in sorted(nodes))
    (base / "online").write_text(f"{mask}\n" if len(nodes) > 1 else "0\n")
    (base / "possible").write_text(f"{mask}\n" if len(nodes) > 1 else "0\n")


def write_proc(proc_root: Path, pid: int, comm: str, cpus: str, mems: str) -> None:
    """A /proc/<pid>/status with the fields the numa collector reads, in the kernel's order."""
    d = proc_root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t1\n"
        f"Threads:\t12\nCpus_allowed:\tffffffff\nCpus_allowed_list:\t{cpus}\n"
        f"Mems_allowed:\t00000000,00000003\nMems_allowed_list:\t{mems}\n"
        "voluntary_ctxt_switches:\t10\nnonvoluntary_ctxt_switches:\t1\n"
    )
    (d / "comm").write_text(comm + "\n")


def build(box: str, devs: Iterable[Dev], nodes: dict[int, str], extra: Iterable[tuple[str, str]] = ()) -> Path:
    """Write one box from scratch; ``extra`` adds raw (path, symlink-target) entries for broken links."""
    top = ROOT / box
    for tree in ("sys", "proc"):  # only what this script writes: the host's nvml/, host.yaml and golden stay
        if (top / tree).exists():
            shutil.rmtree(top / tree)
    sys_root = top / "sys"
    for d in devs:
        write_dev(sys_root, d)
    write_nodes(sys_root, nodes)
    for rel, target in extra:
        p = sys_root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)
    return top


# ---- boxes ---------------------------------------------------------------------------------------------------

H100 = ("0x10de", "0x2330", "0x030200")
A6000 = ("0x10de", "0x2230", "0x030000")
RTX4090 = ("0x10de", "0x2684", "0x030000")
PEX_SWITCH = ("0x1000", "0xc030", "0x060400")
ROOT_PORT_INTEL = ("0x8086", "0x352a", "0x060400")
ROOT_PORT_AMD = ("0x1022", "0x1483", "0x060400")
HOST_BRIDGE = ("0x8086", "0x09a2", "0x060000")
CX7 = ("0x15b3", "0x1021", "0x020700")
NVME = ("0x144d", "0xa80a", "0x010802")
I225 = ("0x8086", "0x15f3", "0x020000")
INTEL_IGPU = ("0x8086", "0xa780", "0x030000")
HDA = ("0x10de", "0x22ba", "0x040300")


def dev(path: str, ids: tuple[str, str, str], **kw: object) -> Dev:
    return Dev(path, ids[0], ids[1], ids[2], **kw)  # type: ignore[arg-type]


def dgx() -> None:
    """8 H100 SXM behind 4 PEX switches (2 per socket), a CX-7 NIC per switch, NVMe on root ports.

    GPU 0000:19:00.0 idles at Gen1 x16 (by design, not a fault); GPU 0000:9b:00.0 has correctable AER
    errors on its link and its switch port.
    """
    devs: list[Dev] = []
    nodes = {0: "0-47,96-143", 1: "48-95,144-191"}
    for k, b in enumerate((0x15, 0x35, 0x95, 0xb5)):
        node = 0 if k < 2 else 1
        cpus = nodes[node]
        hb = f"pci0000:{b:02x}"
        rp = f"{hb}/0000:{b:02x}:01.0"
        usp = f"{rp}/0000:{b + 1:02x}:00.0"
        common = {"numa_node": node, "local_cpulist": cpus}
        devs.append(dev(f"{hb}/0000:{b:02x}:00.0", HOST_BRIDGE, aer=None, **common))
        devs.append(dev(rp, ROOT_PORT_INTEL, driver="pcieport", link=(5, 16, 5, 16), **common))
        devs.append(dev(usp, PEX_SWITCH, driver="pcieport", link=(5, 16, 5, 16), **common))
        for j, slot in enumerate(("00", "01", "02")):
            dsp = f"{usp}/0000:{b + 2:02x}:{slot}.0"
            ep = f"{dsp}/0000:{b + 3 + j:02x}:00.0"
            if j < 2:
                bdf = f"0000:{b + 3 + j:02x}:00.0"
                link = (1, 16, 5, 16) if bdf == "0000:19:00.0" else (5, 16, 5, 16)
                aer = (7, 0, 0) if bdf == "0000:9b:00.0" else (0, 0, 0)
                devs.append(dev(dsp, PEX_SWITCH, driver="pcieport", link=link, aer=aer, **common))
                devs.append(dev(ep, H100, driver="nvidia", link=link, aer=aer, **common))
            else:
                devs.append(dev(dsp, PEX_SWITCH, driver="pcieport", link=(5, 16, 5, 16), **common))
                devs.append(dev(ep, CX7, driver="mlx5_core", link=(5, 16, 5, 16), **common))
        nv_rp = f"{hb}/0000:{b:02x}:03.0"
        devs.append(dev(nv_rp, ROOT_PORT_INTEL, driver="pcieport", link=(4, 4, 5, 4), **common))
        devs.append(dev(f"{nv_rp}/0000:{b + 6:02x}:00.0", NVME, driver="nvme", link=(4, 4, 4, 4), **common))
    build("dgx", devs, nodes)


def riser() -> None:
    """Two sockets; GPU 0000:41:00.0 sits behind a riser that trained at Gen3 x8 in a Gen4 x16 slot.

    Processes (procfs fixture): 4242 trains on GPU 0 (node 0) but is pinned to node 1 CPUs and memory;
    4243 uses GPU 1 from node 1 (local); 4244 uses GPU 0 with local CPUs but memory bound to node 1;
    4245 uses GPU 0 with half its CPUs on each node.
    """
    n0 = {"numa_node": 0, "local_cpulist": "0-15"}
    n1 = {"numa_node": 1, "local_cpulist": "16-31"}
    devs = [
        dev("pci0000:00/0000:00:00.0", ("0x1022", "0x1480", "0x060000"), aer=None, **n0),
        dev("pci0000:00/0000:00:01.1", ROOT_PORT_AMD, driver="pcieport", link=(4, 16, 4, 16), **n0),
        dev("pci0000:00/0000:00:01.1/0000:01:00.0", A6000, driver="nvidia", link=(4, 16, 4, 16), **n0),
        dev("pci0000:00/0000:00:01.1/0000:01:00.1", HDA, driver="snd_hda_intel", link=(4, 16, 4, 16), **n0),
        dev("pci0000:00/0000:00:03.1", ROOT_PORT_AMD, driver="pcieport", link=(4, 4, 4, 4), **n0),
        dev("pci0000:00/0000:00:03.1/0000:02:00.0", NVME, driver="nvme", link=(4, 4, 4, 4), **n0),
        dev("pci0000:40/0000:40:00.0", ("0x1022", "0x1480", "0x060000"), aer=None, **n1),
        # The riser: both ends of the slot's link say Gen3 x8 although both can do Gen4 x16.
        dev("pci0000:40/0000:40:01.1", ROOT_PORT_AMD, driver="pcieport", link=(3, 8, 4, 16), aer=(3, 0, 0), **n1),
        dev("pci0000:40/0000:40:01.1/0000:41:00.0", A6000, driver="nvidia", link=(3, 8, 4, 16), aer=(12, 0, 0),
            **n1),
        dev("pci0000:40/0000:40:03.1", ROOT_PORT_AMD, driver="pcieport", link=(2, 1, 4, 4), **n1),
        dev("pci0000:40/0000:40:03.1/0000:42:00.0", I225, driver="igc", link=(2, 1, 2, 1),
            **n1),
    ]
    top = build("riser", devs, {0: "0-15", 1: "16-31"})
    proc = top / "proc"
    write_proc(proc, 4242, "python3", "16-31", "1")
    write_proc(proc, 4243, "python3", "16-31", "1")
    write_proc(proc, 4244, "python3", "0-15", "1")
    write_proc(proc, 4245, "python3", "8-23", "0-1")


def switch_riser() -> None:
    """The GPU's own link is Gen4 x16, but the uplink of the switch above it trained at Gen3 x4."""
    n0 = {"numa_node": 0, "local_cpulist": "0-23"}
    devs = [
        dev("pci0000:00/0000:00:01.0", ROOT_PORT_INTEL, driver="pcieport", link=(3, 4, 4, 16), **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.0", PEX_SWITCH, driver="pcieport", link=(3, 4, 4, 16), **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", PEX_SWITCH, driver="pcieport", link=(4, 16, 4, 16),
            **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0", PEX_SWITCH, driver="pcieport", link=(4, 16, 4, 16),
            **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", A6000, driver="nvidia",
            link=(4, 16, 4, 16), **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", A6000, driver="nvidia",
            link=(4, 16, 4, 16), **n0),
    ]
    build("switch_riser", devs, {0: "0-23"})


def workstation() -> None:
    """One socket: an RTX 4090 at Gen4 x16, its audio function, an iGPU (no link files), NVMe, a 2.5G NIC."""
    n0 = {"numa_node": -1, "local_cpulist": "0-15"}
    devs = [
        dev("pci0000:00/0000:00:00.0", HOST_BRIDGE, aer=None, **n0),
        dev("pci0000:00/0000:00:02.0", INTEL_IGPU, driver="i915", aer=None, **n0),
        dev("pci0000:00/0000:00:01.0", ("0x8086", "0xa70d", "0x060400"), driver="pcieport", link=(4, 16, 5, 16),
            **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.0", RTX4090, driver="nvidia", link=(4, 16, 4, 16), **n0),
        dev("pci0000:00/0000:00:01.0/0000:01:00.1", ("0x10de", "0x22ba", "0x040300"), driver="snd_hda_intel",
            link=(4, 16, 4, 16), **n0),
        dev("pci0000:00/0000:00:1b.0", ("0x8086", "0x7ac0", "0x060400"), driver="pcieport", link=(4, 4, 4, 4),
            **n0),
        dev("pci0000:00/0000:00:1b.0/0000:02:00.0", NVME, driver="nvme", link=(4, 4, 4, 4), **n0),
        dev("pci0000:00/0000:00:1c.0", ("0x8086", "0x7ab8", "0x060400"), driver="pcieport", link=(2, 1, 3, 1),
            **n0),
        dev("pci0000:00/0000:00:1c.0/0000:03:00.0", I225, driver="igc", link=(2, 1, 2, 1), **n0),
    ]
    build("workstation", devs, {0: "0-15"})


def vm() -> None:
    """A cloud VM: virtio devices and a passed-through GPU on the root bus, no link or AER files at all."""
    n = {"numa_node": -1, "local_cpulist": "0-7", "aer": None}
    devs = [
        dev("pci0000:00/0000:00:00.0", ("0x8086", "0x1237", "0x060000"), **n),
        dev("pci0000:00/0000:00:01.0", ("0x1af4", "0x1000", "0x020000"), driver="virtio-pci", **n),
        dev("pci0000:00/0000:00:02.0", ("0x1af4", "0x1001", "0x010000"), driver="virtio-pci", **n),
        dev("pci0000:00/0000:00:04.0", ("0x1d0f", "0xec20", "0x020000"), driver="ena", **n),
        dev("pci0000:00/0000:00:05.0", ("0x10de", "0x1eb8", "0x030200"), driver="nvidia", **n),
    ]
    build("vm", devs, {0: "0-7"})


def garbage() -> None:
    """Malformed values, missing files, a dangling device link, a directory where a file belongs."""
    n0 = {"numa_node": 0, "local_cpulist": "0-7"}
    devs = [
        dev("pci0000:00/0000:00:01.0", ROOT_PORT_INTEL, driver="pcieport", link=(4, 16, 4, 16), **n0),
        # Unparseable speed/width, bad numa_node and cpulist, AER file without its total line.
        dev("pci0000:00/0000:00:01.0/0000:01:00.0", A6000, driver="nvidia", link=(4, 16, 4, 16),
            extra={"current_link_speed": "fast", "current_link_width": "sixteen", "numa_node": "banana",
                   "local_cpulist": "0-", "aer_dev_correctable": "RxErr 1\nBadTLP x\n"}),
        # No link files and no vendor file.
        dev("pci0000:00/0000:00:02.0", A6000, driver="nvidia", link=None, aer=None, omit=("vendor",), **n0),
        # Unknown class value: skipped at enumeration.
        dev("pci0000:00/0000:00:03.0", A6000, extra={"class": "zz"}, **n0),
        # Link down: speed Unknown, width 0; max values of rates no generation uses.
        dev("pci0000:00/0000:00:04.0", H100, driver="nvidia", link=(5, 16, 5, 16),
            extra={"current_link_speed": "Unknown", "current_link_width": "0", "max_link_speed": "12.0 GT/s",
                   "max_link_width": "3"}, **n0),
        # Old-kernel speed strings without the PCIe suffix, and a directory in place of an AER file.
        dev("pci0000:00/0000:00:06.0", RTX4090, driver="nvidia", link=(3, 16, 3, 16),
            extra={"current_link_speed": "8 GT/s", "max_link_speed": "8 GT/s", "aer_dev_fatal": "<dir>"}, **n0),
    ]
    build("garbage", devs, {0: "0-7"}, extra=[
        ("bus/pci/devices/0000:00:07.0", "../../../devices/pci0000:00/0000:00:07.0"),  # device gone
    ])


BOXES = {"dgx": dgx, "riser": riser, "switch_riser": switch_riser, "workstation": workstation, "vm": vm,
         "garbage": garbage}


def main(argv: list[str]) -> int:
    names = argv or list(BOXES)
    for n in names:
        if n not in BOXES:
            print(f"unknown box {n!r} (known: {', '.join(BOXES)})", file=sys.stderr)
            return 2
        BOXES[n]()
        print(f"wrote {ROOT / n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
