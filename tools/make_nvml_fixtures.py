#!/usr/bin/env python3
"""Write the strict fake NVML's state for a fixture host: tests/fixtures/hosts/<name>/nvml/state.json.

One device per NVIDIA display or 3D controller the host's sysfs lists (vendor 0x10de, class 0x03xxxx), in bus
order as NVML enumerates them, with the identity, affinity and link the sysfs tree implies (link state as
NVML would report it from the GPU's own link files). Processes come from ``--process BDF=PID`` options. The
files are committed; re-run after changing a host's sysfs tree and review the diff::

    python tools/make_nvml_fixtures.py riser --process 0000:01:00.0=4242 --process 0000:41:00.0=4243
    python tools/make_nvml_fixtures.py dgx
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hosts"
NAMES = {"0x2330": "NVIDIA H100 80GB HBM3", "0x2335": "NVIDIA H200", "0x20b5": "NVIDIA A100-SXM4-80GB",
         "0x26b9": "NVIDIA L40S", "0x27b8": "NVIDIA L4", "0x2684": "NVIDIA GeForce RTX 4090"}
GTS = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _gen(text: str | None) -> int | None:
    return GTS.get(text.split()[0]) if text else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def devices(host: Path, processes: dict[str, list[int]]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    base = host / "sys" / "bus" / "pci" / "devices"
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        if _read(dev / "vendor") != "0x10de" or not (_read(dev / "class") or "").startswith("0x03"):
            continue
        bdf = dev.name
        pos = len(out)
        d: dict[str, object] = {
            "uuid": f"GPU-{pos:08x}-fixt-0000-0000-{int(bdf.replace(':', '').replace('.', ''), 16):012x}",
            "name": NAMES.get(_read(dev / "device") or "", "NVIDIA H100 80GB HBM3"),
            "pci_bus_id": bdf,
        }
        cur_g, cur_w = _gen(_read(dev / "current_link_speed")), _int(_read(dev / "current_link_width"))
        max_g, max_w = _gen(_read(dev / "max_link_speed")), _int(_read(dev / "max_link_width"))
        if None not in (cur_g, cur_w, max_g, max_w):
            d["link"] = {"gen": cur_g, "width": cur_w, "max_gen": max_g, "max_width": max_w, "gpu_max_gen": max_g}
        cpus = _read(dev / "local_cpulist")
        numa = _int(_read(dev / "numa_node"))
        d["cpu_affinity"] = cpus or None
        d["memory_affinity"] = str(numa) if numa is not None and numa >= 0 else None
        d["processes"] = [{"pid": p, "used_memory_bytes": 8 << 30} for p in processes.get(bdf, [])]
        out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host", help="a directory under tests/fixtures/hosts")
    ap.add_argument("--process", action="append", default=[], metavar="BDF=PID")
    args = ap.parse_args(argv)
    host = ROOT / args.host
    procs: dict[str, list[int]] = {}
    for item in args.process:
        bdf, _, pid = item.partition("=")
        procs.setdefault(bdf, []).append(int(pid))
    devs = devices(host, procs)
    out = host / "nvml" / "state.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {"driver_version": "550.54.15", "devices": devs} if devs else {"init_error": "library_not_found"}
    out.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(devs)} GPU(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
