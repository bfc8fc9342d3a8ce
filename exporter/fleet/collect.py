"""Read the review's numbers out of Prometheus: the shipped recording rules where loaded, raw series otherwise.

Every GPU-hour comes from a counter (``gpufeed_gpu_state_seconds_total``, ``gpufeed_gpu_waiting_seconds_total``)
or from a recording rule of its rate, summed step by step over the range ``(start, end]``:

- raw: ``increase(counter[step])`` evaluated at the end of each step. Adjacent windows share their boundary
  sample, so the increases telescope to the counter's growth over the range; ``increase`` handles resets
  and extrapolates the sub-scrape gaps at the window edges.
- rules: ``sum_over_time(rule[step - 1ms]) * interval``: each sample of a ``rate5m`` rule stands for one
  evaluation interval of the rule's group (read from /api/v1/rules). The window is one millisecond short so
  a sample exactly on a step boundary is counted in one step only (Prometheus 2 ranges are closed).

A rule is used only where it is loaded, healthy and covers the range as well as the raw series do; otherwise
the raw series are used and the report says why (``model.Source``). Queries run four at a time.

``--source rules`` reads the aggregated form (``collect_aggregated``): Prometheus sums the rules per GPU over the
whole range (one number per GPU and state), per owner, and for the fleet per step; no per-GPU series of steps is
ever asked for, so the answer grows with the GPUs, not with GPUs x steps (4,096 GPUs x 30 days: docs/benchmarks.md).
The raw series it still reads (models, findings, links, idle gaps) are instant or sparse, and are simply absent
from a Prometheus (or Thanos, Mimir) that holds the rules only.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from exporter import log
from exporter import thresholds as judgements
from exporter.fleet.model import (
    BY_LABEL,
    BY_RULE_PREFIX,
    FindingTrack,
    FleetData,
    GapHistogram,
    GpuId,
    JobWaits,
    LinkState,
    Source,
    Window,
    iso,
)
from exporter.fleet.promapi import (
    AuthRefusedError,
    BoundError,
    PromError,
    PrometheusClient,
    RuleInfo,
    Sample,
    Series,
    UnreachableError,
)
from exporter.fleet.stragglers import LATENCY_BOUND
from exporter.names import STATES, WAITING_CAUSES

EXIT_NO_DATA = 5
EXIT_MISSING_RULES = 6

STATE_METRIC = "gpufeed_gpu_state_seconds"
CAUSE_METRIC = "gpufeed_gpu_waiting_seconds"
GPU_STATE_RULE = f"instance_gpu_state:{STATE_METRIC}:rate5m"
GPU_CAUSE_RULE = f"instance_gpu_cause:{CAUSE_METRIC}:rate5m"
JOULES_METRIC = "gpufeed_gpu_waiting_joules"
GPU_JOULES_RULE = f"instance_gpu_cause:{JOULES_METRIC}:rate5m"
# Raw fallback for the per-workload rollups: the same join the rules use (alerts/generate.py, workload_join),
# on 5-minute increases tiled over each step.
SUBSTEP = "5m"
SUBSTEP_S = 300
# A rule is trusted when it has data for at least this share of the GPU-steps the raw series cover.
MIN_COVERAGE = 0.99
RAW_ASKED = "raw series asked for (--source raw)"

_log = log.get_logger(component="report")
Progress = Callable[[int, int, str], None]


class NoDataError(Exception):
    exit_code = EXIT_NO_DATA


class MissingRulesError(Exception):
    exit_code = EXIT_MISSING_RULES


@dataclass(frozen=True, slots=True)
class CollectOptions:
    window: Window
    by: str  # a key of model.BY_LABEL
    source: str  # "auto", "rules" or "raw"
    selector: str = ""  # label matchers every series read must carry, e.g. cluster="eu-1" (no braces)


# A series selector's matchers: name op "value", comma-separated.
_MATCHER = (r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*'  # the label name
            r'(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')  # the operator and the quoted value
SELECTOR = re.compile(rf"\{{(?:{_MATCHER}(?:,{_MATCHER})*,?\s*)?\}}")
# Every series a query reads: a gpufeed metric or one of its recording rules (level:gpufeed_...:operation).
_SERIES = re.compile(r"\b((?:[a-z_]+:)?gpufeed_[a-z_]+(?::[a-z0-9_]+)?)(\{[^}]*\})?")


def _no_workloads_note(by: str) -> str:
    """The report's note when the range has no workload identity to split GPU time ``by``."""
    return (f"No gpufeed_workload_info series with a {BY_LABEL[by]} label in the range: GPU time cannot be split by "
            f"{by} (is the workload identity of gpufeed enabled on these hosts?).")


def with_selector(expr: str, matchers: str) -> str:
    """``expr`` with ``matchers`` added to every gpufeed series it reads (metrics and recording rules alike), so
    a whole report reads one cluster (or any label set the rules keep: their aggregation labels)."""
    if not matchers:
        return expr

    def add(m: re.Match[str]) -> str:
        inner = (m.group(2) or "{}")[1:-1].strip()
        return m.group(1) + "{" + (f"{inner}, {matchers}" if inner else matchers) + "}"

    return _SERIES.sub(add, expr)


# The shipped rules' aggregation labels (exporter/thresholds.yaml): the raw fallback joins as the rules do.
AGGREGATION = ", ".join(str(v) for v in judgements.DEFAULTS.get("aggregation_labels", []))
_AGG = f"{AGGREGATION}, " if AGGREGATION else ""


def workload_join(label: str) -> str:
    """1 per (job, instance, gpu, label): one workload with that label per GPU, as the rules join it."""
    return (f"group by ({_AGG}job, instance, gpu, {label}) (topk by ({_AGG}job, instance, gpu) "
            f"(1, gpufeed_workload_info{{{label}!=\"\"}}))")


def group_rule(by: str, kind: str) -> str:
    """The recording rule of --by namespace|job for kind "state" or "cause"."""
    metric = STATE_METRIC if kind == "state" else CAUSE_METRIC
    return f"{BY_RULE_PREFIX[by]}_{kind}:{metric}:rate5m"


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def left_open(step: float) -> str:
    """A range selector one millisecond short of ``step``: a boundary sample falls in one step only."""
    return f"{round(step * 1000) - 1}ms"


# ------------------------------------------------------------------------------------------------ queries


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL query of the review: over the range's steps (``ranged``) or at its end."""

    key: str
    expr: str
    ranged: bool
    what: str  # for the progress line


def gpu_family_query(family: str, kind: str, window: Window, interval_s: float = 0.0) -> Query:
    """Per-GPU GPU-seconds per step by state (family gpu_state) or cause (gpu_cause), from rules or raw."""
    label = "state" if family == "gpu_state" else "cause"
    if kind == "rules":
        rule = GPU_STATE_RULE if family == "gpu_state" else GPU_CAUSE_RULE
        expr = (f"sum by (job, instance, gpu, {label}) (sum_over_time({rule}[{left_open(window.step)}]))"
                f" * {interval_s:g}")
    else:
        metric = STATE_METRIC if family == "gpu_state" else CAUSE_METRIC
        expr = f"sum by (job, instance, gpu, {label}) (increase({metric}_total[{_ms(window.step)}]))"
    return Query(f"{family}:{kind}", expr, True, f"GPU time by {label} ({kind})")


def group_family_query(family: str, kind: str, by: str, window: Window, interval_s: float = 0.0) -> Query:
    """GPU-seconds per step per namespace / Slurm job by state (group_state) or cause (group_cause)."""
    label, part = BY_LABEL[by], ("state" if family == "group_state" else "cause")
    if kind == "rules":
        expr = (f"sum by ({label}, {part}) (sum_over_time({group_rule(by, part)}[{left_open(window.step)}]))"
                f" * {interval_s:g}")
    else:
        metric = STATE_METRIC if part == "state" else CAUSE_METRIC
        expr = (f"sum_over_time((sum by ({label}, {part}) (increase({metric}_total[{SUBSTEP}]) "
                f"* on ({_AGG}job, instance, gpu) group_left ({label}) {workload_join(label)}))"
                f"[{left_open(window.step)}:{SUBSTEP}])")
    return Query(f"{family}:{kind}", expr, True, f"GPU time by {by} and {part} ({kind})")


def energy_queries(window: Window, by: str, rules: Mapping[str, RuleInfo], use_rules: bool) -> list[Query]:
    """Joules spent waiting over the whole range, by cause, per GPU and per namespace / Slurm job: from the
    energy rules where ``use_rules`` (the waiting-time rules covered the range) and they are loaded and healthy
    (``sum_over_time`` of their watts times the group's interval), from ``gpufeed_gpu_waiting_joules_total``
    otherwise (the same join the rules use, on 5-minute increases)."""
    rng = left_open(window.seconds)
    qs = []
    if use_rules and not _rule_problem(rules, GPU_JOULES_RULE):
        qs.append(Query("gpu_joules", f"sum by (job, instance, gpu, cause) (sum_over_time({GPU_JOULES_RULE}[{rng}]))"
                                      f" * {rules[GPU_JOULES_RULE].interval_s:g}", False, "energy spent waiting"))
    else:
        qs.append(Query("gpu_joules", f"sum by (job, instance, gpu, cause) "
                                      f"(increase({JOULES_METRIC}_total[{_ms(window.seconds)}]))",
                        False, "energy spent waiting"))
    if by != "host":
        label, rule = BY_LABEL[by], f"{BY_RULE_PREFIX[by]}_cause:{JOULES_METRIC}:rate5m"
        if use_rules and not _rule_problem(rules, rule):
            expr = f"sum by ({label}, cause) (sum_over_time({rule}[{rng}])) * {rules[rule].interval_s:g}"
        else:
            expr = (f"sum_over_time((sum by ({label}, cause) (increase({JOULES_METRIC}_total[{SUBSTEP}]) "
                    f"* on ({_AGG}job, instance, gpu) group_left ({label}) {workload_join(label)}))"
                    f"[{rng}:{SUBSTEP}])")
        qs.append(Query("group_joules", expr, False, f"energy spent waiting by {by}"))
    return qs


def base_queries(window: Window, by: str) -> list[Query]:
    """The queries every report runs on raw series (no recording rule exists for them)."""
    win, rng = left_open(window.step), _ms(window.seconds)
    qs = [
        Query("presence", f'max by (job, instance, gpu) (count_over_time({STATE_METRIC}_total{{state="idle"}}[{win}]))',
              True, "GPUs and scrapes per step"),
        Query("models", f"max by (job, instance, gpu, name) (last_over_time(gpufeed_gpu_info[{rng}]))",
              False, "GPU models"),
        Query("findings", f"max by (job, instance, gpu, check) (count_over_time(gpufeed_finding[{win}]))",
              True, "platform findings"),
        Query("hops", f"max by (job, instance, gpu, bdf) (max_over_time(gpufeed_pcie_link_downgraded[{rng}])) == 1",
              False, "downgraded PCIe hops"),
        Query("gaps", f"sum by (job, instance, gpu, le) (increase(gpufeed_gpu_idle_gap_seconds_bucket[{rng}]))",
              False, "idle-gap histograms"),
        Query("gap_sum", f"sum by (job, instance, gpu) (increase(gpufeed_gpu_idle_gap_seconds_sum[{rng}]))",
              False, "idle-gap sums"),
    ]
    for q, metric in (("link_gen", "gpufeed_gpu_pcie_link_generation"), ("link_width", "gpufeed_gpu_pcie_link_width")):
        # The best link seen while the finding was raised (idle GPUs drop to Gen1 by design: take the max).
        qs.append(Query(q, f"max by (job, instance, gpu, kind) (max_over_time(({metric} and on (job, instance, gpu) "
                           f'gpufeed_finding{{check="pcie_link_downgraded"}})[{rng}:1m]))', False, "link states"))
    # What the GPU and slot allow: labels of the link's info series.
    qs.append(Query("link_max", "max by (job, instance, gpu, max_generation, max_width) (last_over_time(("
                                "gpufeed_gpu_pcie_link_info and on (job, instance, gpu) "
                                f'gpufeed_finding{{check="pcie_link_downgraded"}})[{rng}:1m]))', False, "link maxima"))
    if by != "host":
        label = BY_LABEL[by]
        qs.append(Query("workloads", f"count(max by (job, instance, gpu) "
                                     f"(count_over_time(gpufeed_workload_info{{{label}!=\"\"}}[{win}])))",
                        True, f"GPUs with a {by}"))
    return qs


# ------------------------------------------------------------------------------------------------ helpers


def _gpu(labels: Mapping[str, str]) -> GpuId:
    return GpuId(labels.get("job", ""), labels.get("instance", ""), labels.get("gpu", ""))


def _per_step(window: Window, points: Sequence[tuple[float, float]]) -> list[float]:
    out = [0.0] * window.steps
    for t, v in points:
        i = window.index(t)
        if i is not None and math.isfinite(v):
            out[i] += v
    return out


def _split(window: Window, series: Sequence[Series], key: str) -> dict[GpuId, dict[str, tuple[float, ...]]]:
    out: dict[GpuId, dict[str, tuple[float, ...]]] = defaultdict(dict)
    for s in series:
        out[_gpu(s.labels)][s.labels.get(key, "")] = tuple(_per_step(window, s.points))
    return dict(out)


def _steps_with_data(window: Window, series: Sequence[Series]) -> set[int]:
    return {i for s in series for t, _ in s.points if (i := window.index(t)) is not None}


def _rule_problem(rules: Mapping[str, RuleInfo], name: str) -> str:
    """Why ``name`` cannot be used ("" when it can)."""
    r = rules.get(name)
    if r is None:
        return f"recording rule {name} is not loaded on this Prometheus"
    if r.health == "err":
        return f"recording rule {name} fails to evaluate ({r.last_error})"
    if r.interval_s <= 0:
        return f"recording rule {name} has no evaluation interval in /api/v1/rules"
    return ""


class _Runner:
    """Runs queries four at a time, counting them for the progress line."""

    def __init__(self, client: PrometheusClient, window: Window, progress: Progress | None, selector: str = "") -> None:
        self.client, self.window, self.progress, self.selector = client, window, progress, selector
        self.done, self.total = 0, 0

    def run(self, queries: Sequence[Query]) -> dict[str, list[Series] | list[Sample]]:
        w = self.window
        self.total += len(queries)
        out: dict[str, list[Series] | list[Sample]] = {}

        def one(q: Query) -> tuple[str, list[Series] | list[Sample]]:
            t0 = time.monotonic()
            res: list[Series] | list[Sample]
            expr = with_selector(q.expr, self.selector)
            if q.ranged:
                res = self.client.query_range(expr, w.start + w.step, w.end, w.step)
            else:
                res = self.client.query(expr, w.end)
            _log.debug("report_query", key=q.key, seconds=round(time.monotonic() - t0, 3), results=len(res),
                       expr=expr)
            return q.key, res

        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {pool.submit(one, q): q for q in queries}
            try:
                for f in as_completed(futures):
                    key, res = f.result()
                    out[key] = res
                    self.done += 1
                    if self.progress is not None:
                        self.progress(self.done, self.total, futures[f].what)
            except BaseException:
                # The first failure ends the report: the queued queries are not sent, only those in flight
                # (each bounded by --timeout) are waited for.
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        return out


def _series(res: Mapping[str, list[Series] | list[Sample]], key: str) -> list[Series]:
    return [s for s in res.get(key, []) if isinstance(s, Series)]


def _samples(res: Mapping[str, list[Series] | list[Sample]], key: str) -> list[Sample]:
    return [s for s in res.get(key, []) if isinstance(s, Sample)]


# --------------------------------------------------------------------------------------------------- entry


def collect(client: PrometheusClient, opts: CollectOptions, progress: Progress | None = None) -> FleetData:
    """Query everything the review needs; NoDataError when the range holds no gpufeed series, MissingRulesError when
    ``opts.source == "rules"`` and a rule the report needs is unusable."""
    w, by = opts.window, opts.by
    if opts.source == "rules":
        return collect_aggregated(client, opts, progress)
    families = ["gpu_state", "gpu_cause"] + (["group_state", "group_cause"] if by != "host" else [])
    rules: dict[str, RuleInfo] = {}
    rules_api = ""
    if opts.source != "raw":
        try:
            rules = {r.name: r for r in client.rules()}
        except (UnreachableError, AuthRefusedError, BoundError):
            raise
        except PromError as e:
            if opts.source == "rules":
                raise
            # Not every Prometheus-compatible API serves /api/v1/rules: raw series answer all the same.
            rules_api = f"the recording rules could not be listed ({e})"

    def rule_of(family: str) -> str:
        if family.startswith("gpu_"):
            return GPU_STATE_RULE if family == "gpu_state" else GPU_CAUSE_RULE
        return group_rule(by, "state" if family == "group_state" else "cause")

    def family_query(family: str, kind: str) -> Query:
        interval = rules[rule_of(family)].interval_s if kind == "rules" else 0.0
        if family.startswith("gpu_"):
            return gpu_family_query(family, kind, w, interval)
        return group_family_query(family, kind, by, w, interval)

    # Why each family cannot use its rule ("" where it can): decided here, then by the rule's coverage below.
    problems = {f: RAW_ASKED if opts.source == "raw" else rules_api or _rule_problem(rules, rule_of(f))
                for f in families}
    if opts.source == "rules" and any(problems.values()):
        raise MissingRulesError("; ".join(p for p in problems.values() if p)
                                + ": load alerts/gpufeed-recording.yml (python3 alerts/generate.py), "
                                "or use --source auto")
    runner = _Runner(client, w, progress, opts.selector)
    first = base_queries(w, by) + [family_query(f, "rules") for f in families if not problems[f]]
    res = runner.run(first)

    presence = {_gpu(s.labels): _per_step(w, s.points) for s in _series(res, "presence")}
    if not presence:
        where = f" matching {{{opts.selector}}}" if opts.selector else ""
        raise NoDataError(f"no gpufeed data between {iso(w.start)} and {iso(w.end)} on {client.url}: no "
                          f"{STATE_METRIC}_total series{where} in that range (is this Prometheus scraping gpufeed? "
                          "are --end and --range right?)")
    present_steps = {(g, i) for g, counts in presence.items() for i, n in enumerate(counts) if n >= 2}
    workload_steps = {i for s in _series(res, "workloads") for t, v in s.points
                      if v > 0 and (i := w.index(t)) is not None}

    # Which families keep their rule: data for (nearly) every GPU-step the raw series cover.
    for f in families:
        if problems[f]:
            continue
        got = _series(res, f"{f}:rules")
        if f.startswith("gpu_"):
            have = {(_gpu(s.labels), i) for s in got for t, _ in s.points if (i := w.index(t)) is not None}
            need = present_steps
            covered = len(need & have) / len(need) if need else 1.0
        else:
            have_steps = _steps_with_data(w, got)
            covered = len(workload_steps & have_steps) / len(workload_steps) if workload_steps else 1.0
        if covered < MIN_COVERAGE:
            problems[f] = (f"recording rule {rule_of(f)} has data for only {covered:.0%} of the range "
                           "(loaded after the range began?)")
    if opts.source == "rules" and any(problems.values()):
        raise MissingRulesError("; ".join(p for p in problems.values() if p) + ": use --source auto to fall back")
    fallback = [family_query(f, "raw") for f in families if problems[f]]
    # The energy rules are in the same file as the waiting-time rules: trusted where those covered the range.
    res.update(runner.run(fallback + energy_queries(w, by, rules, not problems["gpu_cause"])))

    sources = []
    for f in families:
        kind = "raw" if problems[f] else "rules"
        metric = (STATE_METRIC if f.endswith("state") else CAUSE_METRIC) + "_total"
        sources.append(Source(family=f, kind=kind, series=rule_of(f) if kind == "rules" else metric,
                              note=problems[f]))
        _log.info("report_source", family=f, kind=kind, note=problems[f])
    fam = {f: _series(res, f"{f}:{'raw' if problems[f] else 'rules'}") for f in families}

    state = _split(w, fam["gpu_state"], "state")
    cause = _split(w, fam["gpu_cause"], "cause")
    for g in presence:
        state.setdefault(g, {})
        cause.setdefault(g, {})
    n = w.steps
    state_s = {g: {s: per.get(s, (0.0,) * n) for s in STATES} for g, per in state.items()}
    cause_s = {g: {c: per.get(c, (0.0,) * n) for c in WAITING_CAUSES} for g, per in cause.items()}

    group_state: dict[str, dict[str, float]] = {}
    group_cause: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    if by != "host":
        label = BY_LABEL[by]
        for fname, target, part in (("group_state", group_state, "state"), ("group_cause", group_cause, "cause")):
            for s in fam[fname]:
                target.setdefault(s.labels.get(label, ""), {})[s.labels.get(part, "")] = sum(_per_step(w, s.points))
        if not workload_steps:
            notes.append(_no_workloads_note(by))

    observed = {g: [sum(per[s][i] for s in STATES) for i in range(n)] for g, per in state_s.items()}
    findings = _findings(w, _series(res, "findings"), presence, observed)
    jobs, jobs_source = _stragglers(runner, w, rules if opts.source != "raw" else {})
    return FleetData(window=w, by=by, state_s=state_s, cause_s=cause_s, group_state_s=group_state,
                     group_cause_s=group_cause, findings=tuple(findings), sources=tuple(sources), notes=tuple(notes),
                     jobs=jobs, jobs_source=jobs_source, **_instant_parts(res, by, findings))


def _instant_parts(res: Mapping[str, list[Series] | list[Sample]], by: str,
                   findings: Sequence[FindingTrack]) -> dict[str, Any]:
    """FleetData's models, links, idle gaps and joules, from their (instant) queries' answers."""
    models: dict[GpuId, str] = {}
    for smp in sorted(_samples(res, "models"), key=lambda x: x.labels.get("name", "")):
        models.setdefault(_gpu(smp.labels), smp.labels.get("name", ""))
    cause_j: dict[GpuId, dict[str, float]] = defaultdict(dict)
    for smp in _samples(res, "gpu_joules"):
        if math.isfinite(smp.value):
            cause_j[_gpu(smp.labels)][smp.labels.get("cause", "")] = max(0.0, smp.value)
    group_j: dict[str, dict[str, float]] = defaultdict(dict)
    for smp in _samples(res, "group_joules") if by != "host" else []:
        if math.isfinite(smp.value):
            group_j[smp.labels.get(BY_LABEL[by], "")][smp.labels.get("cause", "")] = max(0.0, smp.value)
    return {"models": models, "links": _links(res, {tr.gpu for tr in findings if tr.check == "pcie_link_downgraded"}),
            "gaps": _gaps(res), "cause_j": dict(cause_j), "group_cause_j": dict(group_j)}


# The straggler rules (alerts/generate.py, job_rules): GPUs of each job in collective_wait, recorded every minute;
# a rank's own waiting is every waiting cause but latency_bound (stragglers.LATENCY_BOUND).
JOB_COLLECTIVE_RULE = "job:gpufeed_gpus_collective_wait:count"


def straggler_queries(w: Window, rules: Mapping[str, RuleInfo]) -> tuple[list[Query], str]:
    """Per distributed job (gpufeed_workload_info's namespace and job_id) and step: the GPU-seconds its ranks spent
    in collective_wait -- from the rule job:gpufeed_gpus_collective_wait:count (one sample per evaluation
    interval: a sum over time times the interval) where loaded and healthy, else the same count of
    gpufeed_gpu_bottleneck{cause="collective_wait"} on a 1-minute subquery -- and the GPU-seconds its ranks waited
    on each cause of their own host (raw counters, every cause but latency_bound as the straggler rules count).
    Returns the queries and the series the collective_wait count came from."""
    ranks = f'topk by ({_AGG}job, instance, gpu) (1, gpufeed_workload_info{{job_id!=""}})'
    join = f"* on ({_AGG}job, instance, gpu) group_left (namespace, job_id) {ranks}"
    if not _rule_problem(rules, JOB_COLLECTIVE_RULE):
        source = JOB_COLLECTIVE_RULE
        collective = (f"sum by (namespace, job_id) (sum_over_time({JOB_COLLECTIVE_RULE}[{left_open(w.step)}]))"
                      f" * {rules[JOB_COLLECTIVE_RULE].interval_s:g}")
    else:
        source = 'gpufeed_gpu_bottleneck{cause="collective_wait"}'
        collective = (f"sum_over_time((count by (namespace, job_id) ({source} {join}))[{left_open(w.step)}:1m])"
                      " * 60")
    own = (f'sum by (namespace, job_id, cause) (increase({CAUSE_METRIC}_total{{cause!="{LATENCY_BOUND}"}}'
           f"[{_ms(w.step)}]) {join})")
    return [Query("job_collective", collective, True, "GPUs waiting for a slower rank"),
            Query("job_own_cause", own, True, "ranks' own waiting")], source


def _stragglers(runner: _Runner, w: Window, rules: Mapping[str, RuleInfo]) -> tuple[tuple[JobWaits, ...], str]:
    """Each distributed job's waits (``straggler_queries``) that had any rank in collective_wait, and the source."""
    queries, source = straggler_queries(w, rules)
    res = runner.run(queries)
    collective_s = {(s.labels.get("namespace", ""), s.labels.get("job_id", "")): tuple(_per_step(w, s.points))
                    for s in _series(res, "job_collective")}
    own_s: dict[tuple[str, str], dict[str, tuple[float, ...]]] = defaultdict(dict)
    for s in _series(res, "job_own_cause"):
        own_s[(s.labels.get("namespace", ""), s.labels.get("job_id", ""))][s.labels.get("cause", "")] = tuple(
            _per_step(w, s.points))
    jobs = tuple(JobWaits(namespace=ns, job_id=jid, collective_s=c, own_cause_s=dict(own_s.get((ns, jid), {})))
                 for (ns, jid), c in sorted(collective_s.items()) if any(v > 0 for v in c))
    return jobs, source


def _findings(window: Window, series: Sequence[Series], presence: Mapping[GpuId, Sequence[float]],
              covered: Mapping[GpuId, Sequence[float]]) -> list[FindingTrack]:
    """Seconds raised per step: the share of the step's scrapes that carried the finding, times the seconds
    the GPU (or, host-wide, the host's longest-reporting GPU) was observed in that step."""
    host_gpus: dict[tuple[str, str], list[GpuId]] = defaultdict(list)
    for g in presence:
        host_gpus[(g.job, g.instance)].append(g)
    out = []
    for s in series:
        g = _gpu(s.labels)
        gpus = [g] if g in presence else host_gpus.get((g.job, g.instance), [])
        if not gpus:
            continue
        counts = _per_step(window, s.points)
        active = []
        for i, nf in enumerate(counts):
            nt = max(presence[x][i] for x in gpus)
            seen = max(covered.get(x, [0.0] * window.steps)[i] for x in gpus)
            active.append(min(1.0, nf / nt) * seen if nt > 0 else 0.0)
        out.append(FindingTrack(gpu=g, check=s.labels.get("check", ""), active_s=tuple(active)))
    return out


def _links(res: Mapping[str, list[Series] | list[Sample]], gpus: set[GpuId]) -> dict[GpuId, LinkState]:
    hops: dict[GpuId, list[str]] = defaultdict(list)
    for smp in _samples(res, "hops"):
        hops[_gpu(smp.labels)].append(smp.labels.get("bdf", ""))
    vals: dict[tuple[GpuId, str, str], int] = {}
    for key in ("link_gen", "link_width"):
        for smp in _samples(res, key):
            if math.isfinite(smp.value):
                vals[(_gpu(smp.labels), key, smp.labels.get("kind", ""))] = round(smp.value)
    for smp in _samples(res, "link_max"):
        for key, label in (("link_gen", "max_generation"), ("link_width", "max_width")):
            if smp.labels.get(label, "").isdigit():
                vals[(_gpu(smp.labels), key, "max")] = int(smp.labels[label])
    out = {}
    for g in sorted(gpus | set(hops)):
        out[g] = LinkState(gpu=g, bdfs=tuple(sorted(hops.get(g, []))),
                           gen=vals.get((g, "link_gen", "current")), width=vals.get((g, "link_width", "current")),
                           max_gen=vals.get((g, "link_gen", "max")), max_width=vals.get((g, "link_width", "max")))
    return out


def _gaps(res: Mapping[str, list[Series] | list[Sample]]) -> dict[GpuId, GapHistogram]:
    buckets: dict[GpuId, dict[float, float]] = defaultdict(dict)
    for smp in _samples(res, "gaps"):
        try:
            le = float(smp.labels.get("le", ""))
        except ValueError:
            continue
        buckets[_gpu(smp.labels)][le] = smp.value
    sums = {_gpu(smp.labels): smp.value for smp in _samples(res, "gap_sum")}
    out = {}
    for g, per in buckets.items():
        les = sorted(per)
        if not les or not math.isinf(les[-1]):
            continue
        out[g] = GapHistogram(gpu=g, bounds=tuple(les[:-1]), cumulative=tuple(per[le] for le in les),
                              sum_s=sums.get(g, 0.0))
    return out


# ------------------------------------------------------------------------------------------ aggregated form


def _instance_regex(instances: Sequence[str]) -> str:
    """A PromQL string literal's content matching exactly ``instances`` (RE2, backslashes doubled)."""
    return "|".join(re.escape(i) for i in sorted(set(instances))).replace("\\", "\\\\")


def aggregated_queries(window: Window, by: str, rules: Mapping[str, RuleInfo]) -> list[Query]:
    """The queries of the aggregated form: GPU-seconds per GPU over the range and per fleet step from the GPU
    rules, per owner over the range from the owner rules, and the (instant or sparse) raw series."""
    rng, win = left_open(window.seconds), left_open(window.step)
    qs = []
    for family, rule, label in (("gpu_state", GPU_STATE_RULE, "state"), ("gpu_cause", GPU_CAUSE_RULE, "cause")):
        iv = f"{rules[rule].interval_s:g}"
        qs.append(Query(f"{family}:total",
                        f"sum by (job, instance, gpu, {label}) (sum_over_time({rule}[{rng}])) * {iv}", False,
                        f"GPU time by {label} per GPU"))
        qs.append(Query(f"{family}:fleet", f"sum by ({label}) (sum_over_time({rule}[{win}])) * {iv}",
                        True, f"fleet GPU time by {label} per step"))
    qs.append(Query("raw_gpus", f'count(max by (job, instance, gpu) (count_over_time({STATE_METRIC}_total'
                                f'{{state="idle"}}[{win}])) >= 2)', True, "GPUs with raw data per step"))
    if by != "host":
        label = BY_LABEL[by]
        for family, part in (("group_state", "state"), ("group_cause", "cause")):
            rule = group_rule(by, part)
            qs.append(Query(f"{family}:total", f"sum by ({label}, {part}) (sum_over_time({rule}[{rng}])) * "
                                               f"{rules[rule].interval_s:g}", False, f"GPU time by {by} and {part}"))
    raw = [q for q in base_queries(window, by) if q.key != "presence"]
    return qs + raw + energy_queries(window, by, rules, True)


def finding_queries(window: Window, instances: Sequence[str], rules: Mapping[str, RuleInfo]) -> list[Query]:
    """Per-step presence and observed seconds of the hosts that had a finding only (the findings' weights)."""
    win, match = left_open(window.step), f'instance=~"{_instance_regex(instances)}"'
    return [
        Query("presence", f'max by (job, instance, gpu) (count_over_time({STATE_METRIC}_total{{state="idle", {match}}}'
                          f"[{win}]))", True, "scrapes per step of hosts with findings"),
        Query("observed", f"sum by (job, instance, gpu) (sum_over_time({GPU_STATE_RULE}{{{match}}}[{win}])) * "
                          f"{rules[GPU_STATE_RULE].interval_s:g}", True, "GPU time per step of hosts with findings"),
    ]


def collect_aggregated(client: PrometheusClient, opts: CollectOptions, progress: Progress | None = None) -> FleetData:
    """``collect`` for ``--source rules``: the same figures from aggregates Prometheus computes (module doc)."""
    w, by = opts.window, opts.by
    families = ["gpu_state", "gpu_cause"] + (["group_state", "group_cause"] if by != "host" else [])
    names = [GPU_STATE_RULE, GPU_CAUSE_RULE] + [group_rule(by, p) for p in ("state", "cause") if by != "host"]
    rules = {r.name: r for r in client.rules()}
    missing = [p for n in names if (p := _rule_problem(rules, n))]
    if missing:
        raise MissingRulesError("; ".join(missing) + ": load alerts/gpufeed-recording.yml "
                                "(python3 alerts/generate.py), or use --source auto")
    runner = _Runner(client, w, progress, opts.selector)
    res = runner.run(aggregated_queries(w, by, rules))
    # The GPU rules must cover the GPU-steps the raw series cover, where this Prometheus holds raw series (a
    # second round: on a server with the rules only, such as a long-term store, there is nothing to compare).
    raw_n = _per_step(w, next(iter(_series(res, "raw_gpus")), Series({}, ())).points)
    need = sum(raw_n)
    covered = 1.0
    if need:
        rule_q = Query("rule_gpus", f'count(count by (job, instance, gpu) (count_over_time({GPU_STATE_RULE}'
                                    f'{{state="idle"}}[{left_open(w.step)}])))', True, "GPUs with rule data per step")
        rule_n = _per_step(w, next(iter(_series(runner.run([rule_q]), "rule_gpus")), Series({}, ())).points)
        covered = sum(min(a, b) for a, b in zip(rule_n, raw_n, strict=True)) / need
    if covered < MIN_COVERAGE:
        raise MissingRulesError(f"recording rule {GPU_STATE_RULE} has data for only {covered:.0%} of the range "
                                "(loaded after the range began?): use --source auto to fall back")
    totals = {f: _samples(res, f"{f}:total") for f in families}
    if not totals["gpu_state"]:
        where = f" matching {{{opts.selector}}}" if opts.selector else ""
        raise NoDataError(f"no gpufeed data between {iso(w.start)} and {iso(w.end)} on {client.url}: no "
                          f"{GPU_STATE_RULE} series{where} in that range (are the recording rules loaded and "
                          "evaluated? are --end and --range right?)")
    sources = tuple(Source(family=f, kind="rules", series=names[i], note="") for i, f in enumerate(families))

    def per_gpu(smps: Sequence[Sample], key: str, keys: Sequence[str]) -> dict[GpuId, dict[str, tuple[float, ...]]]:
        out: dict[GpuId, dict[str, tuple[float, ...]]] = {}
        for smp in smps:
            out.setdefault(_gpu(smp.labels), dict.fromkeys(keys, (0.0,)))[smp.labels.get(key, "")] = (
                smp.value if math.isfinite(smp.value) else 0.0,)
        return out

    state_s = per_gpu(totals["gpu_state"], "state", STATES)
    cause_s = per_gpu(totals["gpu_cause"], "cause", WAITING_CAUSES)
    for g in state_s:
        cause_s.setdefault(g, dict.fromkeys(WAITING_CAUSES, (0.0,)))
    fleet_state = {s.labels.get("state", ""): tuple(_per_step(w, s.points)) for s in _series(res, "gpu_state:fleet")}
    fleet_cause = {s.labels.get("cause", ""): tuple(_per_step(w, s.points)) for s in _series(res, "gpu_cause:fleet")}

    group_state: dict[str, dict[str, float]] = {}
    group_cause: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    if by != "host":
        label = BY_LABEL[by]
        for fname, target, part in (("group_state", group_state, "state"), ("group_cause", group_cause, "cause")):
            for smp in totals[fname]:
                if math.isfinite(smp.value):
                    target.setdefault(smp.labels.get(label, ""), {})[smp.labels.get(part, "")] = smp.value
        if not _series(res, "workloads") and not group_state:
            notes.append(_no_workloads_note(by))

    # Findings are weighed per step by the seconds their GPUs were observed: read for the hosts with one only.
    finding_series = _series(res, "findings")
    findings: list[FindingTrack] = []
    if finding_series:
        more = runner.run(finding_queries(w, [s.labels.get("instance", "") for s in finding_series], rules))
        presence = {_gpu(s.labels): _per_step(w, s.points) for s in _series(more, "presence")}
        observed = {_gpu(s.labels): _per_step(w, s.points) for s in _series(more, "observed")}
        findings = _findings(w, finding_series, presence, observed)
    for f in families:
        _log.info("report_source", family=f, kind="rules", note="aggregated")
    jobs, jobs_source = _stragglers(runner, w, rules)
    return FleetData(window=w, by=by, state_s=state_s, cause_s=cause_s, group_state_s=group_state,
                     group_cause_s=group_cause, findings=tuple(findings), sources=sources, notes=tuple(notes),
                     **_instant_parts(res, by, findings), jobs=jobs, jobs_source=jobs_source,
                     fleet_state_s=fleet_state, fleet_cause_s=fleet_cause)
