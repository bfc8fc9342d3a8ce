"""``gpufeed diagnose``: a one-shot report per GPU, of this host (sampled in real time) or of a scenario
(played in virtual time). Both build the daemon's pipeline and print :mod:`exporter.diagnose.report`'s report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

from exporter import examples, log, names, pipeline
from exporter.capture.options import DIAGNOSE_DIR
from exporter.config import ConfigError, resolve
from exporter.derived.evaluate import with_captures
from exporter.diagnose import report
from exporter.durations import parse_duration
from exporter.engine import Engine, RealClock
from exporter.samples.capture import CaptureNote
from exporter.samples.derived import DerivedState
from exporter.samples.gpu import GpuKey, GpuSample, GpuSlow
from exporter.sources import blind_reason

DEFAULT_DURATION = "30s"
# Sources every Linux host has (/proc/stat, /proc/meminfo) and the GPUs: when none of them could be read, the
# host was not seen, whatever else answered (an empty sysfs "succeeds" with no devices in it).
SEEING_SAMPLERS = frozenset({names.CPU, names.MEMORY, names.GPU_FAST})


def run_diagnose(ns: argparse.Namespace) -> int:
    """``--scenario``: play it in virtual time; otherwise sample this host. Returns the exit code
    (:mod:`exporter.diagnose.report`: 0 all quiet, 1 needs attention, 2 usage, 3 the host could not be seen)."""
    _configure_logging(getattr(ns, "log.level", None))
    for flag in ("scenario", "duration", "path.procfs", "path.sysfs"):
        if "\x00" in str(getattr(ns, flag, "") or ""):
            return _usage(f"--{flag}: contains a NUL character")
    if getattr(ns, "scenario", None):
        return run_scenario(ns)
    return run_live(ns)


def _configure_logging(level: str | None) -> None:
    """Without --log.level, diagnose logs nothing: what went wrong is in the report (``sampler_errors``),
    and a log line in the middle of the report (or of its JSON on a terminal) only confuses it."""
    if level:
        log.configure(level, "logfmt")
    else:
        log.configure("error", "logfmt", stream=_DEVNULL)


class _Discard:
    """A write-only sink for the log lines nobody asked for."""

    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        return None


_DEVNULL = _Discard()


def _usage(message: str) -> int:
    print(f"gpufeed diagnose: error: {message}", file=sys.stderr)
    return report.EXIT_USAGE


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


def sampler_errors(engine: Engine) -> dict[str, str]:
    """The samplers whose source exists but could not be read, with the error of their last run."""
    return {name: st.error for name, st in engine.snapshot.status.items()
            if st.available and not st.success and st.runs > 0 and st.error}


def live_report(engine: Engine, duration: float, captures: Mapping[int, CaptureNote] | None = None) -> dict[str, Any]:
    """The live report as a JSON-ready dict: :mod:`exporter.diagnose.report`'s shape, one phase named ``live``.

    When neither /proc/stat, /proc/meminfo nor a GPU could be read (:data:`SEEING_SAMPLERS`), the report
    carries ``error``: the host was not seen, whatever the empty verdict and finding lists would suggest.
    ``captures`` (``--stacks``, taken after sampling) have their word on the verdicts as the daemon's would.
    """
    snap = engine.snapshot
    state = snap.value(names.DERIVED)
    state = state if isinstance(state, DerivedState) else None
    if state is not None and captures:
        verdicts, found = with_captures({GpuKey(i): v for i, v in state.gpus.items()}, captures)
        state = dataclasses.replace(state, gpus=MappingProxyType({k.gpu: v for k, v in verdicts.items()}),
                                    findings=(*state.findings, *found))
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
    errors = sampler_errors(engine)
    seen = any(st.success for name, st in snap.status.items() if name in SEEING_SAMPLERS)
    error = None if seen else "no source could be read (" + (
        "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())) or "none exists") + ")"
    phase = report.PhaseState(report.LIVE_PHASE, round(duration, 1), state)
    return report.document([] if error else [phase], gpus, scenario=None, host=socket.gethostname(),
                           duration_s=duration, window_s=state.window_s if state is not None else None,
                           note=note, sampler_errors=errors, error=error)


def run_live(ns: argparse.Namespace) -> int:
    """``gpufeed diagnose [--duration 30s] [--json] [--stacks [--stacks.dir DIR]]`` on this host. With
    ``--stacks`` the capture stage is built (never triggering on its own: ``capture.after`` is past the run) and,
    once sampling ends, captures every GPU whose verdict waits; the report's ``captures`` says what each shows."""
    try:
        given = getattr(ns, "duration", None)
        duration = parse_duration(DEFAULT_DURATION if given is None else given)
    except ValueError as e:
        return _usage(f"--duration: {e}")
    if getattr(ns, "check", False) or getattr(ns, "timeline", False):
        return _usage("--check and --timeline need --scenario FILE")
    stacks = bool(getattr(ns, "stacks", False))
    as_json = bool(getattr(ns, "json", False))
    procfs, sysfs = Path(getattr(ns, "path.procfs", "/proc")), Path(getattr(ns, "path.sysfs", "/sys"))
    blind = blind_reason(procfs, sysfs)
    if blind is not None:
        doc = report.document([], [], scenario=None, host=socket.gethostname(), duration_s=0.0, window_s=None,
                              error=blind)
        _emit(doc, as_json)
        if as_json:
            print(f"gpufeed diagnose: cannot see the host: {blind}", file=sys.stderr)
        return report.EXIT_BLIND
    try:
        settings = resolve(pipeline.registry(), {}, {
            "path.procfs": str(procfs), "path.sysfs": str(sysfs),
            # Deep per-thread evidence every second from the start: a diagnosis is short.
            "collector.proc.threads-interval": 1.0,
            # --stacks: the capture stage, built to be asked once sampling ends (never on its own within a run).
            **({"capture.enabled": True, "capture.dir": str(getattr(ns, "stacks.dir", DIAGNOSE_DIR)),
                "capture.after": "1h"} if stacks else {}),
        })
    except ConfigError as e:
        return _usage(str(e))
    pipe = pipeline.build(settings, clock=RealClock(), history_seconds=max(120.0, duration + 30.0))
    tty = sys.stderr if sys.stderr.isatty() and not as_json else None
    try:
        asyncio.run(_sample_live(pipe.engine, duration, tty))
    except KeyboardInterrupt:
        print("gpufeed diagnose: interrupted", file=sys.stderr)
        return 130
    outcomes = None
    if pipe.capture is not None:
        # After the engine stopped: py-spy samples each waiting GPU's processes now, one after another.
        if tty is not None:
            tty.write("gpufeed diagnose: capturing the stacks of the waiting GPUs' processes\n")
        outcomes = pipe.capture.take_waiting()
    doc = live_report(pipe.engine, duration, None if pipe.capture is None else pipe.capture.stats().newest)
    if outcomes is not None:
        doc["captures"] = [o.as_json() for o in outcomes]
    _emit(doc, as_json)
    return report.exit_code(doc)


def _emit(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        report.print_text(doc, sys.stdout)


# ---- scenario ------------------------------------------------------------------------------------------------


def run_scenario(ns: argparse.Namespace) -> int:
    """``gpufeed diagnose --scenario FILE|NAME [--json] [--check] [--timeline]``.

    Exit code as on a live host (0 all quiet in every phase, 1 otherwise), or with ``--check`` the outcome of
    the scenario's ``expect`` list (0 all hold, 1 one failed); 2 for an invalid scenario (the message names
    the file and key) or ``--check`` on a scenario with nothing to check.
    """
    from exporter.sim.player import play
    from exporter.sim.scenario import ScenarioError, load

    try:
        sc = load(str(examples.scenario(ns.scenario)))
    except examples.ExampleError as e:
        return _usage(f"--scenario {e}")
    except ScenarioError as e:
        return _usage(f"invalid scenario: {e}")
    if getattr(ns, "duration", None) is not None:
        return _usage("--duration is for a live host; a scenario lasts as long as its phases")
    if ns.check and not sc.expect:
        return _usage(f"--check: scenario {ns.scenario} has no expect entries, so there is nothing to check")
    res = play(sc, timeline=bool(ns.timeline))
    doc = report.scenario_document(res, timeline=bool(ns.timeline))
    _emit(doc, bool(ns.json))
    if not ns.check:
        return report.exit_code(doc)
    failures = report.check(res)
    stream = sys.stderr if ns.json else sys.stdout
    for f in failures:
        print(f"FAIL {f}", file=stream)
    if failures:
        print(f"{len(failures)} of the scenario's expectations failed", file=stream)
        return report.EXIT_ATTENTION
    print(f"all {len(sc.expect)} expectations hold", file=stream)
    return report.EXIT_OK
