"""One capture: sample the workload's stacks, judge them against the verdict, write the bundle.

Called on the capture thread (exporter/capture/stage.py), by ``gpufeed diagnose --stacks`` and by the HTTP
endpoint through the stage; never raises for what the workload, py-spy or the disk do: the outcome says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from exporter.capture import bundle, runner
from exporter.capture.options import CaptureConfig
from exporter.capture.stacks import (
    LABEL_SYNC,
    ThreadSummary,
    dominant_label,
    evidence,
    speedscope,
    summarize,
)
from exporter.capture.trigger import VerdictChange
from exporter.derived.evaluate import CAPTURE_CONFIRMS
from exporter.names import CAPTURE_TRIGGERS
from exporter.samples.derived import GpuVerdict

# What started it: the GPU waited on one cause for --capture.after; POST /capture; gpufeed diagnose --stacks.
TRIGGERS = CAPTURE_TRIGGERS
TRIGGER_VERDICT, TRIGGER_HTTP, TRIGGER_DIAGNOSE = TRIGGERS


@dataclass(frozen=True, slots=True)
class CaptureContext:
    """What the capture is about: the GPU, why it runs, the processes, and what the engine knew then."""

    gpu: int | None
    trigger: str
    pids: tuple[int, ...]
    verdict: GpuVerdict | None = None
    history: tuple[VerdictChange, ...] = ()
    samples: Mapping[str, Any] = field(default_factory=dict)  # sampler -> JSON-ready samples of the window
    host: Mapping[str, Any] = field(default_factory=dict)  # sampler -> JSON-ready newest sample
    now: float = 0.0  # the engine's clock when it was gathered (the history's times are on it)


@dataclass(frozen=True, slots=True)
class CaptureOutcome:
    """What one capture gave."""

    name: str
    gpu: int | None
    trigger: str
    path: Path | None  # None when the bundle could not be written (``error`` says why)
    label: str | None
    assessment: str
    evidence: tuple[str, ...]
    unavailable: str | None  # "stacks unavailable: <reason>" when no stack was seen
    problems: tuple[str, ...]
    cpu_seconds: float
    wall_seconds: float
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The outcome as JSON-ready values (diagnose --json, GET /captures)."""
        return {"name": self.name, "gpu": self.gpu, "trigger": self.trigger,
                "path": None if self.path is None else str(self.path), "label": self.label,
                "assessment": self.assessment, "evidence": list(self.evidence), "unavailable": self.unavailable,
                "problems": list(self.problems), "cpu_seconds": round(self.cpu_seconds, 3),
                "wall_seconds": round(self.wall_seconds, 3), "error": self.error}


def assess(cause: str | None, label: str | None) -> str:
    """What the stacks say about the verdict, in one sentence."""
    if label is None:
        return "the stacks show no dominant wait in the GPU process"
    if label == LABEL_SYNC:
        # A loop blocked in a host sync every step reads as latency_bound (or launch_bound) from the GPU's side;
        # under those verdicts the analyzer raises the sync_bound finding from this capture.
        said = f" (the verdict reads it as {cause})" if cause else ""
        return f"sync-bound: the GPU process blocks in a host sync every step{said}"
    if cause is not None and cause in CAPTURE_CONFIRMS.get(label, ()):  # the derived layer's rule
        return f"the stacks confirm {cause}"
    if cause is None:
        return f"the stacks point to {label}"
    return f"the stacks point to {label}, not {cause}: look at both"


def bundle_name(wall: float, gpu: int | None, trigger: str) -> str:
    """``20260612T141503Z-gpu3-verdict``: UTC time first, so name order is age order."""
    stamp = datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{'host' if gpu is None else f'gpu{gpu}'}-{trigger}"


def summary_markdown(ctx: CaptureContext, outcome: CaptureOutcome, threads: list[ThreadSummary]) -> str:
    """The short Markdown to paste in a ticket."""
    v = ctx.verdict
    head = f"GPU {ctx.gpu}" if ctx.gpu is not None else "host"
    lines = [f"# gpufeed capture {outcome.name}", ""]
    if v is not None:
        lines.append(f"**{head}: {v.cause}** (confidence {v.confidence:.2f}, waiting {100 * v.waiting_ratio:.0f}% "
                     f"of the window); trigger: {ctx.trigger}; processes: {', '.join(map(str, ctx.pids)) or 'none'}")
    else:
        lines.append(f"**{head}**; trigger: {ctx.trigger}; processes: {', '.join(map(str, ctx.pids)) or 'none'}")
    lines += ["", f"**Stacks:** {outcome.unavailable or outcome.assessment}", ""]
    lines += [f"- {e}" for e in outcome.evidence]
    if v is not None and v.evidence:
        lines += ["", "**Verdict evidence:**", ""] + [f"- {e}" for e in v.evidence]
    if ctx.history:
        lines += ["", "**Verdict history** (seconds before the capture):", ""]
        lines += [f"- {ctx.now - h.t:.0f} s: {h.cause} ({h.confidence:.2f})" for h in ctx.history]
    if outcome.problems:
        lines += ["", "**Partial:**", ""] + [f"- {p}" for p in outcome.problems]
    if threads:
        lines += ["", "| process | thread | samples | top frame | user line | share | label |",
                  "|---|---|---|---|---|---|---|"]
        for t in threads[:12]:
            h = t.hotspots[0] if t.hotspots else None
            share = 100 * h.share if h else 0.0
            lines.append(f"| {t.pid} | {t.name or t.tid} | {t.samples} | {h.frame.name if h else ''} | "
                         f"{h.user.where if h and h.user else ''} | {share:.0f}% | {t.label or ''} |")
    lines += ["", "Files: `stacks.speedscope.json` (open at https://www.speedscope.app), `capture.json`, "
              "`samples.json`, `host.json`, `stacks.raw`.", ""]
    return "\n".join(lines)


def take(ctx: CaptureContext, config: CaptureConfig, *, procfs: Path = Path("/proc"),
         binary: str | None = None, wall: float | None = None,
         cancel: threading.Event | None = None) -> CaptureOutcome:
    """Sample, judge, write. The CPU charged is py-spy's plus this thread's; ``cancel`` stops py-spy early."""
    wall = time.time() if wall is None else wall  # wall clock: the bundle's name and timestamp, not a measure
    cpu0 = time.thread_time()
    name = bundle_name(wall, ctx.gpu, ctx.trigger)
    stacks = runner.record(ctx.pids, duration=config.duration, rate=config.rate, procfs=procfs,
                           native=config.native, binary=binary, cancel=cancel)
    threads = summarize(stacks.threads, gpu_pids=stacks.pids, cpu_share=stacks.cpu_share)
    label = dominant_label(threads)
    cause = None if ctx.verdict is None else ctx.verdict.cause
    outcome = CaptureOutcome(
        name=name, gpu=ctx.gpu, trigger=ctx.trigger, path=None, label=label,
        assessment=assess(cause, label) if stacks.threads else "no stacks", evidence=tuple(evidence(threads)),
        unavailable=stacks.unavailable, problems=stacks.problems, cpu_seconds=stacks.cpu_seconds,
        wall_seconds=stacks.wall_seconds)
    record = outcome.as_json() | {
        "time": datetime.fromtimestamp(wall, tz=timezone.utc).isoformat(),
        "verdict": bundle.jsonable(ctx.verdict),
        "history": [bundle.jsonable(h) | {"seconds_before": round(ctx.now - h.t, 3)} for h in ctx.history],
        "threads": bundle.jsonable(threads),
        "settings": {"duration_s": config.duration, "rate_hz": config.rate, "native": config.native},
    }
    files = {
        "summary.md": summary_markdown(ctx, outcome, threads).encode(),
        "capture.json": bundle.dumps(record),
        "stacks.speedscope.json": bundle.dumps(speedscope(stacks.threads, name)),
        "stacks.raw": stacks.raw.encode(),
        "samples.json": bundle.dumps(dict(ctx.samples)),
        "host.json": bundle.dumps(dict(ctx.host)),
    }
    path: Path | None = None
    error: str | None = None
    try:
        path = bundle.write(config.dir, name, files, max_count=config.max_count, max_bytes=config.max_bytes)
    except OSError as e:
        error = f"cannot write the bundle in {config.dir}: {e.strerror or e}"
    cpu = stacks.cpu_seconds + time.thread_time() - cpu0
    return CaptureOutcome(name=name, gpu=ctx.gpu, trigger=ctx.trigger, path=path, label=label,
                          assessment=outcome.assessment, evidence=outcome.evidence, unavailable=outcome.unavailable,
                          problems=outcome.problems, cpu_seconds=cpu, wall_seconds=stacks.wall_seconds, error=error)
