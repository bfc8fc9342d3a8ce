"""proc_threads focused on the waiting GPUs' processes: deep reads cost what the waiting GPUs need."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.collectors.proc import ProcCollector
from exporter.samples.host import ProcSample
from tests.support.hosts import LARGE, exposition, make, run_engine, series

WAITING = 4242  # GPU 0's process, 150 threads
WORKING = 4300  # GPU 1's process, 2 threads


def _collector() -> ProcCollector:
    col = make("proc", LARGE)
    assert isinstance(col, ProcCollector)
    col.ctx.targets.publish({"0": [WAITING], "1": [WORKING]})
    return col


def _count_thread_reads(col: ProcCollector, monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """pid -> /proc/<pid>/task/<tid>/stat files read, from now on (schedstat and status of threads that ran
    are counted apart: they are read only for those)."""
    counts: dict[int, int] = {}
    real = col._read

    def counting(path: str, deep: bool = False) -> str:
        parts = path.split("/")
        if parts[-3] == "task" and parts[-1] == "stat":
            counts[int(parts[-4])] = counts.get(int(parts[-4]), 0) + 1
        return real(path, deep)

    monkeypatch.setattr(col, "_read", counting)
    return counts


def test_focused_deep_pass_reads_threads_of_the_waiting_gpus_process_only(monkeypatch: pytest.MonkeyPatch) -> None:
    col = _collector()
    reads = _count_thread_reads(col, monkeypatch)
    col.ctx.targets.set_focus([WORKING])
    sample = col.update_threads()
    assert reads == {WORKING: 2}
    assert set(sample.processes) == {WORKING} and len(sample.processes[WORKING].threads) == 2
    assert sample.deep


def test_focus_cleared_reads_every_process_in_depth_again(monkeypatch: pytest.MonkeyPatch) -> None:
    col = _collector()
    reads = _count_thread_reads(col, monkeypatch)
    col.ctx.targets.set_focus([WAITING])
    col.update_threads()
    col.ctx.targets.set_focus(None)
    reads.clear()
    sample = col.update_threads()
    assert reads == {WAITING: 150, WORKING: 2}
    assert set(sample.processes) == {WAITING, WORKING} and not sample.held


def test_requested_full_pass_reads_everyone_once_then_focus_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    col = _collector()
    reads = _count_thread_reads(col, monkeypatch)
    col.ctx.targets.set_focus([WORKING])
    col.ctx.targets.request_full()
    assert set(col.update_threads().processes) == {WAITING, WORKING}
    assert reads == {WAITING: 150, WORKING: 2}
    reads.clear()
    assert set(col.update_threads().processes) == {WORKING}
    assert reads == {WORKING: 2}


def test_process_left_out_of_a_focused_pass_keeps_its_thread_series_as_last_read() -> None:
    col = _collector()
    eng = run_engine(col)  # one full deep pass at t=0: both processes' threads
    col.ctx.targets.set_focus([WORKING])
    eng.run_once("proc_threads")
    deep: ProcSample = eng.snapshot.value("proc_threads")
    assert set(deep.processes) == {WORKING}
    assert set(deep.held) == {WAITING}  # exposition only; analysis reads .processes
    s = series(exposition(eng))
    assert s['gpufeed_process_threads{comm="python3",pid="4242",state="disk_sleep"}'] == 3
    assert s['gpufeed_process_threads{comm="python3",pid="4242",state="running"}'] == 1


def test_process_that_is_no_longer_a_target_is_not_held() -> None:
    col = _collector()
    eng = run_engine(col)
    col.ctx.targets.publish({"1": [WORKING]})
    col.ctx.targets.set_focus([WORKING])
    eng.run_once("proc_threads")
    deep: ProcSample = eng.snapshot.value("proc_threads")
    assert not deep.held
    assert not any('pid="4242"' in k for k in series(exposition(eng)) if k.startswith("gpufeed_process_threads"))


def test_configured_pids_stay_deep_while_focused(monkeypatch: pytest.MonkeyPatch) -> None:
    col = make("proc", LARGE, options={"pids": (WAITING,)})
    assert isinstance(col, ProcCollector)
    col.ctx.targets.publish({"1": [WORKING]})
    reads = _count_thread_reads(col, monkeypatch)
    col.ctx.targets.set_focus([WORKING])
    sample: Any = col.update_threads()
    assert set(sample.processes) == {WAITING, WORKING}
    assert reads == {WAITING: 150, WORKING: 2}


def test_deep_sampler_keeps_only_the_analyzers_cpu_window_not_engine_history() -> None:
    col = _collector()
    eng = run_engine(col)  # --engine.history at its default, 30 s
    eng.set_interval("proc_threads", 0.5)  # a GPU waits
    eng.run_until(60.0)
    hist = eng.history("proc_threads")
    assert len(hist) == 25  # 48.0 ... 60.0: 12 s at 0.5 s, where 30 s would hold 62 samples of every thread
    assert hist[-1].t - hist[0].t <= 12.5
    assert len(eng.history("proc")) == 31  # the cheap sampler keeps the engine's whole history: 30.0 ... 60.0
