"""pcie collector on fixture trees: the degraded hop is found where it is, idle links are not faults,
bad files are skipped, and this VM's real /sys degrades quietly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from exporter import linkmath
from exporter.collectors.pcie import PcieCollector
from exporter.samples.topology import PcieLink, PcieSample
from exporter.sampling import CollectorContext, NoDataError
from exporter.sources import KeptFiles
from tests.support.hosts import context, load_tool, snapshot_of
from tests.support.hosts import family_series as series
from tests.support.hosts import family_value as value

GTS = 1e9


def sample_of(name: str | Path, **options: Any) -> tuple[PcieCollector, PcieSample]:
    c = PcieCollector(context(name, options=options))
    return c, c.update()


def metrics_of(c: PcieCollector, s: PcieSample) -> list[Any]:
    return list(c.metrics(snapshot_of("pcie", s)))


def info_of(fams: list[Any], bdf: str) -> dict[str, str]:
    """The labels of a device's gpufeed_pcie_device_info series."""
    return dict(next(k for k in series(fams, "gpufeed_pcie_device_info") if ("bdf", bdf) in k))


def below_limit(link: PcieLink) -> tuple[bool, bool]:
    """(speed below the system limit, width below the system limit) -- what the derived layer checks."""
    assert link.limit_speed_gts is not None and link.limit_width is not None
    assert link.current_speed_gts is not None and link.current_width is not None
    return link.current_speed_gts < link.limit_speed_gts, link.current_width < link.limit_width


# ---- riser box: Gen3 x8 under a Gen4 x16 slot ----------------------------------------------------------------


def test_riser_gpu_chain_shows_the_degraded_hop_at_the_slot_with_gen3_x8_capacity() -> None:
    c, s = sample_of("riser")
    assert s.chains["0000:41:00.0"] == ("0000:40:01.1", "0000:41:00.0")
    gpu, slot = s.devices["0000:41:00.0"], s.devices["0000:40:01.1"]
    assert (gpu.role, gpu.port, gpu.link_peer) == ("gpu", "endpoint", "0000:40:01.1")
    assert (slot.role, slot.port, slot.link_peer, slot.gpu_bdf) == ("bridge", "root_port", "0000:41:00.0",
                                                                      "0000:41:00.0")
    for d in (gpu, slot):
        assert d.link is not None
        assert (d.link.current_speed_gts, d.link.current_width) == (8.0, 8)
        assert (d.link.limit_speed_gts, d.link.limit_width) == (16.0, 16)
        assert below_limit(d.link) == (True, True)
    fams = metrics_of(c, s)
    # Both ends of the one link are at Gen3 x8: the narrowest hop is a tie, exported at the GPU's end.
    cap = value(fams, "gpufeed_pcie_link_capacity_bytes_per_second", bdf="0000:41:00.0")
    assert cap == pytest.approx(linkmath.capacity_bytes_per_second(3, 8))
    assert value(fams, "gpufeed_pcie_link_current_speed_transfers_per_second", bdf="0000:41:00.0") == 8 * GTS
    assert value(fams, "gpufeed_pcie_link_current_speed_transfers_per_second", bdf="0000:40:01.1") is None
    gpu_info = info_of(fams, "0000:41:00.0")
    assert (gpu_info["max_speed"], gpu_info["max_width"]) == ("16.0 GT/s", "16")
    assert (gpu_info["limit_speed"], gpu_info["limit_width"]) == ("16.0 GT/s", "16")
    whole = metrics_of(PcieCollector(context("riser", options={"chain": True})), s)
    assert value(whole, "gpufeed_pcie_link_current_width", bdf="0000:40:01.1", role="bridge",
                 gpu_bdf="0000:41:00.0") == 8
    assert value(whole, "gpufeed_pcie_link_capacity_bytes_per_second", bdf="0000:40:01.1") == pytest.approx(cap)


def test_riser_healthy_gpu_on_the_other_socket_is_at_its_limit() -> None:
    _, s = sample_of("riser")
    link = s.devices["0000:01:00.0"].link
    assert link is not None and below_limit(link) == (False, False)
    assert s.devices["0000:01:00.0"].numa_node == 0 and s.devices["0000:41:00.0"].numa_node == 1
    assert s.devices["0000:41:00.0"].local_cpus == frozenset(range(16, 32))


def test_riser_aer_totals_are_counters_per_severity() -> None:
    c, s = sample_of("riser")
    aer = s.devices["0000:41:00.0"].aer
    assert aer is not None and (aer.correctable, aer.nonfatal, aer.fatal) == (12, 0, 0)
    fams = metrics_of(c, s)
    # By default one total per severity for the GPU's whole path: the GPU's 12 and the slot's 3.
    assert value(fams, "gpufeed_pcie_aer_errors_total", bdf="0000:41:00.0") is None
    assert value(fams, "gpufeed_pcie_aer_errors_total", bdf="0000:40:01.1") is None
    assert value(fams, "gpufeed_pcie_chain_aer_errors_total", gpu_bdf="0000:41:00.0", severity="correctable") == 15
    assert value(fams, "gpufeed_pcie_chain_aer_errors_total", gpu_bdf="0000:41:00.0", severity="fatal") == 0
    whole = metrics_of(PcieCollector(context("riser", options={"chain": True})), s)
    assert value(whole, "gpufeed_pcie_aer_errors_total", bdf="0000:41:00.0", severity="correctable") == 12
    assert value(whole, "gpufeed_pcie_aer_errors_total", bdf="0000:41:00.0", severity="fatal") == 0
    assert value(whole, "gpufeed_pcie_aer_errors_total", bdf="0000:40:01.1", severity="correctable") == 3
    assert series(whole, "gpufeed_pcie_chain_aer_errors_total") == {}  # per device instead: never counted twice


def test_feeders_are_reported_without_their_bridges() -> None:
    _c, s = sample_of("riser")
    roles = {b: d.role for b, d in s.devices.items()}
    assert roles["0000:02:00.0"] == "nvme" and roles["0000:42:00.0"] == "nic"
    assert "0000:00:03.1" not in roles and "0000:40:03.1" not in roles  # bridges only above GPUs
    assert "0000:01:00.1" not in roles  # the GPU's audio function is not a feeder
    nic = s.devices["0000:42:00.0"]
    assert nic.gpu_bdf is None and nic.upstream == ("0000:40:03.1",)
    assert nic.link is not None and (nic.link.limit_speed_gts, nic.link.limit_width) == (5.0, 1)
    _, only_gpus = sample_of("riser", feeders=False)
    assert {d.role for d in only_gpus.devices.values()} == {"gpu", "bridge"}


def test_info_series_carry_vendor_device_class_driver_and_node() -> None:
    c, s = sample_of("riser")
    fams = metrics_of(c, s)
    info = series(fams, "gpufeed_pcie_device_info")
    assert info_of(fams, "0000:41:00.0") == {
        "bdf": "0000:41:00.0", "role": "gpu", "vendor": "0x10de", "device": "0x2230", "class": "0x030000",
        "driver": "nvidia", "gpu_bdf": "0000:41:00.0", "numa_node": "1", "port": "endpoint",
        "max_speed": "16.0 GT/s", "max_width": "16", "limit_speed": "16.0 GT/s", "limit_width": "16"}
    # Every GPU and feeder, and no bridge: each chain's narrowest hop is its GPU's own link here.
    assert len(info) == sum(d.role != "bridge" for d in s.devices.values()) and set(info.values()) == {1.0}
    whole = series(metrics_of(PcieCollector(context("riser", options={"chain": True})), s), "gpufeed_pcie_device_info")
    assert len(whole) == len(s.devices)


# ---- switch_riser: the GPU's own link is fine, the switch's uplink is not -------------------------------------


def test_degraded_switch_uplink_is_found_above_a_healthy_gpu_link() -> None:
    c, s = sample_of("switch_riser")
    chain = s.chains["0000:03:00.0"]
    assert chain == ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0")
    ports = [s.devices[b].port for b in chain]
    assert ports == ["root_port", "upstream_port", "downstream_port", "endpoint"]
    degraded = []
    for b in chain:
        link = s.devices[b].link
        assert link is not None
        if any(below_limit(link)):
            degraded.append(b)
    assert degraded == ["0000:00:01.0", "0000:01:00.0"]  # both ends of the uplink, nothing below it
    assert s.devices["0000:01:00.0"].link_peer == "0000:00:01.0"
    assert s.devices["0000:00:01.0"].link_peer == "0000:01:00.0"
    assert s.devices["0000:02:00.0"].link_peer == "0000:03:00.0"
    fams = metrics_of(c, s)
    # The narrowest hop of the chain is the uplink, at the end nearest the GPU (the switch's upstream port):
    # it is exported by default beside the GPU's own link, with the identity that names it; the healthy hops
    # between them are not.
    cap = value(fams, "gpufeed_pcie_link_capacity_bytes_per_second", bdf="0000:01:00.0", gpu_bdf="0000:03:00.0")
    assert cap == pytest.approx(linkmath.capacity_bytes_per_second(3, 4))
    assert info_of(fams, "0000:01:00.0")["port"] == "upstream_port"
    assert value(fams, "gpufeed_pcie_link_capacity_bytes_per_second", bdf="0000:03:00.0") == pytest.approx(
        linkmath.capacity_bytes_per_second(4, 16))
    for healthy in ("0000:00:01.0", "0000:02:00.0"):
        assert value(fams, "gpufeed_pcie_link_capacity_bytes_per_second", bdf=healthy) is None


def test_bridge_shared_by_two_gpus_appears_once_named_after_the_first_gpu() -> None:
    _c, s = sample_of("switch_riser")
    assert s.chains["0000:04:00.0"][:2] == s.chains["0000:03:00.0"][:2]
    assert s.devices["0000:01:00.0"].gpu_bdf == "0000:03:00.0"
    assert s.devices["0000:02:01.0"].gpu_bdf == "0000:04:00.0"
    cur = series(metrics_of(PcieCollector(context("switch_riser", options={"chain": True})), s),
                 "gpufeed_pcie_link_current_width")
    assert sum(1 for k in cur if ("bdf", "0000:01:00.0") in k) == 1


# ---- DGX-like: 8 GPUs behind switches, one idling at Gen1 --------------------------------------------------


def test_dgx_eight_gpus_each_with_root_port_switch_ports_and_gpu() -> None:
    _c, s = sample_of("dgx")
    gpus = [d for d in s.devices.values() if d.role == "gpu"]
    assert len(gpus) == 8 and len(s.chains) == 8
    for g in gpus:
        chain = s.chains[g.bdf]
        assert len(chain) == 4
        assert [s.devices[b].port for b in chain] == ["root_port", "upstream_port", "downstream_port", "endpoint"]
        assert g.upstream == chain[:-1]
    assert sum(d.role == "bridge" for d in s.devices.values()) == 4 * 2 + 8  # RP+USP per switch, DSP per GPU
    assert sum(d.role == "nic" for d in s.devices.values()) == 4
    assert sum(d.role == "nvme" for d in s.devices.values()) == 4
    assert {g.numa_node for g in gpus} == {0, 1}


def test_idle_gpu_at_gen1_exposes_current_and_max_but_no_downgrade_flag() -> None:
    """Idle GPUs drop to Gen1 by design: the collector records it, it never judges it."""
    c, s = sample_of("dgx")
    link = s.devices["0000:19:00.0"].link
    assert link is not None and link.current_speed_gts == 2.5 and link.limit_speed_gts == 32.0
    assert link.current_width == link.limit_width == 16  # width is the stable signal: not below its limit
    fams = metrics_of(c, s)
    assert value(fams, "gpufeed_pcie_link_current_speed_transfers_per_second", bdf="0000:19:00.0") == 2.5 * GTS
    assert info_of(fams, "0000:19:00.0")["limit_speed"] == "32.0 GT/s"
    assert not [f for f in fams if "downgrade" in f.name]


def test_dgx_exports_one_hop_per_gpu_chain_by_default_and_every_hop_with_the_chain_flag() -> None:
    c, s = sample_of("dgx")
    samples = [smp for f in metrics_of(c, s) for smp in f.samples]
    chain = set(s.chains["0000:18:00.0"])
    assert sum(1 for smp in samples if smp.labels.get("bdf") in chain) == 5  # info, 4 link series
    assert sum(1 for smp in samples if smp.labels.get("gpu_bdf") == "0000:18:00.0"
               and smp.name == "gpufeed_pcie_chain_aer_errors_total") == 3
    # 16 GPUs and feeders x (info, 4 link series) + 8 feeders x 3 AER + 8 chains x 3 AER totals
    assert len(samples) == 16 * 5 + 8 * 3 + 8 * 3
    whole = [smp for f in metrics_of(PcieCollector(context("dgx", options={"chain": True})), s) for smp in f.samples]
    assert sum(1 for smp in whole if smp.labels.get("bdf") in chain) == 4 * 8
    assert len(whole) == 32 * 8  # 8 GPUs, 16 bridges, 8 feeders x (info, 4 link series, 3 AER)


def test_nvidia_gpus_are_listed_before_other_vendors() -> None:
    _, s = sample_of("workstation")
    gpus = [d for d in s.devices.values() if d.role == "gpu"]
    assert [g.vendor for g in gpus] == ["0x10de", "0x8086"]
    igpu = gpus[1]
    assert igpu.link is None and s.chains[igpu.bdf] == (igpu.bdf,)  # integrated: no link, no bridges
    assert igpu.driver == "i915"


def test_single_socket_workstation_has_no_numa_node_and_an_unconstrained_link() -> None:
    _, s = sample_of("workstation")
    gpu = s.devices["0000:01:00.0"]
    assert gpu.numa_node is None  # numa_node -1
    slot = s.devices["0000:00:01.0"]
    # The slot can do Gen5, the card Gen4: the system limit is Gen4, so Gen4 is not a downgrade.
    assert slot.link is not None and slot.link.max_speed_gts == 32.0 and slot.link.limit_speed_gts == 16.0
    assert below_limit(slot.link) == (False, False)


# ---- degrade, don't die ---------------------------------------------------------------------------------------


def test_vm_without_link_files_reports_identity_only() -> None:
    c, s = sample_of("vm")
    gpu = s.devices["0000:00:05.0"]
    assert gpu.link is None and gpu.aer is None and gpu.numa_node is None
    fams = metrics_of(c, s)
    assert series(fams, "gpufeed_pcie_link_current_speed_transfers_per_second") == {}
    assert series(fams, "gpufeed_pcie_aer_errors_total") == {}
    assert len(series(fams, "gpufeed_pcie_device_info")) == 3  # the GPU and two NICs; virtio-blk is not NVMe


def test_this_hosts_real_sys_degrades_quietly() -> None:
    c = PcieCollector(CollectorContext(procfs=Path("/proc"), sysfs=Path("/sys")))
    if not Path("/sys/bus/pci/devices").is_dir():
        with pytest.raises(NoDataError):
            c.update()
        return
    s = c.update()
    list(c.metrics(snapshot_of("pcie", s)))
    for d in s.devices.values():
        assert d.role in ("gpu", "nvme", "nic", "bridge")
        assert d.link is None or d.link.current_speed_gts in (None, *linkmath.GENERATION_GTS.values())
    assert c.update().devices.keys() == s.devices.keys()


def test_garbage_values_are_omitted_never_guessed() -> None:
    c, s = sample_of("garbage")
    assert "0000:00:03.0" not in s.devices  # class "zz": skipped at enumeration
    assert "0000:00:07.0" not in s.devices  # dangling bus link
    bad = s.devices["0000:01:00.0"]
    assert bad.link is not None
    assert (bad.link.current_speed_gts, bad.link.current_width) == (None, None)
    assert (bad.link.max_speed_gts, bad.link.max_width) == (16.0, 16)
    assert bad.numa_node is None and bad.local_cpus == frozenset() and bad.aer is None
    assert s.devices["0000:00:02.0"].link is None and s.devices["0000:00:02.0"].vendor == ""
    down = s.devices["0000:00:04.0"]
    assert down.link is None  # Unknown / width 0 / rates no generation uses
    old = s.devices["0000:00:06.0"]
    assert old.link is not None and old.link.current_speed_gts == 8.0  # "8 GT/s" from an old kernel
    assert old.aer is None  # aer_dev_fatal is a directory
    fams = metrics_of(c, s)
    assert value(fams, "gpufeed_pcie_link_current_speed_transfers_per_second", bdf="0000:01:00.0") is None
    assert value(fams, "gpufeed_pcie_link_capacity_bytes_per_second", bdf="0000:01:00.0") is None
    assert info_of(fams, "0000:01:00.0")["max_width"] == "16"
    assert info_of(fams, "0000:01:00.0")["max_speed"] == "16.0 GT/s"


def test_permission_denied_attribute_is_skipped_and_the_rest_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    real = KeptFiles.read  # link state is read every cycle through kept descriptors

    def read(self: KeptFiles, path: str) -> bytes:
        if path.endswith("/current_link_width") and "0000:41:00.0" in path:
            raise PermissionError(13, "Permission denied", path)
        return real(self, path)

    monkeypatch.setattr(KeptFiles, "read", read)
    _, s = sample_of("riser")
    link = s.devices["0000:41:00.0"].link
    assert link is not None and link.current_width is None and link.current_speed_gts == 8.0
    assert s.devices["0000:40:01.1"].link is not None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 files; the monkeypatched test covers it")
def test_unreadable_mode_000_aer_file_is_skipped(copy_box: Any) -> None:
    root = copy_box("riser")
    f = root / "sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/aer_dev_fatal"
    f.chmod(0)
    _, s = sample_of(root)
    assert s.devices["0000:41:00.0"].aer is None and s.devices["0000:41:00.0"].link is not None


def test_missing_pci_bus_is_no_data_not_a_failure(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    c = PcieCollector(context(tmp_path))
    with pytest.raises(NoDataError, match="bus/pci/devices"):
        c.update()


# ---- link history: changes and flapping ---------------------------------------------------------------------


def test_link_renegotiations_are_counted_per_device(copy_box: Any) -> None:
    root = copy_box("dgx")
    gpu = root / "sys/bus/pci/devices/0000:19:00.0"
    c = PcieCollector(context(root))
    assert c.update().devices["0000:19:00.0"].link_changes == 0
    for speed in ("32.0 GT/s PCIe", "32.0 GT/s PCIe", "2.5 GT/s PCIe", "16.0 GT/s PCIe"):
        (gpu / "current_link_speed").write_text(speed + "\n")
        s = c.update()
    assert s.devices["0000:19:00.0"].link_changes == 3  # 2.5->32, 32->2.5, 2.5->16 (one unchanged cycle)
    assert s.devices["0000:18:00.0"].link_changes == 0
    fams = metrics_of(c, s)
    assert value(fams, "gpufeed_pcie_link_changes_total", bdf="0000:19:00.0") == 3
    (gpu / "current_link_width").write_text("8\n")
    assert c.update().devices["0000:19:00.0"].link_changes == 4


def test_link_files_are_reread_every_cycle_but_devices_enumerated_once(copy_box: Any) -> None:
    root = copy_box("riser")
    c = PcieCollector(context(root, options={"interval": 5.0, "rescan-interval": 60.0}))
    c.update()
    (root / "sys/bus/pci/devices/0000:41:00.0/current_link_width").write_text("16\n")
    link = c.update().devices["0000:41:00.0"].link
    assert link is not None and link.current_width == 16
    # Replaced by a rename (the simulator's and a capture tool's way): a new file at the same path.
    attr = root / "sys/bus/pci/devices/0000:41:00.0/current_link_width"
    (attr.parent / ".new").write_text("4\n")
    os.replace(attr.parent / ".new", attr)
    link = c.update().devices["0000:41:00.0"].link
    assert link is not None and link.current_width == 4
    assert c.scans == 1


def test_a_devices_link_capability_is_read_once_per_enumeration(copy_box: Any) -> None:
    """max_link_{speed,width} is the Link Capabilities register, fixed while the device is present: read at the
    first cycle after each enumeration, not at every cycle (the current link is)."""
    root = copy_box("riser")
    c = PcieCollector(context(root, options={"interval": 5.0, "rescan-interval": 60.0}))
    before = c.update().devices["0000:41:00.0"].link
    assert before is not None and before.max_width == 16
    (root / "sys/bus/pci/devices/0000:41:00.0/max_link_width").write_text("8\n")
    link = c.update().devices["0000:41:00.0"].link
    assert link is not None and link.max_width == 16, "kept until the next enumeration"
    c.request_rescan("test")
    link = c.update().devices["0000:41:00.0"].link
    assert link is not None and link.max_width == 8 and c.scans == 2


def test_an_unchanged_device_keeps_its_sample_object_until_a_new_enumeration_reads_it_again(copy_box: Any) -> None:
    """A cycle where nothing moved reuses last cycle's device (no copy); a re-enumeration's identity (a rebound
    driver) is never hidden behind the old object, though its link and AER counters did not move."""
    root = copy_box("riser")
    c = PcieCollector(context(root, options={"interval": 5.0, "rescan-interval": 60.0}))
    first = c.update().devices["0000:41:00.0"]
    again = c.update().devices["0000:41:00.0"]
    assert again is first and again.driver == "nvidia"
    driver = root / "sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/driver"
    driver.unlink()
    os.symlink("../../../../bus/pci/drivers/vfio-pci", driver)
    c.request_rescan("test")
    rebound = c.update().devices["0000:41:00.0"]
    assert rebound.driver == "vfio-pci" and rebound.link == first.link and rebound.aer == first.aer
    assert c.scans == 2


def test_bridge_directly_above_a_gpu_is_its_link_partner_even_when_the_switch_uplink_is_hidden(
    tmp_path: Path,
) -> None:
    """Root port -> one bridge -> GPU (a switch whose upstream port is not visible, as in some VMs and in
    the simulator): the bridge next to the GPU is the other end of the GPU's link, not an upstream port."""
    mk = load_tool("make_sysfs_fixtures")
    sys_root = tmp_path / "sys"
    rp = "pci0000:80/0000:80:03.1"
    for d in (
        mk.dev(rp, mk.ROOT_PORT_AMD, driver="pcieport", link=(4, 16, 4, 16)),
        mk.dev(f"{rp}/0000:81:00.0", mk.PEX_SWITCH, driver="pcieport", link=(3, 8, 4, 16)),
        mk.dev(f"{rp}/0000:81:00.0/0000:82:00.0", mk.A6000, driver="nvidia", link=(3, 8, 4, 16)),
    ):
        mk.write_dev(sys_root, d)
    _, s = sample_of(tmp_path)
    assert [s.devices[b].port for b in s.chains["0000:82:00.0"]] == ["root_port", "downstream_port", "endpoint"]
    assert s.devices["0000:81:00.0"].link_peer == "0000:82:00.0"
    assert s.devices["0000:80:03.1"].link_peer == "0000:81:00.0"


def test_failed_enumeration_is_retried_on_the_next_cycle(copy_box: Any) -> None:
    root = copy_box("riser")
    bus = root / "sys/bus/pci/devices"
    c = PcieCollector(context(root))
    assert "0000:41:00.0" in c.update().devices
    c.request_rescan("test")
    hidden = root / "sys/bus/pci/hidden"
    bus.rename(hidden)
    with pytest.raises(NoDataError):
        c.update()
    hidden.rename(bus)
    assert "0000:41:00.0" in c.update().devices
    assert c.scans == 2
