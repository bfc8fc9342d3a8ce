"""The capacity review's figures from plain numbers (pure: no I/O, no clock, no globals).

Input: a ``model.FleetData`` (GPU-seconds per step per GPU, per state and per waiting cause, findings per step,
idle-gap histograms...). Output: a ``Report`` whose fields are exactly the JSON of docs/report.schema.json
(``to_json``). Every share is of GPU-hours observed; a cause's share is of the waiting GPU-hours.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.fleet.model import FindingTrack, FleetData, GpuId, LinkState, Source, Window, iso
from exporter.fleet.playbook import CAUSE_LABELS, FINDING_LABELS, finding_fix, fix_for
from exporter.fleet.stragglers import Stragglers, stragglers
from exporter.names import STATES, WAITING_CAUSES

SCHEMA_VERSION = 1
# A step counts as "finding raised" from this many seconds on (a single scrape at 15 s is still a sighting).
_ACTIVE_S = 1.0
# Hosts of one GPU model whose busy efficiency differs by this much are called out ("two identical servers").
SPREAD_NOTE = 0.10
# Hosts with less busy time than this are left out of the spread (too little work to compare).
_MIN_BUSY_HOURS = 1.0


@dataclass(frozen=True, slots=True)
class Breakdown:
    """GPU-hours by state and by waiting cause, with the shares a review reads."""

    gpu_hours: float
    state_hours: Mapping[str, float]
    cause_hours: Mapping[str, float]
    working_share: float
    waiting_share: float
    idle_share: float
    busy_efficiency: float | None  # working / (working + waiting): how well the GPU was fed while in use
    dominant_cause: str | None
    dominant_cause_share: float  # of the waiting GPU-hours
    fix: str


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One namespace, Slurm job or host, ranked by waiting GPU-hours."""

    name: str
    breakdown: Breakdown


@dataclass(frozen=True, slots=True)
class HostRow:
    job: str
    instance: str
    gpus: int
    models: tuple[str, ...]
    findings: tuple[str, ...]
    breakdown: Breakdown


@dataclass(frozen=True, slots=True)
class FindingRow:
    """One finding on one GPU (gpu "" = host-wide) over the range."""

    job: str
    instance: str
    gpu: str
    check: str
    hours: float
    episodes: int
    longest_hours: float
    first_seen: str
    last_seen: str


@dataclass(frozen=True, slots=True)
class HostFinding:
    """One finding on one host: how long any of its GPUs (or the host) had it raised, and the fix."""

    job: str
    instance: str
    check: str
    label: str
    gpus: tuple[str, ...]
    hours: float
    episodes: int
    longest_hours: float
    first_seen: str
    last_seen: str
    detail: str
    fix: str
    active_hours: tuple[float, ...]  # per step of the timeline


@dataclass(frozen=True, slots=True)
class ModelHost:
    job: str
    instance: str
    gpus: int
    findings: tuple[str, ...]
    breakdown: Breakdown


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One GPU model: the fleet's GPUs of that model, and its hosts side by side."""

    name: str
    gpus: int
    hosts: int
    breakdown: Breakdown
    per_host: tuple[ModelHost, ...]
    efficiency_spread: float | None  # best minus worst busy efficiency among its hosts
    note: str


@dataclass(frozen=True, slots=True)
class GapRow:
    """The idle-gap histogram of one of the GPUs that waited most (non-cumulative counts per bucket)."""

    job: str
    instance: str
    gpu: str
    model: str
    waiting_hours: float
    waiting_share: float
    bounds: tuple[float, ...]
    counts: tuple[float, ...]  # one per bound, then the +Inf bucket
    gaps: float
    mean_gap_s: float | None


@dataclass(frozen=True, slots=True)
class Timeline:
    """Fleet GPU-hours per step; ``ends`` are the steps' end times."""

    step_seconds: float
    ends: tuple[str, ...]
    state_hours: Mapping[str, tuple[float, ...]]
    cause_hours: Mapping[str, tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class RangeInfo:
    start: str
    end: str
    seconds: float
    step_seconds: float


@dataclass(frozen=True, slots=True)
class FleetTotals:
    gpus: int
    hosts: int
    possible_gpu_hours: float  # GPUs seen x hours of the range
    observed_share: float  # observed GPU-hours / possible
    breakdown: Breakdown


@dataclass(frozen=True, slots=True)
class CostRow:
    """The waiting of one cause, or of one namespace / Slurm job / host: GPU-hours, the energy they drew and
    what both cost at the prices given."""

    name: str
    waiting_hours: float
    waiting_kwh: float | None  # None: no GPU of it has an energy counter
    cost: float | None  # None: no price given


@dataclass(frozen=True, slots=True)
class Cost:
    """What waiting cost over the range: GPU-hours at ``price_per_gpu_hour`` plus kWh at ``price_per_kwh``."""

    price_per_gpu_hour: float | None
    price_per_kwh: float | None
    energy_gpus: int  # GPUs with an energy counter (gpufeed_gpu_waiting_joules_total)
    total: CostRow
    by_cause: tuple[CostRow, ...]  # causes with waiting, most first
    by_group: tuple[CostRow, ...]  # namespaces / Slurm jobs / hosts, most waiting first; "(no owner)" included


@dataclass(frozen=True, slots=True)
class Delta:
    """One figure this period and the period before it."""

    name: str
    now: float
    before: float
    change: float  # now - before
    ratio: float | None  # now / before - 1; None when before is 0


@dataclass(frozen=True, slots=True)
class Comparison:
    """This range against the one of the same length just before it (``--compare previous``)."""

    previous_start: str
    previous_end: str
    gpus: Delta
    gpu_hours: Delta
    waiting_hours: Delta
    waiting_share: Delta
    waiting_kwh: Delta | None  # None when neither period has an energy counter
    cost: Delta | None  # None without prices
    by_cause: tuple[Delta, ...]  # waiting GPU-hours per cause
    by_group: tuple[Delta, ...]  # waiting GPU-hours per namespace / Slurm job / host (the --top largest changes)


@dataclass(frozen=True, slots=True)
class Report:
    schema_version: int
    generated_at: str
    prometheus: str
    range: RangeInfo
    by: str
    top: int
    sources: tuple[Source, ...]
    notes: tuple[str, ...]
    summary: str
    fleet: FleetTotals
    timeline: Timeline
    groups: tuple[GroupRow, ...]
    unattributed: Breakdown | None  # GPU time with no workload of the --by kind (None for --by host)
    hosts: tuple[HostRow, ...]
    findings: tuple[HostFinding, ...]
    finding_details: tuple[FindingRow, ...]
    models: tuple[ModelRow, ...]
    idle_gaps: tuple[GapRow, ...]
    cost: Cost
    stragglers: Stragglers
    comparison: Comparison | None = None


# ------------------------------------------------------------------------------------------------ helpers


def pct(x: float | None) -> str:
    """A share as prose writes it: 31%, <1%, 0%."""
    if x is None:
        return "n/a"
    if 0 < x < 0.005:
        return "<1%"
    return f"{x * 100:.0f}%"


def hours_text(h: float) -> str:
    """GPU-hours as prose writes them: 1,234 or 12.5 or 0.34 or 0.012 -- two significant digits below 1, never a
    bare 0.0 for time that was there (<0.001 below that)."""
    if h >= 100:
        return f"{h:,.0f}"
    if h >= 1 or h == 0:
        return f"{h:.1f}"
    if h < 0.001:
        return "<0.001"
    return f"{h:.2g}" if h >= 0.01 else f"{h:.1g}"


def amount_text(x: float) -> str:
    """kWh or money as prose writes them: 1,234 or 12.5 or 0.34 (as :func:`hours_text`)."""
    return hours_text(x)


def plural(n: int, noun: str) -> str:
    """1 GPU, 2 GPUs; 1 host, 3 hosts."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def span_text(seconds: float) -> str:
    """A range's length: 7 days, 1 day, 6 hours, 1 hour, 30 minutes."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds / size
            return f"{n:g} {unit}" + ("" if n == 1 else "s")
    return f"{seconds:g} seconds"


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def breakdown(state_s: Mapping[str, float], cause_s: Mapping[str, float]) -> Breakdown:
    """A Breakdown from GPU-seconds per state and per waiting cause."""
    state_h = {s: max(0.0, state_s.get(s, 0.0)) / 3600 for s in STATES}
    cause_h = {c: max(0.0, cause_s.get(c, 0.0)) / 3600 for c in WAITING_CAUSES}
    total = sum(state_h.values())
    busy = state_h["working"] + state_h["waiting"]
    waited = sum(cause_h.values())
    dominant = max(WAITING_CAUSES, key=lambda c: cause_h[c]) if waited > 0 else None
    return Breakdown(
        gpu_hours=total, state_hours=state_h, cause_hours=cause_h,
        working_share=_share(state_h["working"], total), waiting_share=_share(state_h["waiting"], total),
        idle_share=_share(state_h["idle"], total),
        busy_efficiency=state_h["working"] / busy if busy > 0 else None,
        dominant_cause=dominant, dominant_cause_share=_share(cause_h[dominant], waited) if dominant else 0.0,
        fix=fix_for(dominant),
    )


def _totals(series: Iterable[Mapping[str, Sequence[float]]], keys: Sequence[str]) -> dict[str, float]:
    out = dict.fromkeys(keys, 0.0)
    for per_key in series:
        for k in keys:
            out[k] += sum(per_key.get(k, ()))
    return out


def _gpu_breakdown(data: FleetData, gpus: Iterable[GpuId]) -> Breakdown:
    gs = list(gpus)
    return breakdown(_totals((data.state_s.get(g, {}) for g in gs), STATES),
                     _totals((data.cause_s.get(g, {}) for g in gs), WAITING_CAUSES))


def _runs(active: Sequence[float]) -> list[tuple[int, int]]:
    """Maximal runs [first, last] of steps with the finding raised."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, a in enumerate(active):
        if a >= _ACTIVE_S and start is None:
            start = i
        elif a < _ACTIVE_S and start is not None:
            runs.append((start, i - 1))
            start = None
    if start is not None:
        runs.append((start, len(active) - 1))
    return runs


@dataclass(frozen=True, slots=True)
class _Span:
    hours: float
    episodes: int
    longest_hours: float
    first_seen: str
    last_seen: str


def _span(window: Window, active: Sequence[float]) -> _Span | None:
    runs = _runs(active)
    if not runs:
        return None
    run_h = [sum(active[a:b + 1]) / 3600 for a, b in runs]
    return _Span(hours=sum(active) / 3600, episodes=len(runs), longest_hours=max(run_h),
                 first_seen=iso(window.step_end(runs[0][0]) - window.step), last_seen=iso(window.step_end(runs[-1][1])))


def link_text(gen: int | None, width: int | None) -> str:
    """Gen3 x8, Gen4, x8 or ''."""
    parts = ([f"Gen{gen}"] if gen else []) + ([f"x{width}"] if width else [])
    return " ".join(parts)


def _link_detail(links: Sequence[LinkState]) -> str:
    parts = []
    for ls in links:
        now, best = link_text(ls.gen, ls.width), link_text(ls.max_gen, ls.max_width)
        if not now:
            continue
        text = f"GPU {ls.gpu.gpu} at {now}" + (f" (max {best})" if best else "")
        if ls.bdfs:
            text += " at hop " + ", ".join(ls.bdfs)
        parts.append(text)
    return "; ".join(parts) + ("." if parts else "")


# ---------------------------------------------------------------------------------------------- sections


def _timeline(data: FleetData) -> Timeline:
    n = data.window.steps
    state = {s: [0.0] * n for s in STATES}
    cause = {c: [0.0] * n for c in WAITING_CAUSES}
    aggregated = bool(data.fleet_state_s)
    # Aggregated form: the fleet's steps as Prometheus summed them (state_s then holds range totals per GPU).
    for per in [data.fleet_state_s] if aggregated else data.state_s.values():
        for s in STATES:
            for i, v in enumerate(per.get(s, ())):
                state[s][i] += max(0.0, v) / 3600
    for per in [data.fleet_cause_s] if aggregated else data.cause_s.values():
        for c in WAITING_CAUSES:
            for i, v in enumerate(per.get(c, ())):
                cause[c][i] += max(0.0, v) / 3600
    return Timeline(step_seconds=data.window.step, ends=tuple(iso(data.window.step_end(i)) for i in range(n)),
                    state_hours={k: tuple(v) for k, v in state.items()},
                    cause_hours={k: tuple(v) for k, v in cause.items()})


def _hosts_of(gpus: Iterable[GpuId]) -> dict[tuple[str, str], list[GpuId]]:
    out: dict[tuple[str, str], list[GpuId]] = defaultdict(list)
    for g in sorted(gpus):
        out[(g.job, g.instance)].append(g)
    return out


def _finding_rows(data: FleetData) -> tuple[list[FindingRow], list[HostFinding]]:
    w = data.window
    rows: list[FindingRow] = []
    per_host: dict[tuple[str, str, str], list[FindingTrack]] = defaultdict(list)
    for tr in sorted(data.findings, key=lambda t: (t.gpu, t.check)):
        sp = _span(w, tr.active_s)
        if sp is None:
            continue
        rows.append(FindingRow(job=tr.gpu.job, instance=tr.gpu.instance, gpu=tr.gpu.gpu, check=tr.check,
                               hours=sp.hours, episodes=sp.episodes, longest_hours=sp.longest_hours,
                               first_seen=sp.first_seen, last_seen=sp.last_seen))
        per_host[(tr.gpu.job, tr.gpu.instance, tr.check)].append(tr)
    hosts: list[HostFinding] = []
    for (job, inst, check), tracks in per_host.items():
        union = [max(tr.active_s[i] for tr in tracks) for i in range(w.steps)]
        sp = _span(w, union)
        if sp is None:
            continue
        detail = FINDING_LABELS.get(check, check)
        if check == "pcie_link_downgraded":
            links = [data.links[tr.gpu] for tr in tracks if tr.gpu in data.links]
            detail = _link_detail(sorted(links, key=lambda ls: ls.gpu)) or detail
        hosts.append(HostFinding(job=job, instance=inst, check=check, label=FINDING_LABELS.get(check, check),
                                 gpus=tuple(sorted({tr.gpu.gpu for tr in tracks}, key=_gpu_order)),
                                 hours=sp.hours, episodes=sp.episodes, longest_hours=sp.longest_hours,
                                 first_seen=sp.first_seen, last_seen=sp.last_seen, detail=detail,
                                 fix=finding_fix(check), active_hours=tuple(a / 3600 for a in union)))
    hosts.sort(key=lambda f: (-f.hours, f.instance, f.check))
    return rows, hosts


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (-1, gpu)


def _models(data: FleetData, host_findings: Mapping[tuple[str, str], tuple[str, ...]]) -> list[ModelRow]:
    by_model: dict[str, list[GpuId]] = defaultdict(list)
    for g in data.state_s:
        by_model[data.models.get(g, "unknown model")].append(g)
    rows = []
    for name, gpus in by_model.items():
        per_host = []
        for (job, inst), hg in _hosts_of(gpus).items():
            per_host.append(ModelHost(job=job, instance=inst, gpus=len(hg), findings=host_findings.get((job, inst), ()),
                                      breakdown=_gpu_breakdown(data, hg)))
        per_host.sort(key=lambda h: (-(h.breakdown.busy_efficiency or 0.0), h.instance))
        comparable = [h for h in per_host if h.breakdown.busy_efficiency is not None
                      and h.breakdown.state_hours["working"] + h.breakdown.state_hours["waiting"] >= _MIN_BUSY_HOURS]
        spread, note = None, ""
        if len(comparable) >= 2:
            best, worst = comparable[0], comparable[-1]
            assert best.breakdown.busy_efficiency is not None and worst.breakdown.busy_efficiency is not None
            spread = best.breakdown.busy_efficiency - worst.breakdown.busy_efficiency
            if spread >= SPREAD_NOTE:
                note = (f"{worst.instance} worked {pct(worst.breakdown.busy_efficiency)} of its busy time against "
                        f"{pct(best.breakdown.busy_efficiency)} on {best.instance} with the same {name}")
                if worst.breakdown.dominant_cause:
                    note += f", waiting mostly on {worst.breakdown.dominant_cause}"
                extra = [f for f in worst.findings if f not in best.findings]
                note += (f"; {worst.instance} had " + ", ".join(extra) if extra else "")
                note += (". Compare PCIe link state, CPU governor, NUMA binding, BIOS power settings and the "
                         "storage path (playbook: two identical servers differ).")
        rows.append(ModelRow(name=name, gpus=len(gpus), hosts=len(per_host), breakdown=_gpu_breakdown(data, gpus),
                             per_host=tuple(per_host), efficiency_spread=spread, note=note))
    rows.sort(key=lambda m: (-m.gpus, m.name))
    return rows


def _gaps(data: FleetData, top_gpus: int) -> list[GapRow]:
    ranked = sorted(data.state_s, key=lambda g: (-sum(data.state_s[g].get("waiting", ())), g))
    rows: list[GapRow] = []
    for g in ranked:
        h = data.gaps.get(g)
        if h is None or len(rows) >= top_gpus or sum(data.state_s[g].get("waiting", ())) <= 0:
            continue
        b = _gpu_breakdown(data, [g])
        cum = [max(0.0, c) for c in h.cumulative]
        counts = tuple(max(0.0, cum[i] - (cum[i - 1] if i else 0.0)) for i in range(len(cum)))
        total = cum[-1] if cum else 0.0
        rows.append(GapRow(job=g.job, instance=g.instance, gpu=g.gpu, model=data.models.get(g, "unknown model"),
                           waiting_hours=b.state_hours["waiting"], waiting_share=b.waiting_share, bounds=h.bounds,
                           counts=counts, gaps=total, mean_gap_s=h.sum_s / total if total > 0 else None))
    return rows


def _groups(data: FleetData, hosts: Sequence[HostRow]) -> tuple[list[GroupRow], Breakdown | None]:
    if data.by == "host":
        return [GroupRow(name=h.instance, breakdown=h.breakdown) for h in hosts], None
    rows = [GroupRow(name=name, breakdown=breakdown(data.group_state_s.get(name, {}), data.group_cause_s.get(name, {})))
            for name in sorted(set(data.group_state_s) | set(data.group_cause_s))]
    rows.sort(key=lambda r: (-r.breakdown.state_hours["waiting"], r.name))
    fleet_state = _totals(data.state_s.values(), STATES)
    fleet_cause = _totals(data.cause_s.values(), WAITING_CAUSES)
    grouped_state = {s: sum(r.breakdown.state_hours[s] for r in rows) * 3600 for s in STATES}
    grouped_cause = {c: sum(r.breakdown.cause_hours[c] for r in rows) * 3600 for c in WAITING_CAUSES}
    rest = breakdown({s: fleet_state[s] - grouped_state[s] for s in STATES},
                     {c: fleet_cause[c] - grouped_cause[c] for c in WAITING_CAUSES})
    return rows, rest


# ------------------------------------------------------------------------------------------------ summary

_BY_NOUN = {"namespace": "namespace", "job": "Slurm job", "host": "host"}
_SUMMARY_FINDINGS = 3  # the longest-lasting findings named in the summary; the rest are in their section


def no_owner(by: str) -> str:
    """The name of the bucket of GPU time no namespace / Slurm job held."""
    return f"(no {_BY_NOUN[by]})"


def summary(fleet: FleetTotals, window: Window, by: str, *, groups: Sequence[GroupRow],
            findings: Sequence[HostFinding], links: Mapping[GpuId, LinkState], models: Sequence[ModelRow],
            unattributed: Breakdown | None = None, cost: Cost | None = None) -> str:
    """The paragraph at the top of the report: the figures that matter, in words."""
    b = fleet.breakdown
    out = [f"Over {span_text(window.seconds)} ({iso(window.start)} to {iso(window.end)}), "
           f"{plural(fleet.gpus, 'GPU')} on {plural(fleet.hosts, 'host')} "
           f"reported {hours_text(b.gpu_hours)} GPU-hours ({pct(fleet.observed_share)} of "
           f"{hours_text(fleet.possible_gpu_hours)} possible)."]
    out.append(f"{pct(b.waiting_share)} of GPU-hours waited ({hours_text(b.state_hours['waiting'])} GPU-hours), "
               f"{pct(b.working_share)} worked and {pct(b.idle_share)} were idle.")
    waited = sum(b.cause_hours.values())
    if waited > 0:
        ranked = sorted(WAITING_CAUSES, key=lambda c: -b.cause_hours[c])
        parts = [f"{pct(b.cause_hours[c] / waited)} on {CAUSE_LABELS[c]} ({c})" for c in ranked[:3]
                 if b.cause_hours[c] / waited >= 0.05]
        out.append("Of the waiting, " + _join(parts) + ".")
    worst = next((g for g in groups if g.breakdown.state_hours["waiting"] > 0), None)
    if unattributed is not None and unattributed.state_hours["waiting"] > (
            worst.breakdown.state_hours["waiting"] if worst is not None else 0.0):
        # The largest bucket is the time no owner held: say so rather than name the largest owner as if it led.
        ub = unattributed
        of_all = ub.state_hours["waiting"] / b.state_hours["waiting"] if b.state_hours["waiting"] > 0 else 0.0
        out.append(f"More of the waiting than any {_BY_NOUN[by]}'s, {hours_text(ub.state_hours['waiting'])} GPU-hours "
                   f"({pct(of_all)} of it; {pct(ub.dominant_cause_share)} of that {ub.dominant_cause}), was on GPUs "
                   f"no {_BY_NOUN[by]} held "
                   f"({no_owner(by)} in the tables)"
                   + (f"; of the {_BY_NOUN[by]}s, {worst.name} waited most "
                      f"({hours_text(worst.breakdown.state_hours['waiting'])} GPU-hours)." if worst is not None
                      else "."))
    elif worst is not None:
        wb = worst.breakdown
        out.append(f"The {_BY_NOUN[by]} that waited most was {worst.name} ({hours_text(wb.state_hours['waiting'])} "
                   f"GPU-hours, {pct(wb.dominant_cause_share)} {wb.dominant_cause}).")
    if cost is not None and (cost.total.waiting_kwh or cost.total.cost is not None):
        parts = []
        if cost.total.waiting_kwh:
            parts.append(f"drew {amount_text(cost.total.waiting_kwh)} kWh")
        if cost.total.cost is not None:
            parts.append(f"cost {amount_text(cost.total.cost)} at the prices given")
        out.append("The waiting " + " and ".join(parts) + ".")
    by_check: dict[str, list[HostFinding]] = defaultdict(list)
    for f in findings:
        by_check[f.check].append(f)
    sentences = []
    ranked_checks = sorted(by_check.items(), key=lambda kv: -sum(f.hours for f in kv[1]))
    for check, fs in ranked_checks[:_SUMMARY_FINDINGS]:
        n = len({(f.job, f.instance) for f in fs})
        hosts = f"{_count_word(n)} host{'s' if n != 1 else ''}"
        total = sum(f.hours for f in fs)
        if check == "pcie_link_downgraded":
            states = sorted({link_text(ls.gen, ls.width) for f in fs for ls in links.values()
                             if (ls.gpu.job, ls.gpu.instance) == (f.job, f.instance) and link_text(ls.gen, ls.width)})
            at = f" at {' or '.join(states)}" if states else " below its maximum"
            sentences.append(f"{hosts} had a link{at} while busy ({check}, {hours_text(total)} h in all)")
        else:
            sentences.append(f"{hosts} had {FINDING_LABELS.get(check, check)} ({check}, {hours_text(total)} h)")
    if len(ranked_checks) > _SUMMARY_FINDINGS:
        more = len(ranked_checks) - _SUMMARY_FINDINGS
        sentences.append(f"{_count_word(more)} more finding{'s' if more != 1 else ''} below")
    if sentences:
        s = "; ".join(sentences)
        out.append(s[0].upper() + s[1:] + ".")
    noted = [m.note for m in models if m.note]
    if noted:
        out.append("Same model, different result: " + noted[0].split(". Compare")[0] + ".")
    return " ".join(out)


def _join(parts: Sequence[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _count_word(n: int) -> str:
    words = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return words[n] if n < len(words) else str(n)


# ---------------------------------------------------------------------------------------------------- cost

_KWH_J = 3.6e6


def _cost_row(name: str, hours: float, joules: float | None, gpu_hour: float | None, kwh: float | None) -> CostRow:
    kwh_used = None if joules is None else joules / _KWH_J
    cost = None
    if gpu_hour is not None or kwh is not None:
        cost = hours * (gpu_hour or 0.0) + (kwh_used or 0.0) * (kwh or 0.0)
    return CostRow(name=name, waiting_hours=hours, waiting_kwh=kwh_used, cost=cost)


def _cost(data: FleetData, fleet: Breakdown, *, groups: Sequence[GroupRow], rest: Breakdown | None,
          hosts: Sequence[HostRow], gpu_hour: float | None, kwh: float | None) -> Cost:
    """Waiting GPU-hours and kWh per cause and per group, priced."""
    have = bool(data.cause_j)
    fleet_j = {c: sum(per.get(c, 0.0) for per in data.cause_j.values()) for c in WAITING_CAUSES} if have else {}
    waited = fleet.state_hours["waiting"]
    total = _cost_row("all", waited, sum(fleet_j.values()) if have else None, gpu_hour, kwh)
    by_cause = tuple(_cost_row(c, fleet.cause_hours[c], fleet_j.get(c) if have else None, gpu_hour, kwh)
                     for c in sorted(WAITING_CAUSES, key=lambda c: -fleet.cause_hours[c])
                     if fleet.cause_hours[c] > 0 or fleet_j.get(c, 0.0) > 0)
    rows: list[CostRow] = []
    if data.by == "host":
        for h in hosts:
            gs = [g for g in data.cause_j if (g.job, g.instance) == (h.job, h.instance)]
            j = sum(sum(data.cause_j[g].values()) for g in gs) if gs else None
            rows.append(_cost_row(h.instance, h.breakdown.state_hours["waiting"], j, gpu_hour, kwh))
    else:
        grouped_j = 0.0
        for g in groups:
            per = data.group_cause_j.get(g.name)
            gj = sum(per.values()) if per else (0.0 if have else None)
            grouped_j += gj or 0.0
            rows.append(_cost_row(g.name, g.breakdown.state_hours["waiting"], gj, gpu_hour, kwh))
        if rest is not None and (rest.state_hours["waiting"] > 0 or (have and total.waiting_kwh)):
            rest_j = max(0.0, sum(fleet_j.values()) - grouped_j) if have else None
            rows.append(_cost_row(no_owner(data.by), rest.state_hours["waiting"], rest_j, gpu_hour, kwh))
        rows.sort(key=lambda r: (-r.waiting_hours, r.name))
    return Cost(price_per_gpu_hour=gpu_hour, price_per_kwh=kwh, energy_gpus=len(data.cause_j), total=total,
                by_cause=by_cause, by_group=tuple(rows))


def _delta(name: str, now: float, before: float) -> Delta:
    return Delta(name=name, now=now, before=before, change=now - before,
                 ratio=(now / before - 1) if before > 0 else None)


def compare(current: Report, previous: Report) -> Comparison:
    """``current`` against ``previous`` (the range of the same length just before it): the fleet's figures,
    waiting GPU-hours per cause, and per namespace / Slurm job / host the ``top`` largest changes."""
    cb, pb = current.fleet.breakdown, previous.fleet.breakdown
    kwh = None
    if current.cost.total.waiting_kwh is not None or previous.cost.total.waiting_kwh is not None:
        kwh = _delta("waiting kWh", current.cost.total.waiting_kwh or 0.0, previous.cost.total.waiting_kwh or 0.0)
    cost = None
    if current.cost.total.cost is not None and previous.cost.total.cost is not None:
        cost = _delta("cost of waiting", current.cost.total.cost, previous.cost.total.cost)
    causes = tuple(_delta(c, cb.cause_hours[c], pb.cause_hours[c]) for c in WAITING_CAUSES
                   if cb.cause_hours[c] > 0 or pb.cause_hours[c] > 0)
    now_g = {r.name: r.waiting_hours for r in current.cost.by_group}
    before_g = {r.name: r.waiting_hours for r in previous.cost.by_group}
    groups = [_delta(n, now_g.get(n, 0.0), before_g.get(n, 0.0)) for n in set(now_g) | set(before_g)]
    groups.sort(key=lambda d: (-abs(d.change), d.name))
    return Comparison(
        previous_start=previous.range.start, previous_end=previous.range.end,
        gpus=_delta("GPUs", current.fleet.gpus, previous.fleet.gpus),
        gpu_hours=_delta("GPU-hours", cb.gpu_hours, pb.gpu_hours),
        waiting_hours=_delta("waiting GPU-hours", cb.state_hours["waiting"], pb.state_hours["waiting"]),
        waiting_share=_delta("share waiting", cb.waiting_share, pb.waiting_share),
        waiting_kwh=kwh, cost=cost, by_cause=causes, by_group=tuple(groups[:current.top]),
    )


def comparison_sentence(c: Comparison) -> str:
    """The comparison in one sentence for the summary."""
    w = c.waiting_hours
    if w.before <= 0 and w.now <= 0:
        return "No GPU waited in this period or the one before."
    trend = "more" if w.change > 0 else "less"
    text = (f"Against the period before ({c.previous_start[:10]} to {c.previous_end[:10]}), the fleet waited "
            f"{hours_text(abs(w.change))} GPU-hours {trend}" + (f" ({w.ratio:+.0%})" if w.ratio is not None else "")
            + f", {pct(c.waiting_share.now)} of its time against {pct(c.waiting_share.before)}")
    mover = max(c.by_cause, key=lambda d: abs(d.change), default=None)
    if mover is not None and abs(mover.change) > 0:
        text += (f"; {mover.name} moved most ({'+' if mover.change > 0 else '-'}"
                 f"{hours_text(abs(mover.change))} GPU-hours)")
    return text + "."


# --------------------------------------------------------------------------------------------------- entry


def build_report(data: FleetData, *, prometheus: str, generated_at: float, top: int = 10,
                 top_gpus: int = 6, price_per_gpu_hour: float | None = None, price_per_kwh: float | None = None,
                 previous: FleetData | None = None) -> Report:
    """Every figure of the review from ``data``; with ``previous`` (the range before it), the comparison."""
    w = data.window
    gpus = sorted(data.state_s)
    host_map = _hosts_of(gpus)
    finding_rows, host_findings = _finding_rows(data)
    checks_of: dict[tuple[str, str], tuple[str, ...]] = {}
    for f in host_findings:
        checks_of[(f.job, f.instance)] = (*checks_of.get((f.job, f.instance), ()), f.check)
    hosts = [HostRow(job=job, instance=inst, gpus=len(hg),
                     models=tuple(sorted({data.models.get(g, "unknown model") for g in hg})),
                     findings=tuple(sorted(checks_of.get((job, inst), ()))), breakdown=_gpu_breakdown(data, hg))
             for (job, inst), hg in host_map.items()]
    hosts.sort(key=lambda h: (-h.breakdown.state_hours["waiting"], h.instance))
    fb = _gpu_breakdown(data, gpus)
    possible = len(gpus) * w.seconds / 3600
    fleet = FleetTotals(gpus=len(gpus), hosts=len(host_map), possible_gpu_hours=possible,
                        observed_share=_share(fb.gpu_hours, possible), breakdown=fb)
    groups, rest = _groups(data, hosts)
    models = _models(data, {k: tuple(sorted(v)) for k, v in checks_of.items()})
    cost = _cost(data, fb, groups=groups, rest=rest, hosts=hosts, gpu_hour=price_per_gpu_hour, kwh=price_per_kwh)
    text = summary(fleet, w, data.by, groups=groups, findings=host_findings, links=data.links, models=models,
                   unattributed=rest, cost=cost)
    lost = stragglers(data, top)
    if lost.jobs:
        worst, cause = lost.jobs[0], lost.by_cause[0]
        text += (f" Distributed jobs lost {hours_text(lost.lost_gpu_hours)} GPU-hours waiting for stragglers, most "
                 f"to {cause.cause} ({hours_text(cause.gpu_hours)}); {worst.job_id} lost most "
                 f"({hours_text(worst.lost_gpu_hours)}).")
    report = Report(
        schema_version=SCHEMA_VERSION, generated_at=iso(generated_at), prometheus=prometheus,
        range=RangeInfo(start=iso(w.start), end=iso(w.end), seconds=w.seconds, step_seconds=w.step),
        by=data.by, top=top, sources=data.sources, notes=data.notes, summary=text,
        fleet=fleet, timeline=_timeline(data), groups=tuple(groups), unattributed=rest, hosts=tuple(hosts),
        findings=tuple(host_findings), finding_details=tuple(finding_rows), models=tuple(models),
        idle_gaps=tuple(_gaps(data, top_gpus)), cost=cost, stragglers=lost,
    )
    if previous is None:
        return report
    before = build_report(previous, prometheus=prometheus, generated_at=generated_at, top=top, top_gpus=top_gpus,
                          price_per_gpu_hour=price_per_gpu_hour, price_per_kwh=price_per_kwh)
    c = compare(report, before)
    return dataclasses.replace(report, comparison=c, summary=f"{text} {comparison_sentence(c)}")


def to_json(report: Report) -> dict[str, Any]:
    """The report as the JSON object of docs/report.schema.json."""
    out: dict[str, Any] = dataclasses.asdict(report)
    return out
