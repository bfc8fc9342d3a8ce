"""py-spy's raw stacks reduced to evidence: real captures of the three test programs (tests/capture/programs/,
recorded with exporter.capture.runner on this machine; the checkout's path replaced by /srv/job)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.capture.stacks import (
    LABEL_BUSY,
    LABEL_INPUT,
    LABEL_LAUNCH,
    LABEL_SYNC,
    Frame,
    dominant_label,
    evidence,
    parse_frame,
    parse_raw,
    speedscope,
    summarize,
)

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> tuple[list, int]:  # type: ignore[type-arg]
    threads = parse_raw((FIXTURES / f"{name}.raw").read_text())
    return threads, min(t.pid for t in threads)  # the program's own process; the others are its workers


def test_raw_lines_become_one_entry_per_thread_with_every_sample() -> None:
    threads, root = load("queue_wait")
    keys = {(t.pid, t.tid) for t in threads}
    assert len(keys) == len(threads)
    main = next(t for t in threads if t.pid == root and t.tid == root)
    assert main.name == "MainThread"
    assert 150 <= main.samples <= 210  # 2 s at 100 Hz
    assert main.command.endswith("queue_wait.py 8")
    # Workers (with --subprocesses) are their own processes, each with its feeder thread.
    assert len({t.pid for t in threads}) == 3


def test_frames_parse_python_and_native_forms() -> None:
    assert parse_frame("Queue.get (/usr/lib/python3.11/multiprocessing/queues.py:103)") == Frame(
        "Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 103)
    assert parse_frame("cuLaunchKernel (libcuda.so.1)") == Frame("cuLaunchKernel", "libcuda.so.1", None)
    assert parse_frame("0x7f00deadbeef") == Frame("0x7f00deadbeef", "", None)


@pytest.mark.parametrize(("file", "user", "short"), [
    ("/srv/job/train.py", True, "train.py"),
    ("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", False, "torch/utils/data/dataloader.py"),
    ("/usr/lib/python3/dist-packages/numpy/core/fromnumeric.py", False, "numpy/core/fromnumeric.py"),
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/multiprocessing/queues.py", False, "multiprocessing/queues.py"),
    ("<frozen importlib._bootstrap>", False, "<frozen importlib._bootstrap>"),
    ("libcuda.so.1", False, "libcuda.so.1"),
])
def test_user_code_is_neither_a_library_nor_the_standard_library(file: str, user: bool, short: str) -> None:
    f = Frame("f", file, 1)
    assert f.user is user
    assert f.short_file == short


def test_main_thread_waiting_on_a_queue_fed_by_slow_workers_is_input() -> None:
    threads, root = load("queue_wait")
    summaries = summarize(threads, gpu_pids=[root])
    main = summaries[0]
    assert (main.pid, main.tid, main.label) == (root, root, LABEL_INPUT)
    top = main.hotspots[0]
    assert (top.frame.name, top.frame.short_file) == ("get", "multiprocessing/queues.py")
    assert top.user is not None and top.user.where == "queue_wait.py:18"  # return int(q.get())
    assert top.share > 0.9
    assert dominant_label(summaries) == LABEL_INPUT
    lines = evidence(summaries)
    assert lines[0].startswith("main thread ")
    assert "in `get` (multiprocessing/queues.py) \u2190 `queue_wait.py:18`: waiting on the workers" in lines[0]


def test_workers_computing_are_busy_when_their_cpu_says_so() -> None:
    threads, root = load("queue_wait")
    workers = {t.pid for t in threads if t.pid != root}
    share = {(p, p): 0.98 for p in workers}
    summaries = summarize(threads, gpu_pids=[root], cpu_share=share)
    busy = [s for s in summaries if s.pid in workers and s.tid == s.pid]
    assert {s.label for s in busy} == {LABEL_BUSY}
    assert all(s.hotspots[0].frame.short_file == "queue_wait.py" for s in busy)  # the slow transform itself
    assert any(line.startswith(f"worker {sorted(workers)[0]} ") for line in evidence(summaries))


def test_one_thread_spinning_on_tiny_launches_is_launch_bound_when_always_runnable() -> None:
    threads, root = load("launch_spin")
    summaries = summarize(threads, gpu_pids=[root], cpu_share={(root, root): 0.97})
    main = summaries[0]
    assert main.label == LABEL_LAUNCH
    assert main.hotspots[0].frame.name == "launch"
    assert main.hotspots[0].user is not None and main.hotspots[0].user.where == "launch_spin.py:13"
    line = evidence(summaries)[0]
    assert "in `launch` (fakecuda/__init__.py) \u2190 `launch_spin.py:13`" in line
    assert line.endswith("runnable 97% of the time: busy in Python launching work")
    # Without the thread's CPU measure the same stacks say nothing about launching.
    assert summarize(threads, gpu_pids=[root])[0].label is None


def test_a_loop_blocked_in_synchronize_every_step_is_sync() -> None:
    threads, root = load("sync_wait")
    summaries = summarize(threads, gpu_pids=[root], cpu_share={(root, root): 0.01})
    main = summaries[0]
    assert main.label == LABEL_SYNC
    assert main.hotspots[0].frame.name == "synchronize"
    assert main.hotspots[0].user is not None and main.hotspots[0].user.where == "sync_wait.py:17"
    assert evidence(summaries)[0].endswith("\u2190 `sync_wait.py:17`: a host sync every step")
    # The device thread (a library's own thread, waiting) is not news.
    assert len(evidence(summaries)) == 1


def test_native_sync_and_launch_frames_name_the_label() -> None:
    user = "train (/srv/job/train.py:120)"
    raw = (f"thread (7): MainThread;{user};item (/v/lib/python3.11/site-packages/torch/_tensor.py:1);"
           "cudaStreamSynchronize (libcudart.so.12) 60\n"
           f"thread (7): MainThread;{user};cuLaunchKernel (libcuda.so.1) 40\n")
    s = summarize(parse_raw(raw), gpu_pids=[7])[0]
    assert s.pid == 7 and s.label == LABEL_SYNC
    assert [h.frame.name for h in s.hotspots] == ["cudaStreamSynchronize", "cuLaunchKernel"]
    assert evidence([s]) == ["main thread 60% in `cudaStreamSynchronize` (libcudart.so.12) \u2190 `train.py:120`: "
                             "a host sync every step"]


def test_truncated_and_foreign_lines_are_skipped() -> None:
    raw = "thread (7): MainThread;f (/a.py:1) 5\nthread (7): MainThread;f (/a.py:1) 3\nthread (7): Main\nnoise\n"
    (t,) = parse_raw(raw)
    assert t.samples == 8 and len(t.stacks) == 1


def test_speedscope_file_holds_every_sample_once_per_thread() -> None:
    threads, _ = load("queue_wait")
    doc = speedscope(threads, "x")
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert len(doc["profiles"]) == len(threads)
    for prof, t in zip(doc["profiles"], threads, strict=True):
        assert sum(prof["weights"]) == t.samples == prof["endValue"]
        assert all(0 <= i < len(doc["shared"]["frames"]) for s in prof["samples"] for i in s)


def test_command_lines_with_newlines_quotes_and_semicolons_and_thread_names_with_them_parse() -> None:
    # A real capture of `python -c '...'` whose code has newlines, quotes and ";", and a thread named "x;y".
    threads = parse_raw((FIXTURES / "dash_c.raw").read_text())
    assert sorted(t.name for t in threads) == ["MainThread", "x;y"]
    assert all(t.samples > 50 for t in threads)
    for t in threads:
        assert t.command.startswith("/srv/job/.venv/bin/python -c import threading\ns = \"a\";t = \"b\"\n")
        assert t.stacks[0][0][-1].function in ("spin", "<module>")
        assert t.stacks[0][0][0].name in ("<module>", "_bootstrap")
    assert parse_raw("thread (7);f (/a.py:1) 5\n")[0].name == ""  # a thread without a name
