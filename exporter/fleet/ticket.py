"""The report as Markdown, to paste into a ticket: the summary, then the tables of the HTML page."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.fleet.figures import Breakdown, Report, hours_text, pct
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


def render(r: Report) -> str:
    """The whole Markdown document."""
    b = r.fleet.breakdown
    out = [f"# GPU capacity review, {r.range.start} to {r.range.end}", "", r.summary, ""]
    waited = sum(b.cause_hours.values())
    out += ["## Where the waiting went", ""]
    out += _table(["cause", "waiting on", "GPU-hours", "share of waiting", "fix"],
                  [[f"`{c}`", CAUSE_LABELS[c], hours_text(b.cause_hours[c]), pct(b.cause_hours[c] / waited), fix_for(c)]
                   for c in sorted(b.cause_hours, key=lambda c: -b.cause_hours[c]) if waited and b.cause_hours[c] > 0])
    head = ["GPU-hours", "worked", "waited", "idle", "dominant cause"]
    if r.by != "host":
        out += [f"## Top waiting {BY_TITLE[r.by]}", ""]
        out += [f"> {n}" for n in r.notes] + ([""] if r.notes else [])
        rows = [[g.name, *_cells(g.breakdown), g.breakdown.fix] for g in r.groups[:r.top]]
        if r.unattributed is not None and r.unattributed.gpu_hours > 0.01:
            rows.append([f"(no {BY_TITLE[r.by][:-1]})", *_cells(r.unattributed), ""])
        out += _table([r.by, *head, "fix"], rows)
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
