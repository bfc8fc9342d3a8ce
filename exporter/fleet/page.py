"""The report as one self-contained HTML page: inline CSS, inline SVG plots, no script, no network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from exporter.fleet.figures import Breakdown, Comparison, Cost, Delta, Report, amount_text, hours_text, no_owner, pct
from exporter.fleet.playbook import CAUSE_LABELS, FINDING_FIXES, fix_for

BY_TITLE = {"namespace": "namespaces", "job": "Slurm jobs", "host": "hosts"}
SECTIONS = ("summary", "compare", "cost", "stragglers", "time", "groups", "hosts", "findings", "models", "gaps",
            "sources")
PLOT_CAPTIONS = {
    "totals": "Where the GPU-hours went: working, waiting by cause, idle.",
    "state-timeline": "Fleet GPU-hours per step, by state.",
    "cause-timeline": "Waiting GPU-hours per step, by cause.",
    "groups": "The top waiting {by}, GPU-hours by state and waiting cause.",
    "hosts": "The top waiting hosts, GPU-hours by state and waiting cause.",
    "findings": "When each finding was raised (darker: more of the step).",
    "models": "Each host's share of GPU-hours working / waiting / idle, grouped by GPU model.",
    "gaps": "Idle gaps between bursts of the GPUs that waited most (count per length, symlog scale).",
}

_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #ffffff; --tile: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1340px; padding: 24px 32px 48px; color: var(--fg); background: var(--bg);
       font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
.meta { color: var(--muted); margin: 0 0 16px; }
.summary { font-size: 16px; background: var(--tile); border-left: 4px solid #ef6c00; padding: 12px 16px; }
.tiles { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.tile { background: var(--tile); border-radius: 6px; padding: 10px 14px; flex: 1 1 0; min-width: 110px; }
.tile b { display: block; font-size: 22px; }
.tile span { color: var(--muted); font-size: 12px; }
figure.plot { margin: 12px 0 20px; }
figure.plot svg { width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 4px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 16px; font-size: 13px; }
table.compact { width: auto; min-width: 55%; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--tile); font-weight: 600; }
td.num, th.num { text-align: right; white-space: nowrap; }
td.fix { color: var(--muted); font-size: 12px; min-width: 220px; max-width: 360px; }
.nw { white-space: nowrap; }
td.model { max-width: 150px; }
.up { color: #b42318; } .down { color: #067647; }
td:first-child, td.host { white-space: nowrap; }
code { font-size: 12px; background: var(--tile); padding: 1px 4px; border-radius: 3px; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 5px; }
.note { background: #fff8e1; border-left: 4px solid #f9a825; padding: 8px 12px; margin: 8px 0; }
.empty { color: var(--muted); font-style: italic; }
"""


def _plot(plots: Mapping[str, str], key: str, by: str) -> str:
    svg = plots.get(key)
    if svg is None:
        return ""
    caption = PLOT_CAPTIONS[key].format(by=BY_TITLE.get(by, by))
    return f'<figure class="plot" data-plot="{key}">{svg}<figcaption>{escape(caption)}</figcaption></figure>\n'


def _cause_cell(b: Breakdown) -> str:
    if b.dominant_cause is None:
        return "—"
    return (f'<span class="nw"><code>{escape(b.dominant_cause)}</code> {pct(b.dominant_cause_share)}</span>'
            f"<br><span class=\"empty\">{escape(CAUSE_LABELS.get(b.dominant_cause, ''))}</span>")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: Sequence[int] = (),
           fix_col: int | None = None, host_col: int | None = None, model_col: int | None = None,
           compact: bool = False) -> str:
    out = ['<table class="compact"><thead><tr>' if compact else "<table><thead><tr>"]
    out += [f'<th class="num">{escape(h)}</th>' if i in numeric else f"<th>{escape(h)}</th>"
            for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>\n")
    for r in rows:
        out.append("<tr>")
        for i, c in enumerate(r):
            cls = (' class="num"' if i in numeric else ' class="fix"' if i == fix_col
                   else ' class="host"' if i == host_col else ' class="model"' if i == model_col else "")
            out.append(f"<td{cls}>{c}</td>")
        out.append("</tr>\n")
    out.append("</tbody></table>\n")
    return "".join(out)


def _breakdown_cells(b: Breakdown) -> list[str]:
    return [hours_text(b.gpu_hours), pct(b.working_share), pct(b.waiting_share),
            hours_text(b.state_hours["waiting"]), pct(b.idle_share)]


def _summary(r: Report, plots: Mapping[str, str]) -> str:
    b = r.fleet.breakdown
    tiles = [(str(r.fleet.gpus), "GPU" if r.fleet.gpus == 1 else "GPUs"),
             (str(r.fleet.hosts), "host" if r.fleet.hosts == 1 else "hosts"),
             (hours_text(b.gpu_hours), "GPU-hours observed"),
             (pct(b.working_share), "working"), (pct(b.waiting_share), "waiting"), (pct(b.idle_share), "idle"),
             (pct(b.busy_efficiency), "busy efficiency")]
    if r.cost.total.waiting_kwh is not None:
        tiles.append((amount_text(r.cost.total.waiting_kwh), "kWh while waiting"))
    if r.cost.total.cost is not None:
        tiles.append((amount_text(r.cost.total.cost), "cost of waiting"))
    out = ['<section id="summary"><h2>Summary</h2>\n', f'<p class="summary">{escape(r.summary)}</p>\n',
           '<div class="tiles">']
    out += [f'<div class="tile"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for v, k in tiles]
    out.append("</div>\n")
    out.append(_plot(plots, "totals", r.by))
    waited = sum(b.cause_hours.values())
    rows = [[f"<code>{c}</code>", escape(CAUSE_LABELS[c]), hours_text(b.cause_hours[c]),
             pct(b.cause_hours[c] / waited if waited else 0.0), escape(fix_for(c))]
            for c in sorted(b.cause_hours, key=lambda c: -b.cause_hours[c]) if b.cause_hours[c] > 0]
    if rows:
        out.append(_table(["cause", "waiting on", "GPU-hours", "share of waiting", "the playbook's fix"], rows,
                          numeric=(2, 3), fix_col=4))
    out.append("</section>\n")
    return "".join(out)


def _count(x: float) -> str:
    return f"{x:,.0f}"


def _signed(d: Delta, fmt: str = "hours", *, colored: bool = True) -> str:
    """A change with its sign and, where the period before had any, its ratio: +12.5 (+31%); a share's change in
    percentage points."""
    text = (f"{abs(d.change) * 100:.0f} points" if fmt == "share" else amount_text(abs(d.change)) if fmt == "amount"
            else _count(abs(d.change)) if fmt == "count" else hours_text(abs(d.change)))
    sign = "+" if d.change > 0 else "&minus;" if d.change < 0 else "&plusmn;"
    cls = ("up" if d.change > 0 else "down" if d.change < 0 else "") if colored else ""
    ratio = f" ({d.ratio:+.0%})" if d.ratio is not None and fmt != "share" else ""
    return f'<span class="{cls}">{sign}{text}{ratio}</span>'


def _delta_row(label: str, d: Delta, fmt: str = "hours", *, colored: bool = True) -> list[str]:
    show = {"share": pct, "amount": amount_text, "count": _count}.get(fmt, hours_text)
    return [label, show(d.now), show(d.before), _signed(d, fmt, colored=colored)]


def _compare(r: Report) -> str:
    c: Comparison | None = r.comparison
    if c is None:
        return ""
    out = [f'<section id="compare"><h2>Against the period before</h2>\n<p class="meta">This period '
           f"{escape(r.range.start)} to {escape(r.range.end)} against {escape(c.previous_start)} to "
           f"{escape(c.previous_end)} (the same length just before). More waiting is red, less green.</p>\n"]
    # More waiting is red, less green; the fleet's size and observed hours are neither good nor bad.
    rows = [_delta_row("GPUs", c.gpus, "count", colored=False),
            _delta_row("GPU-hours observed", c.gpu_hours, colored=False),
            _delta_row("waiting GPU-hours", c.waiting_hours), _delta_row("share of GPU-hours waiting",
                                                                         c.waiting_share, "share")]
    if c.waiting_kwh is not None:
        rows.append(_delta_row("kWh drawn while waiting", c.waiting_kwh, "amount"))
    if c.cost is not None:
        rows.append(_delta_row("cost of waiting", c.cost, "amount"))
    rows += [_delta_row(f"<code>{escape(d.name)}</code> waiting GPU-hours", d) for d in c.by_cause]
    out.append(_table(["figure", "this period", "period before", "change"], rows, numeric=(1, 2, 3), compact=True))
    if c.by_group:
        out.append(f"<h3>Largest changes by {escape(r.by)}</h3>\n")
        out.append(_table([r.by, "waiting GPU-hours", "period before", "change"],
                          [_delta_row(escape(d.name), d) for d in c.by_group], numeric=(1, 2, 3), compact=True))
    out.append("</section>\n")
    return "".join(out)


def _cost_cells(kwh: float | None, cost: float | None, priced: bool) -> list[str]:
    return [amount_text(kwh) if kwh is not None else "—", *([amount_text(cost) if cost is not None else "—"]
                                                            if priced else [])]


def _cost(r: Report) -> str:
    c: Cost = r.cost
    if c.energy_gpus == 0 and c.total.cost is None:
        return ('<section id="cost"><h2>Energy and cost of waiting</h2>\n<p class="empty">No GPU in the range '
                "exported an energy counter (gpufeed_gpu_waiting_joules_total), and no price was given "
                "(--price-per-gpu-hour, --price-per-kwh).</p>\n</section>\n")
    priced = c.total.cost is not None
    prices = []
    if c.price_per_gpu_hour is not None:
        prices.append(f"{c.price_per_gpu_hour:g} per GPU-hour")
    if c.price_per_kwh is not None:
        prices.append(f"{c.price_per_kwh:g} per kWh")
    gpus = r.fleet.gpus
    if c.energy_gpus >= gpus:
        meta = "Energy from the GPUs' energy counters (every GPU has one). "
    elif c.energy_gpus:
        meta = (f"Energy from the GPUs' energy counters ({c.energy_gpus} of {gpus} GPUs have one; the kWh of the "
                "others are not known and not counted). ")
    else:
        meta = "No GPU exported an energy counter: kWh are not known. "
    meta += (f"Cost at {' and '.join(prices)}." if priced else "Give --price-per-gpu-hour and --price-per-kwh "
             "to price them.")
    out = [f'<section id="cost"><h2>Energy and cost of waiting</h2>\n<p class="meta">{escape(meta)}</p>\n']
    head = ["waiting GPU-hours", "kWh while waiting", *(["cost"] if priced else [])]
    rows = [[f"<code>{escape(x.name)}</code>", hours_text(x.waiting_hours),
             *_cost_cells(x.waiting_kwh, x.cost, priced)] for x in c.by_cause]
    rows.append(["<b>all</b>", hours_text(c.total.waiting_hours), *_cost_cells(c.total.waiting_kwh, c.total.cost,
                                                                               priced)])
    out.append(_table(["cause", *head], rows, numeric=tuple(range(1, len(head) + 1)), compact=True))
    if c.by_group:
        rows = [[escape(x.name), hours_text(x.waiting_hours), *_cost_cells(x.waiting_kwh, x.cost, priced)]
                for x in c.by_group[:r.top]]
        out.append(_table([r.by, *head], rows, numeric=tuple(range(1, len(head) + 1)), compact=True))
    out.append("</section>\n")
    return "".join(out)


def _stragglers(r: Report) -> str:
    """GPU-hours distributed jobs lost waiting for a slower rank, per job and by the straggler's cause."""
    s = r.stragglers
    out = ['<section id="stragglers"><h2>GPU-hours lost to stragglers</h2>\n']
    if not s.jobs:
        return "".join(out) + ('<p class="empty">No rank of a distributed job (gpufeed_workload_info job_id) waited '
                               "for a slower rank (collective_wait) in the range.</p></section>\n")
    out.append(f'<p class="meta">While one rank of a job is slow, the others wait for it in their collectives '
               f"(collective_wait): the job loses those ranks x the time they waited, charged here to the cause the "
               f"slow rank waited on, on its own host. Counted from {escape(s.source)}.</p>\n")
    rows = [[f"<code>{escape(c.cause)}</code>", hours_text(c.gpu_hours)] for c in s.by_cause]
    rows.append(["<b>all</b>", hours_text(s.lost_gpu_hours)])
    out.append(_table(["straggler's cause", "GPU-hours lost"], rows, numeric=(1,), compact=True))
    rows = [[escape(j.namespace) or "—", escape(j.job_id), hours_text(j.lost_gpu_hours), f"{j.peak_ranks_waiting:.1f}",
             ", ".join(f"<code>{escape(c.cause)}</code> {hours_text(c.gpu_hours)}" for c in j.by_cause)]
            for j in s.jobs]
    out.append(_table(["namespace", "job", "GPU-hours lost", "most ranks waiting", "by the straggler's cause"], rows,
                      numeric=(2, 3)))
    out.append("</section>\n")
    return "".join(out)


def _time(r: Report, plots: Mapping[str, str]) -> str:
    return ('<section id="time"><h2>GPU-hours over time</h2>\n' + _plot(plots, "state-timeline", r.by)
            + _plot(plots, "cause-timeline", r.by) + "</section>\n")


def _groups(r: Report, plots: Mapping[str, str]) -> str:
    if r.by == "host":
        return ""
    title = BY_TITLE[r.by]
    out = [f'<section id="groups"><h2>Top waiting {escape(title)}</h2>\n']
    if not r.groups:
        out.append(f'<p class="empty">No GPU time was attributed to any {escape(title[:-1])} in the range.</p>\n')
    out += [f'<p class="note">{escape(n)}</p>\n' for n in r.notes]
    out.append(_plot(plots, "groups", r.by))
    ranked = [(g.breakdown.state_hours["waiting"], escape(g.name), g.breakdown, escape(g.breakdown.fix))
              for g in r.groups[:r.top]]
    if r.unattributed is not None and r.unattributed.gpu_hours > 0:
        # The time no owner held is a bucket like the others, ranked by its waiting: often the largest.
        u = r.unattributed
        ranked.append((u.state_hours["waiting"], f"<i>{escape(no_owner(r.by))}</i>", u, escape(u.fix)))
    ranked.sort(key=lambda x: -x[0])
    rows = [[name, *_breakdown_cells(b), _cause_cell(b), fix] for _, name, b, fix in ranked]
    if rows:
        out.append(_table([r.by, "GPU-hours", "worked", "waited", "waiting GPU-h", "idle", "dominant cause",
                           "the playbook's fix"], rows, numeric=(1, 2, 3, 4, 5), fix_col=7))
    out.append("</section>\n")
    return "".join(out)


def _hosts(r: Report, plots: Mapping[str, str]) -> str:
    out = ['<section id="hosts"><h2>Top waiting hosts</h2>\n', _plot(plots, "hosts", r.by)]
    rows = [[escape(h.instance), str(h.gpus), escape(", ".join(h.models)), *_breakdown_cells(h.breakdown),
             _cause_cell(h.breakdown), escape(", ".join(h.findings)).replace(", ", "<br>") or "—",
             escape(h.breakdown.fix)]
            for h in r.hosts[:r.top]]
    out.append(_table(["host", "GPUs", "model", "GPU-hours", "worked", "waited", "waiting GPU-h", "idle",
                       "dominant cause", "findings", "the playbook's fix"], rows, numeric=(1, 3, 4, 5, 6, 7),
                      fix_col=10, model_col=2))
    out.append("</section>\n")
    return "".join(out)


def _findings(r: Report, plots: Mapping[str, str]) -> str:
    out = ['<section id="findings"><h2>Hosts with platform findings</h2>\n']
    if not r.findings:
        out.append('<p class="empty">No platform finding was raised in the range.</p>\n</section>\n')
        return "".join(out)
    out.append(_plot(plots, "findings", r.by))
    rows = [[escape(f.instance), f"<code>{escape(f.check)}</code><br>{escape(f.detail)}",
             escape(", ".join(g or "host" for g in f.gpus)), hours_text(f.hours), str(f.episodes),
             hours_text(f.longest_hours), escape(f.first_seen.replace("T", " ")), escape(f.last_seen.replace("T", " ")),
             escape(f.fix or FINDING_FIXES.get(f.check, ""))] for f in r.findings]
    out.append(_table(["host", "finding", "GPUs", "hours", "episodes", "longest (h)", "first seen", "last seen",
                       "the playbook's fix"], rows, numeric=(3, 4, 5), fix_col=8))
    out.append("</section>\n")
    return "".join(out)


def _models(r: Report, plots: Mapping[str, str]) -> str:
    out = ['<section id="models"><h2>GPU models compared: identical servers, different results</h2>\n']
    out += [f'<p class="note">{escape(m.note)}</p>\n' for m in r.models if m.note]
    out.append(_plot(plots, "models", r.by))
    rows = []
    for m in r.models:
        rows.append([f"<b>{escape(m.name)}</b>", "all", str(m.gpus), *_breakdown_cells(m.breakdown)[1:],
                     pct(m.breakdown.busy_efficiency), _cause_cell(m.breakdown), ""])
        rows += [["", escape(h.instance), str(h.gpus), *_breakdown_cells(h.breakdown)[1:],
                  pct(h.breakdown.busy_efficiency), _cause_cell(h.breakdown), escape(", ".join(h.findings)) or "—"]
                 for h in m.per_host]
    out.append(_table(["model", "host", "GPUs", "worked", "waited", "waiting GPU-h", "idle", "busy efficiency",
                       "dominant cause", "findings"], rows, numeric=(2, 3, 4, 5, 6, 7), host_col=1))
    out.append("</section>\n")
    return "".join(out)


def _gaps(r: Report, plots: Mapping[str, str]) -> str:
    out = ['<section id="gaps"><h2>Idle gaps of the GPUs that waited most</h2>\n']
    if not r.idle_gaps:
        out.append('<p class="empty">No idle-gap histogram (gpufeed_gpu_idle_gap_seconds) in the range.</p>\n')
        out.append("</section>\n")
        return "".join(out)
    out.append(_plot(plots, "gaps", r.by))
    rows = []
    for g in r.idle_gaps:
        labels = [f"≤ {b:g} s" for b in g.bounds] + [f"> {g.bounds[-1]:g} s" if g.bounds else "all"]
        top = max(range(len(g.counts)), key=lambda i: g.counts[i]) if g.counts else 0
        rows.append([escape(f"{g.instance} GPU {g.gpu}"), escape(g.model), pct(g.waiting_share),
                     f"{g.gaps:,.0f}", f"{g.mean_gap_s:.2f} s" if g.mean_gap_s is not None else "—",
                     escape(labels[top]) if g.counts else "—"])
    out.append(_table(["GPU", "model", "waited", "idle gaps", "mean gap", "most gaps"], rows, numeric=(2, 3, 4)))
    out.append("</section>\n")
    return "".join(out)


def _sources(r: Report) -> str:
    names = {"gpu_state": "GPU time by state", "gpu_cause": "waiting time by cause",
             "group_state": f"{r.by} rollup by state", "group_cause": f"{r.by} rollup by cause"}
    items = []
    for s in r.sources:
        what = "recording rule" if s.kind == "rules" else "raw series"
        note = f" — {escape(s.note)}" if s.note else ""
        items.append(f"<li>{escape(names.get(s.family, s.family))}: {what} <code>{escape(s.series)}</code>{note}</li>")
    return ('<section id="sources"><h2>Sources and method</h2>\n<ul>' + "".join(items) + "</ul>\n"
            f"<p>Prometheus <code>{escape(r.prometheus)}</code>, range {escape(r.range.start)} to "
            f"{escape(r.range.end)} in steps of {r.range.step_seconds:g} s. GPU-hours are sums of "
            "<code>increase()</code> of gpufeed's counters per step (or of its recording rules' rates); findings "
            "are the share of scrapes that carried them. Each figure and its query: docs/report.md in the "
            "gpufeed repository.</p>\n</section>\n")


def render(report: Report, plots: Mapping[str, str]) -> str:
    """The whole page."""
    r = report
    title = f"gpufeed capacity review, {r.range.start[:10]} to {r.range.end[:10]}"
    head = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{escape(title)}</title>\n'
            f"<style>{_CSS}</style></head>\n<body>\n")
    meta = (f'<header><h1>GPU capacity review</h1><p class="meta">{escape(r.range.start)} to {escape(r.range.end)} '
            f"· Prometheus {escape(r.prometheus)} · by {escape(r.by)} · generated {escape(r.generated_at)}</p>"
            "</header>\n")
    body = (_summary(r, plots) + _compare(r) + _cost(r) + _stragglers(r) + _time(r, plots) + _groups(r, plots)
            + _hosts(r, plots) + _findings(r, plots)
            + _models(r, plots) + _gaps(r, plots) + _sources(r))
    return head + meta + body + "</body></html>\n"
