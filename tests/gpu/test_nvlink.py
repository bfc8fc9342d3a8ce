"""NVLink per GPU (exporter/gpu/nvlink.py) against the strict fake: links found once, one batched field call per
GPU and slow cycle, the getters where a driver lacks the fields, and no series at all on PCIe-only GPUs."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pynvml

from exporter.sim.fakenvml import FakeNvml, StateError
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


def links(n: int, **kw: Any) -> list[dict[str, Any]]:
    return [{"remote": "switch", "version": 6, "speed_mbps": 25781, **kw} for _ in range(n)]


def test_pcie_only_gpus_export_no_nvlink_series_and_are_asked_once(rig: MakeRig) -> None:
    r = rig([device(0), device(1)])
    r.run_until(16.0)
    assert not [k for k in r.metrics() if k[0].startswith("gpufeed_gpu_nvlink")]
    assert r.fake.calls["nvmlDeviceGetNvLinkState"] == 2, "link 0 once per GPU: NOT_SUPPORTED means none"
    assert r.history("gpu_slow")[-1][1].gpus[0].nvlink == ()


def test_an_nvswitch_gpu_exports_its_links_state_version_far_end_speed_and_data(rig: MakeRig) -> None:
    nv = links(18, tx_kib=1000, rx_kib=2000)
    nv[5] = {**nv[5], "up": False}
    r = rig([device(0, nvlink=nv), device(1)])
    r.run_until(11.0)
    assert r.value("gpufeed_gpu_nvlink_links_up", gpu="0", links="18", version="6", remote="switch") == 17.0
    assert r.value("gpufeed_gpu_nvlink_capacity_bytes_per_second", gpu="0") == 17 * 25781e6
    assert r.value("gpufeed_gpu_nvlink_bytes_total", gpu="0") == 18 * (1000 + 2000) * 1024
    assert r.value("gpufeed_gpu_nvlink_errors_total", gpu="0") == 0.0
    per_gpu = [k for k in r.metrics() if k[0].startswith("gpufeed_gpu_nvlink")]
    assert len(per_gpu) == 4, "four series per GPU with NVLink, whatever its number of links"
    assert not [k for k in per_gpu if ("gpu", "1") in k[1]], "the PCIe-only GPU 1 has none"
    slow = r.history("gpu_slow")[-1][1].gpus[0]
    assert [ln.link for ln in slow.nvlink if not ln.up] == [5] and slow.nvlink[5].speed_bytes_per_s is None
    # Discovery: 18 links then INVALID_ARGUMENT on the 19th (GPU 0; no 19th where the binding's
    # NVML_NVLINK_MAX_LINKS is 18), NOT_SUPPORTED on link 0 (GPU 1); after that one batched field call per slow
    # cycle carries every link.
    assert r.fake.calls["nvmlDeviceGetNvLinkState"] == min(19, pynvml.NVML_NVLINK_MAX_LINKS) + 1


def test_rising_error_counters_are_counted_per_link(rig: MakeRig) -> None:
    r = rig([device(0, nvlink=links(4))])
    r.at(7.0, lambda st: st["devices"][0]["nvlink"][2].update(replay=40, recovery=2, crc=7))
    r.run_until(22.0)  # the steady GPU's links are read every third slow cycle: within 15 s
    assert r.value("gpufeed_gpu_nvlink_errors_total", gpu="0") == 40.0 + 2 + 7
    slow = r.history("gpu_slow")[-1][1].gpus[0]
    assert dict(slow.nvlink[2].errors) == {"replay": 40, "recovery": 2, "crc": 7}
    assert dict(slow.nvlink[1].errors) == {"replay": 0, "recovery": 0, "crc": 0}


def test_a_driver_without_the_nvlink_fields_is_read_through_the_getters(rig: MakeRig) -> None:
    nv = links(2)
    nv[1] = {**nv[1], "up": False, "replay": 9}
    r = rig([device(0, nvlink=nv, unsupported=["field:165", "field:161", "field:162", "field:163"])])
    r.run_until(11.0)
    assert r.value("gpufeed_gpu_nvlink_links_up", gpu="0", links="2", version="6", remote="switch") == 1.0
    assert r.value("gpufeed_gpu_nvlink_errors_total", gpu="0") == 9.0
    assert r.history("gpu_slow")[-1][1].gpus[0].nvlink[1].errors["replay"] == 9
    assert r.fake.calls["nvmlDeviceGetNvLinkErrorCounter"] > 0


def test_a_link_down_at_discovery_gets_its_version_and_far_end_once_it_comes_up(rig: MakeRig) -> None:
    r = rig([device(0, nvlink=links(2, up=False))])
    r.at(6.0, lambda st: st["devices"][0]["nvlink"][0].update(up=True))
    r.run_until(4.0)
    assert r.value("gpufeed_gpu_nvlink_links_up", gpu="0", links="2", version="", remote="") == 0.0
    r.run_until(21.0)
    assert r.value("gpufeed_gpu_nvlink_links_up", gpu="0", links="2", version="6", remote="switch") == 1.0
    slow = r.history("gpu_slow")[-1][1].gpus[0]
    assert [(ln.version, ln.remote) for ln in slow.nvlink] == [(6, "switch"), (None, "")]


def _reads(r: Rig) -> list[float]:
    """The times of the slow samples that carried a new NVLink reading of GPU 0 (a held one is the same tuple)."""
    out: list[float] = []
    prev = None
    for t, sample in r.history("gpu_slow"):
        links_now = sample.gpus[0].nvlink
        if links_now is not prev:
            out.append(t)
        prev = links_now
    return out


def test_a_steady_gpus_quiet_links_are_read_every_third_slow_cycle_and_errors_bring_back_every_cycle(
        rig: MakeRig) -> None:
    r = rig([device(0, nvlink=links(4, tx_kib=1000))])
    r.at(41.0, lambda st: st["devices"][0]["nvlink"][1].update(replay=3))
    r.run_until(39.0)
    reads = _reads(r)
    assert reads[:2] == [0.0, 5.0], "every cycle until the GPU is steady (10 s without a dip)"
    assert [b - a for a, b in pairwise(reads[1:])] == [15.0, 15.0], reads
    r.run_until(71.0)
    after = [t for t in _reads(r) if t > 40.0]
    assert r.value("gpufeed_gpu_nvlink_errors_total", gpu="0") == 3.0
    assert after[:2] == [after[0], after[0] + 5.0] and after[0] <= 55.0, (
        f"errors moved at the read at {after[0]}: the next cycle reads again ({after})")
    assert after[2] == after[1] + 15.0, "quiet again: every third cycle"


def test_the_fake_refuses_a_bad_link() -> None:
    for bad in ([{"up": "yes"}], [{"remote": "nic"}], [{"speed": 1}], {"up": True}):
        try:
            FakeNvml({"devices": [{"pci_bus_id": "0000:82:00.0", "nvlink": bad}]})
        except StateError:
            continue
        raise AssertionError(f"accepted {bad!r}")
