"""Run py-spy on a workload's processes for a few seconds and hand back what it saw, whatever happened.

One ``py-spy record`` per GPU process (``--subprocesses`` follows its data-loader workers), all at once, in
non-blocking mode by default: py-spy reads the target's memory through ``process_vm_readv`` without stopping
it (``--native`` needs the target paused at each sample: py-spy refuses it with ``--nonblocking``). Each run
has a deadline (the duration plus :data:`GRACE_S`); past it py-spy is killed and what it wrote is not there.
Outcomes are values, never exceptions: a target that exits mid-capture gives the samples taken until then
and a note; ptrace refused (no ``CAP_SYS_PTRACE``, another PID namespace, Yama) or py-spy missing gives
"stacks unavailable: <reason>". The CPU time py-spy used is measured with ``wait4(2)`` per child.

Each thread's runnable time over the capture (on a CPU or queued for one) is read from
``/proc/<pid>/task/<tid>/schedstat`` before and after: a thread runnable the whole time is busy, one blocked is
waiting, whatever frame py-spy caught it in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.capture.stacks import ThreadStacks, parse_raw
from exporter.sources import USER_HZ

GRACE_S = 10.0  # py-spy's start (reading the target's symbols) and writing its file, beyond the duration
MAX_OUTPUT_BYTES = 64 * 1024 * 1024  # a raw file larger than this is not read (a runaway stack depth)
MAX_TARGETS = 8  # GPU processes sampled in one capture (one py-spy each)


@dataclass(frozen=True, slots=True)
class StackCapture:
    """What one capture of stacks gave: the threads seen, each thread's CPU share, and what went wrong."""

    pids: tuple[int, ...]
    threads: tuple[ThreadStacks, ...] = ()
    cpu_share: Mapping[tuple[int, int], float] = field(default_factory=dict)  # runnable share of the wall time
    problems: tuple[str, ...] = ()  # one line per target that gave less than asked
    cpu_seconds: float = 0.0  # py-spy's own user + system time, every run
    wall_seconds: float = 0.0
    raw: str = ""  # py-spy's raw output, every target's, as written

    @property
    def unavailable(self) -> str | None:
        """``stacks unavailable: <reason>`` when no stack at all was seen."""
        if self.threads:
            return None
        reason = "; ".join(self.problems) if self.problems else "no thread sampled"
        return f"stacks unavailable: {reason}"


def pyspy_binary() -> str | None:
    """py-spy next to this interpreter (the wheel installs it into the scripts folder), else on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def command(binary: str, pid: int, duration: float, rate: int, out: Path, *, native: bool = False) -> list[str]:
    """The py-spy command line for one target."""
    cmd = [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(duration))), "--rate", str(rate),
           "--format", "raw", "--threads", "--idle", "--full-filenames", "--subprocesses", "--output", str(out)]
    return [*cmd, "--native"] if native else [*cmd, "--nonblocking"]


def why(output: str, rc: int) -> str:
    """The reason py-spy gives for a failed run, as one line."""
    for line in output.splitlines():
        text = line.strip()
        if text.startswith("Permission Denied"):
            return "permission denied (ptrace: run as root or with CAP_SYS_PTRACE, in the target's PID namespace)"
        if text.startswith("Error:"):
            return text[len("Error:"):].strip()
    return f"py-spy exited with status {rc}"


def descendants(procfs: Path, pids: Iterable[int]) -> set[int]:
    """``pids`` and every process below them, from each /proc/<pid>/stat's ppid."""
    parent: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(procfs):
            if not entry.name.isdigit():
                continue
            try:
                text = (procfs / entry.name / "stat").read_text()
            except OSError:
                continue
            rest = text[text.rfind(")") + 2:].split()
            if len(rest) > 1 and rest[1].isdigit():
                parent[int(entry.name)] = int(rest[1])
    found = set(pids)
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in found and p not in found}
        found |= more
        grew = bool(more)
    return found


def thread_runnable(procfs: Path, pids: Iterable[int]) -> dict[tuple[int, int], float]:
    """Seconds every thread of ``pids`` was on a CPU or waiting in a run queue for one, from
    /proc/<pid>/task/<tid>/schedstat (sched-stats.rst: on-CPU ns, run-queue ns, timeslices); utime + stime
    from .../stat where there is no schedstat (a kernel without CONFIG_SCHED_INFO).

    Runnable, not CPU time: on a busy host a spinning thread gets a fraction of a CPU and waits for the rest,
    and it is still a thread that never blocks."""
    out: dict[tuple[int, int], float] = {}
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(procfs / str(pid) / "task") if t.isdigit()]
        except OSError:
            continue
        for tid in tids:
            task = procfs / str(pid) / "task" / str(tid)
            try:
                fields = (task / "schedstat").read_text().split()
                out[(pid, tid)] = (int(fields[0]) + int(fields[1])) / 1e9
                continue
            except (OSError, ValueError, IndexError):
                pass
            try:
                text = (task / "stat").read_text()
            except OSError:
                continue
            rest = text[text.rfind(")") + 2:].split()
            if len(rest) > 12:
                out[(pid, tid)] = (int(rest[11]) + int(rest[12])) / USER_HZ  # proc(5): utime, stime in ticks
    return out


def _explain(exe: str, pid: int, said: str) -> str:
    """py-spy's output, or, where --subprocesses hid the cause ("No python processes found"), the output of one
    ``py-spy dump`` of the target alone, which names it (permission denied, not a Python process)."""
    if "No python processes found" not in said:
        return said
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=GRACE_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return said
    return (done.stdout + done.stderr).decode(errors="replace") or said


def _reap(proc: subprocess.Popen[bytes], deadline: float, cancel: threading.Event | None) -> tuple[int, float]:
    """Wait for ``proc`` until ``deadline`` (monotonic) or ``cancel``, killing it then; its status and CPU
    seconds."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline or (cancel is not None and cancel.is_set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        time.sleep(0.05)


def record(pids: Iterable[int], *, duration: float, rate: int = 100, procfs: Path = Path("/proc"),
           native: bool = False, binary: str | None = None, cancel: threading.Event | None = None) -> StackCapture:
    """Sample ``pids`` (and their children) for ``duration`` seconds at ``rate`` Hz; never raises for what the
    targets or py-spy do. ``cancel`` set (the daemon stopping) kills py-spy at once."""
    targets = tuple(sorted(set(pids)))[:MAX_TARGETS]
    if not targets:
        return StackCapture(pids=(), problems=("no process to sample",))
    exe = binary or pyspy_binary()
    if exe is None:
        return StackCapture(pids=targets, problems=("py-spy is not installed (pip install 'gpufeed[capture]')",))
    started = time.monotonic()
    family = descendants(procfs, targets)
    before = thread_runnable(procfs, family)
    problems: list[str] = []
    texts: list[str] = []
    cpu = 0.0
    with tempfile.TemporaryDirectory(prefix="gpufeed-pyspy-") as tmp:
        runs: list[tuple[int, Path, subprocess.Popen[bytes], Path]] = []
        for pid in targets:
            out, log = Path(tmp) / f"{pid}.raw", Path(tmp) / f"{pid}.log"
            with log.open("wb") as sink:
                try:
                    proc = subprocess.Popen(command(exe, pid, duration, rate, out, native=native),
                                            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
                except OSError as e:
                    problems.append(f"pid {pid}: cannot run py-spy: {e.strerror or e}")
                    continue
            runs.append((pid, out, proc, log))
        deadline = time.monotonic() + duration + GRACE_S
        for pid, out, proc, log in runs:
            rc, used = _reap(proc, deadline, cancel)
            cpu += used
            said = log.read_text(errors="replace")
            try:
                text = out.read_text(errors="replace") if out.stat().st_size <= MAX_OUTPUT_BYTES else ""
            except OSError:
                text = ""
            if rc == -signal.SIGKILL and cancel is not None and cancel.is_set():
                problems.append(f"pid {pid}: cancelled (gpufeed stopping)")
            elif rc == -signal.SIGKILL:
                problems.append(f"pid {pid}: py-spy did not finish within {duration + GRACE_S:g} s")
            elif rc != 0:
                problems.append(f"pid {pid}: {why(_explain(exe, pid, said), rc)}")
            elif "process exited" in said:
                problems.append(f"pid {pid}: the process exited during the capture (stacks until then)")
            texts.append(text)
    wall = time.monotonic() - started
    after = thread_runnable(procfs, family | descendants(procfs, targets))
    share = {k: max(0.0, (v - before[k]) / wall) for k, v in after.items() if k in before and wall > 0}
    raw = "".join(t if t.endswith("\n") or not t else t + "\n" for t in texts)
    threads = tuple(parse_raw(raw))
    return StackCapture(pids=targets, threads=threads, cpu_share=share, problems=tuple(problems),
                        cpu_seconds=cpu, wall_seconds=wall, raw=raw)
