"""The self collector: gpufeed's own CPU, memory, threads and descriptors, from the real /proc/self."""

from __future__ import annotations

import os
import resource
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporter.collectors.selfstat import SelfCollector, count_open_fds, parse_self_stat, parse_self_status
from exporter.sampling import CollectorError
from exporter.sources import USER_HZ
from tests.support.hosts import CAPTURE, context, exposition, run_engine, series

# A real /proc/<pid>/stat line whose comm holds spaces and parentheses (a thread may name itself so).
STAT = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 9 0 0 0 1234 567 0 0 20 0 3 0 100 1 1 18446744073709551615"


def test_utime_and_stime_are_read_after_the_last_parenthesis() -> None:
    assert parse_self_stat(STAT) == (1234 / USER_HZ, 567 / USER_HZ)
    with pytest.raises(CollectorError, match="fields"):
        parse_self_stat("4242 (short) S 1")


def test_resident_memory_and_threads_come_from_a_captured_status_file() -> None:
    rss, threads = parse_self_status((CAPTURE / "proc" / "1" / "status").read_text())
    text = (CAPTURE / "proc" / "1" / "status").read_text()
    want_kb = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS:"))
    assert rss == want_kb * 1024 and threads >= 1
    with pytest.raises(CollectorError, match="VmRSS"):
        parse_self_status("Name:\tx\n")


def test_an_open_descriptor_shows_up_in_open_fds_under_the_soft_limit() -> None:
    c = SelfCollector(context("capture"))  # the configured root is ignored: the daemon is not in it
    before = c.update()
    with tempfile.TemporaryFile() as _held, tempfile.TemporaryFile() as _held2:
        during = c.update()
    assert during.open_fds == before.open_fds + 2
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert during.max_fds == (None if soft == resource.RLIM_INFINITY else soft)
    assert during.threads >= 1 and during.resident_bytes > 1 << 20


def test_open_fds_are_counted_by_the_fd_directory_size_or_by_listing_it_on_older_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fd_dir = Path("/proc/self/fd")
    listed = len(os.listdir(fd_dir)) - 1  # listdir's own descriptor is in its listing
    if os.stat(fd_dir).st_size == 0:
        pytest.skip("this kernel (< 6.2) does not report open descriptors as the fd directory's size")
    assert count_open_fds(fd_dir) == listed
    real_stat = os.stat
    monkeypatch.setattr(os, "stat",
                        lambda p, *a, **k: SimpleNamespace(st_size=0) if Path(p) == fd_dir else real_stat(p, *a, **k))
    assert count_open_fds(fd_dir) == listed  # a pre-6.2 kernel: size 0, the directory is listed
    with pytest.raises(CollectorError, match="no-such-dir"):
        count_open_fds(Path("/proc/self/no-such-dir"))


def test_cpu_seconds_grow_with_work_and_are_exported_per_mode() -> None:
    c = SelfCollector(context("capture"))
    first = c.update()
    deadline = os.times().elapsed + 0.3
    while os.times().elapsed < deadline:
        sum(range(10_000))
    second = c.update()
    assert second.user_seconds + second.system_seconds > first.user_seconds + first.system_seconds
    s = series(exposition(run_engine(c)))
    assert set(s) >= {'gpufeed_self_cpu_seconds_total{mode="user"}', 'gpufeed_self_cpu_seconds_total{mode="system"}',
                      "gpufeed_self_resident_memory_bytes", "gpufeed_self_threads", "gpufeed_self_open_fds"}
