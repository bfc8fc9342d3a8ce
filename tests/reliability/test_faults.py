"""Fault injection on a whole simulated host: every collector at once, one fault at a time.

For each fault: the affected collector reports it (``gpufeed_collector_success`` 0, or the documented
degraded outcome), every other collector keeps its success and its series, the log says what happened
once (not every cycle), and when the fault clears the collector comes back by itself. The table of
outcomes is in docs/reliability.md.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from exporter import log, names
from exporter.derived.cadence import QUIET_INTERVALS
from tests.support.nvmlsurface import backend_functions

from .faults import GPU1, GPU_PID, OTHER_GPU_PID, Host, nvml_state, scratch_dir

OWN = {  # which series each collector owns (to check that "nothing else changes")
    "cpu": ("gpufeed_cpu_",), "memory": ("gpufeed_memory_",), "disk": ("gpufeed_disk_",),
    "pressure": ("gpufeed_pressure_",), "nfs": ("gpufeed_nfs_",), "cpufreq": ("gpufeed_cpufreq_",),
    "proc": ("gpufeed_process_cpu", "gpufeed_process_read", "gpufeed_process_threads", "gpufeed_process_hot",
             "gpufeed_process_d_state"),
    "numa": ("gpufeed_process_numa", "gpufeed_gpu_numa"), "pcie": ("gpufeed_pcie_",),
    "gpu": ("gpufeed_gpu_",),
}
VOLATILE = re.compile(r"^gpufeed_(collector_duration_seconds|sampler_|build_info)")


@pytest.fixture(autouse=True)
def _fresh_log_once() -> Iterator[None]:
    """log.once is process-wide: each test must see first occurrences."""
    yield
    with log._once_lock:
        log._once_keys.clear()


@pytest.fixture
def root() -> Iterator[Path]:
    d = scratch_dir()
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def host(root: Path) -> Host:
    h = Host(root)
    h.run(2.0)
    assert set(h.success().values()) == {1.0}, h.success()
    return h




def owned_by(name: str, collectors: tuple[str, ...]) -> bool:
    return any(name.startswith(p) for c in collectors for p in OWN[c])


def untouched(before: dict[str, float], after: dict[str, float], affected: tuple[str, ...]) -> list[str]:
    """Series of the other collectors that disappeared (derived cross-collector outputs excluded)."""
    return [k for k in before if k not in after and not VOLATILE.match(k) and not owned_by(k, affected)
            and any(owned_by(k, (c,)) for c in OWN)]


def events(
    logs: Sequence[MutableMapping[str, Any]], name: str, collector: str | None = None
) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name and (collector is None or e.get("collector") == collector)]


# ---- procfs / sysfs files: missing, empty, truncated, garbage, permission denied --------------------------

FILES = {"cpu": "proc/stat", "memory": "proc/meminfo", "disk": "proc/diskstats", "pressure": "proc/pressure/cpu"}
# No GPU of the fault host waits: its host samplers run at their quiet pace, so a fault is seen (and its repair)
# within one quiet interval.
QUIET_S = max(QUIET_INTERVALS[c] for c in FILES)
KINDS = ("missing", "empty", "truncated", "garbage", "denied")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("collector", sorted(FILES))
def test_broken_source_file_fails_only_its_collector_logs_once_and_recovers(
    host: Host, deny: Callable[[Path, int], None], collector: str, kind: str
) -> None:
    rel = FILES[collector]
    path = host.root / rel
    before = host.series()
    good = path.read_bytes()
    with capture_logs() as logs:
        if kind == "missing":
            path.unlink()
        elif kind == "empty":
            host.replace(rel, b"")
        elif kind == "truncated":
            host.replace(rel, good[: len(good) // 3].rsplit(b" ", 1)[0])
        elif kind == "garbage":
            host.replace(rel, b"\x00\xff\xfe garbage \x1b[31m\n\x00")
        else:
            deny(path, errno.EACCES)
        host.run(QUIET_S + 1.0)  # a cycle of the failing sampler at least (its quiet pace), several of the others
        during = host.series()
        success = host.success()
    if (collector, kind) == ("pressure", "missing"):
        # One PSI file absent while the others exist is a resource this kernel does not report: it is left
        # out, the rest is exported (documented degrade, not a failure).
        assert success[collector] == 1.0 and not events(logs, "collector_failed")
        assert not [k for k in during if k.startswith("gpufeed_pressure_") and 'resource="cpu"' in k]
        assert [k for k in during if k.startswith("gpufeed_pressure_") and 'resource="io"' in k]
        host.replace(rel, good)
        return
    assert success[collector] == 0.0
    assert {c: v for c, v in success.items() if c != collector} == {c: 1.0 for c in success if c != collector}
    assert not any(owned_by(k, (collector,)) for k in during), "a failing source exports no made-up values"
    assert untouched(before, during, (collector,)) == []
    failed = events(logs, "collector_failed")
    assert [e["collector"] for e in failed] == [collector], "logged once, by the affected collector only"
    assert Path(rel).name in failed[0]["error"]
    with capture_logs() as logs:
        deny(path, 0)
        host.replace(rel, good)
        host.run(QUIET_S + 1.0)
    assert host.success()[collector] == 1.0
    assert len(events(logs, "collector_recovered", collector)) == 1
    assert untouched(before, host.series(), ()) == []


# ---- NVML ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", ["library_not_found"])
def test_nvml_absent_leaves_host_signals_and_marks_gpu_not_available_quietly(root: Path, error: str) -> None:
    # No NVIDIA device on the PCI bus either (with one, a missing library is a failure: the next test).
    with capture_logs() as logs:
        h = Host(root, nvml=nvml_state(init_error=error))
        for v in sorted((h.sys / "bus" / "pci" / "devices").glob("*/vendor")):
            h.replace(str(v.relative_to(h.root)), "0x8086\n")
        h.run(3.0)
    assert h.available()["gpu"] == 0.0
    assert "gpu" not in h.success()
    assert set(h.success().values()) == {1.0}
    assert not [e for e in logs if e["log_level"] in ("error", "warning") and e.get("collector") == "gpu"]
    assert len(events(logs, "collector_not_available", "gpu")) == 3  # once per GPU sampler, not per cycle


def test_driver_libraries_without_an_nvidia_gpu_on_the_bus_are_absence_not_failure(root: Path) -> None:
    # A host image that ships the driver's user-space libraries but runs on a CPU-only machine answers
    # DRIVER_NOT_LOADED; with no NVIDIA device in sysfs that is "no GPU here", not a page-worthy failure.
    with capture_logs() as logs:
        h = Host(root, nvml=nvml_state(init_error="driver_not_loaded"))
        vendors = sorted((h.sys / "bus" / "pci" / "devices").glob("*/vendor"))
        assert any(v.read_text().strip() == "0x10de" for v in vendors)
        for v in vendors:
            h.replace(str(v.relative_to(h.root)), "0x8086\n")
        h.run(3.0)
    assert h.available()["gpu"] == 0.0
    assert "gpu" not in h.success()
    assert not [e for e in logs if e["event"] == "nvml_init_failed"]


@pytest.mark.parametrize(("error", "hint"), [("no_permission", "video group"),
                                           ("driver_not_loaded", "kernel module is not loaded"),
                                           ("library_not_found", "CDI"),
                                           ("unknown", "nvidia-smi")])
def test_nvml_init_failing_on_a_gpu_host_is_a_failure_not_absence(root: Path, error: str, hint: str) -> None:
    # The NVML library is there but nvmlInit fails (a non-root user without access to /dev/nvidiactl gives
    # NO_PERMISSION): an operator must see gpufeed_collector_success{collector="gpu"} 0, not "no GPU here". So
    # must a pod on a GPU node that the container toolkit gave no libnvidia-ml.so.1 (LIBRARY_NOT_FOUND).
    with capture_logs() as logs:
        h = Host(root, nvml=nvml_state(init_error=error))
        h.run(3.0)
        assert h.success().get("gpu") == 0.0
        assert "gpu" not in h.available()  # available: a success series, no 0 here
        assert {k: v for k, v in h.success().items() if k != "gpu"} and set(
            v for k, v in h.success().items() if k != "gpu") == {1.0}, "host collectors unaffected"
        failed = [e for e in logs if e["event"] == "nvml_init_failed"]
        assert len(failed) == 1 and failed[0]["log_level"] == "error", "logged once, not every cycle"
        assert hint in failed[0]["error"]
        h.run(120.0)
        assert len([e for e in logs if e["event"] == "nvml_init_failed"]) == 1
        calls = h.fake.calls["nvmlInit"]
        assert 3 <= calls <= 10, f"retried with backoff (5 s doubling to 60 s), not every tick: {calls}"
        h.nvml(lambda st: st.update(init_error=None))
        h.run(65.0)
    assert h.success()["gpu"] == 1.0, "recovers once the cause is fixed"
    assert any(e["event"] == "collector_recovered" and e.get("collector") == "gpu" for e in logs)


def test_gpu_lost_is_reported_for_that_gpu_only_and_it_comes_back(host: Host) -> None:
    before = host.series()
    with capture_logs() as logs:
        host.nvml(lambda st: st["devices"][1].update(lost=True))
        host.run(5.0)
    during = host.series()
    assert set(host.success().values()) == {1.0}  # the collector works; one GPU is lost
    assert during['gpufeed_finding{check="gpu_lost",gpu="1"}'] == 1.0
    assert not [k for k in during if 'gpu="1"' in k and k.startswith("gpufeed_gpu_sm")]  # no made-up values
    assert [k for k in before if 'gpu="0"' in k and k not in during] == []
    assert len(events(logs, "gpu_lost")) == 1
    with capture_logs() as logs:
        host.nvml(lambda st: st["devices"][1].update(lost=False))
        host.run(70.0)  # re-initialisation backs off
    after = host.series()
    assert after.get('gpufeed_finding{check="gpu_lost",gpu="1"}', 0.0) == 0.0
    assert events(logs, "gpu_recovered")
    assert untouched(before, after, ()) == []


def test_every_nvml_call_not_supported_keeps_identity_and_host_signals(host: Host) -> None:
    # Every function the backend calls (read from its source), but the ones that set up NVML itself.
    calls = [fn for fn in backend_functions() if fn not in ("nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion",
                                                            "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                                                            "nvmlDeviceGetUUID", "nvmlGpmSampleAlloc",
                                                            "nvmlGpmSampleFree", "nvmlEventSetCreate",
                                                            "nvmlEventSetFree", "nvmlEventSetWait_v2")]
    assert "nvmlDeviceGetMigMode" in calls and "nvmlDeviceRegisterEvents" in calls
    with capture_logs() as logs:
        h = Host(host.root.parent / "unsupported", nvml=nvml_state())  # same scratch dir
        h.nvml(lambda st: [d.update(unsupported=calls) for d in st["devices"]])
        h.run(12.0)
    assert set(h.success().values()) == {1.0}, h.success()
    s = h.series()
    assert any(k.startswith("gpufeed_gpu_info{") for k in s)
    assert not events(logs, "collector_failed")
    disabled = events(logs, "gpu_call_disabled")
    assert disabled and len(disabled) == len({(e["gpu"], e["call"]) for e in disabled}), "each call logged once"


# ---- processes ------------------------------------------------------------------------------------------------


def test_gpu_process_exiting_between_listing_and_reading_is_skipped(
    host: Host, deny: Callable[[Path, int], None]
) -> None:
    # NVML still lists the pid; /proc says it is gone (ESRCH mid-read, then no directory).
    deny(host.proc / str(GPU_PID) / "status", errno.ESRCH)
    with capture_logs() as logs:
        host.run(6.0)
    s = host.series()
    assert set(host.success().values()) == {1.0}
    assert not [k for k in s if f'pid="{GPU_PID}"' in k and k.startswith("gpufeed_process_cpu")]
    assert [k for k in s if f'pid="{OTHER_GPU_PID}"' in k and k.startswith("gpufeed_process_cpu")]
    assert not events(logs, "collector_failed")


def test_unreadable_io_of_another_users_gpu_process_is_unknown_not_a_failure(
    host: Host, deny: Callable[[Path, int], None]
) -> None:
    # Non-root without CAP_SYS_PTRACE: /proc/<pid>/io of another user's process is EACCES.
    deny(host.proc / str(GPU_PID) / "io", errno.EACCES)
    host.run(3.0)
    s = host.series()
    assert set(host.success().values()) == {1.0}
    assert not [k for k in s if f'pid="{GPU_PID}"' in k and k.startswith("gpufeed_process_read")]
    assert [k for k in s if f'pid="{GPU_PID}"' in k and k.startswith("gpufeed_process_cpu")]


def test_gpu_process_with_10000_threads_is_sampled_with_bounded_series(host: Host) -> None:
    task = host.proc / str(GPU_PID) / "task"
    stat = next(p for p in sorted(task.iterdir()) if (p / "stat").exists()) / "stat"
    text = stat.read_text()
    _, _, tail = text.partition(" ")
    for tid in range(100000, 110000):
        d = task / str(tid)
        d.mkdir()
        (d / "stat").write_text(f"{tid} {tail}")
    n_before = len(host.series())
    host.run(QUIET_INTERVALS[names.PROC_THREADS] + 1.0)  # no GPU waits: the per-thread pass at its quiet pace
    st = host.engine.snapshot.status["proc_threads"]
    assert st.success, st.error
    s = host.series()
    assert set(host.success().values()) == {1.0}
    assert len(s) <= n_before + 5, "no per-thread series"
    value = host.engine.snapshot.value("proc_threads")
    assert len(value.processes[GPU_PID].threads) >= 10000
    print(f"proc_threads with 10000 threads: {st.duration * 1000:.0f} ms per run")


# ---- devices coming and going ---------------------------------------------------------------------------------


def test_disk_hot_removed_and_re_added_with_reset_counters(host: Host) -> None:
    before = host.series()
    stats = host.proc / "diskstats"
    good = stats.read_text()
    host.replace("proc/diskstats", "".join(ln + "\n" for ln in good.splitlines() if " sda " not in ln))
    with capture_logs() as logs:
        host.run(QUIET_S + 1.0)
    s = host.series()
    assert set(host.success().values()) == {1.0}
    assert not [k for k in s if 'device="sda"' in k]
    assert [k for k in s if 'device="nvme0n1"' in k]
    assert untouched(before, s, ("disk",)) == []
    assert not events(logs, "collector_failed")
    # back, as a new device: counters start again from small values (a counter reset Prometheus handles)
    sda = next(ln for ln in good.splitlines() if " sda " in ln).split()
    reset = " ".join(sda[:3] + ["1"] * (len(sda) - 3))
    host.replace("proc/diskstats", "".join((reset if " sda " in ln else ln) + "\n" for ln in good.splitlines()))
    host.run(QUIET_S + 1.0)
    s = host.series()
    assert host.success()["disk"] == 1.0
    reads = [v for k, v in s.items() if 'device="sda"' in k and k.startswith("gpufeed_disk_read")]
    assert reads and all(v >= 0 for v in reads)


def test_pci_device_removed_and_re_added_is_dropped_and_found_again(root: Path) -> None:
    h = Host(root, options={"collector.pcie.rescan-interval": "1s"})
    h.run(2.0)
    before = h.series()
    gpu1 = [k for k in before if k.startswith("gpufeed_pcie_") and GPU1 in k]
    assert gpu1
    link = h.sys / "bus" / "pci" / "devices" / GPU1
    target = os.readlink(link)
    real = (link.parent / target).resolve()
    parked = real.with_name(real.name + ".removed")
    with capture_logs() as logs:
        link.unlink()
        real.rename(parked)
        h.run(5.0)
    s = h.series()
    assert set(h.success().values()) == {1.0}, h.success()
    assert not [k for k in s if k.startswith("gpufeed_pcie_") and f'gpu_bdf="{GPU1}"' in k]
    assert [k for k in s if k.startswith("gpufeed_pcie_") and 'gpu_bdf="0000:01:00.0"' in k]
    assert not events(logs, "collector_failed")
    parked.rename(real)
    os.symlink(target, link)
    h.run(5.0)
    again = h.series()
    assert [k for k in gpu1 if k not in again] == []


# ---- time ------------------------------------------------------------------------------------------------------


def test_driver_clock_jumping_backwards_never_makes_a_counter_go_down(host: Host) -> None:
    host.run(3.0)
    before = {k: v for k, v in host.series().items() if k.startswith("gpufeed_gpu_") and "_total" in k}
    with capture_logs() as logs:
        host.nvml(lambda st: st.update(t=float(st.get("t", 0.0)) - 1000.0))
        host.run(5.0)
    after = host.series()
    assert set(host.success().values()) == {1.0}
    down = {k: (v, after[k]) for k, v in before.items() if k in after and after[k] < v}
    assert down == {}
    assert not events(logs, "collector_failed")


def test_no_wall_clock_reads_in_the_sampling_path() -> None:
    # The engine and collectors run on a monotonic clock: NTP steps and a clock set backwards do not move
    # sampling, intervals or rates. Wall time appears only in log timestamps, in the lines marked
    # "# wall clock: <why>", which turn a monotonic instant into a Unix timestamp at render time or compare a
    # certificate's expiry with the calendar, and in gpufeed report (exporter/fleet), which samples nothing:
    # it asks Prometheus about a range of wall-clock time ending now; none of them schedules or measures.
    root = Path(__file__).resolve().parents[2] / "exporter"
    reads = [
        (str(p.relative_to(root)), i, line)
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\btime\.time\b|datetime\.now\(|datetime\.utcnow\(", line)
        and "sim/" not in str(p) and "fleet/" not in str(p)
    ]
    offenders = [f"{f}:{i}" for f, i, line in reads if "# wall clock:" not in line]
    assert offenders == []
    assert {f for f, _, _ in reads} == {"exposition.py", "webconfig.py", "capture/stage.py", "capture/take.py"}
