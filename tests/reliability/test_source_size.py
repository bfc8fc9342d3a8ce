"""A 1 GB file where a procfs file should be is refused at 4 MiB, never read whole (round 2: RSS 5.2 GB with a
1 GB file as ``stat``). Every collector reads through exporter/sources.py; the GPU backend reads no files."""

from __future__ import annotations

import ast
import resource
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from .faults import GPU_PID, OTHER_GPU_PID, Host, scratch_dir

GB = 1 << 30


@pytest.fixture
def root() -> Iterator[Path]:
    d = scratch_dir()
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that occupies nothing (a hole) -- what a hostile mount could put there."""
    path.unlink()
    with path.open("wb") as f:
        f.truncate(size)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_1_gb_process_stat_skips_that_process_only_and_memory_stays_flat(root: Path) -> None:
    host = Host(root)
    host.run(2.0)
    before = _rss_mib()
    _sparse(host.proc / str(GPU_PID) / "stat", GB)
    with capture_logs() as logs:
        host.run(12.0)  # a dozen shallow passes and two deep ones
    series = host.series()
    assert _rss_mib() - before < 64  # capped reads: at most 4 MiB per file at a time
    assert series['gpufeed_collector_success{collector="proc"}'] == 1.0  # one bad item is skipped
    pids = {k.split('pid="')[1].split('"')[0] for k in series if k.startswith("gpufeed_process_cpu_seconds_total")}
    assert pids == {str(OTHER_GPU_PID)}
    skipped = [e for e in logs if e["event"] == "proc_parse_failed"]
    assert len(skipped) == 1 and "longer than" in skipped[0]["reason"]


def test_a_1_gb_proc_stat_fails_the_cpu_collector_naming_the_cap_and_memory_stays_flat(root: Path) -> None:
    host = Host(root)
    host.run(2.0)
    before = _rss_mib()
    _sparse(host.proc / "stat", GB)
    host.run(5.0)
    assert _rss_mib() - before < 64
    assert host.success()["cpu"] == 0.0
    assert "longer than 4194304 bytes" in (host.engine.snapshot.status["cpu"].error or "")
    assert {c for c, v in host.success().items() if v != 1.0} == {"cpu"}


def test_every_collector_reads_files_only_through_exporter_sources() -> None:
    # The one door (STYLE.md): no open(), Path.read_*(), os.read() or io.open in a collector or the GPU backend.
    pkg = Path(__file__).resolve().parents[2] / "exporter"
    offenders = []
    for path in [*sorted((pkg / "collectors").glob("*.py")), *sorted((pkg / "gpu").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in ("open", "read_text", "read_bytes", "readlines", "fdopen") or (
                        name == "read" and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "os"):
                    # read_text/read_bytes imported from exporter.sources are the door itself
                    if isinstance(f, ast.Name) and name in ("read_text", "read_bytes"):
                        continue
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
