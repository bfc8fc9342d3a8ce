#!/usr/bin/env python3
"""Generate gpufeed's Grafana dashboards (plain Python, no SDK) into deploy/grafana/dashboards/.

    python3 deploy/grafana/generate.py           # rewrite the committed JSON
    python3 deploy/grafana/generate.py --check   # exit 1 when the committed JSON drifts (CI)

Two dashboards: a fleet overview (GPU-time by state and cause, worst hosts, active findings) and a host
drill-down that answers "why is GPU N waiting?". Every query uses the metric names of docs/metrics.md or
the recording rules of alerts/gpufeed-recording.yml; template variables are ``datasource``, ``host``
(the ``instance`` label) and ``gpu``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from exporter.names import VERDICTS  # noqa: E402 -- the repo root is put on sys.path above
from exporter.regen import write_or_check  # noqa: E402
from exporter.thresholds import DEFAULTS as LIMITS  # noqa: E402 -- the thresholds the alert rules use
from exporter.vocabulary import STATE_COLOURS, VERDICT_LIST  # noqa: E402

OUT = HERE / "dashboards"
# The repository's other copies, written with the default --out: Helm reads files inside the chart only, and
# jsonnet-bundler vendors only the mixin's directory.
COPIES = (HERE.parent / "helm" / "gpufeed" / "files" / "dashboards", HERE.parent.parent / "mixin" / "dashboards")
DS = {"type": "prometheus", "uid": "${datasource}"}
# The cluster variable's "All" is ".*", which also matches series with no cluster label (one Prometheus, one
# cluster); the rules keep cluster (exporter/thresholds.yaml aggregation_labels), so every recorded series has it
# wherever the raw ones do.
C = 'cluster=~"$cluster"'
H = f'{C}, instance=~"$host"'
HG = f'{H}, gpu=~"$gpu"'
RI = "$__rate_interval"

Panel = dict[str, Any]
Steps = list[tuple[float | None, str]]

# Units. A per-GPU rate of GPU-seconds stacked over GPUs is not a 0-1 share but "GPUs' worth" (8 GPUs waiting
# half the time stack to 4), so it gets its own unit instead of a percentunit axis that would pass 100%.
GPUS = "suffix: GPUs"
CORES = "suffix: cores"

# Thresholds. Every panel sets its own, so Grafana's default (green, red at 80) never paints a count of hosts
# or a 0-1 share red. NEUTRAL: the value is neither good nor bad by itself (sizes, counts, shapes); the others
# are the judgement gpufeed's own alerts and findings make (exporter/thresholds.yaml), so a board turns
# orange where an alert would start counting.
NEUTRAL: Steps = [(None, "text")]
ANY_IS_BAD: Steps = [(None, "green"), (1, "red")]  # Xid errors, OOM kills, lost GPUs: one is one too many
WAITING_SHARE: Steps = [(None, "green"), (LIMITS["gpu_starved"]["min_waiting_ratio"], "orange")]
GPU_MEMORY_FULL: Steps = [(None, "green"), (LIMITS["gpu_memory_full"]["min_gpu_memory_used_ratio"], "orange")]
MEMORY_STALL: Steps = [(None, "green"), (LIMITS["memory_pressure"]["max_memory_stall_ratio"], "orange")]
SAMPLE_AGE: Steps = [(None, "green"), (LIMITS["samples_stale"]["max_age_seconds"], "red")]
OVERRUNS: Steps = [(None, "green"), (LIMITS["sampler_overruns"]["max_overruns_per_second"], "orange")]
COLLECTOR_OK: Steps = [(None, "red"), (1, "green")]  # gpufeed_collector_success: 0 failing, 1 fine
# The io_bound rule counts a disk as busy at >= 50% of the time (docs/derived.md, exporter/derived/verdict.py).
DISK_BUSY: Steps = [(None, "green"), (0.5, "orange")]


def thresholds(steps: Steps) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}

# Colours of the states and verdicts, the same on every panel and in gpufeed report (exporter/vocabulary.py).
COLORS = {**STATE_COLOURS, **{v.name: v.colour for v in VERDICT_LIST}}


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, fmt: str = "time_series"
           ) -> dict[str, Any]:
    return {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto",
            "instant": instant, "range": not instant, "format": fmt}


def overrides_by_name(names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"matcher": {"id": "byName", "options": n},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": COLORS[n]}}]}
            for n in names if n in COLORS]


def panel(kind: str, title: str, desc: str, targets: list[dict[str, Any]], *, unit: str = "short",
          stack: bool = False, color_names: tuple[str, ...] = (), options: dict[str, Any] | None = None,
          custom: dict[str, Any] | None = None, mappings: list[dict[str, Any]] | None = None,
          minmax: tuple[float | None, float | None] = (None, None), steps: Steps = NEUTRAL,
          field_overrides: list[dict[str, Any]] | None = None) -> Panel:
    defaults: dict[str, Any] = {"unit": unit, "custom": dict(custom or {}), "thresholds": thresholds(steps)}
    if minmax[0] is not None:
        defaults["min"] = minmax[0]
    if minmax[1] is not None:
        defaults["max"] = minmax[1]
    if kind == "timeseries":
        defaults["custom"].update({"drawStyle": "line", "lineWidth": 1, "fillOpacity": 60 if stack else 10,
                                   "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                                   "showPoints": "never"})
        if steps is not NEUTRAL:  # draw the judgement where the lines cross it
            defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
    if mappings:
        defaults["mappings"] = mappings
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return {"type": kind, "title": title, "description": desc, "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": defaults,
                            "overrides": overrides_by_name(color_names) + list(field_overrides or [])},
            "options": options or {}}


def layout(rows: list[tuple[str, list[tuple[Panel, int, int]]]]) -> list[Panel]:
    """Place panels left to right in rows of 24 columns; each entry is (panel, width, height)."""
    out: list[Panel] = []
    y, pid = 0, 1
    for title, panels in rows:
        out.append({"type": "row", "title": title, "id": pid, "collapsed": False, "panels": [],
                    "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
        pid += 1
        y += 1
        x, row_h = 0, 0
        for p, w, h in panels:
            if x + w > 24:
                x, y, row_h = 0, y + row_h, 0
            p["id"] = pid
            p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
            pid += 1
            x += w
            row_h = max(row_h, h)
            out.append(p)
        y += row_h
    return out


def variables(*, with_gpu: bool) -> list[dict[str, Any]]:
    ds = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
          "hide": 0, "refresh": 1, "regex": "", "options": []}
    # Hidden where no series has a cluster label: Grafana then keeps "All" (.*), which matches them all.
    cluster_q = "label_values(gpufeed_build_info, cluster)"
    cluster = {"name": "cluster", "label": "Cluster", "type": "query", "datasource": DS,
               "query": {"query": cluster_q, "refId": "cluster"}, "refresh": 2, "sort": 1,
               "multi": not with_gpu, "includeAll": True, "allValue": ".*", "hide": 0,
               "options": [], "regex": ""}
    host_q = f"label_values(gpufeed_build_info{{{C}}}, instance)"
    host = {"name": "host", "label": "Host", "type": "query", "datasource": DS,
            "query": {"query": host_q, "refId": "host"}, "refresh": 2, "sort": 1,
            "multi": not with_gpu, "includeAll": not with_gpu, "allValue": ".+", "hide": 0,
            "options": [], "regex": ""}
    out = [ds, cluster, host]
    if with_gpu:
        gpu_q = f"label_values(gpufeed_gpu_state_seconds_total{{{H}}}, gpu)"
        out.append({"name": "gpu", "label": "GPU", "type": "query", "datasource": DS,
                    "query": {"query": gpu_q, "refId": "gpu"}, "refresh": 2, "sort": 3,
                    "multi": True, "includeAll": True, "allValue": ".*", "hide": 0,
                    "options": [], "regex": ""})
    return out


def board_link(title: str, uid: str) -> dict[str, Any]:
    """A link to the other board carrying the time range, the data source and the cluster and host selections
    (``${var:queryparam}`` renders ``var-host=a&var-host=b``; Grafana's own includeVars would also carry $gpu,
    which the fleet board does not have)."""
    return {"title": title, "type": "link", "icon": "dashboard", "tooltip": f"Open {title} for the same hosts",
            "url": f"/d/{uid}/{uid}?${{__url_time_range}}&${{datasource:queryparam}}&${{cluster:queryparam}}"
                   "&${host:queryparam}",
            "asDropdown": False, "includeVars": False, "keepTime": False, "tags": [], "targetBlank": False}


def host_data_link(p: Panel) -> Panel:
    """Each row of a fleet table opens the host drill-down for that row's instance, same time, data source and
    cluster selection (host names repeat across clusters)."""
    p["fieldConfig"]["defaults"]["links"] = [{
        "title": "Host drill-down for ${__data.fields.instance}",
        "url": "/d/gpufeed-host/gpufeed-host?${__url_time_range}&${datasource:queryparam}&${cluster:queryparam}"
               "&var-host=${__data.fields.instance}"}]
    return p


def column(name: str, unit: str, steps: Steps = NEUTRAL) -> dict[str, Any]:
    """A table column (a merged query's ``Value #B``) with its own unit and thresholds."""
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": "unit", "value": unit}, {"id": "thresholds", "value": thresholds(steps)}]}


def info_table(title: str, desc: str, expr: str) -> Panel:
    """A table of an info metric's labels now (one row per series; its value 1, Time and job hidden)."""
    p = panel("table", title, desc, [target(expr, instant=True, fmt="table")], options={"showHeader": True})
    p["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}}}]
    return p


def query_unit(ref: str, unit: str) -> dict[str, Any]:
    """The unit of one query's series in a panel that mixes kinds (a 0-1 share next to a coefficient)."""
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": [{"id": "unit", "value": unit}]}


def dashboard(uid: str, title: str, desc: str, panels: list[Panel], *, templating: list[dict[str, Any]],
              links: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["gpufeed", "gpu"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "timezone": "",
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": templating},
        "annotations": {"list": [{
            "name": "gpufeed alerts", "datasource": DS, "enable": True, "iconColor": "red",
            "expr": f'ALERTS{{alertname=~"Gpufeed.*", alertstate="firing", {H}}}',
            "titleFormat": "{{ alertname }}", "textFormat": "{{ instance }} GPU {{ gpu }} {{ cause }}",
            "step": "60s",
        }]},
        "links": links, "panels": panels,
    }


# ------------------------------------------------------------------------------------------------ fleet


def fleet() -> dict[str, Any]:
    states = ("working", "waiting", "idle")
    causes = ("launch_bound", "input_bound", "io_bound", "transfer_bound", "latency_bound")
    table_opts = {"showHeader": True, "cellHeight": "sm"}
    hide_time = [{"id": "organize", "options": {"excludeByName": {"Time": True, "job": True}}}]
    worst_24h = panel(
        "table", "Worst hosts: waiting GPU-hours, last 24h",
        "Hosts ranked by GPU-hours their GPUs spent waiting (all causes) over the last day, and their share of "
        "the fleet's waiting. Recording rules instance:gpufeed_gpu_waiting_hours:increase1d and "
        ":fleet_ratio1d.",
        [target(f"sort_desc(topk(15, instance:gpufeed_gpu_waiting_hours:increase1d{{{H}}}))", instant=True,
                fmt="table"),
         target(f"instance:gpufeed_gpu_waiting_hours:fleet_ratio1d{{{H}}}", instant=True, fmt="table")],
        unit="h", options=table_opts, field_overrides=[column("Value #B", "percentunit")])
    worst_24h["transformations"] = [{"id": "merge", "options": {}}, *hide_time]
    worst_now = panel(
        "table", "Worst hosts now: share of GPU-time waiting",
        "Hosts ranked by the share of their GPU-time spent waiting over the last 5 minutes.",
        [target(f'sort_desc(topk(15, instance_state:gpufeed_gpu_time:ratio_rate5m{{state="waiting", {H}}}))',
                instant=True, fmt="table")],
        unit="percentunit", options=table_opts, minmax=(0, 1), steps=WAITING_SHARE)
    worst_now["transformations"] = hide_time
    for t in (worst_24h, worst_now):
        host_data_link(t)
    findings = panel(
        "table", "Active findings", "Platform findings raised now (gpufeed_finding), one row per host, check "
        "and GPU; gpu empty means host-wide. Each has an alert and a runbook section.",
        [target(f"gpufeed_finding{{{H}}} == 1", instant=True, fmt="table")], options=table_opts)
    findings["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}}}]
    alerts = panel(
        "table", "Firing gpufeed alerts", "Alerts from alerts/gpufeed-alerts.yml firing now.",
        [target(f'ALERTS{{alertname=~"Gpufeed.*", alertstate="firing", {H}}}', instant=True, fmt="table")],
        options=table_opts)
    alerts["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "alertstate": True,
                          "job": True, "runbook_url": True}}}]
    health = panel(
        "table", "Exporter health", "Per collector: the worst success over the fleet (0 means at least one "
        "host's collector is failing) and how many hosts run it.",
        [target(f"min by (collector) (gpufeed_collector_success{{{H}}})", instant=True, fmt="table"),
         target(f"count by (collector) (gpufeed_collector_success{{{H}}})", instant=True, fmt="table")],
        options=table_opts, steps=COLLECTOR_OK, field_overrides=[column("Value #B", "short")])
    health["transformations"] = [{"id": "merge", "options": {}}, *hide_time]
    rows: list[tuple[str, list[tuple[Panel, int, int]]]] = [
        ("Fleet now", [
            (panel("stat", "Hosts reporting", "gpufeed exporters Prometheus scrapes.",
                   [target(f"count(gpufeed_build_info{{{H}}})", instant=True)]), 4, 4),
            (panel("stat", "GPUs", "GPUs with a working/waiting/idle account.",
                   [target(f"count(count by (instance, gpu) (gpufeed_gpu_state_seconds_total{{{H}}}))",
                           instant=True)]), 4, 4),
            (panel("stat", "Fleet GPU-time by state (5m)", "Share of all GPUs' time working, waiting, idle.",
                   [target(f"sum by (state) (job_state:gpufeed_gpu_time:ratio_rate5m{{{C}}})", "{{state}}",
                           instant=True)], unit="percentunit", color_names=states, minmax=(0, 1),
                   options={"colorMode": "background", "textMode": "value_and_name"}), 8, 4),
            (panel("stat", "GPU-hours lost waiting, last 24h", "Sum over all causes and hosts.",
                   [target(f"sum(job_cause:gpufeed_gpu_waiting_hours:increase1d{{{C}}})", instant=True)], unit="h"),
             8, 4),
        ]),
        ("GPU-time", [
            (panel("timeseries", "Fleet GPU-time by state", "job_state:gpufeed_gpu_time:ratio_rate5m.",
                   [target(f"sum by (state) (job_state:gpufeed_gpu_time:ratio_rate5m{{{C}}})", "{{state}}")],
                   unit="percentunit", stack=True, color_names=states, minmax=(0, 1)), 12, 8),
            (panel("timeseries", "Fleet GPU-time waiting, by cause",
                   "Share of all GPU-time spent waiting on each cause "
                   "(job_cause:gpufeed_gpu_waiting_time:ratio_rate5m).",
                   [target(f"sum by (cause) (job_cause:gpufeed_gpu_waiting_time:ratio_rate5m{{{C}}})", "{{cause}}")],
                   unit="percentunit", stack=True, color_names=causes, minmax=(0, 1)), 12, 8),
            (panel("bargauge", "GPU-hours lost per cause, last 24h",
                   "job_cause:gpufeed_gpu_waiting_hours:increase1d: where the fleet's GPU time goes to waste.",
                   [target(f"sum by (cause) (job_cause:gpufeed_gpu_waiting_hours:increase1d{{{C}}})", "{{cause}}",
                           instant=True)], unit="h", color_names=causes,
                   options={"orientation": "horizontal", "displayMode": "gradient"}), 12, 8),
            (panel("piechart", "Current verdicts", "Number of GPUs per current verdict (gpufeed_gpu_bottleneck).",
                   [target(f"count by (cause) (gpufeed_gpu_bottleneck{{{H}}} == 1)", "{{cause}}", instant=True)],
                   color_names=tuple(VERDICTS), options={"pieType": "donut", "legend": {"displayMode": "table",
                                                                                      "placement": "right"}}),
             12, 8),
        ]),
        ("Hosts", [
            (worst_24h, 12, 9),
            (worst_now, 12, 9),
            (panel("timeseries", "Waiting share per host", "instance_state:gpufeed_gpu_time:ratio_rate5m.",
                   [target(f'instance_state:gpufeed_gpu_time:ratio_rate5m{{state="waiting", {H}}}',
                           "{{instance}}")], unit="percentunit", minmax=(0, 1), steps=WAITING_SHARE), 24, 8),
        ]),
        ("By team / job", team_row(causes, states, table_opts)),
        ("Jobs", jobs_row(table_opts)),
        ("Findings and alerts", [
            (findings, 12, 8),
            (alerts, 12, 8),
            (health, 24, 7),
        ]),
    ]
    links = [board_link("Host drill-down", "gpufeed-host")]
    return dashboard("gpufeed-fleet", "gpufeed / Fleet overview",
                     "Is the fleet's GPU time spent working, or waiting -- and on what?",
                     layout(rows), templating=variables(with_gpu=False), links=links)


def team_row(causes: tuple[str, ...], states: tuple[str, ...],
             table_opts: dict[str, Any]) -> list[tuple[Panel, int, int]]:
    """GPU time per Kubernetes namespace and per Slurm job (DESIGN.md "Workloads"): the per-owner recording rules,
    joined through gpufeed_workload_info; and who owns each GPU now."""
    owners = panel(
        "table", "Who owns each GPU now", "gpufeed_workload_info: the pod (namespace/pod/container, from the "
        "kubelet), the Slurm job or the systemd unit of each GPU's workload, and the container id.",
        [target(f"gpufeed_workload_info{{{H}}}", instant=True, fmt="table")], options=table_opts)
    owners["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}}}]
    host_data_link(owners)
    return [
        (panel("bargauge", "GPU-hours lost per namespace, last 24h",
               "namespace_cause:gpufeed_gpu_waiting_hours:increase1d, stacked by cause: which team's GPUs wait, "
               "and on what. Each namespace's own time: the rule takes the mean of its rate over every minute "
               "of the day, not only the minutes it held a GPU (docs/deployment.md).",
               [target("sort_desc(sum by (namespace, cause) "
                       f"(namespace_cause:gpufeed_gpu_waiting_hours:increase1d{{{C}}}))",
                       "{{namespace}} {{cause}}", instant=True)], unit="h", color_names=causes,
               options={"orientation": "horizontal", "displayMode": "gradient"}), 12, 9),
        (panel("timeseries", "GPU-seconds waiting per namespace, by cause",
               "namespace_cause:gpufeed_gpu_waiting_seconds:rate5m: GPUs' worth of waiting per namespace.",
               [target(f"sum by (namespace, cause) (namespace_cause:gpufeed_gpu_waiting_seconds:rate5m{{{C}}})",
                       "{{namespace}} {{cause}}")], unit=GPUS, stack=True), 12, 9),
        (panel("bargauge", "GPU-hours per Slurm job by state, last 24h",
               "slurm_job_state:gpufeed_gpu_hours:increase1d: working, waiting and idle GPU-hours of each job in "
               "the last 24 h, a job that ended included, each counted for the minutes it held its GPUs.",
               [target("sort_desc(sum by (slurm_job_id, state) "
                       f"(slurm_job_state:gpufeed_gpu_hours:increase1d{{{C}}}))",
                       "job {{slurm_job_id}} {{state}}", instant=True)], unit="h", color_names=states,
               options={"orientation": "horizontal", "displayMode": "gradient"}), 12, 9),
        (owners, 12, 9),
        (panel("timeseries", "GPUs per namespace, by state",
               "namespace_state:gpufeed_gpu_state_seconds:rate5m: how many GPUs' worth of each namespace's GPU time "
               "is working, waiting and idle -- what a team holds and what it does with it.",
               [target(f"sum by (namespace, state) (namespace_state:gpufeed_gpu_state_seconds:rate5m{{{C}}})",
                       "{{namespace}} {{state}}")], unit=GPUS, stack=True), 24, 8),
    ]


def jobs_row(table_opts: dict[str, Any]) -> list[tuple[Panel, int, int]]:
    """Distributed jobs (docs/runbooks.md "GpufeedJobStraggler"): each job's slowest rank, its host and its cause,
    and the GPU-hours the other ranks lost waiting for it in collectives (the gpufeed-jobs recording rules)."""
    slowest = panel(
        "table", "Slowest rank of each job now",
        "Per distributed job (gpufeed_workload_info job_id): the rank waiting most on a cause of its own host "
        "(job_rank:gpufeed_gpu_own_waiting:ratio_rate5m, any waiting cause but latency_bound), its host, GPU and "
        "main cause, and the job's median rank. A slowest rank far above the median is a straggler: every other "
        "rank waits for it (collective_wait).",
        [target("sort_desc(topk by (namespace, job_id) (1, "
                f"job_rank:gpufeed_gpu_own_waiting:ratio_rate5m{{{C}}})\n"
                "* on (job, instance, gpu) group_left (cause)\n"
                "(topk by (job, instance, gpu) (1, instance_gpu_cause:gpufeed_gpu_waiting_time:ratio_rate5m"
                f'{{cause!="latency_bound", {C}}}) ^ 0))', instant=True, fmt="table"),
         target(f"job:gpufeed_gpu_own_waiting:median_rate5m{{{C}}}", instant=True, fmt="table")],
        unit="percentunit", options=table_opts, steps=WAITING_SHARE, minmax=(0, 1),
        field_overrides=[column("Value #B", "percentunit")])
    slowest["transformations"] = [{"id": "merge", "options": {}}, {"id": "organize", "options": {
        "excludeByName": {"Time": True, "job": True, "__name__": True},
        "renameByName": {"Value #A": "rank waiting", "Value #B": "job median"}}}]
    host_data_link(slowest)
    lost = panel(
        "bargauge", "GPU-hours lost waiting for a slower rank",
        "Per job, over the dashboard's range: its GPUs in collective_wait (job:gpufeed_gpus_collective_wait:count, "
        "recorded every minute) x the minutes they waited -- what its straggler cost the job.",
        [target("sort_desc(sum by (namespace, job_id) (sum_over_time("
                f"job:gpufeed_gpus_collective_wait:count{{{C}}}[$__range])) / 60)",
                "{{namespace}} {{job_id}}", instant=True)],
        unit="h", options={"orientation": "horizontal", "displayMode": "gradient"})
    waiting = panel(
        "timeseries", "GPUs waiting for a slower rank, per job",
        "job:gpufeed_gpus_collective_wait:count: how many of each job's GPUs spin in collectives (collective_wait).",
        [target(f"sum by (namespace, job_id) (job:gpufeed_gpus_collective_wait:count{{{C}}})",
                "{{namespace}} {{job_id}}")], unit=GPUS, color_names=("collective_wait",))
    return [(slowest, 24, 8), (lost, 12, 8), (waiting, 12, 8)]


# ------------------------------------------------------------------------------------------------- host


def verdict_code_expr(*, mig: bool = False) -> str:
    """One series per GPU (``mig``: per MIG instance) whose value is the index (1-based) of its current verdict
    in VERDICTS. A GPU in MIG mode has no whole-GPU verdict: its instances are judged (mig label)."""
    sel = 'mig!="", ' if mig else 'mig="", '  # an absent label is the empty one
    parts = [f'(gpufeed_gpu_bottleneck{{cause="{c}", {sel}{HG}}} == 1) * {i}' for i, c in enumerate(VERDICTS, 1)]
    return f"max by (gpu{', mig' if mig else ''}) (\n  " + "\n  or ".join(parts) + "\n)"


def gpu_health_row(verdict_map: list[dict[str, Any]]) -> tuple[str, list[tuple[Panel, int, int]]]:
    """Xid errors, ECC and row remapping, and the MIG instances of GPUs in MIG mode."""
    flags = [{"type": "value", "options": {"0": {"text": "ok", "color": "green", "index": 0},
                                          "1": {"text": "yes", "color": "red", "index": 1}}}]
    return ("GPU errors and MIG instances", [
        (panel("timeseries", "Xid errors",
               "Xid errors NVML reported per GPU and code (gpufeed_gpu_xid_errors_total): 48/63/64/94/95 memory, "
               "74 NVLink, 79 fell off the bus, 92 single-bit ECC rate, 119/120 GSP. See the runbook.",
               [target(f"sum by (gpu, xid) (increase(gpufeed_gpu_xid_errors_total{{{HG}}}[{RI}]))",
                       "GPU {{gpu}} Xid {{xid}}")], custom={"drawStyle": "bars"}, steps=ANY_IS_BAD), 12, 7),
        (panel("timeseries", "ECC errors",
               "ECC errors since the driver loaded (volatile): uncorrected ones need a GPU reset, a rising "
               "corrected rate comes before them.",
               [target(f'increase(gpufeed_gpu_ecc_errors_total{{counter="volatile", {HG}}}[{RI}])',
                       "GPU {{gpu}} {{error}}")]), 12, 7),
        (panel("state-timeline", "Row remapping pending / failed",
               "A pending remap takes effect at the next GPU reset; a failed one means the memory cannot be repaired.",
               # The flags are 1 or absent: 0 ("ok") for the GPUs whose remapping counters answer at all.
               [target(f"max by (instance, gpu) (gpufeed_gpu_row_remap_pending{{{HG}}}) or "
                       f"max by (instance, gpu) (0 * gpufeed_gpu_remapped_rows{{{HG}}})", "GPU {{gpu}} remap pending"),
                target(f"max by (instance, gpu) (gpufeed_gpu_row_remap_failure{{{HG}}}) or "
                       f"max by (instance, gpu) (0 * gpufeed_gpu_remapped_rows{{{HG}}})", "GPU {{gpu}} remap failed")],
               mappings=flags),
         12, 6),
        (panel("state-timeline", "MIG instance verdicts",
               "GPUs in MIG mode are judged per MIG instance (gpu, mig): each instance's verdict over time.",
               [target(verdict_code_expr(mig=True), "GPU {{gpu}} MIG {{mig}}")], mappings=verdict_map,
               options={"showValue": "auto", "mergeValues": True, "rowHeight": 0.8}), 12, 6),
        (panel("timeseries", "MIG instance time waiting, by cause",
               "GPU-seconds per second each MIG instance spent waiting, per cause (its own processes' evidence).",
               [target(f'sum by (gpu, mig, cause) (rate(gpufeed_gpu_waiting_seconds_total{{mig!="", {HG}}}[{RI}]))',
                       "GPU {{gpu}} MIG {{mig}} {{cause}}")], unit=GPUS, stack=True, minmax=(0, None)),
         24, 7),
    ])



def gpu_state_row() -> tuple[str, list[tuple[Panel, int, int]]]:
    """The evidence gpu_throttled and gpu_clock_throttled rest on: temperature, power against its limit, memory,
    clock-event (throttle) reasons and SM clocks -- from NVML's slow sampler (5 s)."""
    flag = [{"type": "value", "options": {"0": {"text": "-", "color": "transparent", "index": 0},
                                          "1": {"text": "active", "color": "orange", "index": 1}}}]
    lost = [{"type": "value", "options": {"0": {"text": "ok", "color": "green", "index": 0},
                                          "1": {"text": "lost", "color": "red", "index": 1}}}]
    return ("GPU health", [
        (panel("timeseries", "GPU temperature",
               "Core temperature per GPU. Where the GPU slows down is model-specific; the clock-event reasons panel "
               "shows when it does (sw_thermal_slowdown, hw_thermal_slowdown).",
               [target(f"gpufeed_gpu_temperature_celsius{{{HG}}}", "GPU {{gpu}}")], unit="celsius"), 8, 7),
        (panel("timeseries", "Power draw vs limit",
               "Board power against the enforced limit: a GPU held at its limit with sw_power_cap active is "
               "power-throttled (gpu_throttled).",
               [target(f"gpufeed_gpu_power_watts{{{HG}}}", "GPU {{gpu}} draw"),
                target(f"gpufeed_gpu_power_limit_watts{{{HG}}}", "GPU {{gpu}} limit")], unit="watt",
               minmax=(0, None)), 8, 7),
        (panel("timeseries", "GPU memory used share",
               "Device memory used / total per GPU (and MIG instance); gpu_memory_full is raised at the orange "
               "line while the GPU is partly idle.",
               [target(f"gpufeed_gpu_memory_used_bytes{{{HG}}} / gpufeed_gpu_memory_total_bytes{{{HG}}}",
                       "GPU {{gpu}} {{mig}}")], unit="percentunit", minmax=(0, 1), steps=GPU_MEMORY_FULL), 8, 7),
        (panel("timeseries", "GPU memory used / total", "Device memory in use and its size, per GPU and MIG instance.",
               [target(f"gpufeed_gpu_memory_used_bytes{{{HG}}}", "GPU {{gpu}} {{mig}} used"),
                target(f"gpufeed_gpu_memory_total_bytes{{{HG}}}", "GPU {{gpu}} {{mig}} total")], unit="bytes",
               minmax=(0, None)), 12, 7),
        (panel("timeseries", "SM clock vs max",
               "Current SM clock against the GPU's maximum: gpu_throttled needs it below 85% with power or thermal "
               "reasons active (an idle GPU downclocks by design).",
               [target(f"gpufeed_gpu_sm_clock_hertz{{{HG}}}", "GPU {{gpu}} SM clock"),
                target(f"gpufeed_gpu_sm_clock_max_hertz{{{HG}}}", "GPU {{gpu}} max")], unit="hertz",
               minmax=(0, None)), 12, 7),
        (panel("state-timeline", "Clock-event (throttle) reasons",
               "NVML's clock-event reasons per GPU over time (gpufeed_gpu_clock_event_reason): gpu_idle is normal on "
               "an idle GPU; sw_power_cap, hw_slowdown and the thermal ones cost clock while work runs.",
               [target(f"gpufeed_gpu_clock_event_reason{{{HG}}}", "GPU {{gpu}} {{reason}}")], mappings=flag,
               options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8}), 12, 8),
        (panel("timeseries", "Time throttled, by reason",
               "Share of each second the driver held the GPU's clocks down, per reason "
               "(gpufeed_gpu_throttle_seconds_total; reasons overlap, so they are not stacked). A reason's "
               "counter appears with its first throttled time; a GPU with none shows 0.",
               [target(f"sum by (gpu, reason) (rate(gpufeed_gpu_throttle_seconds_total{{{HG}}}[{RI}])) or "
                       f"max by (gpu) (0 * gpufeed_gpu_info{{{HG}}})",
                       "GPU {{gpu}} {{reason}}")], unit="percentunit", minmax=(0, 1)), 12, 8),
        (panel("timeseries", "GPM DRAM and tensor activity",
               "GPM's DRAM-bandwidth and tensor-pipe utilisation per GPU (Hopper and newer): near zero on a busy GPU "
               "whose SMs are nearly idle is a collective waiting for a slower rank (collective_wait) when the "
               "process is one rank of a job.",
               [target(f"gpufeed_gpu_dram_active_ratio{{{HG}}}", "GPU {{gpu}} DRAM"),
                target(f"gpufeed_gpu_tensor_active_ratio{{{HG}}}", "GPU {{gpu}} tensor")], unit="percentunit",
               minmax=(0, 1)), 24, 7),
        (panel("state-timeline", "GPU lost", "1 while NVML answers GPU_IS_LOST (fell off the bus): GpufeedGPULost. "
               "The flag is absent while the GPU answers; shown as 0.",
               [target(f"max by (gpu) (gpufeed_gpu_lost{{{HG}}}) or max by (gpu) (0 * gpufeed_gpu_info{{{HG}}})",
                       "GPU {{gpu}}")], mappings=lost, steps=ANY_IS_BAD,
               options={"showValue": "auto", "mergeValues": True, "rowHeight": 0.8}), 24, 4),
    ])


def workload_row() -> tuple[str, list[tuple[Panel, int, int]]]:
    """Who each GPU works for (DESIGN.md "Workloads"): the pod or Slurm job or unit, the CPU it may use, and the GPU
    time it waits, by owner."""
    owners = info_table(
        "Who owns each GPU", "gpufeed_workload_info: namespace/pod/container (the kubelet's pod-resources "
        "assignment), Slurm job and systemd unit (the cgroup path) and the container id of each GPU's workload.",
        f"gpufeed_workload_info{{{HG}}}")
    procs = panel(
        "table", "GPU processes: device memory and SM share",
        "Each compute process NVML lists on the GPU: its device memory and its share of SM time in the latest "
        "driver sample.",
        [target(f"gpufeed_gpu_process_memory_bytes{{{HG}}}", instant=True, fmt="table"),
         target(f"gpufeed_gpu_process_sm_ratio{{{HG}}}", instant=True, fmt="table")],
        unit="bytes", options={"showHeader": True}, field_overrides=[column("Value #B", "percentunit")])
    procs["transformations"] = [{"id": "merge", "options": {}}, {"id": "organize", "options": {
        "excludeByName": {"Time": True, "__name__": True, "job": True},
        "renameByName": {"Value #A": "device memory", "Value #B": "SM share"}}}]
    owner = "namespace, pod, container, slurm_job_id, unit"
    return ("Workloads", [
        (owners, 12, 7),
        (procs, 12, 7),
        (panel("timeseries", "GPU time waiting per owner, by cause",
               "GPU-seconds per second each owner's GPUs spent waiting, per cause: the waiting counters joined "
               "with gpufeed_workload_info (a GPU with no known owner is left out).",
               [target(f"sum by ({owner}, cause) (rate(gpufeed_gpu_waiting_seconds_total{{{HG}}}[{RI}])"
                       f" * on (job, instance, gpu) group_left ({owner}) gpufeed_workload_info{{{HG}}})",
                       "{{namespace}}/{{pod}} {{slurm_job_id}} {{unit}} {{cause}}")], unit=GPUS, stack=True,
               minmax=(0, None)), 12, 8),
        (panel("timeseries", "Workload CPU vs capacity",
               "CPU the GPU's workload uses against what it may use (the smaller of its cpuset and CFS quota): "
               "at capacity, input_bound or launch_bound follow; cpu_quota_throttled says the quota did it.",
               [target(f"gpufeed_workload_cpu_cores{{{HG}}}", "GPU {{gpu}} used"),
                target(f"gpufeed_workload_cpu_capacity_cores{{{HG}}}", "GPU {{gpu}} capacity")], unit=CORES,
               minmax=(0, None)), 12, 8),
        (panel("timeseries", "Processes and cgroups inspected",
               "How much of the host gpufeed follows as the GPUs' workloads: processes (GPU processes, descendants, "
               "group members) and container / Slurm job / unit cgroups.",
               [target(f"gpufeed_workload_processes{{{H}}}", "processes"),
                target(f"sum by (kind) (gpufeed_workload_groups{{{H}}})", "{{kind}} cgroups")]), 24, 6),
    ])


def interconnect_row() -> tuple[str, list[tuple[Panel, int, int]]]:
    """NVLink and the network adapters beside the GPUs (docs/topology.md): traffic against the capacity of the
    current links (network_bound), links down and errors (nvlink_degraded, nic_link_degraded)."""
    nv = "NVLink (GPUs with NVLink only)"
    return ("Interconnect: NVLink and network", [
        (panel("timeseries", f"{nv}: traffic vs active links' capacity",
               "Payload each GPU moves over its NVLinks (both directions) against its active links' capacity per "
               "direction: a waiting GPU whose busier direction nears it is network_bound.",
               [target(f"rate(gpufeed_gpu_nvlink_bytes_total{{{HG}}}[{RI}])", "GPU {{gpu}} moved"),
                target(f"gpufeed_gpu_nvlink_capacity_bytes_per_second{{{HG}}}", "GPU {{gpu}} capacity")],
               unit="Bps", minmax=(0, None)), 12, 8),
        (panel("timeseries", f"{nv}: links down and errors",
               "Links up per GPU, of its links (idle GPUs let links sleep: only a busy GPU's down link is "
               "nvlink_degraded), and the links' replay, recovery and CRC errors summed.",
               [target(f"gpufeed_gpu_nvlink_links_up{{{HG}}}", "GPU {{gpu}} up of {{links}} (v{{version}}, "
                       "{{remote}})"),
                target(f"increase(gpufeed_gpu_nvlink_errors_total{{{HG}}}[{RI}])", "GPU {{gpu}} errors")],
               steps=ANY_IS_BAD), 12, 8),
        (info_table("Network adapters beside the GPUs",
                    "gpufeed_nic_info: each InfiniBand/RoCE port and Ethernet interface on a GPU's PCIe switch, its "
                    "kind, model, the GPUs beside it and capable_rate, the rate in bits/s it is known to reach.",
                    f"gpufeed_nic_info{{{H}}}"), 24, 7),
        (panel("timeseries", "Network adapters: current rate and traffic",
               "Each port's negotiated rate now (0 while its link is down) and, with --collector.nic.traffic, the "
               "bits it moves: a rate below the port's capable_rate (the table above) under load is "
               "nic_link_degraded, traffic near the current rate while the GPU waits is network_bound.",
               [target(f"gpufeed_nic_rate_bits_per_second{{{H}}}", "{{adapter}}/{{port}} rate"),
                target(f"8 * rate(gpufeed_nic_receive_bytes_total{{{H}}}[{RI}])", "{{adapter}}/{{port}} received"),
                target(f"8 * rate(gpufeed_nic_transmit_bytes_total{{{H}}}[{RI}])", "{{adapter}}/{{port}} sent")],
               unit="bps", minmax=(0, None)), 12, 8),
        (panel("timeseries", "Network adapters: errors",
               "Each port's symbol, receive and CRC errors, link recoveries and link-down events, summed "
               "(nic_link_degraded's detail names the counter).",
               [target(f"increase(gpufeed_nic_errors_total{{{H}}}[{RI}])", "{{adapter}}/{{port}} errors")],
               steps=ANY_IS_BAD), 12, 8),
    ])


def exporter_row() -> tuple[str, list[tuple[Panel, int, int]]]:
    """gpufeed's own health: what GpufeedCollectorFailing, GpufeedSamplesStale and GpufeedSamplerOverruns page on."""
    ok = [{"type": "value", "options": {"0": {"text": "failing", "color": "red", "index": 0},
                                        "1": {"text": "ok", "color": "green", "index": 1}}}]
    return ("Exporter", [
        (panel("state-timeline", "Collector success",
               "gpufeed_collector_success per collector (GpufeedCollectorFailing).",
               [target(f"gpufeed_collector_success{{{H}}}", "{{collector}}")], mappings=ok, steps=COLLECTOR_OK,
               options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8}), 24, 6),
        (panel("timeseries", "Age of the newest sample, per sampler",
               "time() - gpufeed_sampler_last_success_timestamp_seconds: keeps growing if the exporter stops "
               "publishing (GpufeedSamplesStale at the red line).",
               [target(f"time() - gpufeed_sampler_last_success_timestamp_seconds{{{H}}}", "{{sampler}}")],
               unit="s", minmax=(0, None), steps=SAMPLE_AGE), 12, 7),
        (panel("timeseries", "Sampler overruns", "Samples that started late because the previous one was still "
               "running, per second (GpufeedSamplerOverruns at the orange line).",
               [target(f"rate(gpufeed_sampler_overruns_total{{{H}}}[{RI}])", "{{sampler}}")], unit="ops",
               minmax=(0, None), steps=OVERRUNS), 12, 7),
        (panel("stat", "Web config in force",
               "With --web.config.file: whether the last reload was applied (GpufeedWebConfigReloadFailed when "
               "not), and whether TLS and basic auth are on now. Empty without a web config.",
               [target(f"gpufeed_web_config_last_reload_successful{{{H}}}", "last reload applied", instant=True),
                target(f"gpufeed_web_config_tls_enabled{{{H}}}", "TLS", instant=True),
                target(f"gpufeed_web_config_auth_enabled{{{H}}}", "basic auth", instant=True)],
               mappings=[{"type": "value", "options": {"0": {"text": "no", "color": "red", "index": 0},
                                                       "1": {"text": "yes", "color": "green", "index": 1}}}],
               steps=COLLECTOR_OK), 24, 4),
    ])

def host() -> dict[str, Any]:
    verdict_map = [{"type": "value", "options": {
        str(i): {"text": c, "color": COLORS.get(c, "text"), "index": i - 1} for i, c in enumerate(VERDICTS, 1)}}]
    timeline = panel(
        "state-timeline", "Verdict history", "The classifier's verdict per GPU over time (gpufeed_gpu_bottleneck).",
        [target(verdict_code_expr(), "GPU {{gpu}}")], mappings=verdict_map,
        options={"showValue": "auto", "mergeValues": True, "rowHeight": 0.8})
    gaps = panel(
        "heatmap", "Idle gaps between bursts",
        "Histogram of idle stretches between bursts of GPU activity (gpufeed_gpu_idle_gap_seconds): many short "
        "gaps = launch-bound small kernels; gaps at batch boundaries = input; long irregular gaps = IO.",
        [target(f"sum by (le) (increase(gpufeed_gpu_idle_gap_seconds_bucket{{{HG}}}[{RI}]))", "{{le}}",
                fmt="heatmap")],
        options={"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
                 "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64}})
    placement = panel(
        "table", "NUMA placement of GPU processes",
        "Share of each GPU process's allowed CPUs local to its GPU's NUMA node, and mismatches with their reason.",
        [target(f"gpufeed_process_numa_local_cpu_ratio{{{HG}}}", instant=True, fmt="table"),
         target(f"gpufeed_process_numa_mismatch{{{HG}}}", instant=True, fmt="table")],
        unit="short", options={"showHeader": True}, field_overrides=[query_unit("A", "percentunit")])
    placement["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "__name__": True, "job": True}}}]
    gpus = panel(
        "table", "GPUs and NUMA nodes", "gpufeed_gpu_info: each GPU's PCI bus id and NUMA node.",
        [target(f"gpufeed_gpu_info{{{HG}}}", instant=True, fmt="table")], options={"showHeader": True})
    gpus["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}}}]
    hops = info_table(
        "PCIe devices on the GPUs' paths",
        "gpufeed_pcie_device_info: every hop from root port to GPU (role, driver, NUMA node, port type).",
        f"gpufeed_pcie_device_info{{{H}}}")
    findings = panel(
        "table", "Findings on this host", "gpufeed_finding raised now (gpu empty = host-wide).",
        [target(f"gpufeed_finding{{{H}}} == 1", instant=True, fmt="table")], options={"showHeader": True})
    findings["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}}}]
    rows: list[tuple[str, list[tuple[Panel, int, int]]]] = [
        ("Why is the GPU waiting?", [
            (timeline, 24, 6),
            (panel("timeseries", "GPU time by state", "GPU-seconds per second working, waiting, idle.",
                   [target(f"sum by (gpu, state) (rate(gpufeed_gpu_state_seconds_total{{{HG}}}[{RI}]))",
                           "GPU {{gpu}} {{state}}")], unit=GPUS, stack=True, minmax=(0, None)), 12, 8),
            (panel("timeseries", "GPU time waiting, by cause", "GPU-seconds per second waiting on each cause.",
                   [target(f"sum by (gpu, cause) (rate(gpufeed_gpu_waiting_seconds_total{{{HG}}}[{RI}]))",
                           "GPU {{gpu}} {{cause}}")], unit=GPUS, stack=True, minmax=(0, None)), 12, 8),
            (panel("timeseries", "Power drawn while waiting, by cause",
                   "Watts each GPU spent while it waited, by cause (gpufeed_gpu_waiting_joules_total): the energy "
                   "cost of waiting. Only GPUs with an energy counter.",
                   [target(f"sum by (gpu, cause) (rate(gpufeed_gpu_waiting_joules_total{{{HG}}}[{RI}]))",
                           "GPU {{gpu}} {{cause}}")], unit="watt", stack=True, minmax=(0, None)), 24, 7),
            (panel("stat", "Verdict confidence", "gpufeed_gpu_bottleneck_confidence.",
                   [target(f"gpufeed_gpu_bottleneck_confidence{{{HG}}}", "GPU {{gpu}}", instant=True)],
                   unit="percentunit", minmax=(0, 1)), 6, 5),
            (findings, 18, 5),
        ]),
        ("Activity shape", [
            (gaps, 12, 8),
            (panel("timeseries", "Burstiness and idle share",
                   "Coefficient of variation of GPU activity (0 steady, >1 bursty), idle share of the window, "
                   "and whether idle gaps are periodic (batch boundaries).",
                   [target(f"gpufeed_gpu_burstiness_ratio{{{HG}}}", "GPU {{gpu}} burstiness"),
                    target(f"gpufeed_gpu_idle_ratio{{{HG}}}", "GPU {{gpu}} idle share"),
                    target(f"gpufeed_gpu_idle_gaps_periodic{{{HG}}}", "GPU {{gpu}} periodic gaps")],
                   unit="none", field_overrides=[query_unit("B", "percentunit")]), 12, 8),
            (panel("timeseries", "GPU busy, SM active and clock",
                   "Share of time a kernel ran (busy), SM activity, and SM clock as a share of its maximum.",
                   [target(f"rate(gpufeed_gpu_busy_seconds_total{{{HG}}}[{RI}])", "GPU {{gpu}} busy"),
                    target(f"rate(gpufeed_gpu_sm_active_seconds_total{{{HG}}}[{RI}])", "GPU {{gpu}} SM active"),
                    target(f"gpufeed_gpu_sm_clock_hertz{{{HG}}} / gpufeed_gpu_sm_clock_max_hertz{{{HG}}}",
                           "GPU {{gpu}} SM clock / max")], unit="percentunit", minmax=(0, 1)), 24, 7),
        ]),
        ("CPU shape of the GPU processes", [
            (panel("timeseries", "CPU of the GPU processes",
                   "Cores used per GPU process (user and system): one core near 1.0 with few threads running = "
                   "launch-bound; many cores = input-bound. The verdict's evidence names the threads.",
                   [target(f"sum by (pid, comm) (rate(gpufeed_process_cpu_seconds_total{{{H}}}[{RI}]))",
                           "{{comm}}[{{pid}}]")], unit=CORES, stack=True), 12, 8),
            (panel("timeseries", "Threads by state",
                   "Threads of the GPU processes that are running (R) or waiting on I/O (D); the sleeping rest is "
                   "not exported.",
                   [target(f"sum by (pid, comm, state) (gpufeed_process_threads{{{H}}})",
                           "{{comm}}[{{pid}}] {{state}}")], stack=True), 12, 8),
            (panel("timeseries", "Host CPU busy per NUMA node", "Non-idle share of each node's CPUs, by mode.",
                   [target(f'sum by (node, mode) (rate(gpufeed_cpu_node_seconds_total{{mode!="idle", {H}}}[{RI}]))'
                           f" / on (node) group_left sum by (node) (gpufeed_cpu_node_cpus{{{H}}})",
                           "node {{node}} {{mode}}")], unit="percentunit", minmax=(0, 1)), 12, 8),
            (panel("timeseries", "Average read size of the GPU processes",
                   "rchar / syscr from /proc/<pid>/io: a few KiB per read = small random reads.",
                   [target(f"sum by (pid, comm) (rate(gpufeed_process_read_bytes_total{{{H}}}[{RI}]))"
                           f" / sum by (pid, comm) (rate(gpufeed_process_read_syscalls_total{{{H}}}[{RI}]))",
                           "{{comm}}[{{pid}}]")], unit="bytes"), 12, 8),
        ]),
        ("PCIe and NUMA", [
            (panel("timeseries", "PCIe traffic vs link capacity",
                   "GPU PCIe RX/TX against the achievable capacity of the current link at every hop (GPU and "
                   "upstream bridges): traffic near the lowest capacity = transfer-bound.",
                   [target(f"rate(gpufeed_gpu_pcie_rx_bytes_total{{{HG}}}[{RI}])", "GPU {{gpu}} RX (host to GPU)"),
                    target(f"rate(gpufeed_gpu_pcie_tx_bytes_total{{{HG}}}[{RI}])", "GPU {{gpu}} TX (GPU to host)"),
                    target(f"gpufeed_pcie_link_capacity_bytes_per_second{{{H}}}",
                           "capacity {{role}} {{bdf}} (GPU {{gpu_bdf}})")], unit="Bps"), 12, 8),
            (panel("timeseries", "PCIe link speed per hop, current vs max",
                   "Idle GPUs drop to Gen1 by design; a hop below max while the GPU is busy is a downgrade.",
                   [target(f"gpufeed_pcie_link_current_speed_transfers_per_second{{{H}}} * on (job, instance, bdf) "
                           f"group_left (max_speed, limit_speed) gpufeed_pcie_device_info{{{H}}}",
                           "{{role}} {{bdf}} current (max {{max_speed}}, limit {{limit_speed}})")],
                   unit="short"), 12, 8),
            (panel("timeseries", "PCIe link width per hop, current vs max",
                   "Lanes of each hop's link now, its maximum in the legend; fewer lanes than max under load is a "
                   "bad seat or riser (critical in GpufeedPCIeLinkDowngraded).",
                   [target(f"gpufeed_pcie_link_current_width{{{H}}} * on (job, instance, bdf) "
                           f"group_left (max_width, limit_width) gpufeed_pcie_device_info{{{H}}}",
                           "{{role}} {{bdf}} current (max x{{max_width}}, limit x{{limit_width}})")],
                   unit="short"), 12, 8),
            (hops, 12, 8),
            (panel("state-timeline", "Link downgraded under load",
                   "gpufeed_pcie_link_downgraded per GPU and hop (absent while the link is fine; shown as 0).",
                   [target(f"max by (gpu, bdf) (gpufeed_pcie_link_downgraded{{{HG}}}) or "
                           f"max by (gpu) (0 * gpufeed_gpu_info{{{HG}}})", "GPU {{gpu}} {{bdf}}")],
                   mappings=[{"type": "value", "options": {
                       "0": {"text": "ok", "color": "green", "index": 0},
                       "1": {"text": "downgraded", "color": "red", "index": 1}}}]), 12, 6),
            (panel("timeseries", "PCIe errors", "AER errors per device and NVML replays per GPU.",
                   # Per device (NVMe, NICs; every hop with --collector.pcie.chain) and per GPU chain (the default
                   # for GPUs and their bridges), one legend: a chain total is named after its GPU.
                   [target(f"sum by (bdf, severity) (increase(gpufeed_pcie_aer_errors_total{{{H}}}[{RI}]) or "
                           f"label_replace(increase(gpufeed_pcie_chain_aer_errors_total{{{H}}}[{RI}]), \"bdf\", "
                           f"\"path of GPU $1\", \"gpu_bdf\", \"(.*)\"))", "AER {{severity}} {{bdf}}"),
                    target(f"increase(gpufeed_gpu_pcie_replays_total{{{HG}}}[{RI}])", "GPU {{gpu}} replays")]),
             12, 6),
            (placement, 12, 7),
            (gpus, 12, 7),
        ]),
        interconnect_row(),
        gpu_state_row(),
        gpu_health_row(verdict_map),
        workload_row(),
        ("IO, memory and pressure", [
            (panel("timeseries", "Pressure stall (PSI some)", "Share of wall time tasks stalled on CPU, IO, memory.",
                   [target(f"rate(gpufeed_pressure_stalled_seconds_total{{{H}}}[{RI}])", "{{resource}}")],
                   unit="percentunit", minmax=(0, 1), steps=MEMORY_STALL), 8, 8),
            (panel("timeseries", "Disk read latency", "Mean time per completed read (await).",
                   [target(f"rate(gpufeed_disk_read_time_seconds_total{{{H}}}[{RI}])"
                           f" / rate(gpufeed_disk_reads_completed_total{{{H}}}[{RI}])", "{{device}} read await")],
                   unit="s", minmax=(0, None)), 8, 8),
            (panel("timeseries", "Disk utilisation", "Share of time each device had IO in flight (io_ticks); "
                   "io_bound counts a disk from 50% busy.",
                   [target(f"rate(gpufeed_disk_io_time_seconds_total{{{H}}}[{RI}])", "{{device}} busy")],
                   unit="percentunit", minmax=(0, 1), steps=DISK_BUSY), 8, 8),
            (panel("timeseries", "Memory", "Total, available, dirty and writeback memory.",
                   [target(f"gpufeed_memory_total_bytes{{{H}}}", "total"),
                    target(f"gpufeed_memory_available_bytes{{{H}}}", "available"),
                    target(f"gpufeed_memory_dirty_bytes{{{H}}}", "dirty"),
                    target(f"gpufeed_memory_writeback_bytes{{{H}}}", "writeback")], unit="bytes"), 12, 8),
            (panel("timeseries", "OOM kills", "Processes the kernel's OOM killer ended (/proc/vmstat oom_kill).",
                   [target(f"increase(gpufeed_oom_kills_total{{{H}}}[{RI}])", "OOM kills")],
                   custom={"drawStyle": "bars"}, steps=ANY_IS_BAD), 12, 8),
            (panel("timeseries", "NFS client", "RPC calls, retransmissions and operations per second.",
                   [target(f"rate(gpufeed_nfs_rpc_calls_total{{{H}}}[{RI}])", "rpc calls"),
                    target(f"rate(gpufeed_nfs_rpc_retransmissions_total{{{H}}}[{RI}])", "retransmissions"),
                    target(f"sum by (op) (rate(gpufeed_nfs_operations_total{{{H}}}[{RI}]))", "{{op}}")],
                   unit="ops"), 12, 8),
            (panel("timeseries", "CPU frequency governor", "CPUs per cpufreq governor (powersave starves bursty "
                   "threads).", [target(f"gpufeed_cpufreq_governor_cpus{{{H}}}", "{{governor}}")]), 12, 8),
        ]),
        exporter_row(),
    ]
    links = [board_link("Fleet overview", "gpufeed-fleet")]
    return dashboard("gpufeed-host", "gpufeed / Host drill-down",
                     "Why is GPU N waiting? Verdicts, activity shape, CPU shape, PCIe, NUMA, IO and pressure.",
                     layout(rows), templating=variables(with_gpu=True), links=links)


def outputs() -> dict[str, str]:
    return {name: json.dumps(d, indent=2, sort_keys=False) + "\n"
            for name, d in (("gpufeed-fleet.json", fleet()), ("gpufeed-host.json", host()))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--check", action="store_true", help="exit 1 if the JSON in --out differs from the generator")
    ns = p.parse_args(argv)
    dirs = (ns.out, *COPIES) if ns.out.resolve() == OUT else (ns.out,)
    files = {d / name: text for name, text in outputs().items() for d in dirs}
    return write_or_check(files, check=ns.check, what="dashboards", command="python3 deploy/grafana/generate.py")


if __name__ == "__main__":
    sys.exit(main())
