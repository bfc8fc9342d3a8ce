"""The report's plots, rendered by matplotlib's SVG backend to inline ``<svg>`` text (no pyplot, no display).

Glyphs are embedded as paths (``svg.fonttype: path``) so the page looks the same without any font installed,
and each plot gets its own ``svg.hashsalt`` so the ids of two inlined SVGs never collide. Needs the
``gpufeed[report]`` extra; ``command`` checks for it before querying anything.
"""

from __future__ import annotations

import datetime as dt
import io
import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import matplotlib
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from exporter.fleet.figures import Breakdown, GapRow, HostFinding, Report, hours_text, pct
from exporter.names import STATES, WAITING_CAUSES
from exporter.vocabulary import STATE_COLOURS, VERDICT

STATE_COLORS = dict(STATE_COLOURS)
CAUSE_COLORS = {c: VERDICT[c].colour for c in WAITING_CAUSES}
GAP_COLOR = "#5e35b1"
FINDING_COLOR = "#d84315"
_RC: dict[str, Any] = {"svg.fonttype": "path", "font.size": 9, "font.family": "DejaVu Sans", "axes.spines.top": False,
       "axes.spines.right": False, "axes.titlesize": 9, "legend.frameon": False}


_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)


def _style(**extra: Any) -> AbstractContextManager[None]:
    """The report's matplotlib settings (plus ``extra``, e.g. the SVG hash salt) for a ``with`` block."""
    settings: Any = {**_RC, **{k.replace("__", "."): v for k, v in extra.items()}}
    cm: AbstractContextManager[None] = matplotlib.rc_context(settings)
    return cm


def _svg(fig: Figure, key: str) -> str:
    buf = io.StringIO()
    FigureCanvasSVG(fig)
    with _style(svg__hashsalt=f"gpufeed-{key}"):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    # Inline in HTML: no XML prolog, no DOCTYPE, no RDF metadata block.
    return _METADATA.sub("", text[text.index("<svg"):])


def _figure(width: float, height: float) -> Figure:
    with _style():
        fig = Figure(figsize=(width, height), dpi=96, layout="constrained")
    return fig


def _times(ends: Sequence[str]) -> list[float]:
    """Step end times as matplotlib date numbers for an axis set up with ``xaxis_date``: days since
    matplotlib's default ``date.epoch``, the Unix epoch (matplotlib >= 3.3)."""
    return [dt.datetime.fromisoformat(e.replace("Z", "+00:00")).timestamp() / 86400 for e in ends]


def _stacked_timeline(report: Report, series: Mapping[str, Sequence[float]], colors: Mapping[str, str],
                      ylabel: str, key: str) -> str:
    tl = report.timeline
    with _style():
        fig = _figure(10, 2.8)
        ax = fig.add_subplot()
        ax.stackplot(_times(tl.ends), *[series[k] for k in colors], labels=list(colors), colors=list(colors.values()),
                     step="pre", linewidth=0)
        ax.set_ylabel(f"{ylabel} per {_step_word(tl.step_seconds)}")
        ax.legend(loc="upper left", ncols=len(colors), bbox_to_anchor=(0, 1.18))
        ax.margins(x=0)
        ax.xaxis_date()
        return _svg(fig, key)


def state_timeline(report: Report) -> str:
    """Fleet GPU-hours per step, stacked by state."""
    return _stacked_timeline(report, report.timeline.state_hours, STATE_COLORS, "GPU-hours", "state-timeline")


def cause_timeline(report: Report) -> str:
    """Waiting GPU-hours per step, stacked by cause."""
    return _stacked_timeline(report, report.timeline.cause_hours, CAUSE_COLORS, "waiting GPU-hours",
                             "cause-timeline")


def _step_word(step: float) -> str:
    return {3600.0: "hour", 86400.0: "day", 300.0: "5 min"}.get(step, f"{step:g} s")


def totals(report: Report) -> str:
    """Where the GPU-hours went: working, each waiting cause, idle."""
    b = report.fleet.breakdown
    labels = ["working", *WAITING_CAUSES, "idle"]
    values = [b.state_hours["working"], *[b.cause_hours[c] for c in WAITING_CAUSES], b.state_hours["idle"]]
    colors = [STATE_COLORS["working"], *[CAUSE_COLORS[c] for c in WAITING_CAUSES], STATE_COLORS["idle"]]
    with _style():
        fig = _figure(10, 2.6)
        ax = fig.add_subplot()
        bars = ax.barh(labels[::-1], values[::-1], color=colors[::-1])
        total = b.gpu_hours or 1.0
        # The report's own number format: a small fleet's 0.058 h is not "0 h", nor 0.4% "0%".
        ax.bar_label(bars, labels=[f"{hours_text(v)} h ({pct(v / total)})" if v > 0 else "—" for v in values[::-1]],
                     padding=3)
        ax.set_xlabel("GPU-hours")
        ax.margins(x=0.15)
        return _svg(fig, "totals")


def _stacked_rows(names: Sequence[str], rows: Sequence[Breakdown], key: str) -> str:
    with _style():
        fig = _figure(10, 0.9 + 0.32 * max(1, len(rows)))
        ax = fig.add_subplot()
        y = list(range(len(rows)))[::-1]
        left = [0.0] * len(rows)
        parts = [("working", STATE_COLORS["working"], [r.state_hours["working"] for r in rows])]
        parts += [(c, CAUSE_COLORS[c], [r.cause_hours[c] for r in rows]) for c in WAITING_CAUSES]
        parts += [("idle", STATE_COLORS["idle"], [r.state_hours["idle"] for r in rows])]
        for label, color, vals in parts:
            ax.barh(y, vals, left=left, color=color, label=label, height=0.7)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_yticks(y, list(names))
        ax.set_xlabel("GPU-hours")
        ax.legend(loc="upper left", ncols=7, bbox_to_anchor=(0, 1.0 + 0.5 / max(1, len(rows))), fontsize=8)
        return _svg(fig, key)


def groups(report: Report) -> str:
    """The top waiting namespaces / Slurm jobs / hosts, stacked by state and cause."""
    rows = list(report.groups[:report.top])
    return _stacked_rows([r.name for r in rows], [r.breakdown for r in rows], "groups")


def hosts(report: Report) -> str:
    """The top waiting hosts, stacked by state and cause."""
    rows = list(report.hosts[:report.top])
    return _stacked_rows([h.instance for h in rows], [h.breakdown for h in rows], "hosts")


def _shaded_runs(active_hours: Sequence[float], step_s: float) -> list[tuple[int, int, float]]:
    """(first step, steps, share of each step raised, to a tenth) for each run of steps with equal shading."""
    runs: list[tuple[int, int, float]] = []
    for i, h in enumerate(active_hours):
        share = round(min(1.0, h * 3600 / step_s), 1)
        if share <= 0:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i and runs[-1][2] == share:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, share)
        else:
            runs.append((i, 1, share))
    return runs


def findings(report: Report) -> str:
    """When each host had each finding raised: one row per (host, check), shaded by the share of each step."""
    rows: Sequence[HostFinding] = report.findings[:max(report.top, 12)]
    times = _times(report.timeline.ends)
    with _style():
        fig = _figure(10, 0.9 + 0.3 * max(1, len(rows)))
        ax = fig.add_subplot()
        step = report.timeline.step_seconds / 86400
        for y, f in enumerate(reversed(rows)):
            for first, n, share in _shaded_runs(f.active_hours, report.timeline.step_seconds):
                ax.broken_barh([(times[first] - step, n * step)], (y - 0.35, 0.7), facecolors=FINDING_COLOR,
                               alpha=0.25 + 0.75 * share, linewidth=0)
        ax.set_yticks(range(len(rows)), [f"{f.instance} {f.check}" for f in reversed(rows)])
        if times:
            ax.set_xlim(times[0] - step, times[-1])
        ax.xaxis_date()
        return _svg(fig, "findings")


def models(report: Report) -> str:
    """Per GPU model, each host's share of GPU-hours working / waiting / idle (same model, side by side)."""
    labels: list[str] = []
    rows: list[Breakdown] = []
    for m in report.models:
        for h in m.per_host:
            labels.append(f"{m.name} | {h.instance}")
            rows.append(h.breakdown)
    with _style():
        fig = _figure(10, 0.9 + 0.3 * max(1, len(rows)))
        ax = fig.add_subplot()
        y = list(range(len(rows)))[::-1]
        left = [0.0] * len(rows)
        for s in STATES:
            vals = [getattr(r, f"{s}_share") * 100 for r in rows]
            ax.barh(y, vals, left=left, color=STATE_COLORS[s], label=s, height=0.7)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_yticks(y, labels)
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of the host's GPU-hours")
        ax.legend(loc="upper left", ncols=3, bbox_to_anchor=(0, 1.0 + 0.5 / max(1, len(rows))))
        return _svg(fig, "models")


def _bucket_labels(bounds: Sequence[float]) -> list[str]:
    return [f"≤{b:g}s" for b in bounds] + [f">{bounds[-1]:g}s" if bounds else "all"]


def gaps(report: Report) -> str:
    """Idle-gap histograms of the GPUs that waited most: how long the GPU sat idle between bursts."""
    rows: Sequence[GapRow] = report.idle_gaps
    cols = 3
    nrows = max(1, -(-len(rows) // cols))
    with _style():
        fig = _figure(10, 2.1 * nrows)
        axes = fig.subplots(nrows, cols, squeeze=False)
        for i, ax in enumerate(axes.flat):
            if i >= len(rows):
                ax.set_axis_off()
                continue
            r = rows[i]
            labels = _bucket_labels(r.bounds)
            ax.bar(range(len(r.counts)), r.counts, color=GAP_COLOR)
            ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
            ax.set_title(f"{r.instance} GPU {r.gpu}: waited {r.waiting_share:.0%}", fontsize=8)
            ax.set_yscale("symlog", linthresh=10)
        return _svg(fig, "gaps")


PLOTS = {
    "totals": totals,
    "state-timeline": state_timeline,
    "cause-timeline": cause_timeline,
    "groups": groups,
    "hosts": hosts,
    "findings": findings,
    "models": models,
    "gaps": gaps,
}


def render_all(report: Report) -> dict[str, str]:
    """Every plot of the page as SVG text, keyed as in PLOTS (a section with no data gets no plot)."""
    out = {}
    for key, fn in PLOTS.items():
        if key == "groups" and (report.by == "host" or not report.groups):
            continue
        if key == "findings" and not report.findings:
            continue
        if key == "gaps" and not report.idle_gaps:
            continue
        if key == "models" and not report.models:
            continue
        out[key] = fn(report)
    return out
