"""Broken sources: malformed, truncated, empty, missing, unreadable or garbage files.

Each must give one clear log event naming the collector and the file, ``gpufeed_collector_success`` 0 (through the
engine and the exposition), no made-up values -- and the daemon keeps serving.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter.collectors import load_all
from exporter.config import resolve
from exporter.daemon import Daemon
from tests.support.hosts import HOST_COLLECTORS, exposition, make, run_engine, series

GARBAGE = b"\x00\xff\xfe\x80 \x1b[31m\xc3( not procfs \n\x00\x00"


def _lines(keep: int, tokens: int) -> Callable[[str], str]:
    """Cut after ``keep`` whole lines and ``tokens`` words of the next one (a short read mid-line)."""
    def cut(text: str) -> str:
        lines = text.splitlines()
        return "\n".join([*lines[:keep], " ".join(lines[keep].split()[:tokens])])
    return cut


def _field(text: str, n: int, value: str) -> str:
    """Replace field ``n`` (proc(5) numbering, 1-based) of a /proc/<pid>/stat line."""
    head, _, tail = text.rpartition(") ")
    rest = tail.split()
    rest[n - 3] = value
    return f"{head}) " + " ".join(rest) + "\n"


# (collector, file under the fixture root, how it is broken, transform of the text or None to delete/deny/garbage)
CASES: list[tuple[str, str, str, Callable[[str], str] | None]] = [
    ("cpu", "proc/stat", "empty", lambda t: ""),
    ("cpu", "proc/stat", "truncated", _lines(50, 3)),
    ("cpu", "proc/stat", "malformed", lambda t: t.replace("cpu7 ", "cpu7 x", 1)),
    ("cpu", "proc/stat", "garbage", None),
    ("cpu", "proc/stat", "missing", None),
    ("cpu", "proc/stat", "denied", None),
    ("cpu", "sys/devices/system/node/node1/cpulist", "malformed", lambda t: "48-x\n"),
    ("memory", "proc/meminfo", "empty", lambda t: ""),
    ("memory", "proc/meminfo", "truncated", _lines(5, 1)),
    ("memory", "proc/meminfo", "malformed", lambda t: t.replace("Dirty:          ", "Dirty:      lots", 1)),
    ("memory", "proc/meminfo", "garbage", None),
    ("memory", "proc/meminfo", "missing", None),
    ("memory", "proc/meminfo", "denied", None),
    ("memory", "proc/vmstat", "malformed", lambda t: t.replace("oom_kill 3", "oom_kill three")),
    ("memory", "proc/vmstat", "missing", None),
    ("disk", "proc/diskstats", "empty", lambda t: ""),
    ("disk", "proc/diskstats", "truncated", _lines(2, 5)),
    ("disk", "proc/diskstats", "malformed", lambda t: t.replace("8812345", "88x2345")),
    ("disk", "proc/diskstats", "garbage", None),
    ("disk", "proc/diskstats", "missing", None),
    ("disk", "proc/diskstats", "denied", None),
    ("nfs", "proc/net/rpc/nfs", "empty", lambda t: ""),
    ("nfs", "proc/net/rpc/nfs", "truncated", _lines(3, 4)),
    ("nfs", "proc/net/rpc/nfs", "malformed", lambda t: t.replace("rpc 1850000", "rpc 18500x0")),
    ("nfs", "proc/net/rpc/nfs", "garbage", None),
    ("nfs", "proc/net/rpc/nfs", "denied", None),
    ("pressure", "proc/pressure/io", "empty", lambda t: ""),
    ("pressure", "proc/pressure/io", "truncated", _lines(0, 2)),
    ("pressure", "proc/pressure/io", "malformed", lambda t: t.replace("total=987654321", "total=98765x321")),
    ("pressure", "proc/pressure/io", "garbage", None),
    ("pressure", "proc/pressure/io", "denied", None),
    ("cpufreq", "sys/devices/system/cpu/cpu3/cpufreq/scaling_cur_freq", "empty", lambda t: ""),
    ("cpufreq", "sys/devices/system/cpu/cpu3/cpufreq/scaling_cur_freq", "malformed", lambda t: "fast\n"),
    ("cpufreq", "sys/devices/system/cpu/cpu3/cpufreq/scaling_cur_freq", "garbage", None),
    ("cpufreq", "sys/devices/system/cpu/cpu3/cpufreq/cpuinfo_max_freq", "denied", None),
    ("cpufreq", "sys/devices/system/cpu/cpu3/cpufreq/scaling_governor", "empty", lambda t: ""),
    # A read denied under /proc/<pid> is a host-level problem (hidepid, missing privileges), not one bad process.
    ("proc", "proc/4242/stat", "denied", None),
    ("proc", "proc/4242/task", "denied", None),
]

# One process's file malformed: that process is skipped, the other one (4300) is still reported.
PER_PROCESS: list[tuple[str, str, Callable[[str], str] | None]] = [
    ("proc/4242/stat", "empty", lambda t: ""),
    ("proc/4242/stat", "truncated", _lines(0, 6)),
    ("proc/4242/stat", "malformed", lambda t: _field(t, 14, "12x4")),
    ("proc/4242/stat", "garbage", None),
    ("proc/4242/status", "malformed", lambda t: t.replace("0-47,96-143", "0-47,96-")),
    ("proc/4242/status", "truncated", _lines(3, 1)),
    ("proc/4242/status", "garbage", None),
    ("proc/4242/io", "malformed", lambda t: t.replace("syscr: 246913580", "syscr: many")),
    ("proc/4242/io", "empty", lambda t: ""),
    ("proc/4242/task/4250/stat", "truncated", _lines(0, 10)),
]


def _break(root: Path, rel: str, kind: str, transform: Callable[[str], str] | None,
           deny: Callable[[Path], None]) -> None:
    path = root / rel
    if kind == "missing":
        path.unlink()
    elif kind == "denied":
        deny(path)
    elif kind == "garbage":
        path.write_bytes(GARBAGE)
    else:
        assert transform is not None
        broken = transform(path.read_text())
        assert broken != path.read_text(), "the case must actually change the file"
        path.write_text(broken)


@pytest.mark.parametrize(("collector", "rel", "kind", "transform"), CASES,
                         ids=[f"{c}-{r.split('/', 1)[1]}-{k}" for c, r, k, _ in CASES])
def test_broken_source_fails_the_collector_with_a_clear_log_event(  # noqa: PLR0917 - pytest parameters
    large: Path, deny: Callable[[Path], None], collector: str, rel: str, kind: str,
    transform: Callable[[str], str] | None,
) -> None:
    col = make(collector, large, pids=(4242,))
    _break(large, rel, kind, transform, deny)
    with capture_logs() as logs:
        eng = run_engine(col)
    failed = [e for e in logs if e["event"] == "collector_failed"]
    assert failed, logs
    assert all(e["collector"] == collector for e in failed)
    name = Path(rel).name
    assert any(name in e["error"] for e in failed), failed
    if kind == "denied":
        assert any("Permission denied" in e["error"] for e in failed)
    s = series(exposition(eng))
    assert s[f'gpufeed_collector_success{{collector="{collector}"}}'] == 0
    assert f'gpufeed_collector_available{{collector="{collector}"}}' not in s  # available, failing: success 0
    # No made-up values: the failing sampler exports nothing of its own.
    prefix = {"cpu": "gpufeed_cpu_", "memory": "gpufeed_memory_", "disk": "gpufeed_disk_", "nfs": "gpufeed_nfs_",
              "pressure": "gpufeed_pressure_", "cpufreq": "gpufeed_cpufreq_", "proc": "gpufeed_process_threads"}
    if collector != "proc" or "task" in rel:
        assert not any(k.startswith(prefix[collector]) for k in s), [k for k in s if k.startswith(prefix[collector])]


@pytest.mark.parametrize(("rel", "kind", "transform"), PER_PROCESS,
                         ids=[f"{r.split('/', 2)[2]}-{k}" for r, k, _ in PER_PROCESS])
def test_malformed_file_of_one_process_skips_that_process_and_keeps_the_others(
    large: Path, deny: Callable[[Path], None], rel: str, kind: str, transform: Callable[[str], str] | None,
) -> None:
    col = make("proc", large, pids=(4242, 4300))
    _break(large, rel, kind, transform, deny)
    with capture_logs() as logs:
        eng = run_engine(col, until=3.0)
    assert not [e for e in logs if e["event"] == "collector_failed"], logs
    skipped = [e for e in logs if e["event"] == "proc_parse_failed"]
    assert len(skipped) == 1, "logged once per pid, not every cycle"
    assert skipped[0]["pid"] == 4242 and rel.removeprefix("proc/") in skipped[0]["file"] and skipped[0]["reason"]
    s = series(exposition(eng))
    assert s['gpufeed_collector_success{collector="proc"}'] == 1
    # task/*/stat is read only by the deep sampler: there the process is absent from the thread series.
    family = "gpufeed_process_threads" if "task" in rel else "gpufeed_process_cpu_seconds"
    assert any(k.startswith(family) and 'pid="4300"' in k for k in s), "the good process is still reported"
    assert not any(k.startswith("gpufeed_process_") and 'pid="4242"' in k
                   for k in s if k.startswith(family)), "the bad process is absent, not made up"


def test_missing_procfs_root_fails_the_proc_collector(large: Path) -> None:
    col = make("proc", large, pids=(4242, 4300))
    shutil.rmtree(large / "proc")
    with capture_logs() as logs:
        eng = run_engine(col)
    failed = [e for e in logs if e["event"] == "collector_failed" and e["collector"] == "proc"]
    assert failed and "procfs root missing" in failed[0]["error"]
    s = series(exposition(eng))
    assert s['gpufeed_collector_success{collector="proc"}'] == 0
    assert not any(k.startswith("gpufeed_process_") for k in s)


def test_failure_is_logged_once_not_every_cycle_and_recovery_is_logged(large: Path) -> None:
    stat = large / "proc" / "meminfo"
    good = stat.read_text()
    stat.write_text("")
    col = make("memory", large)
    with capture_logs() as logs:
        eng = run_engine(col, until=5.0)
        stat.write_text(good)
        eng.run_until(6.0)
    events = [e["event"] for e in logs]
    assert events.count("collector_failed") == 1
    assert events.count("collector_recovered") == 1
    assert eng.snapshot.status["memory"].failures == 6


async def test_daemon_keeps_serving_while_a_collector_fails(large: Path) -> None:
    """Corrupt /proc/diskstats under a running daemon: /metrics still answers, disk success drops to 0."""
    registry = {n: c for n, c in load_all().items() if n in HOST_COLLECTORS}
    settings = resolve(registry, {}, {
        "web.listen-address": "127.0.0.1:0", "path.procfs": str(large / "proc"), "path.sysfs": str(large / "sys"),
        "web.render-interval": "10ms", "collector.disk.interval": "50ms",
    })
    daemon = Daemon(settings, stages=registry)
    await daemon.start()
    try:
        async def scrape() -> dict[str, float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", daemon.web.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            return series(body.decode())

        async def until(pred: Callable[[dict[str, float]], bool]) -> dict[str, float]:
            for _ in range(200):
                s = await scrape()
                if pred(s):
                    return s
                await asyncio.sleep(0.02)
            raise AssertionError("condition not reached")

        await until(lambda s: s.get('gpufeed_collector_success{collector="disk"}') == 1)
        (large / "proc" / "diskstats").write_text("garbage\n")
        s = await until(lambda s: s.get('gpufeed_collector_success{collector="disk"}') == 0)
        assert s['gpufeed_collector_success{collector="memory"}'] == 1
        assert not any(k.startswith("gpufeed_disk_") for k in s)
        shutil.rmtree(large / "proc" / "pressure")
        s = await until(lambda s: s.get('gpufeed_collector_available{collector="pressure"}') == 0)
        assert daemon.engine.alive()
    finally:
        await daemon.stop()


@pytest.mark.parametrize("rel", ["proc/4242/stat", "proc/4242/status"])
def test_one_process_whose_file_cannot_be_read_is_skipped_and_the_others_kept(
    large: Path, deny: Callable[[Path], None], rel: str,
) -> None:
    # N9: one unreadable /proc/<pid>/stat (EACCES, EIO) failed every process's series for the pass. A read
    # denied for every process inspected is still a host-level failure (the cases above).
    col = make("proc", large, pids=(4242, 4300))
    deny(large / rel)
    with capture_logs() as logs:
        eng = run_engine(col, until=3.0)
    assert not [e for e in logs if e["event"] == "collector_failed"], logs
    skipped = [e for e in logs if e["event"] == "proc_read_failed"]
    assert len(skipped) == 1 and skipped[0]["pid"] == 4242 and "Permission denied" in skipped[0]["error"]
    s = series(exposition(eng))
    assert s['gpufeed_collector_success{collector="proc"}'] == 1
    assert any(k.startswith("gpufeed_process_cpu_seconds") and 'pid="4300"' in k for k in s)
    assert not any(k.startswith("gpufeed_process_") and 'pid="4242"' in k for k in s)
