"""The report as Markdown, to paste into a ticket: the summary, then the tables of the HTML page."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exporter.fleet.figures import Breakdown, CostRow, Delta, Report, amount_text, hours_text, no_owner, pct
from exporter.fleet.page import BY_TITLE
from exporter.fleet.playbook import CAUSE_LABELS, fix_for


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return [*out, ""]


def _cause(b: Breakdown) -> str:
    return f"`{b.dominant_cause}` {pct(b.dominant_cause_share)}" if b.dominant_cause else "—"


def _cells(b: Breakdown) -> list[str]:
    return [hours_text(b.gpu_hours), pct(b.working_share), pct(b.waiting_share), pct(b.idle_share), _cause(b)]


def _change(d: Delta, show: Callable[[float | None], str] | Callable[[float], str] = hours_text) -> str:
    sign = "+" if d.change > 0 else "-" if d.change < 0 else "±"
    if show is pct:  # a share changes by percentage points
        return f"{sign}{abs(d.change) * 100:.0f} points"
    ratio = f" ({d.ratio:+.0%})" if d.ratio is not None else ""
    return f"{sign}{show(abs(d.change))}{ratio}"


def _sections(r: Report) -> list[str]:
    """The comparison with the period before (when asked) and the energy and cost of waiting."""
    out: list[str] = []
    c = r.comparison
    if c is not None:
        out += [f"## Against the period before ({c.previous_start} to {c.previous_end})", ""]
        rows = [["GPU-hours observed", hours_text(c.gpu_hours.now), hours_text(c.gpu_hours.before),
                 _change(c.gpu_hours)],
                ["waiting GPU-hours", hours_text(c.waiting_hours.now), hours_text(c.waiting_hours.before),
                 _change(c.waiting_hours)],
                ["share waiting", pct(c.waiting_share.now), pct(c.waiting_share.before), _change(c.waiting_share, pct)]]
        for label, d in (("kWh while waiting", c.waiting_kwh), ("cost of waiting", c.cost)):
            if d is not None:
                rows.append([label, amount_text(d.now), amount_text(d.before), _change(d, amount_text)])
        rows += [[f"`{d.name}` waiting GPU-hours", hours_text(d.now), hours_text(d.before), _change(d)]
                 for d in c.by_cause]
        out += _table(["figure", "this period", "period before", "change"], rows)
        if c.by_group:
            out += _table([r.by, "waiting GPU-hours", "period before", "change"],
                          [[d.name, hours_text(d.now), hours_text(d.before), _change(d)] for d in c.by_group])
    cost = r.cost
    if cost.energy_gpus or cost.total.cost is not None:
        priced = cost.total.cost is not None
        out += ["## Energy and cost of waiting", ""]
        head = ["waiting GPU-hours", "kWh while waiting", *(["cost"] if priced else [])]

        def cells(x: CostRow) -> list[str]:
            return [hours_text(x.waiting_hours), amount_text(x.waiting_kwh) if x.waiting_kwh is not None else "—",
                    *([amount_text(x.cost) if x.cost is not None else "—"] if priced else [])]
        out += _table(["cause", *head], [[f"`{x.name}`", *cells(x)] for x in (*cost.by_cause, cost.total)])
        if cost.by_group:
            out += _table([r.by, *head], [[x.name, *cells(x)] for x in cost.by_group[:r.top]])
    s = r.stragglers
    if s.jobs:
        out += ["## GPU-hours lost to stragglers", "",
                "Ranks waiting in collectives for a slower rank (collective_wait) x the time they waited, charged to "
                f"the cause the slow rank waited on, on its own host (from `{s.source}`).", ""]
        out += _table(["straggler's cause", "GPU-hours lost"],
                      [*([f"`{c.cause}`", hours_text(c.gpu_hours)] for c in s.by_cause),
                       ["**all**", hours_text(s.lost_gpu_hours)]])
        out += _table(["namespace", "job", "GPU-hours lost", "most ranks waiting", "by the straggler's cause"],
                      [[j.namespace or "—", j.job_id, hours_text(j.lost_gpu_hours), f"{j.peak_ranks_waiting:.1f}",
                        ", ".join(f"`{c.cause}` {hours_text(c.gpu_hours)}" for c in j.by_cause)] for j in s.jobs])
    return out


def render(r: Report) -> str:
    """The whole Markdown document."""
    b = r.fleet.breakdown
    out = [f"# GPU capacity review, {r.range.start} to {r.range.end}", "", r.summary, ""]
    waited = sum(b.cause_hours.values())
    out += _sections(r)
    out += ["## Where the waiting went", ""]
    out += _table(["cause", "waiting on", "GPU-hours", "share of waiting", "fix"],
                  [[f"`{c}`", CAUSE_LABELS[c], hours_text(b.cause_hours[c]), pct(b.cause_hours[c] / waited), fix_for(c)]
                   for c in sorted(b.cause_hours, key=lambda c: -b.cause_hours[c]) if waited and b.cause_hours[c] > 0])
    head = ["GPU-hours", "worked", "waited", "idle", "dominant cause"]
    if r.by != "host":
        out += [f"## Top waiting {BY_TITLE[r.by]}", ""]
        out += [f"> {n}" for n in r.notes] + ([""] if r.notes else [])
        ranked = [(g.name, g.breakdown) for g in r.groups[:r.top]]
        if r.unattributed is not None and r.unattributed.gpu_hours > 0:
            ranked.append((no_owner(r.by), r.unattributed))
        ranked.sort(key=lambda x: -x[1].state_hours["waiting"])
        out += _table([r.by, *head, "fix"], [[name, *_cells(b), b.fix] for name, b in ranked])
    out += ["## Top waiting hosts", ""]
    out += _table(["host", "GPUs", *head, "findings"],
                  [[h.instance, str(h.gpus), *_cells(h.breakdown), ", ".join(h.findings) or "—"]
                   for h in r.hosts[:r.top]])
    out += ["## Platform findings", ""]
    if r.findings:
        out += _table(["host", "finding", "GPUs", "hours", "episodes", "first seen", "last seen", "detail", "fix"],
                      [[f.instance, f"`{f.check}`", ", ".join(g or "host" for g in f.gpus), hours_text(f.hours),
                        str(f.episodes), f.first_seen, f.last_seen, f.detail, f.fix] for f in r.findings])
    else:
        out += ["No platform finding was raised in the range.", ""]
    out += ["## GPU models compared", ""]
    out += [f"> {m.note}" for m in r.models if m.note] + ([""] if any(m.note for m in r.models) else [])
    out += _table(["model", "host", "GPUs", "worked", "waited", "idle", "busy efficiency", "findings"],
                  [[m.name, h.instance, str(h.gpus), pct(h.breakdown.working_share), pct(h.breakdown.waiting_share),
                    pct(h.breakdown.idle_share), pct(h.breakdown.busy_efficiency), ", ".join(h.findings) or "—"]
                   for m in r.models for h in m.per_host])
    if r.idle_gaps:
        out += ["## Idle gaps of the GPUs that waited most", ""]
        out += _table(["GPU", "waited", "idle gaps", "mean gap (s)"],
                      [[f"{g.instance} GPU {g.gpu}", pct(g.waiting_share), f"{g.gaps:,.0f}",
                        f"{g.mean_gap_s:.2f}" if g.mean_gap_s is not None else "—"] for g in r.idle_gaps])
    out += ["## Sources", ""]
    out += [f"- {s.family}: {'recording rule' if s.kind == 'rules' else 'raw series'} `{s.series}`"
            + (f" ({s.note})" if s.note else "") for s in r.sources]
    out += ["", f"Prometheus `{r.prometheus}`, generated {r.generated_at} by `gpufeed report`.", ""]
    return "\n".join(out)
