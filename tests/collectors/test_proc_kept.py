"""Deep passes through kept descriptors: schedstat first, stat and status only for threads that ran.

The reader (exporter/sources.py KeptFiles) on real procfs -- a real thread that burns CPU, one that exits --
and on a regular tree whose files are replaced by renames (what the simulator and captured trees are); the
collector on a copied fixture thread tree whose schedstat files the test moves.
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from exporter.collectors.proc import FULL_EVERY_S, ProcCollector
from exporter.sources import FD_RESERVE, KeptFiles, SourceTooLargeError, fd_budget
from tests.support.gctrack import young_survivors
from tests.support.hosts import LARGE, make

GPU = 4242  # 150 threads in the LARGE fixture (stat only: no schedstat there)


def _burn(stop: threading.Event, tid: list[int]) -> None:
    tid.append(threading.get_native_id())
    x = 0
    while not stop.is_set():
        x += 1


def test_a_kept_descriptor_reads_the_current_content_of_a_real_threads_schedstat() -> None:
    stop = threading.Event()
    tid: list[int] = []
    t = threading.Thread(target=_burn, args=(stop, tid))
    t.start()
    try:
        while not tid:
            time.sleep(0.001)
        path = f"/proc/{os.getpid()}/task/{tid[0]}/schedstat"
        kept = KeptFiles(capacity=4)
        first = int(kept.read(path).split()[0])
        assert len(kept) == 1
        deadline = time.monotonic() + 10
        second = first
        while second == first and time.monotonic() < deadline:
            time.sleep(0.02)
            second = int(kept.read(path).split()[0])
        assert second > first  # the same descriptor, new content: pread at 0 regenerates the file
        assert len(kept) == 1
    finally:
        stop.set()
        t.join()
    # The thread exited (join() returns a moment before the kernel reaps it): the kept descriptor fails with
    # ESRCH, the path no longer exists -- gone, as ENOENT.
    deadline = time.monotonic() + 10
    with pytest.raises(OSError) as err:
        while time.monotonic() < deadline:
            kept.read(path)
            time.sleep(0.01)
    assert err.value.errno in (errno.ENOENT, errno.ESRCH)
    assert len(kept) == 0
    kept.close()


def test_a_replaced_file_on_a_regular_filesystem_is_read_again_by_path(tmp_path: Path) -> None:
    f = tmp_path / "schedstat"
    f.write_text("100 5 1\n")
    kept = KeptFiles(capacity=4)
    assert kept.read(str(f)) == b"100 5 1\n"
    tmp = tmp_path / ".schedstat.tmp"
    tmp.write_text("200 7 2\n")
    os.replace(tmp, f)  # how the simulator writes: the kept descriptor now holds the old, unlinked file
    assert kept.read(str(f)) == b"200 7 2\n"
    f.unlink()
    with pytest.raises(FileNotFoundError):
        kept.read(str(f))
    kept.close()


def test_a_replaced_hard_linked_file_is_read_again_and_an_unchanged_one_costs_no_path_lookup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fault harness links every file to a template (two links): a rename over the path leaves the old inode
    # one link, not none.
    template = tmp_path / "template"
    template.write_text("100 5 1\n")
    f = tmp_path / "schedstat"
    os.link(template, f)
    kept = KeptFiles(capacity=4)
    assert kept.read(str(f)) == b"100 5 1\n"
    looked: list[str] = []
    real_stat = os.stat

    def counting_stat(path: object, *a: object, **k: object) -> os.stat_result:
        looked.append(str(path))
        return real_stat(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting_stat)
    assert kept.read(str(f)) == b"100 5 1\n"
    assert looked == []  # the inode kept its links: no stat of the path
    tmp = tmp_path / ".schedstat.tmp"
    tmp.write_text("200 7 2\n")
    os.replace(tmp, f)
    assert kept.read(str(f)) == b"200 7 2\n"
    assert looked == [str(f)]
    kept.close()


def test_capacity_closes_the_least_recently_read_and_sweep_the_idle(tmp_path: Path) -> None:
    paths = []
    for i in range(5):
        p = tmp_path / f"f{i}"
        p.write_text(f"{i}\n")
        paths.append(str(p))
    kept = KeptFiles(capacity=3)
    for name in paths:
        kept.read(name)
    assert len(kept) == 3
    assert kept.read(paths[0]) == b"0\n"  # evicted earlier: read by path, kept again
    assert len(kept) == 3
    kept.sweep(idle=3600)
    assert len(kept) == 3
    kept.sweep(idle=0)
    assert len(kept) == 0
    none = KeptFiles(capacity=0)
    assert none.read(paths[1]) == b"1\n" and len(none) == 0


def test_reading_kept_files_again_leaves_no_new_objects_for_the_cycle_collector(tmp_path: Path) -> None:
    # A deep pass reads ~3,600 kept files; a bookkeeping tuple per read was that many objects for the next young
    # collection to examine, every pass.
    paths = []
    for i in range(200):
        (tmp_path / f"f{i}").write_text(f"{i} 0 1\n")
        paths.append(str(tmp_path / f"f{i}"))
    kept = KeptFiles(capacity=400)
    for p in paths:
        kept.read(p)

    def read_all() -> None:
        for p in paths:
            kept.read(p)

    assert len(young_survivors(read_all)) < 10
    assert len(kept) == 200
    # Nor does opening them: the per-descriptor bookkeeping is plain numbers, which no collection walks (a dict of
    # (inode, links) tuples stays tracked until a full collection, 3,600 entries on the benchmark's host).
    assert [m for m in vars(kept).values() if isinstance(m, dict) and gc.is_tracked(m)] == []
    kept.close()


def test_a_file_longer_than_the_first_page_is_read_whole(tmp_path: Path) -> None:
    f = tmp_path / "status"
    f.write_bytes(b"y" * 5000 + b"\n")
    kept = KeptFiles(capacity=2)
    assert kept.read(str(f)) == b"y" * 5000 + b"\n"
    assert kept.read(str(f)) == b"y" * 5000 + b"\n"  # again through the kept descriptor
    kept.close()


def test_a_file_over_the_limit_is_refused_not_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "stat"
    big.write_bytes(b"x" * 5000)
    kept = KeptFiles(capacity=2, limit=4096)
    with pytest.raises(SourceTooLargeError, match="longer than 4096 bytes"):
        kept.read(str(big))
    kept.close()


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _tree(tmp_path: Path) -> Path:
    """The LARGE fixture's GPU process, each thread given a schedstat (on-CPU ns = its stat's ticks)."""
    root = tmp_path / "host"
    shutil.copytree(LARGE / "proc" / str(GPU), root / "proc" / str(GPU))
    for d in (root / "proc" / str(GPU) / "task").iterdir():
        (d / "schedstat").write_text(f"{1_000_000 + int(d.name)} 0 1\n")
        (d / "status").write_text("voluntary_ctxt_switches:\t10\nnonvoluntary_ctxt_switches:\t1\n")
    return root


def _counting(col: ProcCollector, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """File name -> reads of a thread's files by the deep sampler, from now on."""
    counts: dict[str, int] = {}
    real = col._kept_deep.read

    def counting(path: str) -> bytes:
        parts = path.split("/")
        if parts[-3] == "task":
            counts[parts[-1]] = counts.get(parts[-1], 0) + 1
        return real(path)

    monkeypatch.setattr(col._kept_deep, "read", counting)
    return counts


def test_a_thread_that_did_not_run_costs_one_schedstat_read_and_one_that_ran_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path)
    col = make("proc", root, pids=(GPU,))
    assert isinstance(col, ProcCollector)
    clock = _Clock()
    col.ctx.clock = clock
    reads = _counting(col, monkeypatch)
    first = col.update_threads().processes[GPU]
    assert reads == {"schedstat": 150, "stat": 150, "status": 150}
    assert {t.run_delay for t in first.threads} == {0.0}
    assert all(t.on_cpu is not None for t in first.threads)

    # One thread ran (time on a CPU moved, waited 2 ms for a CPU), and its stat shows it now in D.
    ran = GPU + 7
    task = root / "proc" / str(GPU) / "task" / str(ran)
    (task / "schedstat").write_text(f"{5_000_000 + ran} 2000000 9\n")
    stat = (task / "stat").read_text()
    lpar = stat.rfind(")")
    (task / "stat").write_text(stat[: lpar + 2] + "D" + stat[lpar + 3:])
    (task / "status").write_text("voluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t4\n")
    reads.clear()
    clock.t += 0.5
    second = col.update_threads().processes[GPU]
    assert reads == {"schedstat": 150, "stat": 1, "status": 1}
    by_tid = {t.tid: t for t in second.threads}
    assert by_tid[ran].state == "D" and by_tid[ran].run_delay == pytest.approx(0.002)
    assert by_tid[ran].switches == (12, 4)
    before = {t.tid: t for t in first.threads}
    assert all(by_tid[t] == before[t] for t in by_tid if t != ran)  # the others: their previous reading
    # ... carried over as the very rows stored before: no new object per idle thread for the cycle collector.
    stored = {row[0]: row for row in first.threads.tuples()}
    assert all((row is stored[row[0]]) == (row[0] != ran) for row in second.threads.tuples())

    # Once per FULL_EVERY_S every thread's stat is read again, ran or not (status only for those that ran).
    reads.clear()
    clock.t += FULL_EVERY_S
    third = col.update_threads().processes[GPU]
    assert reads == {"schedstat": 150, "stat": 150}
    assert {t.tid: t for t in third.threads} == by_tid
    col.close()


def test_without_schedstat_every_threads_stat_is_read_each_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    col = make("proc", LARGE, pids=(GPU,))
    assert isinstance(col, ProcCollector)
    reads = _counting(col, monkeypatch)
    col.update_threads()  # first sight of each thread: status read for its context switches
    reads.clear()
    col.update_threads()
    assert reads == {"schedstat": 150, "stat": 150}  # no schedstat: stat's ticks say nothing ran, no status
    assert all(t.run_delay is None and t.on_cpu is None for t in col.update_threads().processes[GPU].threads)
    col.close()


@pytest.mark.parametrize(("nofile", "max_connections", "kept", "connections"), [
    (256, 512, 0, 192),  # short of descriptors: the kept ones give way first, then the connections
    (1024, 512, 256, 512),
    (4096, 512, 1024, 512),  # the systemd unit's LimitNOFILE
    (700, 512, 124, 512),  # the reserve, the configured connections, and what is left kept
    (64, 512, 0, 1),
])
def test_one_descriptor_budget_splits_the_limit_and_kept_descriptors_give_way_first(
        nofile: int, max_connections: int, kept: int, connections: int) -> None:
    assert fd_budget(nofile, max_connections) == (kept, connections)
    if nofile > FD_RESERVE:
        assert kept + connections + FD_RESERVE <= nofile
