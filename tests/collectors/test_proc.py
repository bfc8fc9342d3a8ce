"""proc: GPU processes' CPU time, placement, read pattern; per-thread evidence on the deep sampler."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.collectors import load_all
from exporter.collectors.proc import PidListOption, ProcCollector, parse_stat
from exporter.config import ConfigError, resolve
from exporter.engine import Engine, VirtualClock
from exporter.samples.host import ProcSample
from exporter.sampling import Targets
from exporter.sources import USER_HZ
from tests.support.gctrack import tracked_inside
from tests.support.hosts import CAPTURE, LARGE, exposition, make, run_engine, series

GPU = 4242
OTHER = 4300


def test_comm_with_spaces_and_parentheses_is_split_at_the_last_paren() -> None:
    line = "4243 (a) b (c) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 6) + " 7 3 " + " ".join(["0"] * 35)
    st = parse_stat(line)
    assert st.comm == "a) b (c"
    assert st.state == "S"


def test_stat_fields_are_taken_from_their_proc5_positions() -> None:
    text = (LARGE / "proc" / str(GPU) / "task" / str(GPU) / "stat").read_text()
    st = parse_stat(text)
    assert (st.comm, st.state, st.processor, st.num_threads) == ("python3", "R", 17, 150)
    assert st.utime == 890_000 / USER_HZ and st.stime == 310_000 / USER_HZ


def test_gpu_process_with_150_threads_hot_launch_thread_and_three_in_d_state() -> None:
    eng = run_engine(make("proc", LARGE, pids=(GPU,)))
    deep: ProcSample = eng.snapshot.value("proc_threads")
    assert deep.deep
    p = deep.processes[GPU]
    assert len(p.threads) == 150 and p.num_threads == 150
    hot = max(p.threads, key=lambda t: t.utime + t.stime)
    assert (hot.tid, hot.processor, hot.state) == (GPU, 17, "R")
    assert sum(t.state == "D" for t in p.threads) == 3
    assert any(t.comm == "a) b (c" for t in p.threads)
    assert p.cpus_allowed == frozenset((*range(0, 48), *range(96, 144)))
    assert p.mems_allowed == frozenset({0})
    assert (p.io_rchar, p.io_syscr) == (987654321000, 246913580)
    s = series(exposition(eng))
    assert s['gpufeed_process_threads{comm="python3",pid="4242",state="disk_sleep"}'] == 3
    assert s['gpufeed_process_threads{comm="python3",pid="4242",state="running"}'] == 1
    assert sum(t.state == "S" for t in p.threads) > 100
    assert not [k for k in s if k.startswith("gpufeed_process_threads") and 'state="sleeping"' in k], (
        "the sleeping majority is not exported (the host-level series budget)")
    assert s['gpufeed_process_read_syscalls_total{comm="python3",pid="4242"}'] == 246913580


def test_a_deep_pass_keeps_each_process_threads_as_one_object_for_the_cycle_collector() -> None:
    # Issue 14: one tracked object per thread per pass, kept in the ring buffer, made full collections slow.
    eng = run_engine(make("proc", LARGE, pids=(GPU,)))
    deep: ProcSample = eng.snapshot.value("proc_threads")
    threads = deep.processes[GPU].threads
    assert len(threads) == 150 and tracked_inside(threads) == [threads]


def test_shallow_sampler_reads_no_threads() -> None:
    eng = run_engine(make("proc", LARGE, pids=(GPU,)))
    shallow: ProcSample = eng.snapshot.value("proc")
    assert not shallow.deep and shallow.processes[GPU].threads == ()


def test_unreadable_io_of_another_users_process_is_unknown_not_zero(
    large: Path, deny: Callable[[Path], None]
) -> None:
    deny(large / "proc" / str(GPU) / "io")
    col = make("proc", large, pids=(GPU, OTHER))
    sample = col.update()
    assert sample.processes[GPU].io_rchar is None and sample.processes[GPU].io_syscr is None
    assert sample.processes[OTHER].io_rchar is None  # no io file at all in the fixture
    eng = run_engine(col)
    s = series(exposition(eng))
    assert not any(k.startswith("gpufeed_process_read_bytes_total") for k in s)
    assert s['gpufeed_process_cpu_seconds_total{comm="infer server",pid="4300"}'] == (4000 + 1000) / USER_HZ


def test_process_that_vanished_is_skipped_without_error(large: Path) -> None:
    shutil.rmtree(large / "proc" / str(OTHER))
    eng = run_engine(make("proc", large, pids=(GPU, OTHER, 999_999)))
    assert eng.snapshot.status["proc"].success and eng.snapshot.status["proc_threads"].success
    assert set(eng.snapshot.value("proc").processes) == {GPU}


def test_thread_that_exits_between_listing_and_reading_is_skipped(
    large: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = large / "proc" / str(GPU) / "task"
    victim = task / str(GPU + 10)
    real_listdir = os.listdir

    def listdir_then_exit(path: str | os.PathLike[str]) -> list[str]:
        names = real_listdir(path)
        if os.fspath(path) == os.fspath(task) and victim.exists():
            shutil.rmtree(victim)  # the thread exits right after the directory was listed
        return names

    monkeypatch.setattr(os, "listdir", listdir_then_exit)
    col = make("proc", large, pids=(GPU,))
    assert isinstance(col, ProcCollector)
    sample = col.update_threads()
    assert len(sample.processes[GPU].threads) == 149


def test_gpu_pids_published_later_are_picked_up() -> None:
    targets = Targets()
    col = make("proc", LARGE)
    col.ctx.targets = targets
    assert dict(col.update().processes) == {}
    targets.publish({"0": [GPU]})
    assert set(col.update().processes) == {GPU}


def test_pids_option_is_validated_at_config_time() -> None:
    opt = PidListOption("pids", "list", (), "")
    assert opt.parse("123, 456") == (123, 456)
    assert opt.parse([7, "8"]) == (7, 8)
    with pytest.raises(ConfigError, match=r"--collector\.proc\.pids: not a pid: 'abc'"):
        resolve(load_all(), {}, {"collector.proc.pids": "1,abc"})


def test_threads_sampler_interval_is_an_option_and_adaptive(large: Path) -> None:
    col = make("proc", LARGE, pids=(GPU,), options={"threads-interval": 5.0})
    clock = VirtualClock()
    eng = Engine([col], clock, inline=True)
    eng.run_until(10.0)
    assert eng.samplers["proc_threads"].runs == 3  # t = 0, 5, 10
    assert eng.samplers["proc"].runs == 11
    eng.set_interval("proc_threads", 0.5)  # a GPU is waiting: deep evidence on demand
    eng.run_until(12.0)
    assert eng.samplers["proc_threads"].runs == 3 + 4  # 10.5, 11, 11.5, 12
    assert all(x.value.deep for x in eng.history("proc_threads"))


def test_captured_machine_processes_parse() -> None:
    pids = tuple(int(p) for p in os.listdir(CAPTURE / "proc") if p.isdigit())
    eng = run_engine(make("proc", CAPTURE, pids=pids))
    assert eng.snapshot.status["proc_threads"].success, eng.snapshot.status["proc_threads"].error
    assert set(eng.snapshot.value("proc_threads").processes) == set(pids)


def test_a_pid_reused_by_a_process_of_the_same_name_is_a_new_counter_life_not_a_regression(large: Path) -> None:
    # N5(b): a new process under a known pid and comm starts its CPU time from ~0; the exposition withheld its
    # counter (a "regression") until it passed the old process's total -- absent for 60 s in the attack.
    from exporter.exposition import Renderer

    eng = run_engine(make("proc", large, pids=(GPU,)))
    r = Renderer(eng.stages)
    r.render(eng.snapshot)
    key = f'gpufeed_process_cpu_seconds_total{{comm="python3",pid="{GPU}"}}'
    assert series(r.text().body.decode())[key] > 1.0
    stat = large / "proc" / str(GPU) / "stat"
    fields = stat.read_text().split()
    fields[13], fields[14], fields[21] = "7", "3", str(int(fields[21]) + 500_000)  # utime, stime, starttime
    stat.write_text(" ".join(fields) + "\n")
    eng.run_until(2.0)
    r.render(eng.snapshot)
    assert series(r.text().body.decode()).get(key) == pytest.approx((7 + 3) / USER_HZ)
    assert r.regressions == 0


def test_a_lower_cpu_time_of_the_same_process_is_still_withheld(large: Path) -> None:
    from exporter.exposition import Renderer

    eng = run_engine(make("proc", large, pids=(GPU,)))
    r = Renderer(eng.stages)
    r.render(eng.snapshot)
    stat = large / "proc" / str(GPU) / "stat"
    fields = stat.read_text().split()
    fields[13] = "7"  # the same start time: not a new process, a source gone backwards
    stat.write_text(" ".join(fields) + "\n")
    eng.run_until(2.0)
    r.render(eng.snapshot)
    assert f'gpufeed_process_cpu_seconds_total{{comm="python3",pid="{GPU}"}}' \
        not in series(r.text().body.decode())
    assert r.regressions >= 1
