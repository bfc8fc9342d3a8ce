#!/usr/bin/env python3
"""Generate the large hand-written host fixture (tests/fixtures/hosts/large): a 2-socket GPU server.

    python tools/make_large_fixture.py tests/fixtures/hosts/large

192 CPUs on 2 NUMA nodes (0-47,96-143 and 48-95,144-191, the usual SMT-sibling numbering), cpufreq with a
few CPUs left in powersave, an NVMe disk with partitions, a SATA disk with one partition, loop0 and dm-0
(both skipped by default), an NFS v3+v4 client, and a GPU training process (pid 4242) with 150 threads:
one hot launch thread, data-loader threads, three threads in D state, and a thread whose comm contains
spaces and parentheses. A second process (pid 4300) is another user's: its io file is unreadable in real
life, so it is absent here. Deterministic: the same output on every run (fixed seed), so the committed tree
and this script can be reviewed together.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
from pathlib import Path

CPUS = 192
NODES = {0: "0-47,96-143", 1: "48-95,144-191"}
POWERSAVE = frozenset({5, 6, 7, 101})
MAX_KHZ = 3_800_000
GPU_PID = 4242
OTHER_PID = 4300
THREADS = 150
ODD_COMM = "a) b (c"


def write(root: Path, rel: str, text: str) -> None:
    """Write ``text`` to ``root/rel``, creating parents."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def proc_stat(rng: random.Random) -> str:
    """/proc/stat with per-CPU lines in USER_HZ ticks."""
    rows = []
    for cpu in range(CPUS):
        busy = 4 if cpu in (17, 60) else 1  # two hot cores
        rows.append([rng.randint(100_000, 200_000) * busy, rng.randint(0, 500), rng.randint(20_000, 60_000) * busy,
                     rng.randint(5_000_000, 6_000_000), rng.randint(1_000, 9_000), 0, rng.randint(100, 2_000), 0, 0, 0])
    total = [sum(col) for col in zip(*rows, strict=True)]
    lines = ["cpu  " + " ".join(map(str, total))]
    lines += [f"cpu{i} " + " ".join(map(str, r)) for i, r in enumerate(rows)]
    lines += [
        "intr 987654321 0 0", "ctxt 123456789", "btime 1764460800", "processes 654321",
        "procs_running 9", "procs_blocked 3", "softirq 55555 0 1 2 3 4 5 6 7 8 9",
    ]
    return "\n".join(lines) + "\n"


def meminfo() -> str:
    """A 1 TiB host with some dirty data and pinned (Mlocked) CUDA host buffers."""
    rows = [
        ("MemTotal", 1056462060), ("MemFree", 601234560), ("MemAvailable", 912345672), ("Buffers", 123456),
        ("Cached", 301234560), ("SwapCached", 0), ("Active", 201234560), ("Inactive", 181234560),
        ("Unevictable", 33554432), ("Mlocked", 33554432), ("SwapTotal", 0), ("SwapFree", 0),
        ("Dirty", 524288), ("Writeback", 2048), ("AnonPages", 150000000), ("Mapped", 4000000),
        ("Shmem", 8000000), ("HugePages_Total", 0),
    ]
    return "".join(
        f"{k + ':':<16}{v:>10}\n" if k.startswith("HugePages") else f"{k + ':':<16}{v:>10} kB\n" for k, v in rows
    )


def diskstats() -> str:
    """loop0, nvme0n1 (+p1, p2), sda (+sda1), dm-0: 20 fields each (kernel >= 5.5 with discard and flush)."""
    devs = [
        (7, 0, "loop0", [120, 0, 960, 12, 0, 0, 0, 0, 0, 20, 12, 0, 0, 0, 0, 0, 0]),
        (259, 0, "nvme0n1", [8_812_345, 12, 2_097_152_000, 1_234_567, 2_345_678, 345, 987_654_321, 456_789, 7,
                             2_345_678, 1_700_000, 0, 0, 0, 0, 12_345, 6_789]),
        (259, 1, "nvme0n1p1", [1_000, 0, 16_000, 100, 10, 0, 80, 5, 0, 90, 105, 0, 0, 0, 0, 0, 0]),
        (259, 2, "nvme0n1p2", [8_811_000, 12, 2_097_135_000, 1_234_400, 2_345_600, 345, 987_654_200, 456_700, 7,
                               2_345_500, 1_699_900, 0, 0, 0, 0, 0, 0]),
        (8, 0, "sda", [45_678, 1_234, 9_876_543, 98_765, 12_345, 678, 2_345_678, 54_321, 0, 76_543, 153_086, 0, 0,
                       0, 0, 321, 654]),
        (8, 1, "sda1", [45_600, 1_234, 9_876_000, 98_700, 12_300, 678, 2_345_600, 54_300, 0, 76_500, 153_000, 0,
                        0, 0, 0, 0, 0]),
        (253, 0, "dm-0", [500, 0, 4_000, 50, 20, 0, 160, 10, 0, 60, 60, 0, 0, 0, 0, 0, 0]),
    ]
    return "".join(f"{ma:4d} {mi:7d} {name} " + " ".join(map(str, v)) + "\n" for ma, mi, name, v in devs)


def nfs() -> str:
    """An NFS client that speaks v3 to one server and v4.2 to another (69 v4 client procedures, kernel 6.x)."""
    v3 = [0] * 22
    v3[1], v3[3], v3[4], v3[6], v3[7] = 5_000, 1_200, 900, 30_000, 100  # getattr lookup access read write
    v4 = [0] * 69
    v4[1], v4[2], v4[4], v4[8] = 250_000, 10, 4_000, 3_990  # read write open close
    v4[17], v4[18], v4[19] = 12_000, 1_500_000, 80_000  # access getattr lookup
    return (
        "net 0 0 0 0\n"
        "rpc 1850000 37 0\n"
        "proc3 22 " + " ".join(map(str, v3)) + "\n"
        "proc4 69 " + " ".join(map(str, v4)) + "\n"
    )


def pid_stat(pid: int, comm: str, state: str, *, utime: int, stime: int, threads: int, cpu: int) -> str:
    """A /proc/<pid>/stat line (52 fields, kernel >= 5.x layout)."""
    after = [state, "1", str(pid), str(pid), "0", "-1", "4194560", "123456", "0", "12", "0", str(utime), str(stime),
             "0", "0", "20", "0", str(threads), "0", "98765", "34359738368", "2621440", "18446744073709551615",
             "1", "1", "0", "0", "0", "0", "0", "16781312", "17926", "0", "0", "0", "17", str(cpu), "0", "0",
             "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0"]
    return f"{pid} ({comm}) " + " ".join(after) + "\n"


def status(pid: int, name: str, cpus: str, mems: str, threads: int) -> str:
    """The /proc/<pid>/status lines around the two gpufeed reads."""
    return (
        f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t1\n"
        f"Threads:\t{threads}\nCpus_allowed:\tffffffff,ffffffff,ffffffff,ffffffff,ffffffff,ffffffff\n"
        f"Cpus_allowed_list:\t{cpus}\nMems_allowed:\t00000000,00000003\nMems_allowed_list:\t{mems}\n"
        "voluntary_ctxt_switches:\t12345\nnonvoluntary_ctxt_switches:\t678\n"
    )


def processes(root: Path, rng: random.Random) -> None:
    """The GPU process (150 threads) and another user's process without a readable io file."""
    tids = [GPU_PID, *range(GPU_PID + 1, GPU_PID + THREADS)]
    total_u = total_s = 0
    for i, tid in enumerate(tids):
        if i == 0:
            comm, state, u, s, cpu = "python3", "R", 890_000, 310_000, 17  # the launch thread: hot, system-heavy
        elif i == 1:
            comm, state, u, s, cpu = ODD_COMM, "S", 10, 5, 20
        elif i < 40:
            comm, state, u, s, cpu = "pt_data_worker", "D" if i in (5, 6, 7) else "S", 40_000 + i, 9_000, 96 + i
        else:
            comm, state, u, s, cpu = "python3", "S", rng.randint(0, 200), rng.randint(0, 100), rng.randint(0, 47)
        total_u += u
        total_s += s
        write(root, f"proc/{GPU_PID}/task/{tid}/stat",
              pid_stat(tid, comm, state, utime=u, stime=s, threads=THREADS, cpu=cpu))
    write(root, f"proc/{GPU_PID}/stat",
          pid_stat(GPU_PID, "python3", "R", utime=total_u, stime=total_s, threads=THREADS, cpu=17))
    write(root, f"proc/{GPU_PID}/status", status(GPU_PID, "python3", "0-47,96-143", "0", THREADS))
    write(root, f"proc/{GPU_PID}/io",
          "rchar: 987654321000\nwchar: 12345678\nsyscr: 246913580\nsyscw: 1234\nread_bytes: 1234567890\n"
          "write_bytes: 4096\ncancelled_write_bytes: 0\n")
    write(root, f"proc/{OTHER_PID}/stat",
          pid_stat(OTHER_PID, "infer server", "S", utime=4_000, stime=1_000, threads=2, cpu=50))
    write(root, f"proc/{OTHER_PID}/status", status(OTHER_PID, "infer server", "48-95,144-191", "1", 2))
    for tid, state in ((OTHER_PID, "S"), (OTHER_PID + 1, "R")):
        write(root, f"proc/{OTHER_PID}/task/{tid}/stat",
              pid_stat(tid, "infer server", state, utime=2_000, stime=500, threads=2, cpu=50))


def sysfs(root: Path, rng: random.Random) -> None:
    """NUMA nodes, cpufreq per CPU, /sys/block with relative symlinks like the kernel's."""
    write(root, "sys/devices/system/node/online", "0-1\n")
    write(root, "sys/devices/system/node/possible", "0-1\n")
    for node, cpus in NODES.items():
        write(root, f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")
    write(root, "sys/devices/system/cpu/online", f"0-{CPUS - 1}\n")
    for cpu in range(CPUS):
        d = f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        gov = "powersave" if cpu in POWERSAVE else "performance"
        cur = 1_200_000 if cpu in POWERSAVE else rng.randrange(2_800_000, 3_700_001, 100_000)
        write(root, f"{d}/scaling_governor", gov + "\n")
        write(root, f"{d}/scaling_cur_freq", f"{cur}\n")
        write(root, f"{d}/cpuinfo_max_freq", f"{MAX_KHZ}\n")
        write(root, f"{d}/cpuinfo_min_freq", "800000\n")
    block = {
        "nvme0n1": ("devices/pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/nvme0n1", ["nvme0n1p1", "nvme0n1p2"]),
        "sda": ("devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda", ["sda1"]),
        "loop0": ("devices/virtual/block/loop0", []),
        "dm-0": ("devices/virtual/block/dm-0", []),
    }
    (root / "sys/block").mkdir(parents=True, exist_ok=True)
    for dev, (target, parts) in block.items():
        write(root, f"sys/{target}/removable", "0\n")
        for n, part in enumerate(parts, 1):
            write(root, f"sys/{target}/{part}/partition", f"{n}\n")
        os.symlink(f"../{target}", root / "sys/block" / dev)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory to (re)create")
    args = ap.parse_args(argv)
    rng = random.Random(20261130)
    root: Path = args.out
    for tree in ("proc", "sys"):  # only what this script writes: the host's nvml/, host.yaml and golden stay
        if (root / tree).exists():
            shutil.rmtree(root / tree)
    write(root, "proc/stat", proc_stat(rng))
    write(root, "proc/meminfo", meminfo())
    write(root, "proc/vmstat", "nr_free_pages 150308640\nnr_dirty 131072\nnr_writeback 512\npgfault 987654321\n"
                               "oom_kill 3\n")
    write(root, "proc/diskstats", diskstats())
    write(root, "proc/pressure/cpu", "some avg10=1.50 avg60=1.20 avg300=0.90 total=123456789\n"
                                     "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    write(root, "proc/pressure/io", "some avg10=22.10 avg60=18.00 avg300=9.50 total=987654321\n"
                                    "full avg10=20.00 avg60=15.00 avg300=8.00 total=876543210\n")
    write(root, "proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=4567\n"
                                        "full avg10=0.00 avg60=0.00 avg300=0.00 total=1234\n")
    write(root, "proc/net/rpc/nfs", nfs())
    processes(root, rng)
    sysfs(root, rng)
    print(f"wrote {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
