"""memory, disk, nfs, cpufreq, pressure on good data: the values the GPU diagnosis reads, in base units."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.collectors import load_all
from exporter.collectors.nfs import parse_nfs
from exporter.config import ConfigError, resolve
from exporter.samples.host import CpufreqSample, DiskSample, MemorySample, NfsSample, PressureSample
from exporter.sampling import NoDataError
from tests.support.gctrack import tracked_inside
from tests.support.hosts import CAPTURE, LARGE, exposition, make, run_engine, series


# ---- memory ------------------------------------------------------------------------------------------------
def test_meminfo_kb_are_converted_to_bytes_and_oom_kills_counted() -> None:
    eng = run_engine(make("memory", LARGE))
    m: MemorySample = eng.snapshot.value("memory")
    assert m.total == 1056462060 * 1024 and m.available == 912345672 * 1024
    assert (m.dirty, m.writeback, m.mlocked) == (524288 * 1024, 2048 * 1024, 33554432 * 1024)
    assert m.oom_kills == 3
    s = series(exposition(eng))
    assert s["gpufeed_oom_kills_total"] == 3 and s["gpufeed_memory_mlocked_bytes"] == 33554432 * 1024

def test_kernel_without_oom_kill_counter_exports_no_oom_series(large: Path) -> None:
    (large / "proc" / "vmstat").write_text("nr_free_pages 1\npgfault 2\n")
    eng = run_engine(make("memory", large))
    assert eng.snapshot.status["memory"].success
    assert eng.snapshot.value("memory").oom_kills is None
    assert "gpufeed_oom_kills_total" not in series(exposition(eng))

def test_captured_machine_memory_parses() -> None:
    eng = run_engine(make("memory", CAPTURE))
    assert eng.snapshot.status["memory"].success
    assert eng.snapshot.value("memory").total > 0

# ---- disk --------------------------------------------------------------------------------------------------
def test_whole_nvme_and_sata_disks_only_partitions_loop_and_dm_skipped() -> None:
    eng = run_engine(make("disk", LARGE))
    d: DiskSample = eng.snapshot.value("disk")
    assert sorted(d.devices) == ["nvme0n1", "sda"]
    nvme = d.devices["nvme0n1"]
    assert nvme.reads == 8_812_345 and nvme.read_bytes == 2_097_152_000 * 512
    assert nvme.read_time == 1234.567 and nvme.in_flight == 7 and nvme.io_time == 2345.678
    s = series(exposition(eng))
    assert s['gpufeed_disk_written_bytes_total{device="sda"}'] == 2_345_678 * 512
    assert not [k for k in s if k.startswith("gpufeed_disk_io_now")], "an instant a scrape samples at random"

def test_device_exclude_option_replaces_the_default(large: Path) -> None:
    eng = run_engine(make("disk", large, options={"device-exclude": "^sd"}))
    assert sorted(eng.snapshot.value("disk").devices) == ["dm-0", "loop0", "nvme0n1"]

def test_bad_device_exclude_regex_is_a_config_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--collector\.disk\.device-exclude: bad regular expression"):
        resolve(load_all(), {}, {"collector.disk.device-exclude": "(unclosed"})

def test_without_sys_block_partitions_are_recognised_by_name(large: Path) -> None:
    shutil.rmtree(large / "sys" / "block")
    eng = run_engine(make("disk", large))
    assert sorted(eng.snapshot.value("disk").devices) == ["nvme0n1", "sda"]

def test_captured_machine_disks_skip_loop_and_zram() -> None:
    eng = run_engine(make("disk", CAPTURE))
    devices = eng.snapshot.value("disk").devices
    assert devices and not any(n.startswith(("loop", "zram")) for n in devices)

# ---- nfs ---------------------------------------------------------------------------------------------------
def test_nfs_v3_and_v4_ops_are_mapped_by_kernel_procedure_index_and_summed() -> None:
    eng = run_engine(make("nfs", LARGE))
    n: NfsSample = eng.snapshot.value("nfs")
    assert (n.rpc_calls, n.retransmissions, n.auth_refreshes) == (1_850_000, 37, 0)
    # v3: getattr=5000 lookup=1200 read=30000; v4: read=250000 open=4000 getattr=1500000 lookup=80000
    assert dict(n.ops) == {"getattr": 1_505_000, "lookup": 81_200, "open": 4_000, "read": 280_000}
    s = series(exposition(eng))
    assert s["gpufeed_nfs_rpc_retransmissions_total"] == 37
    assert s['gpufeed_nfs_operations_total{op="open"}'] == 4000

def test_nfs_v4_only_client_on_an_older_kernel_with_fewer_procedures() -> None:
    v4 = ["0"] * 19
    v4[1], v4[4], v4[18] = "11", "22", "33"  # read, open, getattr; lookup (index 19) not present
    n = parse_nfs("rpc 10 1 0\nproc4 19 " + " ".join(v4) + "\n")
    assert dict(n.ops) == {"getattr": 33, "lookup": 0, "open": 22, "read": 11}

def test_no_nfs_client_is_not_available_rather_than_failed(large: Path) -> None:
    (large / "proc" / "net" / "rpc" / "nfs").unlink()
    with pytest.raises(NoDataError):
        make("nfs", large).update()
    eng = run_engine(make("nfs", large))
    st = eng.snapshot.status["nfs"]
    assert not st.available and st.failures == 0
    s = series(exposition(eng))
    assert s['gpufeed_collector_available{collector="nfs"}'] == 0
    assert 'gpufeed_collector_success{collector="nfs"}' not in s

# ---- cpufreq -----------------------------------------------------------------------------------------------
def test_governors_are_counted_and_frequency_ratio_summarised() -> None:
    eng = run_engine(make("cpufreq", LARGE))
    f: CpufreqSample = eng.snapshot.value("cpufreq")
    assert len(f.cpus) == 192 and f.cpus[5].cur_hz == 1_200_000_000 and f.cpus[5].max_hz == 3_800_000_000
    s = series(exposition(eng))
    assert s['gpufeed_cpufreq_governor_cpus{governor="powersave"}'] == 4
    assert s['gpufeed_cpufreq_governor_cpus{governor="performance"}'] == 188
    assert s["gpufeed_cpufreq_current_ratio_min"] == 1_200_000 / 3_800_000
    assert 0 < s["gpufeed_cpufreq_current_ratio_max"] <= 3_700_000 / 3_800_000

def test_a_cpufreq_sample_is_one_object_for_the_cycle_collector_however_many_cpus() -> None:
    eng = run_engine(make("cpufreq", LARGE))
    f: CpufreqSample = eng.snapshot.value("cpufreq")
    assert f.cpus[5].governor is not None and tracked_inside(f.cpus) == [f.cpus]


def test_vm_without_cpufreq_is_not_available() -> None:
    eng = run_engine(make("cpufreq", CAPTURE))  # this machine is a VM: no cpufreq directories
    assert not eng.snapshot.status["cpufreq"].available

def test_unknown_current_frequency_is_left_out_of_the_ratio(large: Path) -> None:
    for cpu in range(192):
        (large / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").write_text("<unknown>\n")
    eng = run_engine(make("cpufreq", large))
    s = series(exposition(eng))
    assert eng.snapshot.status["cpufreq"].success
    assert "gpufeed_cpufreq_current_ratio_min" not in s
    assert s['gpufeed_cpufreq_governor_cpus{governor="powersave"}'] == 4

# ---- pressure ----------------------------------------------------------------------------------------------
def test_psi_totals_are_microseconds_converted_to_seconds() -> None:
    eng = run_engine(make("pressure", LARGE))
    p: PressureSample = eng.snapshot.value("pressure")
    assert p.resources["io"].some == 987.654321 and p.resources["io"].full == 876.54321
    s = series(exposition(eng))
    assert s['gpufeed_pressure_full_stalled_seconds_total{resource="io"}'] == 876.54321

def test_cpu_psi_without_full_line_on_older_kernels(large: Path) -> None:
    (large / "proc" / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=5000000\n")
    eng = run_engine(make("pressure", large))
    assert eng.snapshot.value("pressure").resources["cpu"].full is None
    s = series(exposition(eng))
    assert 'gpufeed_pressure_full_stalled_seconds_total{resource="cpu"}' not in s
    assert s['gpufeed_pressure_stalled_seconds_total{resource="cpu"}'] == 5.0

def test_psi_disabled_at_boot_is_not_available(
    large: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psi=0: the files exist but reading them fails with EOPNOTSUPP."""
    from exporter.collectors import pressure

    real = pressure.read_text  # type: ignore[attr-defined]

    def read_text(path: os.PathLike[str], **k: Any) -> str:
        if Path(path).parent.name == "pressure":
            raise OSError(errno.EOPNOTSUPP, "Operation not supported", str(path))
        return real(path, **k)

    monkeypatch.setattr(pressure, "read_text", read_text)
    eng = run_engine(make("pressure", large))
    assert not eng.snapshot.status["pressure"].available

def test_kernel_without_psi_is_not_available(large: Path) -> None:
    shutil.rmtree(large / "proc" / "pressure")
    eng = run_engine(make("pressure", large))
    assert not eng.snapshot.status["pressure"].available

def test_captured_machine_psi_parses() -> None:
    eng = run_engine(make("pressure", CAPTURE))
    assert eng.snapshot.status["pressure"].success

Unused = Callable[[], None]


def test_hardware_max_frequency_is_cached_and_refreshed_every_12_runs(large: Path) -> None:
    col = make("cpufreq", large)
    assert col.update().cpus[0].max_hz == 3_800_000_000
    (large / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").write_text("4000000\n")  # boost enabled
    for _ in range(11):
        assert col.update().cpus[0].max_hz == 3_800_000_000
    assert col.update().cpus[0].max_hz == 4_000_000_000
