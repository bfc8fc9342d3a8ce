"""The nic collector on the kernel-documented layout of four HDR HCAs beside a DGX's GPUs, and on this machine's own
interfaces against the kernel's /proc/net/dev."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from exporter.collectors.nic import ETHERNET, NicCollector, _Adapter, parse_ib_rate, parse_ib_state
from exporter.samples.topology import NicPort, NicSample
from exporter.sampling import CollectorContext, NoDataError, Targets
from tests.support.hosts import HOSTS, REPO, snapshot_of
from tests.support.hosts import family_series as series

OVERLAY = REPO / "tests" / "fixtures" / "nic" / "sys"
DGX_GPUS = ("0000:18:00.0", "0000:19:00.0", "0000:38:00.0", "0000:39:00.0", "0000:98:00.0", "0000:99:00.0",
            "0000:b8:00.0", "0000:b9:00.0")


@pytest.fixture
def dgx_nics(tmp_path: Path) -> Path:
    """The dgx host's sysfs with the adapter overlay laid over it."""
    sys_root = tmp_path / "sys"
    shutil.copytree(HOSTS / "dgx" / "sys", sys_root, symlinks=True)
    shutil.copytree(OVERLAY / "class", sys_root / "class", symlinks=True)
    return sys_root


def collector(sysfs: Path, gpus: tuple[str, ...] = DGX_GPUS, **options: Any) -> NicCollector:
    targets = Targets()
    targets.publish({str(i): () for i in range(len(gpus))}, {str(i): b for i, b in enumerate(gpus)})
    opts = {"interval": 5.0, "all": False, "rescan-interval": 60.0, **options}
    return NicCollector(CollectorContext(procfs=sysfs.parent / "proc", sysfs=sysfs, options=opts, targets=targets))


def flat(fams: list[Any], name: str) -> dict[str, float]:
    """Samples of ``name`` keyed by their labels as ``k=v`` pairs joined with commas."""
    return {",".join(f"{k}={v}" for k, v in labels): value for labels, value in series(fams, name).items()}


def by_key(sample: NicSample) -> dict[str, NicPort]:
    return {p.key: p for p in sample.ports}


def test_each_hca_is_reported_with_the_two_gpus_on_its_pcie_switch(dgx_nics: Path) -> None:
    ports = by_key(collector(dgx_nics).update())
    assert sorted(ports) == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1"]  # ib0 (IPoIB) and lo are no adapters
    assert ports["mlx5_0/1"].gpus == ("0000:18:00.0", "0000:19:00.0")
    assert ports["mlx5_3/1"].gpus == ("0000:b8:00.0", "0000:b9:00.0")
    assert ports["mlx5_0/1"].bdf == "0000:1a:00.0" and ports["mlx5_0/1"].kind == "infiniband"
    assert ports["mlx5_0/1"].model == "MT4123"


def test_data_counters_are_four_byte_words_converted_to_bytes(dgx_nics: Path) -> None:
    p = by_key(collector(dgx_nics).update())["mlx5_0/1"]
    assert p.rx_bytes == 4 * 1_000_000_000 and p.tx_bytes == 4 * 500_000_000


def test_port_at_half_its_siblings_rate_has_their_rate_as_capable(dgx_nics: Path) -> None:
    ports = by_key(collector(dgx_nics).update())
    assert ports["mlx5_2/1"].rate_bps == 100e9 and ports["mlx5_2/1"].capable_bps == 200e9
    assert ports["mlx5_0/1"].rate_bps == ports["mlx5_0/1"].capable_bps == 200e9


def test_down_port_has_no_rate_but_keeps_its_counters(dgx_nics: Path) -> None:
    p = by_key(collector(dgx_nics).update())["mlx5_3/1"]
    assert p.up is False and p.rate_bps is None and p.errors["symbol_error"] == 0


def test_error_counters_by_the_kernels_file_names(dgx_nics: Path) -> None:
    p = by_key(collector(dgx_nics).update())["mlx5_1/1"]
    assert dict(p.errors) == {"symbol_error": 3, "link_downed": 1, "port_rcv_errors": 2, "link_error_recovery": 1}


def test_a_port_keeps_the_best_rate_it_reached_as_capable_after_training_down(dgx_nics: Path) -> None:
    c = collector(dgx_nics)
    c.update()
    for name in ("mlx5_0", "mlx5_1", "mlx5_3"):  # only the one port left: no sibling says what it can do
        shutil.rmtree(dgx_nics / "class" / "infiniband" / name)
    rate = dgx_nics / "class" / "infiniband" / "mlx5_2" / "ports" / "1" / "rate"
    rate.write_text("200 Gb/sec (4X HDR)\n")
    c2 = collector(dgx_nics)
    assert by_key(c2.update())["mlx5_2/1"].capable_bps == 200e9
    rate.write_text("100 Gb/sec (2X HDR)\n")
    p = by_key(c2.update())["mlx5_2/1"]
    assert p.rate_bps == 100e9 and p.capable_bps == 200e9


def test_adapters_beside_no_gpu_are_left_out_unless_all(dgx_nics: Path) -> None:
    assert sorted(by_key(collector(dgx_nics, gpus=("0000:18:00.0",)).update())) == ["mlx5_0/1"]
    assert len(collector(dgx_nics, gpus=("0000:18:00.0",), all=True).update().ports) == 4


def test_exposition_names_the_port_and_its_gpus(dgx_nics: Path) -> None:
    c = collector(dgx_nics)
    sample = c.update()
    fams = list(c.metrics(snapshot_of("nic", sample)))
    info = flat(fams, "gpufeed_nic_info")
    assert info["adapter=mlx5_0,bdf=0000:1a:00.0,capable_rate=200000000000,gpus=0000:18:00.0,0000:19:00.0,"
                "kind=infiniband,model=MT4123,numa_node=0,port=1"] == 1.0
    assert flat(fams, "gpufeed_nic_rate_bits_per_second") == {
        "adapter=mlx5_0,port=1": 200e9, "adapter=mlx5_1,port=1": 200e9, "adapter=mlx5_2,port=1": 100e9,
        "adapter=mlx5_3,port=1": 0.0}, "a port whose link is down reads 0"
    errors = flat(fams, "gpufeed_nic_errors_total")
    for p in sample.ports:
        assert errors[f"adapter={p.adapter},port={p.port}"] == sum(p.errors.values()), "summed per port"
    assert by_key(sample)["mlx5_1/1"].errors["symbol_error"] == 3 and errors["adapter=mlx5_1,port=1"] >= 3
    assert not series(fams, "gpufeed_nic_receive_bytes_total"), "byte counters only with --collector.nic.traffic"
    assert len([f for f in fams if f.samples]) == 3 and sum(len(f.samples) for f in fams) == 3 * len(sample.ports)


def test_the_byte_counters_are_exported_with_traffic(dgx_nics: Path) -> None:
    c = collector(dgx_nics, traffic=True)
    fams = list(c.metrics(snapshot_of("nic", c.update())))
    assert flat(fams, "gpufeed_nic_receive_bytes_total")["adapter=mlx5_0,port=1"] == 4e9
    assert "adapter=mlx5_0,port=1" in flat(fams, "gpufeed_nic_transmit_bytes_total")


def test_no_class_directories_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    with pytest.raises(NoDataError):
        collector(tmp_path / "sys").update()


@pytest.mark.parametrize(("text", "bps"), [("400 Gb/sec (4X NDR)", 400e9), ("2.5 Gb/sec (1X SDR)", 2.5e9),
                                           ("garbage", None)])
def test_ib_rate_strings(text: str, bps: float | None) -> None:
    assert parse_ib_rate(text) == bps


def test_ib_state_names() -> None:
    assert parse_ib_state("4: ACTIVE") == "ACTIVE" and parse_ib_state("5: LinkUp") == "LinkUp"


# ---- this machine: the Ethernet reader against the kernel's own counters --------------------------------------

def proc_net_dev() -> dict[str, tuple[int, int, int, int]]:
    """/proc/net/dev: interface -> (rx_bytes, rx_errs, tx_bytes, tx_errs) (net/core/net-procfs.c)."""
    out = {}
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        v = [int(x) for x in rest.split()]
        out[name.strip()] = (v[0], v[2], v[8], v[10])
    return out


@pytest.mark.skipif(not Path("/sys/class/net").is_dir() or not Path("/proc/net/dev").exists(),
                    reason="no /sys/class/net or /proc/net/dev")
def test_ethernet_counters_agree_with_proc_net_dev_on_this_machine() -> None:
    """Both files come from the kernel's dev_get_stats; the sysfs read lies between two /proc/net/dev reads."""
    c = collector(Path("/sys"), gpus=(), all=True)
    before = proc_net_dev()
    sample = c.update()
    after = proc_net_dev()
    physical = [p for p in sample.ports if p.kind == "ethernet"]
    for p in physical:
        assert p.rx_bytes is not None and p.tx_bytes is not None
        assert before[p.adapter][0] <= p.rx_bytes <= after[p.adapter][0]
        assert before[p.adapter][2] <= p.tx_bytes <= after[p.adapter][2]
        assert before[p.adapter][1] <= p.errors["rx_errors"] <= after[p.adapter][1]
    # lo has no device link: never an adapter, but the same reader agrees with the kernel on it too
    assert all(p.adapter != "lo" for p in sample.ports)
    lo = _Adapter("lo", "", ETHERNET, "", "", Path("/sys/class/net/lo"), (), None)
    b = proc_net_dev()["lo"]
    port = c._read_net(lo, ())
    a = proc_net_dev()["lo"]
    assert port.rx_bytes is not None and b[0] <= port.rx_bytes <= a[0]
    assert port.tx_bytes is not None and b[2] <= port.tx_bytes <= a[2]
    assert port.rate_bps is None  # lo's speed answers EINVAL: no rate, not a failure
