"""``gpufeed diagnose``: a one-shot report per GPU."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from exporter import analysis, log
from exporter.collectors import load_all
from exporter.collectors.base import parse_duration
from exporter.config import resolve
from exporter.daemon import build_collectors
from exporter.engine import Engine, RealClock
from exporter.samples.derived import DerivedState
from exporter.samples.gpu import GpuSample, GpuSlow


def run_diagnose(ns: argparse.Namespace) -> int:
    """``--scenario``: play it in virtual time (exporter.sim.report); otherwise sample this host."""
    if getattr(ns, "scenario", None):
        from exporter.sim.report import run_scenario

        return run_scenario(ns)
    return run_live(ns)


# ---- live host (owned by the derived layer) -------------------------------------------------------------------

# The next check the field playbook would run for each verdict (shared/reference/playbook.es.txt, checklists).
NEXT_CHECK = {
    "launch_bound": "top -H -p {pid} (which thread is hot), then nsys profile a few steps: count kernel launches "
                    "and syncs; fuse kernels or use CUDA Graphs",
    "input_bound": "mpstat -P ALL 1 and pidstat -t -p {pid} 1: are the data-loader workers' cores saturated? "
                   "then time each stage (read, decode, transform)",
    "io_bound": "iostat -xz 1 (await, small requests) and nfsstat -c on network filesystems",
    "transfer_bound": "lspci -vv -s {bdf} (LnkSta vs LnkCap) and nvidia-smi dmon -s t (PCIe throughput)",
    "gpu_throttled": "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER (clock-event reasons, temperature, power)",
    "gpu_inefficient": "nsys profile / ncu a few steps: kernel efficiency, tensor-core use, precision, batch size",
    "latency_bound": "nvidia-smi dmon -s u: the load is small; batch requests, or accept it for a p99 SLA",
    "healthy": "nvidia-smi dmon -s pucvmt to watch it; nothing to fix on the host",
    "idle": "nvidia-smi: is the job really using this GPU? (no work was submitted)",
}
_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def _next_check(cause: str, pids: Sequence[int], bdf: str) -> str:
    return NEXT_CHECK.get(cause, "").format(pid=pids[0] if pids else "<pid>", bdf=bdf or "<bdf>")


def _progress(done: float, total: float, out: TextIO) -> None:
    width = 30
    filled = min(width, int(width * done / total)) if total > 0 else width
    out.write(f"\rgpufeed diagnose: sampling [{'#' * filled}{'.' * (width - filled)}] {done:4.0f}/{total:.0f} s")
    out.flush()


async def _sample_live(engine: Engine, duration: float, tty: TextIO | None) -> None:
    """Run the engine for ``duration`` seconds of real time, drawing a progress bar on ``tty``."""
    engine.start()
    start = time.monotonic()
    try:
        while (left := duration - (time.monotonic() - start)) > 0:
            if tty is not None:
                _progress(duration - left, duration, tty)
            await asyncio.sleep(min(0.5, left))
    finally:
        if tty is not None:
            _progress(duration, duration, tty)
            tty.write("\n")
        await engine.stop(timeout=1.0)


def live_report(engine: Engine, duration: float) -> dict[str, Any]:
    """The live report as a JSON-ready dict in SPEC.md's shape: one phase named ``live``."""
    snap = engine.snapshot
    state = snap.value("derived")
    gpu_status = snap.status.get("gpu")
    gpus_seen: dict[int, Any] = {}
    pids: dict[int, list[int]] = {}
    bdfs: dict[int, str] = {}
    for name in ("gpu", "gpu_slow"):
        v = snap.value(name)
        if isinstance(v, GpuSample):
            gpus_seen.update(v.identities)
            for i, g in v.gpus.items():
                if isinstance(g, GpuSlow):
                    pids[i] = [p.pid for p in g.processes]
    for i, ident in gpus_seen.items():
        bdfs[i] = ident.pci_bus_id
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "duration_s": round(duration, 1),
        "window_s": state.window_s if isinstance(state, DerivedState) else None,
        "gpus": [],
        "findings": [],
    }
    if not gpus_seen:
        reason = gpu_status.error if gpu_status is not None and gpu_status.error else "no NVIDIA driver or GPU found"
        out["note"] = f"no GPU on this host ({reason}): host findings only"
    if isinstance(state, DerivedState):
        for i in sorted(gpus_seen):
            v = state.gpus.get(i)
            act = state.activity.get(i)
            share = None
            if act is not None:
                total = sum(act.state_seconds.values())
                share = round(act.state_seconds.get("waiting", 0.0) / total, 3) if total > 0 else None
            entry: dict[str, Any] = {
                "index": i,
                "uuid": gpus_seen[i].uuid,
                "name": gpus_seen[i].name,
                "cause": v.cause if v is not None else None,
                "confidence": round(v.confidence, 3) if v is not None else None,
                "waiting_ratio": round(v.waiting_ratio, 3) if v is not None else None,
                "waiting_share_of_run": share,
                "evidence": list(v.evidence) if v is not None else ["no verdict (GPU lost or no data)"],
                "next_check": _next_check(v.cause, pids.get(i, []), bdfs.get(i, "")) if v is not None else
                "dmesg | grep -i xid; nvidia-smi -q",
            }
            out["gpus"].append(entry)
        out["findings"] = [
            {"check": f.check, "gpu": f.gpu, "severity": f.severity, "detail": f.detail}
            for f in sorted(state.findings, key=lambda f: (_SEVERITY_RANK.get(f.severity, 9), f.check))
        ]
    else:
        out["note"] = "the derived layer produced no evaluation (run longer than a few seconds)"
    # SPEC.md's shape: one phase, "live", covering the sampled time.
    phase = {"name": "live", "end_s": out["duration_s"], "gpus": out.pop("gpus"), "findings": out.pop("findings")}
    return {"scenario": None, **out, "phases": [phase]}


def _phase(report: Mapping[str, Any]) -> Mapping[str, Any]:
    phases = report.get("phases") or [{}]
    return dict(phases[-1])


def live_exit_code(report: Mapping[str, Any]) -> int:
    """0 when every GPU is healthy or idle and nothing was found; 1 for any finding or any other verdict."""
    ph = _phase(report)
    if ph.get("findings"):
        return 1
    if any(g.get("cause") not in ("healthy", "idle") for g in ph.get("gpus", [])):
        return 1
    return 0


def print_live(report: Mapping[str, Any], out: TextIO) -> None:
    """The report a person reads in ten seconds: one block per GPU, then the findings."""
    head = f"gpufeed diagnose on {report['host']}: {report['duration_s']:.0f} s sampled"
    if report.get("window_s"):
        head += f", verdicts over the last {min(report['window_s'], report['duration_s']):.0f} s"
    out.write(head + "\n")
    if report.get("note"):
        out.write(f"  {report['note']}\n")
    ph = _phase(report)
    for g in ph.get("gpus", []):
        wait = "" if g["waiting_ratio"] is None else f"  waiting {round(100 * g['waiting_ratio'])}%"
        conf = "" if g["confidence"] is None else f"  (confidence {g['confidence']:.2f})"
        out.write(f"\nGPU {g['index']} {g['name']}: {(g['cause'] or 'no verdict').upper()}{wait}{conf}\n")
        for e in g["evidence"][:3]:
            out.write(f"  - {e}\n")
        if g.get("next_check"):
            out.write(f"  next: {g['next_check']}\n")
    findings = ph.get("findings", [])
    out.write("\nFindings:\n" if findings else "\nFindings: none\n")
    for f in findings:
        where = "host" if f["gpu"] is None else f"GPU {f['gpu']}"
        out.write(f"  [{f['severity']}] {f['check']} ({where}): {f['detail']}\n")


def run_live(ns: argparse.Namespace) -> int:
    """``gpufeed diagnose [--duration 30s] [--json]`` on this host."""
    try:
        duration = parse_duration(getattr(ns, "duration", "30s"))
    except ValueError as e:
        print(f"gpufeed diagnose: --duration: {e}", file=sys.stderr)
        return 2
    if getattr(ns, "check", False) or getattr(ns, "timeline", False):
        print("gpufeed diagnose: --check and --timeline need --scenario FILE", file=sys.stderr)
        return 2
    log.configure("error", "logfmt")
    registry = load_all()
    try:
        settings = resolve(registry, {}, {
            "path.procfs": getattr(ns, "path.procfs", "/proc"), "path.sysfs": getattr(ns, "path.sysfs", "/sys"),
            # Deep per-thread evidence every second from the start: a diagnosis is short.
            "collector.proc.threads-interval": 1.0,
        })
    except (KeyError, ValueError) as e:
        print(f"gpufeed diagnose: {e}", file=sys.stderr)
        return 2
    collectors = build_collectors(settings, registry)
    analysis.attach(collectors, settings)
    engine = Engine(collectors, RealClock(), history_seconds=max(120.0, duration + 30.0))
    analysis.wire(collectors, engine)
    tty = sys.stderr if sys.stderr.isatty() and not getattr(ns, "json", False) else None
    try:
        asyncio.run(_sample_live(engine, duration, tty))
    except KeyboardInterrupt:
        print("gpufeed diagnose: interrupted", file=sys.stderr)
        return 130
    report = live_report(engine, duration)
    if getattr(ns, "json", False):
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_live(report, sys.stdout)
    return live_exit_code(report)
