#!/usr/bin/env python3
"""Copy the /proc and /sys files the host collectors read into a plain tree, for fixtures.

    python tools/capture_procfs.py tests/fixtures/hosts/capture [--pid 1 --pid 1234]

The result has ``proc/`` and ``sys/`` directories usable as ``--path.procfs`` / ``--path.sysfs``. Only
the files gpufeed reads are copied (plus a few neighbours that explain them). Symlinks under /sys/block are
kept as relative symlinks and their targets are created, so the tree stays self-contained. Files that do not
exist on this host (no NFS client, no cpufreq in a VM) are simply absent, as they are on the host.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import sys
from pathlib import Path

PROC_FILES = (
    "stat", "meminfo", "vmstat", "diskstats", "pressure/cpu", "pressure/io", "pressure/memory", "net/rpc/nfs",
)
PID_FILES = ("stat", "status", "io")
CPUFREQ_FILES = ("scaling_governor", "scaling_cur_freq", "cpuinfo_max_freq", "cpuinfo_min_freq", "scaling_driver")
BLOCK_FILES = ("dev", "size", "removable", "ro")


def copy_file(src: Path, dst: Path) -> bool:
    """Copy one pseudo-file by reading it (sizes in procfs/sysfs are not real); False when it does not exist."""
    try:
        data = src.read_bytes()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ESRCH, errno.ENOTDIR):
            return False
        if e.errno in (errno.EACCES, errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL):
            print(f"skip {src}: {e.strerror}", file=sys.stderr)
            return False
        raise
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return True


def capture_proc(procfs: Path, out: Path, pids: list[int]) -> None:
    """Global /proc files and, per pid, stat/status/io and every task's stat."""
    for rel in PROC_FILES:
        copy_file(procfs / rel, out / rel)
    for pid in pids:
        for name in PID_FILES:
            copy_file(procfs / str(pid) / name, out / str(pid) / name)
        try:
            tids = sorted(os.listdir(procfs / str(pid) / "task"), key=lambda t: int(t) if t.isdigit() else -1)
        except OSError:
            continue
        for tid in tids:
            copy_file(procfs / str(pid) / "task" / tid / "stat", out / str(pid) / "task" / tid / "stat")


def capture_sys(sysfs: Path, out: Path) -> None:
    """NUMA node cpulists, cpufreq of every CPU, /sys/block with its symlinks and partition markers."""
    node = sysfs / "devices/system/node"
    for rel in ("online", "possible", "has_cpu"):
        copy_file(node / rel, out / "devices/system/node" / rel)
    if node.is_dir():
        for entry in sorted(os.listdir(node)):
            if entry.startswith("node") and entry[4:].isdigit():
                copy_file(node / entry / "cpulist", out / "devices/system/node" / entry / "cpulist")
    cpu = sysfs / "devices/system/cpu"
    for rel in ("online", "possible", "present"):
        copy_file(cpu / rel, out / "devices/system/cpu" / rel)
    if cpu.is_dir():
        for entry in sorted(os.listdir(cpu)):
            if entry.startswith("cpu") and entry[3:].isdigit():
                (out / "devices/system/cpu" / entry).mkdir(parents=True, exist_ok=True)
                for name in CPUFREQ_FILES:
                    copy_file(cpu / entry / "cpufreq" / name, out / "devices/system/cpu" / entry / "cpufreq" / name)
    block = sysfs / "block"
    if not block.is_dir():
        return
    (out / "block").mkdir(parents=True, exist_ok=True)
    for dev in sorted(os.listdir(block)):
        link = block / dev
        target = os.readlink(link) if link.is_symlink() else None
        real = link.resolve()
        if target is not None:
            if os.path.isabs(target):
                target = os.path.relpath(real, block)
            dst_link = out / "block" / dev
            if dst_link.is_symlink() or dst_link.exists():
                dst_link.unlink()
            os.symlink(target, dst_link)
            dst_dir = (out / "block" / target).resolve()
        else:
            dst_dir = out / "block" / dev
        dst_dir.mkdir(parents=True, exist_ok=True)
        for name in BLOCK_FILES:
            copy_file(real / name, dst_dir / name)
        for sub in sorted(os.listdir(real)):
            if (real / sub / "partition").is_file():
                for name in ("partition", *BLOCK_FILES):
                    copy_file(real / sub / name, dst_dir / sub / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory to write proc/ and sys/ into (replaced)")
    ap.add_argument("--procfs", type=Path, default=Path("/proc"))
    ap.add_argument("--sysfs", type=Path, default=Path("/sys"))
    ap.add_argument("--pid", type=int, action="append", default=[],
                    help="process to capture (repeatable; default: pid 1 and this process)")
    args = ap.parse_args(argv)
    pids = args.pid or [1, os.getpid()]
    for tree in ("proc", "sys"):  # only what is captured: a host's nvml/, host.yaml and golden stay
        if (args.out / tree).exists():
            shutil.rmtree(args.out / tree)
    capture_proc(args.procfs, args.out / "proc", pids)
    capture_sys(args.sysfs, args.out / "sys")
    print(f"captured into {args.out} (pids {', '.join(map(str, pids))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
