"""``gpufeed diagnose``: a one-shot report per GPU, of this host (sampled in real time) or of a scenario
(played in virtual time). Both build the daemon's pipeline and print :mod:`exporter.report`'s report."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from typing import Any, TextIO

from exporter import log, names, pipeline, report
from exporter.config import resolve
from exporter.durations import parse_duration
from exporter.engine import Engine, RealClock
from exporter.samples.derived import DerivedState
from exporter.samples.gpu import GpuSample, GpuSlow


def run_diagnose(ns: argparse.Namespace) -> int:
    """``--scenario``: play it in virtual time; otherwise sample this host."""
    if getattr(ns, "scenario", None):
        return run_scenario(ns)
    return run_live(ns)


# ---- live host ----------------------------------------------------------------------------------------------


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
    """The live report as a JSON-ready dict: :mod:`exporter.report`'s shape, one phase named ``live``."""
    snap = engine.snapshot
    state = snap.value(names.DERIVED)
    state = state if isinstance(state, DerivedState) else None
    gpu_status = snap.status.get(names.GPU_FAST)
    identities: dict[int, Any] = {}
    pids: dict[int, tuple[int, ...]] = {}
    mig_pids: dict[int, dict[int, tuple[int, ...]]] = {}
    for name in (names.GPU_FAST, names.GPU_SLOW):
        v = snap.value(name)
        if isinstance(v, GpuSample):
            identities.update(v.identities)
            for i, g in v.gpus.items():
                if isinstance(g, GpuSlow):
                    pids[i] = tuple(p.pid for p in g.processes)
                    mig_pids[i] = {gi: tuple(p.pid for p in g.processes if p.mig == gi) for gi in g.mig}
    gpus = []
    for i, ident in sorted(identities.items()):
        info = report.GpuInfo(index=i, uuid=ident.uuid, name=ident.name, pids=pids.get(i, ()), bdf=ident.pci_bus_id)
        if ident.mig_mode and ident.mig:  # judged per MIG instance
            gpus.extend(report.mig_infos(info, [(m.gi, m.uuid, m.name) for m in ident.mig], mig_pids.get(i, {})))
        else:
            gpus.append(info)
    note = None
    if not identities:
        reason = gpu_status.error if gpu_status is not None and gpu_status.error else "no NVIDIA driver or GPU found"
        note = f"no GPU on this host ({reason}): host findings only"
    if state is None:
        note = "the derived layer produced no evaluation (run longer than a few seconds)"
    phase = report.PhaseState(report.LIVE_PHASE, round(duration, 1), state)
    return report.document([phase], gpus, scenario=None, host=socket.gethostname(), duration_s=duration,
                           window_s=state.window_s if state is not None else None, note=note)


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
    try:
        settings = resolve(pipeline.registry(), {}, {
            "path.procfs": getattr(ns, "path.procfs", "/proc"), "path.sysfs": getattr(ns, "path.sysfs", "/sys"),
            # Deep per-thread evidence every second from the start: a diagnosis is short.
            "collector.proc.threads-interval": 1.0,
        })
    except (KeyError, ValueError) as e:
        print(f"gpufeed diagnose: {e}", file=sys.stderr)
        return 2
    pipe = pipeline.build(settings, clock=RealClock(), history_seconds=max(120.0, duration + 30.0))
    tty = sys.stderr if sys.stderr.isatty() and not getattr(ns, "json", False) else None
    try:
        asyncio.run(_sample_live(pipe.engine, duration, tty))
    except KeyboardInterrupt:
        print("gpufeed diagnose: interrupted", file=sys.stderr)
        return 130
    doc = live_report(pipe.engine, duration)
    _emit(doc, bool(getattr(ns, "json", False)))
    return report.exit_code(doc)


def _emit(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        report.print_text(doc, sys.stdout)


# ---- scenario ------------------------------------------------------------------------------------------------


def run_scenario(ns: argparse.Namespace) -> int:
    """``gpufeed diagnose --scenario FILE [--json] [--check] [--timeline]``; returns the exit code: 0 done,
    1 ``--check`` found a failed expectation, 2 invalid scenario (the message names the file and key)."""
    from exporter.sim.player import play
    from exporter.sim.scenario import ScenarioError, load

    log.configure("warn", "logfmt")
    try:
        sc = load(ns.scenario)
    except ScenarioError as e:
        print(f"gpufeed diagnose: invalid scenario: {e}", file=sys.stderr)
        return 2
    res = play(sc, timeline=bool(ns.timeline))
    doc = report.scenario_document(res, timeline=bool(ns.timeline))
    _emit(doc, bool(ns.json))
    if ns.timeline and not ns.json:
        for row in doc["timeline"]:
            print(f"t={row['t']:g} GPU {row['gpu']}: {row['cause']}")
    if ns.check:
        failures = report.check(res)
        stream = sys.stderr if ns.json else sys.stdout
        for f in failures:
            print(f"FAIL {f}", file=stream)
        if failures:
            print(f"{len(failures)} of the scenario's expectations failed", file=stream)
            return 1
        print(f"all {len(sc.expect)} expectations hold", file=stream)
    return 0
