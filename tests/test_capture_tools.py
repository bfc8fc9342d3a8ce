"""tools/capture_sysfs.py: a capture of a box reads back exactly like the box (so real GPU-host captures
can become fixtures), and it runs on this VM's real /sys."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

from exporter.collectors.numa import NumaCollector
from exporter.collectors.pcie import PcieCollector
from tests.support.hosts import box, context, load_tool


def tool() -> ModuleType:
    return load_tool("capture_sysfs")


@pytest.mark.parametrize("name", ["dgx", "riser", "switch_riser", "workstation"])
def test_capture_of_a_box_reads_back_identically(name: str, tmp_path: Path) -> None:
    out = tmp_path / "cap"
    pids = [4242, 4243] if name == "riser" else []
    assert tool().main(["--sysfs", str(box(name) / "sys"), "--procfs", str(box(name) / "proc"),
                        "--out", str(out), *[f"--pid={p}" for p in pids]]) == 0
    for link in (out / "sys/bus/pci/devices").iterdir():
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    assert PcieCollector(context(out)).update() == PcieCollector(context(name)).update()
    opts = {"pids": ("0000:01:00.0=4242", "0000:41:00.0=4243")} if pids else {}
    assert NumaCollector(context(out, options=opts)).update() == NumaCollector(context(name, options=opts)).update()


def test_capture_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    out.mkdir()
    assert tool().main(["--sysfs", str(box("vm") / "sys"), "--out", str(out)]) == 1
    assert tool().main(["--sysfs", str(box("vm") / "sys"), "--out", str(out), "--force"]) == 0


def test_capture_of_this_hosts_real_sys_is_a_usable_fixture(tmp_path: Path) -> None:
    if not Path("/sys/bus/pci/devices").is_dir():
        pytest.skip("no PCI bus on this host")
    out = tmp_path / "cap"
    assert tool().main(["--out", str(out), "--all"]) == 0
    captured = PcieCollector(context(out)).update()
    assert captured.devices.keys() == PcieCollector(context(Path("/"))).update().devices.keys()
