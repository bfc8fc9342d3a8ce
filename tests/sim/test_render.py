"""Renderer properties, read back through the real collectors: counters are exact integrals of the
scenario's rates, never go backwards, wrap like the driver's, and the same seed gives the same bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.collectors import load_all
from exporter.engine import VirtualClock
from exporter.samples.gpu import GpuFast, GpuSample
from exporter.samples.host import CpuSample, DiskSample, MemorySample, NfsSample, PressureSample, ProcSample
from exporter.sampling import Collector, CollectorContext
from exporter.sim.fakenvml import FakeNvml
from exporter.sim.model import Model
from exporter.sim.render import Renderer, nvml_state
from exporter.sim.scenario import Scenario, load
from exporter.sources import USER_HZ

HERE = Path(__file__).resolve().parent
RATES = HERE / "scenarios" / "rates.yaml"
SHARED = HERE.parent / "scenarios"


@pytest.fixture(scope="module")
def rates() -> Scenario:
    return load(RATES)


@pytest.fixture
def tree(tmp_path: Path, rates: Scenario) -> Iterator[tuple[Model, Renderer]]:
    model = Model(rates)
    r = Renderer(model, tmp_path)
    r.setup()
    yield model, r


def _collector(name: str, root: Path, **options: Any) -> Collector:
    cls = load_all()[name]
    ctx = CollectorContext(procfs=root / "proc", sysfs=root / "sys", options=options)
    return cls(ctx)


def _read(root: Path) -> dict[str, Any]:
    """Everything the host collectors see in the rendered tree."""
    proc = _collector("proc", root, pids=(1000, 2000))
    return {
        "cpu": _collector("cpu", root).update(),
        "disk": _collector("disk", root).update(),
        "nfs": _collector("nfs", root).update(),
        "pressure": _collector("pressure", root).update(),
        "memory": _collector("memory", root).update(),
        "proc": proc.update_threads(),  # type: ignore[attr-defined]
    }


def _counters(s: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    cpu: CpuSample = s["cpu"]
    for c, t in cpu.cpus.items():
        for mode in ("user", "system", "idle", "iowait", "irq", "softirq"):
            out[f"cpu{c}.{mode}"] = getattr(t, mode)
    disk: DiskSample = s["disk"]
    for d, st in disk.devices.items():
        for f in ("reads", "read_bytes", "read_time", "writes", "write_bytes", "write_time", "io_time"):
            out[f"{d}.{f}"] = getattr(st, f)
    nfs: NfsSample = s["nfs"]
    out["nfs.calls"] = nfs.rpc_calls
    out["nfs.retrans"] = nfs.retransmissions
    for op, n in nfs.ops.items():
        out[f"nfs.{op}"] = n
    psi: PressureSample = s["pressure"]
    for res, tot in psi.resources.items():
        out[f"psi.{res}.some"] = tot.some
        if tot.full is not None:
            out[f"psi.{res}.full"] = tot.full
    mem: MemorySample = s["memory"]
    out["oom"] = float(mem.oom_kills or 0)
    procs: ProcSample = s["proc"]
    for pid, p in procs.processes.items():
        out[f"pid{pid}.utime"], out[f"pid{pid}.stime"] = p.utime, p.stime
        out[f"pid{pid}.rchar"], out[f"pid{pid}.syscr"] = float(p.io_rchar or 0), float(p.io_syscr or 0)
        for th in p.threads:
            out[f"tid{th.tid}.utime"], out[f"tid{th.tid}.stime"] = th.utime, th.stime
    return out


def test_counters_never_go_backwards_across_phases_and_loops(tree: tuple[Model, Renderer]) -> None:
    _model, r = tree
    prev: dict[str, float] | None = None
    # Through both phases, the phase boundary, the end of the timeline and into the second loop.
    for t in (0.0, 0.05, 3.3, 9.99, 19.95, 20.0, 20.07, 33.3, 39.9, 40.0, 41.7, 60.0, 79.99, 85.0):
        r.render(t)
        cur = _counters(_read(r.root))
        if prev is not None:
            back = {k: (prev[k], v) for k, v in cur.items() if v < prev[k]}
            assert not back, f"t={t}: counters went backwards: {back}"
        prev = cur


def _rate(a: dict[str, float], b: dict[str, float], key: str, dt: float) -> float:
    return (b[key] - a[key]) / dt


def test_rates_are_recovered_within_one_percent_from_two_renders(tree: tuple[Model, Renderer]) -> None:
    _model, r = tree
    t1, t2 = 4.0, 16.0
    r.render(t1)
    a = _counters(_read(r.root))
    r.render(t2)
    b = _counters(_read(r.root))
    dt = t2 - t1
    # thread 1000 (0.6 user + 0.3 system) shares core 0 with 0.17 of background: capped to one core.
    scale = (1 - 0.17) / 0.9
    want = {
        "nvme0n1.reads": 1000, "nvme0n1.read_bytes": 4.0e8, "nvme0n1.writes": 100, "nvme0n1.write_bytes": 1.0e7,
        "nvme0n1.read_time": 1000 * 0.5e-3, "nvme0n1.write_time": 100 * 0.5e-3, "nvme0n1.io_time": 1100 * 0.5e-3,
        "nfs.read": 500, "nfs.getattr": 2000, "nfs.open": 100, "nfs.lookup": 50, "nfs.calls": 2650,
        "nfs.retrans": 5, "psi.cpu.some": 0.1, "psi.io.some": 0.3, "psi.io.full": 0.2, "psi.memory.some": 0.05,
        "psi.memory.full": 0.01, "oom": 0.5, "pid1000.rchar": 1.0e8, "pid1000.syscr": 1000,
        "pid1000.utime": 0.6 * scale + 2 * 0.5, "pid1000.stime": 0.3 * scale + 2 * 0.1,
        "tid1000.utime": 0.6 * scale, "tid1001.utime": 0.5, "tid1001.stime": 0.1, "tid1003.utime": 0.0,
        "pid2000.utime": 0.2, "pid2000.stime": 0.05,
        "cpu0.user": 0.05 + 0.6 * scale, "cpu0.system": 0.02 + 0.3 * scale, "cpu0.iowait": 0.1, "cpu0.idle": 0.0,
        "cpu4.user": 0.05 + 0.2, "cpu4.system": 0.02 + 0.05, "cpu7.user": 0.5, "cpu7.system": 0.02,
        "cpu7.idle": 1 - 0.5 - 0.02 - 0.1, "cpu5.idle": 1 - 0.17,
    }
    for key, rate in want.items():
        got = _rate(a, b, key, dt)
        assert got == pytest.approx(rate, rel=0.01, abs=1.5 / USER_HZ / dt), key


def test_thread_load_goes_on_least_loaded_allowed_core_lowest_first(tree: tuple[Model, Renderer]) -> None:
    _model, r = tree
    r.render(5.0)
    procs: ProcSample = _read(r.root)["proc"]
    where = {th.tid: (th.processor, th.state) for p in procs.processes.values() for th in p.threads}
    # 1000: busy threads on cores 0, 1, 2 in tid order; idle ones on the least-loaded remaining (3).
    assert where[1000] == (0, "R") and where[1001] == (1, "S") and where[1002] == (2, "S")
    assert where[1003][0] == 3
    # 2000 is allowed 4-7; core 7 carries a 0.5 user override, so the thread lands on 4.
    assert where[2000] == (4, "D")


def test_square_wave_and_noise_integrals_are_exact(rates: Scenario) -> None:
    model = Model(rates)
    busy = model.gpu_tracks[1]["gpu_util"]  # square: 1.0 for 0.5 s of every 2 s, phase "first" (20 s)
    assert busy.integral(0.25) == pytest.approx(0.25)
    assert busy.integral(1.0) == pytest.approx(0.5)
    assert busy.integral(20.0) == pytest.approx(5.0)
    assert busy.at(0.4) == 1.0 and busy.at(0.6) == 0.0 and busy.at(2.1) == 1.0
    # Phase "second" carries the square over; its periods start at the phase start (t=20).
    assert busy.integral(20.5) == pytest.approx(5.5)
    noisy = Model(load(SHARED / "latency_bound_inference.yaml")).gpu_tracks[0]["gpu_util"]
    # Piecewise constant on the 100 ms grid: the integral over a step is its value x 0.1.
    assert noisy.integral(1.2) - noisy.integral(1.1) == pytest.approx(0.1 * noisy.at(1.15))
    assert 0.2 < noisy.integral(90.0) / 90.0 < 0.28


def test_pcie_byte_counters_wrap_like_the_driver_and_the_gpu_collector_unwraps_them(rates: Scenario) -> None:
    model = Model(rates)
    clock = VirtualClock(0.0)
    fake = FakeNvml(nvml_state(model, 0.0))
    fake.nvmlInit()  # the test's own handle on the fake, besides the collector's
    ctx = CollectorContext(procfs=Path("/nonexistent"), sysfs=Path("/nonexistent"),
                           nvml=fake, clock=clock.now)
    gpu = load_all()["gpu"](ctx)
    last: GpuSample | None = None
    wrapped = False
    for k in range(0, 101):  # 10 s at 100 ms: 7.2 GB/s wraps a 32-bit counter every ~0.6 s
        t = k * 0.1
        clock.set(t)
        fake.set_state(nvml_state(model, t))
        raw = fake.nvmlDeviceGetFieldValues(fake.nvmlDeviceGetHandleByIndex(0), [198])[0].value.uiVal
        wrapped |= raw < int(model.gpu_tracks[0]["pcie_rx_bytes_per_s"].integral(t))
        last = gpu.update()
    assert wrapped, "the fake never reported a wrapped 32-bit value"
    assert last is not None
    fast = last.gpus[0]
    assert isinstance(fast, GpuFast)
    assert fast.pcie_rx_bytes_total is not None and fast.pcie_tx_bytes_total is not None
    # Unwrapped totals since the first read equal the integral of the rate over the same 10 s.
    assert fast.pcie_rx_bytes_total == pytest.approx(7.2e9 * 10.0, rel=1e-6)
    assert fast.pcie_tx_bytes_total == pytest.approx(1.0e8 * 10.0, rel=1e-6)


def _tree_bytes(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_bytes()
    return out


def test_same_seed_gives_the_same_bytes_whatever_the_render_order(tmp_path: Path) -> None:
    sc = load(SHARED / "healthy_training.yaml")  # noise on several keys
    a, b = Renderer(Model(sc), tmp_path / "a"), Renderer(Model(sc), tmp_path / "b")
    a.render(47.3)
    for t in (80.0, 12.0, 47.3):  # out of order, and past the same time
        b.render(t)
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")
    assert nvml_state(Model(sc), 47.3) == nvml_state(Model(sc), 47.3)
    other = load(SHARED / "healthy_training.yaml")
    reseeded = Model(type(other)(**{**{f: getattr(other, f) for f in other.__dataclass_fields__}, "seed": 2}))
    assert nvml_state(reseeded, 47.3) != nvml_state(Model(sc), 47.3)


def test_pci_devices_sit_under_their_bridges_with_relative_links(tree: tuple[Model, Renderer]) -> None:
    _model, r = tree
    r.render(25.0)  # phase "second": GPU 0 link at Gen1 (x16 carried over from the max)
    sysfs = r.root / "sys"
    link = sysfs / "bus" / "pci" / "devices" / "0000:82:00.0"
    assert link.is_symlink() and not os.readlink(link).startswith("/")
    real = link.resolve()
    assert real == (sysfs / "devices" / "pci0000:80" / "0000:80:01.0" / "0000:81:00.0" / "0000:82:00.0").resolve()
    assert (real / "vendor").read_text() == "0x10de\n" and (real / "class").read_text() == "0x030200\n"
    assert (real / "driver").resolve().name == "nvidia"
    assert (real / "current_link_speed").read_text() == "2.5 GT/s PCIe\n"
    assert (real / "max_link_speed").read_text() == "32.0 GT/s PCIe\n"
    # The downstream port above the GPU is the other end of the same link.
    assert (real.parent / "current_link_speed").read_text() == "2.5 GT/s PCIe\n"
    assert (real.parent.parent / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"
    assert "TOTAL_ERR_COR 75\n" in (real / "aer_dev_correctable").read_text()  # 3/s for the 20 s + 5 s at 0
    assert (sysfs / "devices" / "system" / "node" / "node1" / "cpulist").read_text() == "4-7\n"
    assert (sysfs / "devices" / "system" / "cpu" / "cpu3" / "cpufreq" / "scaling_governor").read_text() == \
        "powersave\n"
    assert os.readlink(sysfs / "block" / "sda") == "../devices/virtual/block/sda"


def test_fake_nvml_and_sysfs_agree_on_the_link(tree: tuple[Model, Renderer]) -> None:
    model, r = tree
    for t, gen in ((5.0, 5), (25.0, 1)):
        r.render(t, ["pcie"])
        fake = FakeNvml(nvml_state(model, t))
        fake.nvmlInit()
        h = fake.nvmlDeviceGetHandleByIndex(0)
        assert fake.nvmlDeviceGetCurrPcieLinkGeneration(h) == gen
        sysfs = (r.root / "sys" / "bus" / "pci" / "devices" / "0000:82:00.0" / "current_link_speed").read_text()
        assert sysfs.split()[0] == {5: "32.0", 1: "2.5"}[gen]
