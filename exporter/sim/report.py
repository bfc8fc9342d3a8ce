"""``gpufeed diagnose --scenario FILE [--json] [--check] [--timeline]``: play a scenario, report, check.

The JSON is the one documented at the end of ``shared/scenarios/SPEC.md``::

    {"scenario": name, "classifier": "available" | "unavailable",
     "phases": [{"name", "end_s", "gpus": [{"index", "uuid", "cause", "confidence", "waiting_ratio",
                                             "evidence"}], "findings": [{"check", "gpu", "severity", "detail"}]}],
     "timeline": [{"t", "gpu", "cause"}]}          # with --timeline only

Every phase and every GPU of the scenario is present, whatever the classifier said (``cause`` is null when it
gave no verdict for that GPU, or is not built in). Exit codes: 0 done, 1 ``--check`` found a failed
expectation, 2 invalid scenario (message names the file and key).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from exporter import log
from exporter.samples.derived import DerivedState
from exporter.sim.player import PlayResult, play
from exporter.sim.scenario import Scenario, ScenarioError, load


def _gpu_entry(sc: Scenario, index: int, state: DerivedState | None) -> dict[str, Any]:
    g = sc.gpu(index)
    v = state.gpus.get(index) if state is not None else None
    return {
        "index": index,
        "uuid": g.uuid,
        "cause": v.cause if v is not None else None,
        "confidence": round(v.confidence, 3) if v is not None else None,
        "waiting_ratio": round(v.waiting_ratio, 3) if v is not None else None,
        "evidence": list(v.evidence) if v is not None else [],
    }


def to_json(res: PlayResult, *, timeline: bool = False) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    sc = res.scenario
    out: dict[str, Any] = {
        "scenario": sc.name,
        "classifier": "available" if res.classifier else "unavailable",
        "phases": [],
    }
    if not res.classifier:
        out["note"] = "the verdict classifier (exporter.analysis) is not part of this build: causes are null"
    for ph in res.phases:
        findings = [] if ph.state is None else [
            {"check": f.check, "gpu": f.gpu, "severity": f.severity, "detail": f.detail} for f in ph.state.findings
        ]
        out["phases"].append({
            "name": ph.name,
            "end_s": round(ph.end_s, 3),
            "gpus": [_gpu_entry(sc, g.index, ph.state) for g in sc.gpus],
            "findings": findings,
        })
    if timeline:
        out["timeline"] = [
            {"t": round(t, 3), "gpu": i, "cause": v.cause}
            for t, state in res.timeline for i, v in sorted(state.gpus.items())
        ]
    if res.sampler_errors:
        out["sampler_errors"] = dict(sorted(res.sampler_errors.items()))
    return out


def check(res: PlayResult) -> list[str]:
    """Each failed ``expect`` entry, as a sentence; empty when all hold."""
    sc = res.scenario
    by_name = {p.name: p for p in res.phases}
    failures: list[str] = []
    for e in sc.expect:
        ph = by_name[e.phase]
        st = ph.state
        for idx, want in sorted(e.gpus.items()):
            v = st.gpus.get(idx) if st is not None else None
            got = v.cause if v is not None else None
            if got != want:
                failures.append(f"phase {e.phase!r}: GPU {idx}: expected {want}, got {got or 'no verdict'}")
        found = [] if st is None else [(f.check, f.gpu) for f in st.findings]
        for chk, gpu in e.findings:
            if not any(c == chk and (gpu is None or g == gpu) for c, g in found):
                where = f" on GPU {gpu}" if gpu is not None else ""
                failures.append(f"phase {e.phase!r}: expected finding {chk}{where}, not reported")
        for chk in e.no_findings:
            hits = sorted({"host" if g is None else f"GPU {g}" for c, g in found if c == chk})
            if hits:
                failures.append(f"phase {e.phase!r}: finding {chk} must not be reported, but was ({', '.join(hits)})")
    return failures


def _human(doc: dict[str, Any], out: TextIO) -> None:
    print(f"scenario {doc['scenario']} (classifier {doc['classifier']})", file=out)
    for ph in doc["phases"]:
        print(f"\nphase {ph['name']} (ends at {ph['end_s']:g} s)", file=out)
        for g in ph["gpus"]:
            wr = "-" if g["waiting_ratio"] is None else f"{g['waiting_ratio']:.0%} waiting"
            print(f"  GPU {g['index']} {g['uuid']}: {g['cause'] or 'no verdict'} ({wr})", file=out)
            for ev in g["evidence"]:
                print(f"      - {ev}", file=out)
        for f in ph["findings"]:
            gpu = "host" if f["gpu"] is None else f"GPU {f['gpu']}"
            print(f"  finding {f['check']} [{f['severity']}] {gpu}: {f['detail']}", file=out)
    if "note" in doc:
        print(f"\nnote: {doc['note']}", file=out)


def run_scenario(ns: argparse.Namespace) -> int:
    """The ``diagnose --scenario`` command; returns the exit code."""
    log.configure("warn", "logfmt")
    try:
        sc = load(ns.scenario)
    except ScenarioError as e:
        print(f"gpufeed diagnose: invalid scenario: {e}", file=sys.stderr)
        return 2
    res = play(sc, timeline=bool(ns.timeline))
    doc = to_json(res, timeline=bool(ns.timeline))
    if ns.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        _human(doc, sys.stdout)
        if ns.timeline:
            for row in doc["timeline"]:
                print(f"t={row['t']:g} GPU {row['gpu']}: {row['cause']}")
    if ns.check:
        failures = check(res)
        stream = sys.stderr if ns.json else sys.stdout
        for f in failures:
            print(f"FAIL {f}", file=stream)
        if failures:
            print(f"{len(failures)} of the scenario's expectations failed", file=stream)
            return 1
        print(f"all {len(sc.expect)} expectations hold", file=stream)
    return 0
