"""The ``gpufeed diagnose`` report, for a live host and for a scenario alike: one JSON shape, the text a person
reads, the playbook's next check per GPU, the exit code, and ``--check`` of a scenario's expectations.

The JSON is ``shared/scenarios/SPEC.md``'s, extended the same way in both modes, and published as a JSON Schema
(``exporter/diagnose/report.schema.json``, :data:`SCHEMA`; the tests validate both modes against it)::

    {"scenario": name | null, "host": hostname | null, "duration_s", "window_s",
     "phases": [{"name", "end_s",
                 "gpus": [{"index", "uuid", "name", "cause", "confidence", "waiting_ratio", "waiting_share",
                           "evidence", "next_check", "workload"}],
                 "findings": [{"check", "gpu", "severity", "detail"}]}],
     "timeline": [{"t", "gpu", "cause"}],           # with --timeline only: each change of a GPU's verdict
     "finding_events": [{"t", "gpu", "check", "event"}],   # with --timeline, version-2 scenarios
     "captures": [{"name", "gpu", "trigger", "path", "label", "assessment", "evidence", ...}],  # --stacks
     "note": "...", "sampler_errors": {...},         # only when there is something to say
     "error": "..."}                                 # only when the host could not be seen (exit 3)

A live run is one phase named ``live``. ``window_s`` is the span the verdicts look back over (the classifier
window, or the whole run when that is shorter); ``waiting_ratio`` the share of it the GPU waited;
``waiting_share`` the share of the whole phase (live: the whole run), from the exact state counters.
Every GPU of the scenario (or seen by NVML) is present; ``cause`` is null when no verdict was reached. A GPU
in MIG mode is judged per MIG instance: it is listed once per instance, each entry with ``"mig": <GPU
instance id>`` and the instance's UUID (entries of other GPUs have no ``mig`` key); timeline rows of an
instance carry ``mig`` too. ``workload`` holds the attribution labels of the GPU's workload
(``gpufeed_workload_info``), ``{}`` when none.

Exit codes (:func:`exit_code`, the same in both modes): 0 every GPU healthy or idle and no finding, in every
phase; 1 anything else (a waiting, throttled or inefficient GPU, a GPU without a verdict, any finding);
2 usage (a bad flag or file); 3 the host could not be seen (:data:`EXIT_BLIND`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, TextIO

from exporter.names import QUIET_VERDICTS
from exporter.samples.derived import DerivedState, GpuActivity, GpuVerdict
from exporter.samples.gpu import GpuKey
from exporter.vocabulary import VERDICT_LIST

if TYPE_CHECKING:
    from exporter.sim.player import PlayResult

# The next check the field playbook would run for each verdict (exporter/vocabulary.py).
NEXT_CHECK = {v.name: v.next_check for v in VERDICT_LIST}
NO_VERDICT_CHECK = "dmesg | grep -i xid; nvidia-smi -q"
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
LIVE_PHASE = "live"
EXIT_OK, EXIT_ATTENTION, EXIT_USAGE, EXIT_BLIND = 0, 1, 2, 3
SCHEMA_FILE = "report.schema.json"


def schema() -> dict[str, Any]:
    """The JSON Schema of the report (shipped in the package)."""
    text = resources.files("exporter.diagnose").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What the report knows of a GPU besides its verdict: identity, processes and PCI address."""

    index: int
    uuid: str
    name: str = ""
    pids: tuple[int, ...] = ()
    bdf: str = ""
    mig: int | None = None  # a MIG instance of GPU ``index`` (uuid and name are the instance's)

    @property
    def key(self) -> GpuKey:
        return GpuKey(self.index, self.mig)


@dataclass(frozen=True, slots=True)
class PhaseState:
    """The derived state at the end of a phase (None: no evaluation), and at its start (for shares)."""

    name: str
    end_s: float
    state: DerivedState | None
    start: DerivedState | None = None


def next_check(cause: str | None, pids: Sequence[int], bdf: str) -> str:
    """The playbook's next command for a verdict, filled with the GPU's first process and its address."""
    if cause is None:
        return NO_VERDICT_CHECK
    return NEXT_CHECK.get(cause, "").format(pid=pids[0] if pids else "<pid>", bdf=bdf or "<bdf>")


def _verdict(state: DerivedState | None, key: GpuKey) -> GpuVerdict | None:
    if state is None:
        return None
    return state.gpus.get(key.gpu) if key.mig is None else state.mig.get(key)


def _activity(state: DerivedState | None, key: GpuKey) -> GpuActivity | None:
    if state is None:
        return None
    return state.activity.get(key.gpu) if key.mig is None else state.mig_activity.get(key)


def _waiting_share(key: GpuKey, end: DerivedState | None, start: DerivedState | None) -> float | None:
    """Share of the phase the GPU (or MIG instance) spent waiting, from the state counters at its ends."""
    e, s = _activity(end, key), _activity(start, key)
    if e is None:
        return None
    a1 = e.state_seconds
    a0 = s.state_seconds if s is not None else {}
    total = sum(a1.values()) - sum(a0.values())
    waiting = a1.get("waiting", 0.0) - a0.get("waiting", 0.0)
    return round(waiting / total, 3) if total > 0 else None


def gpu_entry(info: GpuInfo, phase: PhaseState) -> dict[str, Any]:
    """One GPU (or MIG instance) of one phase."""
    v = _verdict(phase.state, info.key)
    why = phase.state.unjudged.get(info.key) if phase.state is not None else None
    entry: dict[str, Any] = {"index": info.index}
    if info.mig is not None:
        entry["mig"] = info.mig
    entry.update({
        "uuid": info.uuid,
        "name": info.name,
        "cause": v.cause if v is not None else None,
        "confidence": round(v.confidence, 3) if v is not None else None,
        "waiting_ratio": round(v.waiting_ratio, 3) if v is not None else None,
        "waiting_share": _waiting_share(info.key, phase.state, phase.start),
        "evidence": list(v.evidence) if v is not None else [why] if why else [],
        "next_check": next_check(v.cause if v is not None else None, info.pids, info.bdf),
        "workload": workload_labels(phase.state, info.index),
    })
    return entry


def mig_infos(gpu: GpuInfo, instances: Sequence[tuple[int, str, str]],
              pids_of: Mapping[int, tuple[int, ...]]) -> list[GpuInfo]:
    """The report entries of a GPU in MIG mode: one per instance ``(gi, uuid, name)``, with its processes."""
    return [GpuInfo(index=gpu.index, uuid=uuid, name=name, pids=pids_of.get(gi, ()), bdf=gpu.bdf, mig=gi)
            for gi, uuid, name in instances]


def owner_line(labels: Mapping[str, str]) -> str:
    """Who owns a GPU's workload, for a person: ``pod vision/trainer-0 (container trainer)``, ``Slurm job 42``."""
    parts: list[str] = []
    if "pod" in labels:
        ctr = f" (container {labels['container']})" if "container" in labels else ""
        parts.append(f"pod {labels.get('namespace', '?')}/{labels['pod']}{ctr}")
    if "slurm_job_id" in labels:
        parts.append(f"Slurm job {labels['slurm_job_id']}")
    if "unit" in labels:
        parts.append(f"unit {labels['unit']}")
    if "container_id" in labels:
        parts.append(f"container id {labels['container_id'][:12]}")
    return ", ".join(parts)


def workload_labels(state: DerivedState | None, index: int) -> dict[str, str]:
    """The attribution labels of the GPU's workload (gpufeed_workload_info), ``{}`` when none are known."""
    if state is None or index not in state.workloads:
        return {}
    return dict(state.workloads[index].labels)


def phase_entry(phase: PhaseState, gpus: Sequence[GpuInfo]) -> dict[str, Any]:
    """One phase: every GPU, then the findings, most severe first."""
    findings = [] if phase.state is None else sorted(phase.state.findings,
                                                     key=lambda f: (SEVERITY_RANK.get(f.severity, 9), f.check))
    return {
        "name": phase.name,
        "end_s": round(phase.end_s, 3),
        "gpus": [gpu_entry(g, phase) for g in gpus],
        "findings": [{"check": f.check, "gpu": f.gpu, "severity": f.severity, "detail": f.detail} for f in findings],
    }


def document(
    phases: Sequence[PhaseState], gpus: Sequence[GpuInfo], *, scenario: str | None, host: str | None,
    duration_s: float, window_s: float | None, note: str | None = None,
    timeline: Sequence[tuple[float, DerivedState]] | None = None,
    sampler_errors: Mapping[str, str] | None = None, error: str | None = None,
    finding_events_wanted: bool = False,
) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (the shape in the module docstring).

    ``window_s`` is the classifier's window; the report states the span the verdicts really cover, which is
    shorter when the run is. ``timeline`` is every evaluation; the report keeps each change of a verdict.
    """
    doc: dict[str, Any] = {
        "scenario": scenario,
        "host": host,
        "duration_s": round(duration_s, 3),
        "window_s": None if window_s is None else round(min(window_s, duration_s), 3),
        "phases": [phase_entry(p, gpus) for p in phases],
    }
    if timeline is not None:
        doc["timeline"] = changes(timeline)
        if finding_events_wanted:
            doc["finding_events"] = finding_events(timeline)
    if note:
        doc["note"] = note
    if sampler_errors:
        doc["sampler_errors"] = dict(sorted(sampler_errors.items()))
    if error:
        doc["error"] = error
    return doc


def changes(timeline: Sequence[tuple[float, DerivedState]]) -> list[dict[str, Any]]:
    """Each GPU's (or MIG instance's) verdict when it first appears and whenever it changes, in time order."""
    last: dict[Any, str | None] = {}
    rows: list[dict[str, Any]] = []
    for t, state in timeline:
        for k, v in state.verdicts().items():
            if k not in last or last[k] != v.cause:
                rows.append({"t": round(t, 3), "gpu": k.gpu, **({} if k.mig is None else {"mig": k.mig}),
                             "cause": v.cause})
                last[k] = v.cause
    return rows


def exit_code(doc: Mapping[str, Any]) -> int:
    """:data:`EXIT_OK` when, in every phase, every GPU is healthy or idle and nothing was found;
    :data:`EXIT_BLIND` when the host could not be seen; :data:`EXIT_ATTENTION` otherwise."""
    if doc.get("error"):
        return EXIT_BLIND
    for ph in doc.get("phases") or []:
        if ph.get("findings") or any(g.get("cause") not in QUIET_VERDICTS for g in ph.get("gpus", [])):
            return EXIT_ATTENTION
    return EXIT_OK


def print_text(doc: Mapping[str, Any], out: TextIO) -> None:
    """The report a person reads in ten seconds: per phase, one block per GPU, then the findings."""
    window = doc.get("window_s")
    if doc.get("scenario") is not None:
        head = f"gpufeed diagnose: scenario {doc['scenario']} ({doc['duration_s']:g} s of scenario time)"
        if window:
            head += f", verdicts over the last {window:g} s of each phase"
    else:
        head = f"gpufeed diagnose on {doc.get('host')}: {doc['duration_s']:g} s sampled"
        if window:
            head += f", verdicts over the last {window:g} s"
    out.write(head + "\n")
    if doc.get("error"):
        out.write(f"  cannot see the host: {doc['error']}\n")
    if doc.get("note"):
        out.write(f"  {doc['note']}\n")
    phases = doc.get("phases", [])
    for ph in phases:
        if len(phases) > 1 or ph["name"] != LIVE_PHASE:
            out.write(f"\nphase {ph['name']} (ends at {ph['end_s']:g} s)\n")
        for g in ph["gpus"]:
            wait = "" if g["waiting_ratio"] is None else f"  waiting {round(100 * g['waiting_ratio'])}%"
            conf = "" if g["confidence"] is None else f"  (confidence {g['confidence']:.2f})"
            name = f" {g['name']}" if g.get("name") else ""
            mig = f" MIG {g['mig']}" if g.get("mig") is not None else ""
            out.write(f"\nGPU {g['index']}{mig}{name}: {(g['cause'] or 'no verdict').upper()}{wait}{conf}\n")
            owner = owner_line(g.get("workload") or {})
            if owner:
                out.write(f"  workload: {owner}\n")
            for e in g["evidence"][:3]:
                out.write(f"  - {e}\n")
            if g.get("next_check"):
                out.write(f"  next: {g['next_check']}\n")
        findings = ph.get("findings", [])
        out.write("\nFindings:\n" if findings else "\nFindings: none\n")
        for f in findings:
            where = "host" if f["gpu"] is None else f"GPU {f['gpu']}"
            out.write(f"  [{f['severity']}] {f['check']} ({where}): {f['detail']}\n")
    if "captures" in doc:
        print_captures(doc["captures"], out)
    for name, err in (doc.get("sampler_errors") or {}).items():
        out.write(f"\nsampler {name} failed: {err}\n")
    if doc.get("timeline"):
        out.write("\nTimeline (each change of a verdict):\n")
        for row in doc["timeline"]:
            out.write(f"  t={row['t']:g} s GPU {row['gpu']}: {row['cause'] or 'no verdict'}\n")


def print_captures(captures: Sequence[Mapping[str, Any]], out: TextIO) -> None:
    """``--stacks``: each capture's bundle, what its stacks say of the verdict and its evidence lines."""
    if not captures:
        out.write("\nStacks: no GPU was waiting when sampling ended: nothing captured\n")
        return
    out.write("\nStacks:\n")
    for c in captures:
        where = "host" if c["gpu"] is None else f"GPU {c['gpu']}"
        out.write(f"  {where}: {c['unavailable'] or c['assessment']}\n")
        for e in c["evidence"]:
            out.write(f"  - {e}\n")
        for p in c["problems"]:
            out.write(f"  partial: {p}\n")
        out.write(f"  bundle: {c['path']}\n" if c["path"] else f"  no bundle: {c['error']}\n")


# ---- scenarios -------------------------------------------------------------------------------------------------


def scenario_document(res: PlayResult, *, timeline: bool = False) -> dict[str, Any]:
    """The report of a played scenario: every phase and every GPU of the scenario."""
    sc = res.scenario
    gpus: list[GpuInfo] = []
    for g in sc.gpus:
        info = GpuInfo(index=g.index, uuid=g.uuid, name=g.name, bdf=g.pci_bus_id,
                       pids=tuple(p.pid for p in sc.processes if g.index in p.gpus))
        if g.mig:  # MIG mode with instances: judged per instance
            pids = {x.gi: tuple(p.pid for p in sc.processes if g.index in p.gpus and p.mig == x.gi) for x in g.mig}
            gpus.extend(mig_infos(info, [(x.gi, x.uuid, x.name) for x in g.mig], pids))
        else:
            gpus.append(info)
    phases: list[PhaseState] = []
    prev: DerivedState | None = None
    for ph in res.phases:
        phases.append(PhaseState(ph.name, ph.end_s, ph.state, prev))
        prev = ph.state
    window = next((p.state.window_s for p in res.phases if p.state is not None), None)
    return document(phases, gpus, scenario=sc.name, host=None, duration_s=sc.duration_s, window_s=window,
                    timeline=res.timeline if timeline else None, sampler_errors=res.sampler_errors,
                    finding_events_wanted=sc.version >= 2)


def finding_events(timeline: Sequence[tuple[float, DerivedState]]) -> list[dict[str, Any]]:
    """Every raise and clear of a finding along the timeline (SPEC v2 ``finding_events``)."""
    out: list[dict[str, Any]] = []
    active: set[tuple[str, int | None]] = set()
    for t, state in timeline:
        now = {(f.check, f.gpu) for f in state.findings}
        for check_, gpu in sorted(now - active, key=_event_key):
            out.append({"t": round(t, 3), "gpu": gpu, "check": check_, "event": "raised"})
        for check_, gpu in sorted(active - now, key=_event_key):
            out.append({"t": round(t, 3), "gpu": gpu, "check": check_, "event": "cleared"})
        active = now
    return out


def _event_key(k: tuple[str, int | None]) -> tuple[str, int]:
    return k[0], -1 if k[1] is None else k[1]


def _banned(found: Sequence[tuple[str, int | None]], bans: Sequence[tuple[str, int | None]]) -> list[str]:
    """``no_findings`` semantics: a bare name bans the check on every GPU and host-wide; (check, gpu) on that
    GPU only. One sentence per ban broken."""
    out: list[str] = []
    for chk, gpu in bans:
        hits = sorted({"host" if g is None else f"GPU {g}" for c, g in found
                       if c == chk and (gpu is None or g == gpu)})
        if hits:
            where = "" if gpu is None else f" on GPU {gpu}"
            out.append(f"finding {chk}{where} must not be reported, but was ({', '.join(hits)})")
    return out


def _want(causes: Sequence[str]) -> str:
    return causes[0] if len(causes) == 1 else "one of " + ", ".join(causes)


def check(res: PlayResult) -> list[str]:
    """Each failed ``expect`` entry of the scenario, as a sentence; empty when all hold.

    Version-2 forms (SPEC "expect, added forms"): a list of verdicts accepts any; ``within_s`` checks every
    evaluation from phase start + N to its end (the evaluation at the phase start belongs to the previous
    phase); ``no_findings_anytime`` every evaluation of the phase; ``evidence_contains`` case-insensitive
    substrings of the GPU's evidence; ``workload`` the attribution labels it names (``{}``: none at all)."""
    by_name = {p.name: p for p in res.phases}
    starts = {p.name: p.start_s for p in res.scenario.phases}
    failures: list[str] = []
    for e in res.scenario.expect:
        st = by_name[e.phase].state
        start, end = starts[e.phase], by_name[e.phase].end_s
        for idx, want in sorted(e.gpus.items()):
            v = st.gpus.get(idx) if st is not None else None
            got = v.cause if v is not None else None
            if got not in want:
                failures.append(f"phase {e.phase!r}: GPU {idx}: expected {_want(want)}, got {got or 'no verdict'}")
        failures.extend(_check_mig(e.phase, e.mig, st))
        found = [] if st is None else [(f.check, f.gpu) for f in st.findings]
        for chk, gpu in e.findings:
            if not any(c == chk and (gpu is None or g == gpu) for c, g in found):
                where = f" on GPU {gpu}" if gpu is not None else ""
                failures.append(f"phase {e.phase!r}: expected finding {chk}{where}, not reported")
        failures.extend(f"phase {e.phase!r}: {x}" for x in _banned(found, e.no_findings))
        during = [(t, s) for t, s in res.timeline if start < t <= end + 1e-9]
        if e.within_s is not None:
            for idx, want in sorted(e.gpus.items()):
                bad = [(t, s.gpus[idx].cause if idx in s.gpus else None) for t, s in during
                       if t >= start + e.within_s - 1e-9 and (idx not in s.gpus or s.gpus[idx].cause not in want)]
                if bad:
                    t, got = bad[0]
                    failures.append(f"phase {e.phase!r}: GPU {idx}: expected {_want(want)} from "
                                    f"{start + e.within_s:g} s on, got {got or 'no verdict'} at {t:g} s "
                                    f"({len(bad)} evaluations)")
        if e.no_findings_anytime:
            broken: set[str] = set()
            for t, s in during:
                for x in _banned([(f.check, f.gpu) for f in s.findings], e.no_findings_anytime):
                    if x not in broken:
                        broken.add(x)
                        failures.append(f"phase {e.phase!r}: at {t:g} s: {x}")
        for idx, subs in sorted(e.evidence_contains.items()):
            v = st.gpus.get(idx) if st is not None else None
            lines = [x.lower() for x in (v.evidence if v is not None else ())]
            for sub in subs:
                if not any(sub.lower() in x for x in lines):
                    failures.append(f"phase {e.phase!r}: GPU {idx}: no evidence line contains {sub!r}")
        for idx, labels in sorted(e.workload.items()):
            got_labels = workload_labels(st, idx)
            if not labels and got_labels:
                failures.append(f"phase {e.phase!r}: GPU {idx}: expected no workload labels, got {got_labels}")
            for k, want_v in sorted(labels.items()):
                if got_labels.get(k) != want_v:
                    failures.append(f"phase {e.phase!r}: GPU {idx}: workload {k} expected {want_v!r}, got "
                                    f"{got_labels.get(k)!r}")
    return failures


def _check_mig(phase: str, expected: Mapping[tuple[int, int], str], st: DerivedState | None) -> list[str]:
    """The failed MIG-instance verdicts of one expectation (project key ``expect[].mig``)."""
    out = []
    for (idx, gi), want in sorted(expected.items()):
        v = _verdict(st, GpuKey(idx, gi))
        got = v.cause if v is not None else None
        if got != want:
            out.append(f"phase {phase!r}: GPU {idx} MIG {gi}: expected {want}, got {got or 'no verdict'}")
    return out
