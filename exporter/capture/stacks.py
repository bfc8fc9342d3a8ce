"""py-spy's stacks of a workload, aggregated per thread into where its time goes (pure: text in, values out).

Input is py-spy's ``raw`` format (``py-spy record --format raw --threads --idle --full-filenames
--subprocesses``): one line per distinct stack, frames root first, separated by ``;``, then a space and the
number of samples that saw it. With ``--subprocesses`` the line starts with the process chain
(``process 12295:"python train.py";process 12339:"python train.py";``), then the thread
(``thread (12339): MainThread``), then the frames (``_next_data (/usr/lib/python3/site-packages/torch/utils/data/
dataloader.py:1328)``). Native frames (``--native``) have a library or source file instead of a Python file.

Each thread is reduced to its hotspots: the frame that names what it does (a known waiting or synchronising
frame when the stack passes through one, else the leaf) and the first frame in the user's own code above it
(not in ``site-packages`` / ``dist-packages``, not the standard library, not native), with the share of the
thread's samples. A thread gets a *label* when one kind of frame dominates it:

- ``input``: waiting on the data-loader's workers or a queue (torch's ``DataLoader`` iterator, a
  ``multiprocessing`` or ``queue`` queue);
- ``sync``: blocked in a synchronising call (``torch.cuda.synchronize``, ``Event.synchronize``, and with
  ``--native`` ``cudaStreamSynchronize`` and friends, which is where ``.item()`` / ``.cpu()`` wait);
- ``launch``: a GPU process's thread busy on the CPU (runnable most of the capture, measured beside it) without
  waiting anywhere -- Python launching work (``cuLaunchKernel`` in native stacks);
- ``busy``: any other process's thread busy on the CPU (a data-loader worker computing).

Labels are capture-side words, not verdicts: they confirm or question the analyzer's verdict in the evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.names import CAPTURE_LABELS as LABELS

LABEL_INPUT, LABEL_SYNC, LABEL_LAUNCH, LABEL_BUSY = LABELS

# A thread's label needs this share of its samples in one kind of frame (input, sync) ...
LABEL_MIN_SHARE = 0.4
# ... or this share of the capture's wall time runnable: on a CPU or queued for one (launch, busy; from
# /proc/<pid>/task/<tid>/schedstat).
BUSY_MIN_CPU = 0.5
HOTSPOTS_PER_THREAD = 3
EVIDENCE_LINES = 5
EVIDENCE_MIN_SHARE = 0.10  # a thread's top hotspot below this share of its samples says nothing

# What the label means, in the evidence line.
MEANING = {
    LABEL_INPUT: "waiting on the workers",
    LABEL_SYNC: "a host sync every step",
    LABEL_LAUNCH: "busy in Python launching work",
    LABEL_BUSY: "busy on the CPU",
}

# Frames that mean "waiting for input", by file suffix and function (the last part of the qualified name),
# in preference order: the one named is the first of these the stack passes through.
INPUT_FRAMES: tuple[tuple[str, frozenset[str]], ...] = (
    ("torch/utils/data/dataloader.py", frozenset({"_next_data", "_get_data", "_try_get_data"})),
    ("multiprocessing/queues.py", frozenset({"get"})),
    ("queue.py", frozenset({"get"})),
    ("multiprocessing/connection.py", frozenset({"recv", "recv_bytes"})),
)
# Functions that synchronise with the device, by name: torch's Python-level calls, and the CUDA driver and
# runtime calls seen with --native (where .item(), .cpu() and blocking copies wait).
SYNC_FUNCTIONS = frozenset({
    "synchronize", "cudaStreamSynchronize", "cuStreamSynchronize", "cudaDeviceSynchronize", "cuCtxSynchronize",
    "cudaEventSynchronize", "cuEventSynchronize", "_local_scalar_dense", "cudaMemcpy", "cuMemcpyDtoH_v2",
})
LAUNCH_FUNCTIONS = frozenset({"cuLaunchKernel", "cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"})

# One record: ``process PID:"CMDLINE";`` parts (the chain from the target down), ``thread (TID)`` with an optional
# ``: NAME``, then ``;``-separated frames, a space and the count at the end of a line. A process part ends at the
# first ``";`` followed by another part, whatever the command line holds.
_PART = r'process \d+:".*?";(?=process \d+:"|thread \()'
_RECORD = re.compile(rf'(?:^|(?<=\n))((?:{_PART})*)thread \((\d+)\)(?:: ?([^;\n]*))?(?:;([^\n]*?))? (\d+)$',
                     re.S | re.M)
_PROCESSES = re.compile(r'process (\d+):"(.*?)";(?=process \d+:"|$)', re.S)
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")
_LIBRARY = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/|^<frozen |^<string>$")


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: function (qualified as py-spy shows it), file and line (None for native frames)."""

    function: str
    file: str
    line: int | None

    @property
    def name(self) -> str:
        """The function's own name (``Queue.get`` -> ``get``)."""
        return self.function.rsplit(".", 1)[-1]

    @property
    def user(self) -> bool:
        """Whether this frame is in the user's own code: a Python file outside site-packages and the stdlib."""
        if not self.file.endswith(".py") or any(p in self.file for p in _LIBRARY):
            return False
        return _STDLIB.search(self.file) is None

    @property
    def short_file(self) -> str:
        """The file as people name it: from the package for a library (``torch/utils/data/dataloader.py``), from
        the standard library's root for it (``multiprocessing/queues.py``), the base name for the user's code."""
        for marker in _LIBRARY:
            if marker in self.file:
                return self.file.rsplit(marker, 1)[1]
        m = _STDLIB.search(self.file)
        if m is not None and m.group(0).startswith("/") and m.end() < len(self.file):
            return self.file[m.end():]
        return self.file.rsplit("/", 1)[-1]

    @property
    def where(self) -> str:
        """``train.py:88`` (the short file and the line)."""
        return self.short_file if self.line is None else f"{self.short_file}:{self.line}"


@dataclass(frozen=True, slots=True)
class ThreadStacks:
    """Every stack py-spy saw on one thread, root frame first, with its sample count."""

    pid: int
    tid: int
    name: str
    command: str
    stacks: tuple[tuple[tuple[Frame, ...], int], ...]

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.stacks)


@dataclass(frozen=True, slots=True)
class Hotspot:
    """Where a share of one thread's samples went: the frame named, the first user frame above it, the label."""

    frame: Frame
    user: Frame | None
    samples: int
    share: float
    label: str | None


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One thread, reduced: its hotspots (largest first), its CPU share over the capture, its label."""

    pid: int
    tid: int
    name: str
    samples: int
    cpu_share: float | None
    gpu_process: bool
    hotspots: tuple[Hotspot, ...]
    label: str | None

    @property
    def who(self) -> str:
        """How the evidence names the thread."""
        if self.gpu_process:
            return "main thread" if self.tid == self.pid else f"thread {self.name or self.tid}"
        return f"worker {self.pid}" if self.tid == self.pid else f"worker {self.pid} thread {self.name or self.tid}"

    def evidence(self) -> str | None:
        """``main thread 68% in `_next_data` (torch/utils/data/dataloader.py) <- `train.py:88`: waiting on the
        workers``; None when nothing stands out."""
        if not self.hotspots or self.hotspots[0].share < EVIDENCE_MIN_SHARE:
            return None
        top = self.hotspots[0]
        # A label from CPU time (launch, busy) holds for the whole thread; input and sync for their frames.
        share = sum(h.share for h in self.hotspots if h.label == self.label) if self.label in (
            LABEL_INPUT, LABEL_SYNC) else top.share
        line = f"{self.who} {round(100 * share)}% in `{top.frame.name}` ({top.frame.short_file})"
        if top.user is not None and top.user != top.frame:
            line += f" \u2190 `{top.user.where}`"
        elif top.frame.user and top.frame.line is not None:
            line = f"{self.who} {round(100 * share)}% at `{top.frame.where}`"
        if self.cpu_share is not None and self.label in (LABEL_LAUNCH, LABEL_BUSY):
            line += f", runnable {round(100 * min(1.0, self.cpu_share))}% of the time"
        return f"{line}: {MEANING[self.label]}" if self.label is not None else line


def parse_frame(text: str) -> Frame:
    """``func (file:line)`` -> Frame; a native frame may have no line, or no parenthesis at all."""
    m = _FRAME.match(text)
    if m is None:
        return Frame(text, "", None)
    return Frame(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None)


def parse_raw(text: str) -> list[ThreadStacks]:
    """py-spy's raw output -> one :class:`ThreadStacks` per (pid, tid), in order of first appearance.

    A command line is written as the process had it: it may hold quotes, ``;`` and newlines (``python -c``), so
    a record is found by its shape -- process parts, the thread part, frames, the count at the end of a line --
    not by lines. Anything else (a truncated last record of an interrupted capture) is skipped."""
    by_thread: dict[tuple[int, int], tuple[str, str, dict[tuple[Frame, ...], int]]] = {}
    for m in _RECORD.finditer(text):
        processes = _PROCESSES.findall(m.group(1))
        tid = int(m.group(2))
        name = m.group(3) or ""
        parts = m.group(4).split(";") if m.group(4) else []
        while m.group(3) is not None and parts and _FRAME.match(parts[0]) is None:
            name += ";" + parts.pop(0)  # a thread name holding ";" (a root frame always has its "(file)")
        name = name.strip()
        frames = tuple(parse_frame(part) for part in parts if part)
        # Without --subprocesses there is no process part: the target's own threads.
        pid, command = (int(processes[-1][0]), processes[-1][1]) if processes else (tid, "")
        _, _, stacks = by_thread.setdefault((pid, tid), (name, command, {}))
        stacks[frames] = stacks.get(frames, 0) + int(m.group(5))
    return [ThreadStacks(pid, tid, name, command, tuple(stacks.items()))
            for (pid, tid), (name, command, stacks) in by_thread.items()]


def _marker(stack: tuple[Frame, ...]) -> tuple[Frame, str | None]:
    """The frame that names what a stack does, and its label: a sync or launch frame, else an input frame
    (in INPUT_FRAMES' order), else the leaf."""
    for f in reversed(stack):
        if f.name in SYNC_FUNCTIONS:
            return f, LABEL_SYNC
        if f.name in LAUNCH_FUNCTIONS:
            return f, LABEL_LAUNCH
    for suffix, functions in INPUT_FRAMES:
        for f in stack:
            if f.name in functions and f.file.endswith(suffix):
                return f, LABEL_INPUT
    return stack[-1], None


def _user_above(stack: tuple[Frame, ...], marker: Frame) -> Frame | None:
    """The deepest user frame at or above ``marker`` (the user's line that led there)."""
    idx = len(stack) - 1 - stack[::-1].index(marker)
    for f in reversed(stack[: idx + 1]):
        if f.user:
            return f
    return None


def summarize(threads: Iterable[ThreadStacks], *, gpu_pids: Iterable[int] = (),
              cpu_share: Mapping[tuple[int, int], float] | None = None) -> list[ThreadSummary]:
    """Each thread reduced to its hotspots and label, threads of the GPU processes first, then by samples.

    ``cpu_share`` is each (pid, tid)'s runnable time over the capture's wall time, where it was measured."""
    gpu = set(gpu_pids)
    shares = cpu_share or {}
    out: list[ThreadSummary] = []
    for t in threads:
        total = t.samples
        if total == 0:
            continue
        groups: dict[tuple[Frame, Frame | None], tuple[int, str | None]] = {}
        for stack, n in t.stacks:
            if not stack:
                continue
            frame, kind = _marker(stack)
            user = _user_above(stack, frame)
            # A library frame by function, whatever its line; the user's own lines stay apart.
            key = (frame if frame.user else Frame(frame.function, frame.file, None), user)
            seen, _ = groups.get(key, (0, kind))
            groups[key] = (seen + n, kind)
        hotspots = sorted((Hotspot(f, u, n, n / total, k) for (f, u), (n, k) in groups.items()),
                          key=lambda h: (-h.samples, h.frame.function))
        by_label: dict[str, float] = {}
        for h in hotspots:
            if h.label is not None:
                by_label[h.label] = by_label.get(h.label, 0.0) + h.share
        cpu = shares.get((t.pid, t.tid))
        label: str | None = None
        waiting = max(((s, lb) for lb, s in by_label.items() if lb in (LABEL_INPUT, LABEL_SYNC)), default=None)
        if waiting is not None and waiting[0] >= LABEL_MIN_SHARE:
            label = waiting[1]
        elif by_label.get(LABEL_LAUNCH, 0.0) >= LABEL_MIN_SHARE or (cpu is not None and cpu >= BUSY_MIN_CPU):
            label = LABEL_LAUNCH if t.pid in gpu else LABEL_BUSY
        if label in (LABEL_INPUT, LABEL_SYNC):
            # The labelled frames first: the evidence names what the label is about.
            hotspots.sort(key=lambda h: (h.label != label, -h.samples, h.frame.function))
        out.append(ThreadSummary(t.pid, t.tid, t.name, total, cpu, t.pid in gpu,
                                 tuple(hotspots[:HOTSPOTS_PER_THREAD]), label))
    out.sort(key=lambda s: (not s.gpu_process, s.tid != s.pid, -s.samples, s.pid, s.tid))
    return out


def dominant_label(summaries: Iterable[ThreadSummary]) -> str | None:
    """The capture's label: the GPU process main thread's (the thread that feeds the GPU), else the first
    labelled thread of a GPU process."""
    gpu = [s for s in summaries if s.gpu_process]
    for s in sorted(gpu, key=lambda s: s.tid != s.pid):
        if s.label is not None:
            return s.label
    return None


def evidence(summaries: Iterable[ThreadSummary], limit: int = EVIDENCE_LINES) -> list[str]:
    """The evidence lines of a capture: a line per thread that says something, GPU processes' threads first;
    an idle thread with no label says nothing (a pool waiting for work is not news)."""
    out: list[str] = []
    for s in summaries:
        line = s.evidence()
        if line is not None and (s.label is not None or (s.gpu_process and s.tid == s.pid)):
            out.append(line)
        if len(out) >= limit:
            break
    return out


def speedscope(threads: Iterable[ThreadStacks], name: str) -> dict[str, Any]:
    """The stacks as a speedscope file (https://www.speedscope.app/file-format-schema.json): one sampled
    profile per thread, weights in samples."""
    frames: list[dict[str, Any]] = []
    index: dict[Frame, int] = {}
    profiles: list[dict[str, Any]] = []
    for t in threads:
        samples: list[list[int]] = []
        weights: list[int] = []
        for stack, n in t.stacks:
            ids = []
            for f in stack:
                if f not in index:
                    index[f] = len(frames)
                    entry: dict[str, Any] = {"name": f.function, "file": f.file}
                    if f.line is not None:
                        entry["line"] = f.line
                    frames.append(entry)
                ids.append(index[f])
            samples.append(ids)
            weights.append(n)
        profiles.append({
            "type": "sampled", "name": f"pid {t.pid} tid {t.tid} {t.name}".strip(), "unit": "none",
            "startValue": 0, "endValue": sum(weights), "samples": samples, "weights": weights,
        })
    return {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "name": name, "exporter": "gpufeed", "activeProfileIndex": 0,
        "shared": {"frames": frames}, "profiles": profiles,
    }
