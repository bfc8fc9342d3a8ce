"""py-spy on real processes: the right frames and user lines, and clear partial results when a target exits or
refuses ptrace. Generous thresholds: these hold on a loaded 2-core machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.capture import runner
from exporter.capture.stacks import LABEL_INPUT, LABEL_LAUNCH, LABEL_SYNC, dominant_label, evidence, summarize
from tests.capture.conftest import line_of

Start = Callable[..., subprocess.Popen[bytes]]


def test_main_loop_waiting_on_slow_workers_names_the_queue_and_the_user_line(workload: Start) -> None:
    proc = workload("queue_wait")
    cap = runner.record([proc.pid], duration=2)
    assert cap.problems == () and cap.unavailable is None
    summaries = summarize(cap.threads, gpu_pids=cap.pids, cpu_share=cap.cpu_share)
    main = summaries[0]
    assert (main.pid, main.tid, main.label) == (proc.pid, proc.pid, LABEL_INPUT)
    assert main.hotspots[0].user is not None
    assert main.hotspots[0].user.where == f"queue_wait.py:{line_of('queue_wait', 'return int(q.get())')}"
    # The workers were followed (--subprocesses) and are seen computing.
    workers = {t.pid for t in cap.threads} - {proc.pid}
    assert len(workers) == 2
    assert dominant_label(summaries) == LABEL_INPUT
    assert "waiting on the workers" in evidence(summaries)[0]
    assert 1.5 < cap.wall_seconds < 2 + runner.GRACE_S
    assert 0 < cap.cpu_seconds < 2.0  # py-spy's own CPU, measured with wait4


def test_loop_spinning_on_tiny_launches_is_launch(workload: Start) -> None:
    proc = workload("launch_spin")
    cap = runner.record([proc.pid], duration=2)
    assert cap.cpu_share[(proc.pid, proc.pid)] > 0.6  # runnable: on a CPU or queued for one
    summaries = summarize(cap.threads, gpu_pids=cap.pids, cpu_share=cap.cpu_share)
    assert summaries[0].label == LABEL_LAUNCH
    hot = summaries[0].hotspots[0]
    assert hot.frame.name in ("launch", "step")
    line = line_of("launch_spin", "fakecuda.launch(i + k)")
    assert hot.user is not None and hot.user.where == f"launch_spin.py:{line}"


def test_loop_blocked_in_a_sync_every_step_is_sync(workload: Start) -> None:
    proc = workload("sync_wait")
    cap = runner.record([proc.pid], duration=2)
    summaries = summarize(cap.threads, gpu_pids=cap.pids, cpu_share=cap.cpu_share)
    main = summaries[0]
    assert main.label == LABEL_SYNC
    assert main.hotspots[0].frame.name == "synchronize"
    assert main.hotspots[0].share > 0.6
    assert main.hotspots[0].user is not None
    assert main.hotspots[0].user.where == f"sync_wait.py:{line_of('sync_wait', 'fakecuda.synchronize()')}"


def test_target_exiting_mid_capture_gives_the_stacks_until_then_and_says_so(workload: Start) -> None:
    proc = workload("sync_wait", seconds=1.0)
    cap = runner.record([proc.pid], duration=4)
    assert cap.threads, "the samples taken before the exit are kept"
    assert cap.wall_seconds < 4 + runner.GRACE_S
    assert cap.problems == (f"pid {proc.pid}: the process exited during the capture (stacks until then)",)


def test_ptrace_denied_says_stacks_unavailable_with_the_reason(workload: Start, tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run py-spy without ptrace rights")
    proc = workload("sync_wait")
    binary = runner.pyspy_binary()
    assert binary is not None
    # py-spy as nobody, without capabilities: the kernel refuses to let it read a root process.
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(f"#!/bin/sh\nexec {setpriv} --reuid 65534 --regid 65534 --clear-groups --inh-caps=-all "
                       f"{binary} \"$@\"\n")
    wrapper.chmod(0o755)
    started = time.monotonic()
    cap = runner.record([proc.pid], duration=2, binary=str(wrapper))
    assert time.monotonic() - started < 2 + runner.GRACE_S
    assert cap.threads == ()
    assert cap.unavailable == (f"stacks unavailable: pid {proc.pid}: permission denied (ptrace: run as root or with "
                               "CAP_SYS_PTRACE, in the target's PID namespace)")


def test_a_process_that_is_not_python_gives_py_spys_reason() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        cap = runner.record([proc.pid], duration=1)
    finally:
        proc.kill()
        proc.wait()
    assert cap.unavailable is not None and cap.unavailable.startswith(f"stacks unavailable: pid {proc.pid}: ")
    assert "python" in cap.unavailable.lower()


def test_no_py_spy_and_no_process_are_reasons_too(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner.record([], duration=1).unavailable == "stacks unavailable: no process to sample"
    monkeypatch.setattr(runner, "pyspy_binary", lambda: None)
    assert runner.record([os.getpid()], duration=1).unavailable == (
        "stacks unavailable: py-spy is not installed (pip install 'gpufeed[capture]')")


def test_py_spy_past_its_deadline_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hang = tmp_path / "hang"
    hang.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    hang.chmod(0o755)
    monkeypatch.setattr(runner, "GRACE_S", 0.5)
    started = time.monotonic()
    cap = runner.record([os.getpid()], duration=1, binary=str(hang))
    assert time.monotonic() - started < 5
    assert cap.unavailable == f"stacks unavailable: pid {os.getpid()}: py-spy did not finish within 1.5 s"


def test_native_mode_shows_the_c_frames_under_the_sync(workload: Start) -> None:
    proc = workload("sync_wait")
    cap = runner.record([proc.pid], duration=2, native=True)
    assert cap.problems == ()
    main = next(t for t in cap.threads if t.tid == proc.pid)
    stack, _ = max(main.stacks, key=lambda s: s[1])
    names = [f.name for f in stack]
    assert names.index("synchronize") < len(names) - 1, "native frames below the Python one"
    assert any(not f.file.endswith(".py") and f.file for f in stack[names.index("synchronize") + 1:])
    assert summarize(cap.threads, gpu_pids=cap.pids)[0].label == LABEL_SYNC
