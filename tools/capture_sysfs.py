#!/usr/bin/env python3
"""Capture the sysfs (and optionally procfs) subtree gpufeed's topology collectors read, as a fixture.

Run on a GPU host (no root needed; AER files are world-readable) and commit the result under
tests/fixtures/hosts/<name>/ so the pcie and numa collectors are tested against real hardware::

    python tools/capture_sysfs.py --out tests/fixtures/hosts/h100-hgx
    python tools/capture_sysfs.py --out /tmp/cap --pid 4242 --pid 4243    # + /proc/<pid>/status
    python tools/capture_sysfs.py --out /tmp/cap --all                   # every PCI device, not only
                                                                         # GPUs, feeders and their bridges

What is kept: ``sys/bus/pci/devices/<bdf>`` as *relative* symlinks into ``sys/devices/pci.../<bdf>`` (the
real directory nesting, so the chain of bridges survives), each captured device's identity, NUMA, link
and AER attribute files, its ``driver`` link (into ``sys/bus/pci/drivers/<name>``), and
``sys/devices/system/node/node*/cpulist``. Nothing else is copied: no config space, no serial numbers,
no resource maps. Review the tree before committing it (``--pid`` status files name processes).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

ATTRS = (
    "class", "vendor", "device", "subsystem_vendor", "subsystem_device", "revision", "numa_node",
    "local_cpulist", "current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
    "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal", "enable", "power_state",
)
INTERESTING_CLASSES = (0x0300, 0x0302, 0x0108, 0x0200, 0x0207)  # GPUs, NVMe, Ethernet, InfiniBand
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PROC_FIELDS = ("Name", "Umask", "State", "Tgid", "Pid", "PPid", "Threads", "Cpus_allowed", "Cpus_allowed_list",
               "Mems_allowed", "Mems_allowed_list")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _real(sysfs: Path, link: Path) -> Path:
    """Resolve a /sys/bus/pci/devices entry to its directory, staying inside ``sysfs``."""
    target = os.readlink(link) if link.is_symlink() else str(link)
    if os.path.isabs(target) and target.startswith("/sys/") and sysfs != Path("/sys"):
        target = str(sysfs / os.path.relpath(target, "/sys"))
    return Path(os.path.realpath(link.parent / target))


def select_devices(sysfs: Path, everything: bool) -> dict[str, Path]:
    """BDF -> real directory: GPUs, NVMe and NICs with every bridge above them (or all devices)."""
    bus = sysfs / "bus" / "pci" / "devices"
    real_root = Path(os.path.realpath(sysfs))
    out: dict[str, Path] = {}
    for entry in sorted(bus.iterdir()):
        real = _real(sysfs, entry)
        if not real.is_dir():
            continue
        cls_text = _read(real / "class")
        try:
            cls = int(cls_text or "", 16)
        except ValueError:
            cls = -1
        if not everything and (cls >> 8) not in INTERESTING_CLASSES:
            continue
        out[entry.name] = real
        p = real.parent
        while p not in (real_root, p.parent) and (_BDF.match(p.name) or p.name.startswith("pci")):
            if _BDF.match(p.name):
                out.setdefault(p.name, p)
            p = p.parent
    return out


def capture(sysfs: Path, procfs: Path, out: Path, pids: list[int], everything: bool) -> int:
    """Write the capture into ``out``; returns the number of devices captured."""
    real_root = Path(os.path.realpath(sysfs))
    dst_sys = out / "sys"
    bus = dst_sys / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    devices = select_devices(sysfs, everything)
    for bdf, real in devices.items():
        rel = real.relative_to(real_root)
        ddir = dst_sys / rel
        ddir.mkdir(parents=True, exist_ok=True)
        for a in ATTRS:
            text = _read(real / a)
            if text is not None:
                (ddir / a).write_text(text)
        os.symlink(os.path.relpath(ddir, bus), bus / bdf)
        drv_link = real / "driver"
        if drv_link.is_symlink():
            name = os.path.basename(os.readlink(drv_link))
            drv = dst_sys / "bus" / "pci" / "drivers" / name
            drv.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(drv, ddir), ddir / "driver")
    node_src = sysfs / "devices" / "system" / "node"
    if node_src.is_dir():
        node_dst = dst_sys / "devices" / "system" / "node"
        node_dst.mkdir(parents=True, exist_ok=True)
        for f in ("online", "possible", "has_cpu", "has_memory"):
            text = _read(node_src / f)
            if text is not None:
                (node_dst / f).write_text(text)
        for n in sorted(node_src.glob("node[0-9]*")):
            text = _read(n / "cpulist")
            if text is not None:
                (node_dst / n.name).mkdir(exist_ok=True)
                (node_dst / n.name / "cpulist").write_text(text)
    for pid in pids:
        text = _read(procfs / str(pid) / "status")
        if text is None:
            print(f"capture_sysfs: pid {pid}: no status (exited?)", file=sys.stderr)
            continue
        keep = [ln for ln in text.splitlines() if ln.partition(":")[0] in PROC_FIELDS]
        (out / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
        (out / "proc" / str(pid) / "status").write_text("\n".join(keep) + "\n")
    return len(devices)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="fixture directory to create (gets sys/ and proc/)")
    ap.add_argument("--sysfs", default=Path("/sys"), type=Path, help="sysfs to capture from (default /sys)")
    ap.add_argument("--procfs", default=Path("/proc"), type=Path, help="procfs for --pid (default /proc)")
    ap.add_argument("--pid", type=int, action="append", default=[], help="also capture /proc/<pid>/status")
    ap.add_argument("--all", action="store_true", help="capture every PCI device, not only GPUs/feeders/bridges")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = ap.parse_args(argv)
    if not (args.sysfs / "bus" / "pci" / "devices").is_dir():
        print(f"capture_sysfs: {args.sysfs}/bus/pci/devices not found", file=sys.stderr)
        return 1
    if args.out.exists():
        if not args.force:
            print(f"capture_sysfs: {args.out} exists (use --force to replace it)", file=sys.stderr)
            return 1
        for tree in ("sys", "proc"):  # only what is captured: a host's nvml/, host.yaml and golden stay
            if (args.out / tree).exists():
                shutil.rmtree(args.out / tree)
    n = capture(args.sysfs, args.procfs, args.out, args.pid, args.all)
    print(f"captured {n} PCI devices into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
