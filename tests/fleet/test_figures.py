"""The review's figures from plain numbers: shares, dominant causes and fixes, findings, models, gaps, summary."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence

import jsonschema
import yaml

from exporter.fleet.collect import (
    AGGREGATION,
    GPU_STATE_RULE,
    JOB_COLLECTIVE_RULE,
    gpu_family_query,
    group_family_query,
    left_open,
    straggler_queries,
    workload_join,
)
from exporter.fleet.figures import breakdown, build_report, pct, to_json
from exporter.fleet.model import FindingTrack, FleetData, GapHistogram, GpuId, JobWaits, LinkState, Source, Window
from exporter.fleet.playbook import CAUSE_LABELS, FINDING_FIXES, FINDING_LABELS, FIXES
from exporter.fleet.promapi import RuleInfo
from exporter.fleet.stragglers import stragglers
from exporter.names import FINDINGS, STATES, VERDICTS, WAITING_CAUSES
from exporter.samples.derived import GAP_BUCKETS
from tests.fleet.harness import RECORDING, REPO

H = 3600.0
W = Window(start=0.0, end=3 * H, step=H)
A0, A1, B0 = GpuId("gpufeed", "a:9842", "0"), GpuId("gpufeed", "a:9842", "1"), GpuId("gpufeed", "b:9842", "0")


def per_step(**hours: Sequence[float]) -> dict[str, tuple[float, ...]]:
    return {k: tuple(h * H for h in v) for k, v in hours.items()}


def fleet(*, by: str = "host", findings: Sequence[FindingTrack] = (), groups: Mapping[str, Mapping[str, float]] = {},
          group_causes: Mapping[str, Mapping[str, float]] = {}, models: Mapping[GpuId, str] | None = None,
          links: Mapping[GpuId, LinkState] = {}, gaps: Mapping[GpuId, GapHistogram] = {}) -> FleetData:
    """Host a: GPU 0 waits on input most of the time, GPU 1 works; host b (same model) waits on PCIe."""
    state = {
        A0: per_step(working=(0.2, 0.2, 0.2), waiting=(0.8, 0.8, 0.6), idle=(0, 0, 0.2)),
        A1: per_step(working=(1, 1, 1), waiting=(0, 0, 0), idle=(0, 0, 0)),
        B0: per_step(working=(0.5, 0.5, 0.5), waiting=(0.5, 0.5, 0.5), idle=(0, 0, 0)),
    }
    cause = {
        A0: per_step(input_bound=(0.8, 0.8, 0.5), io_bound=(0, 0, 0.1)),
        A1: {},
        B0: per_step(transfer_bound=(0.5, 0.5, 0.5)),
    }
    return FleetData(window=W, by=by, state_s=state, cause_s=cause,
                     models=models if models is not None else dict.fromkeys((A0, A1, B0), "NVIDIA H100"),
                     group_state_s=groups, group_cause_s=group_causes, findings=tuple(findings), links=links,
                     gaps=gaps, sources=(Source("gpu_state", "rules", GPU_STATE_RULE, ""),))


def test_waiting_share_dominant_cause_and_the_playbooks_fix() -> None:
    b = breakdown({"working": 2 * H, "waiting": 6 * H, "idle": 2 * H},
                  {"input_bound": 4.5 * H, "io_bound": 1.5 * H})
    assert (b.gpu_hours, b.working_share, b.waiting_share, b.idle_share) == (10, 0.2, 0.6, 0.2)
    assert b.busy_efficiency == 0.25
    assert b.dominant_cause == "input_bound" and b.dominant_cause_share == 0.75
    assert "data-loader workers" in b.fix


def test_a_gpu_that_never_waited_has_no_dominant_cause_and_no_fix() -> None:
    b = breakdown({"working": H}, {})
    assert b.dominant_cause is None and b.fix == "" and b.busy_efficiency == 1.0
    idle = breakdown({"idle": H}, {})
    assert idle.busy_efficiency is None and idle.idle_share == 1.0


def test_fleet_hosts_and_timeline_add_up_the_gpus() -> None:
    r = build_report(fleet(), prometheus="http://p:9090", generated_at=0)
    fb = r.fleet.breakdown
    assert r.fleet.gpus == 3 and r.fleet.hosts == 2 and r.fleet.possible_gpu_hours == 9
    assert fb.state_hours == {"working": 5.1, "waiting": 3.7, "idle": 0.2}
    assert abs(fb.cause_hours["input_bound"] - 2.1) < 1e-9 and abs(fb.cause_hours["transfer_bound"] - 1.5) < 1e-9
    assert [round(x, 6) for x in r.timeline.state_hours["waiting"]] == [1.3, 1.3, 1.1]
    assert r.timeline.ends == ("1970-01-01T01:00:00Z", "1970-01-01T02:00:00Z", "1970-01-01T03:00:00Z")
    # Hosts ranked by waiting GPU-hours: a waited 2.2 h (GPU 0), b 1.5 h.
    assert [(h.instance, round(h.breakdown.state_hours["waiting"], 6)) for h in r.hosts] == [("a:9842", 2.2),
                                                                                            ("b:9842", 1.5)]
    assert r.hosts[0].breakdown.dominant_cause == "input_bound" and r.hosts[1].breakdown.dominant_cause == \
        "transfer_bound"
    assert [g.name for g in r.groups] == ["a:9842", "b:9842"] and r.unattributed is None


def test_gpu_time_outside_every_namespace_is_reported_unattributed() -> None:
    data = fleet(by="namespace", groups={"vision": {"working": 0.6 * H, "waiting": 2.2 * H, "idle": 0.2 * H}},
                 group_causes={"vision": {"input_bound": 2.1 * H, "io_bound": 0.1 * H}})
    r = build_report(data, prometheus="p", generated_at=0)
    assert [g.name for g in r.groups] == ["vision"]
    assert r.groups[0].breakdown.dominant_cause == "input_bound"
    assert r.unattributed is not None
    assert {k: round(v, 6) for k, v in r.unattributed.state_hours.items()} == {"working": 4.5, "waiting": 1.5,
                                                                                "idle": 0.0}
    assert round(r.unattributed.cause_hours["transfer_bound"], 6) == 1.5
    assert "The namespace that waited most was vision (2.2 GPU-hours, 95% input_bound)" in r.summary


def test_a_finding_raised_in_two_stretches_counts_two_episodes_and_its_hours() -> None:
    tracks = [FindingTrack(A0, "numa_mismatch", (H, 0.0, 0.5 * H)),
              FindingTrack(GpuId("gpufeed", "a:9842", ""), "cpu_governor_powersave", (0.0, H, H)),
              FindingTrack(A1, "numa_mismatch", (0.5 * H, 0.0, H))]
    r = build_report(fleet(findings=tracks), prometheus="p", generated_at=0)
    numa = next(f for f in r.findings if f.check == "numa_mismatch")
    # The host had it while either GPU had it: a full first hour, then the third.
    assert (numa.hours, numa.episodes, numa.longest_hours, numa.gpus) == (2.0, 2, 1.0, ("0", "1"))
    assert (numa.first_seen, numa.last_seen) == ("1970-01-01T00:00:00Z", "1970-01-01T03:00:00Z")
    assert "NUMA node" in numa.fix and numa.active_hours == (1.0, 0.0, 1.0)
    gov = next(f for f in r.findings if f.check == "cpu_governor_powersave")
    assert gov.gpus == ("",) and gov.hours == 2.0 and gov.episodes == 1 and "performance governor" in gov.fix
    per_gpu = {(d.gpu, d.check): d.hours for d in r.finding_details}
    assert per_gpu == {("0", "numa_mismatch"): 1.5, ("1", "numa_mismatch"): 1.5, ("", "cpu_governor_powersave"): 2.0}
    assert r.hosts[0].findings == ("cpu_governor_powersave", "numa_mismatch")


def test_a_downgraded_link_is_described_at_its_generation_and_width() -> None:
    track = FindingTrack(B0, "pcie_link_downgraded", (H, H, H))
    link = LinkState(B0, ("0000:81:00.0",), gen=3, width=8, max_gen=4, max_width=16)
    r = build_report(fleet(findings=[track], links={B0: link}), prometheus="p", generated_at=0)
    assert r.findings[0].detail == "GPU 0 at Gen3 x8 (max Gen4 x16) at hop 0000:81:00.0."
    assert "One host had a link at Gen3 x8 while busy (pcie_link_downgraded, 3.0 h in all)" in r.summary


def test_identical_servers_with_different_busy_efficiency_are_called_out() -> None:
    track = FindingTrack(B0, "pcie_link_downgraded", (H, H, H))
    r = build_report(fleet(findings=[track]), prometheus="p", generated_at=0)
    (m,) = r.models
    assert (m.name, m.gpus, m.hosts) == ("NVIDIA H100", 3, 2)
    assert [h.instance for h in m.per_host] == ["a:9842", "b:9842"]  # a: 3.6 of 5.8 busy hours worked (62%)
    assert m.efficiency_spread is not None and abs(m.efficiency_spread - (3.6 / 5.8 - 0.5)) < 1e-9
    assert m.note.startswith("b:9842 worked 50% of its busy time against 62% on a:9842 with the same NVIDIA H100, "
                             "waiting mostly on transfer_bound; b:9842 had pcie_link_downgraded.")
    assert "Same model, different result: b:9842 worked 50%" in r.summary


def test_different_models_are_not_compared() -> None:
    r = build_report(fleet(models={A0: "H100", A1: "H100", B0: "A100"}), prometheus="p", generated_at=0)
    assert all(m.note == "" for m in r.models) and "Same model" not in r.summary


def test_idle_gap_histograms_are_non_cumulative_for_the_gpus_that_waited_most() -> None:
    cum = (0.0, 10.0, 10.0, 40.0, 40.0, 40.0, 40.0, 40.0, 40.0, 40.0)
    gaps = {g: GapHistogram(g, GAP_BUCKETS, cum, 30.0) for g in (A0, A1, B0)}
    r = build_report(fleet(gaps=gaps), prometheus="p", generated_at=0, top_gpus=2)
    assert [(g.instance, g.gpu) for g in r.idle_gaps] == [("a:9842", "0"), ("b:9842", "0")]
    g = r.idle_gaps[0]
    assert g.counts == (0.0, 10.0, 0.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0) and g.gaps == 40 and g.mean_gap_s == 0.75


def test_summary_leads_with_the_waited_share_and_the_causes() -> None:
    r = build_report(fleet(), prometheus="p", generated_at=0)
    assert r.summary.startswith("Over 3 hours (1970-01-01T00:00:00Z to 1970-01-01T03:00:00Z), 3 GPUs on 2 hosts "
                                "reported 9.0 GPU-hours (100% of 9.0 possible). 41% of GPU-hours waited")
    assert "(3.7 GPU-hours), 57% worked and 2% were idle. Of the waiting, 57% on input preprocessing (input_bound) " \
        "and 41% on PCIe transfers (transfer_bound). The host that waited most was a:9842" in r.summary
    assert pct(0.001) == "<1%" and pct(0) == "0%" and pct(None) == "n/a"


def test_the_json_validates_against_the_schema_in_the_repository() -> None:
    schema = json.loads((REPO / "docs" / "report.schema.json").read_text())
    track = FindingTrack(B0, "pcie_link_downgraded", (H, H, 0.0))
    data = fleet(by="namespace", findings=[track], groups={"x": {"working": H}}, group_causes={},
                 gaps={A0: GapHistogram(A0, GAP_BUCKETS, (1.0,) * (len(GAP_BUCKETS) + 1), 0.05)})
    doc = json.loads(json.dumps(to_json(build_report(data, prometheus="p", generated_at=1.7e9))))
    jsonschema.validate(doc, schema)
    assert doc["schema_version"] == 1 and doc["generated_at"] == "2023-11-14T22:13:20Z"


def test_every_cause_and_finding_of_the_vocabulary_has_a_label_and_a_fix() -> None:
    assert set(CAUSE_LABELS) == set(WAITING_CAUSES)
    assert set(FIXES) == set(VERDICTS)
    assert set(FINDING_FIXES) == set(FINDINGS) == set(FINDING_LABELS)
    assert all(FIXES[c] for c in WAITING_CAUSES) and all(FINDING_FIXES.values())
    assert set(STATES) == {"working", "waiting", "idle"}


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_raw_fallback_joins_workloads_exactly_as_the_shipped_rules_do() -> None:
    rules = {r["record"]: r["expr"] for g in yaml.safe_load(RECORDING.read_text())["groups"] for r in g["rules"]}
    for by, label, rule in (("namespace", "namespace", "namespace_state:gpufeed_gpu_state_seconds:rate5m"),
                            ("job", "slurm_job_id", "slurm_job_cause:gpufeed_gpu_waiting_seconds:rate5m")):
        assert _squash(workload_join(label)) in _squash(rules[rule])
        raw = group_family_query("group_state", "raw", by, W).expr
        assert _squash(workload_join(label)) in _squash(raw) and f"[{left_open(H)}:5m]" in raw


def test_rule_sums_use_a_left_open_step_and_the_groups_interval() -> None:
    q = gpu_family_query("gpu_state", "rules", W, 30.0)
    assert q.expr == (f"sum by (job, instance, gpu, state) (sum_over_time({GPU_STATE_RULE}[3599999ms])) * 30")
    raw = gpu_family_query("gpu_cause", "raw", W)
    assert raw.expr == "sum by (job, instance, gpu, cause) (increase(gpufeed_gpu_waiting_seconds_total[3600000ms]))"


def _with_energy(data: FleetData, **kw: object) -> FleetData:
    # a's GPU 0 drew 150 W while waiting (input_bound 2.1 h -> 315 Wh), b's GPU 0 100 W (transfer_bound 1.5 h);
    # A1 never waited: no joules.
    j = {A0: {"input_bound": 150 * 2.0 * H, "io_bound": 150 * 0.1 * H}, B0: {"transfer_bound": 100 * 1.5 * H}}
    return dataclasses.replace(data, cause_j=j, **kw)  # type: ignore[arg-type]


def test_energy_and_cost_of_waiting_per_cause_and_per_host_at_the_prices_given() -> None:
    r = build_report(_with_energy(fleet()), prometheus="p", generated_at=0, price_per_gpu_hour=2.0,
                     price_per_kwh=0.5)
    c = r.cost
    assert c.energy_gpus == 2 and c.total.waiting_kwh is not None and c.total.cost is not None
    assert abs(c.total.waiting_kwh - (0.315 + 0.15)) < 1e-9
    assert abs(c.total.cost - (3.7 * 2.0 + 0.465 * 0.5)) < 1e-9
    by_cause = {x.name: x for x in c.by_cause}
    assert abs(by_cause["input_bound"].waiting_kwh - 0.3) < 1e-9  # type: ignore[operator]
    assert abs(by_cause["transfer_bound"].cost - (1.5 * 2.0 + 0.15 * 0.5)) < 1e-9  # type: ignore[operator]
    assert [x.name for x in c.by_group] == ["a:9842", "b:9842"]
    assert "drew 0.47 kWh" in r.summary and "cost 7.6 at the prices given" in r.summary
    assert "GPUs on 2 hosts" in r.summary


def test_without_energy_counters_or_prices_kwh_and_cost_are_unknown_not_zero() -> None:
    c = build_report(fleet(), prometheus="p", generated_at=0).cost
    assert c.energy_gpus == 0 and c.total.waiting_kwh is None and c.total.cost is None
    assert all(x.waiting_kwh is None for x in (*c.by_cause, *c.by_group))


def test_the_time_no_owner_held_is_named_when_it_waited_most() -> None:
    r = build_report(fleet(by="namespace", groups={"vision": {"working": 0.5 * H, "waiting": 0.5 * H}},
                           group_causes={"vision": {"input_bound": 0.5 * H}}), prometheus="p", generated_at=0)
    assert ("More of the waiting than any namespace's, 3.2 GPU-hours (86% of it; 50% of that input_bound), was on "
            "GPUs no namespace held") in r.summary
    assert "of the namespaces, vision waited most (0.5 GPU-hours)" in r.summary
    assert [x.name for x in r.cost.by_group] == ["(no namespace)", "vision"]


def test_small_fleets_and_short_ranges_read_right() -> None:
    from exporter.fleet.figures import hours_text, plural, span_text
    assert [hours_text(h) for h in (0.0, 0.0004, 0.004, 0.034, 0.5, 1.25, 1234.0)] == [
        "0.0", "<0.001", "0.004", "0.034", "0.5", "1.2", "1,234"]
    assert (plural(1, "GPU"), plural(2, "host"), span_text(3600), span_text(1800), span_text(86400 * 7)) == (
        "1 GPU", "2 hosts", "1 hour", "30 minutes", "7 days")
    one = dataclasses.replace(fleet(), state_s={B0: per_step(working=(0.01, 0, 0), waiting=(0.02, 0, 0),
                                                             idle=(0, 0, 0))}, cause_s={B0: {}})
    text = build_report(one, prometheus="p", generated_at=0).summary
    assert "1 GPU on 1 host reported 0.03 GPU-hours" in text and "0.0 GPU-hours" not in text


def test_compare_previous_gives_deltas_per_cause_and_per_host() -> None:
    before = dataclasses.replace(fleet(), cause_s={A0: per_step(input_bound=(0.4, 0.4, 0.4)), A1: {},
                                                   B0: per_step(transfer_bound=(0.5, 0.5, 0.5))})
    r = build_report(_with_energy(fleet()), prometheus="p", generated_at=0, previous=before, price_per_kwh=1.0)
    c = r.comparison
    assert c is not None
    d = {x.name: x for x in c.by_cause}
    assert abs(d["input_bound"].change - (2.1 - 1.2)) < 1e-9 and abs(d["input_bound"].ratio - 0.75) < 1e-9  # type: ignore[operator]
    assert d["transfer_bound"].change == 0
    assert c.waiting_kwh is not None and c.waiting_kwh.before == 0 and c.waiting_kwh.ratio is None
    assert c.waiting_hours.change == 0  # the state seconds are the same in both periods
    assert "input_bound moved most (+0.9 GPU-hours)" in r.summary
    doc = json.loads(json.dumps(to_json(r)))
    jsonschema.validate(doc, json.loads((REPO / "docs" / "report.schema.json").read_text()))


def test_straggler_loss_is_charged_step_by_step_to_the_cause_the_ranks_waited_on() -> None:
    # Job big: 3 ranks wait all of step 0 (a straggler on transfer_bound), 2 ranks half of step 1 (io_bound beats
    # transfer_bound there), 1 rank all of step 2 while no rank waits on its own host (unknown). Job small: less.
    big = JobWaits("llm", "big", (3 * H, 1 * H, 1 * H),
                   {"transfer_bound": (0.9 * H, 0.1 * H, 0.0), "io_bound": (0.0, 0.5 * H, 0.0)})
    small = JobWaits("llm", "small", (0.0, 0.5 * H, 0.0), {"input_bound": (0.0, 0.2 * H, 0.0)})
    data = dataclasses.replace(fleet(), jobs=(small, big), jobs_source="job:gpufeed_gpus_collective_wait:count")
    r = build_report(data, prometheus="p", generated_at=1.7e9, top=1)
    assert r.summary.endswith(" Distributed jobs lost 5.5 GPU-hours waiting for stragglers, most to transfer_bound "
                              "(3.0); big lost most (5.0).")
    s = r.stragglers
    assert [(j.job_id, j.lost_gpu_hours) for j in s.jobs] == [("big", 5.0)]  # --top 1: the larger only
    assert [(c.cause, c.gpu_hours) for c in s.jobs[0].by_cause] == [
        ("transfer_bound", 3.0), ("io_bound", 1.0), ("unknown", 1.0)]
    assert s.jobs[0].peak_ranks_waiting == 3.0
    assert s.lost_gpu_hours == 5.5
    assert [(c.cause, c.gpu_hours) for c in s.by_cause] == [
        ("transfer_bound", 3.0), ("io_bound", 1.0), ("unknown", 1.0), ("input_bound", 0.5)]
    assert stragglers(dataclasses.replace(data, jobs=()), 10).jobs == ()
    doc = json.loads(json.dumps(to_json(build_report(data, prometheus="p", generated_at=1.7e9))))
    jsonschema.validate(doc, json.loads((REPO / "docs" / "report.schema.json").read_text()))
    assert doc["stragglers"]["jobs"][0]["by_cause"][0] == {"cause": "transfer_bound", "gpu_hours": 3.0}


def test_straggler_queries_count_collective_wait_as_the_shipped_rule_does() -> None:
    rules = {r["record"]: r["expr"] for g in yaml.safe_load(RECORDING.read_text())["groups"] for r in g["rules"]}
    shipped = _squash(rules[JOB_COLLECTIVE_RULE])
    (raw, own), source = straggler_queries(W, {})
    assert source == 'gpufeed_gpu_bottleneck{cause="collective_wait"}'
    agg = f"{AGGREGATION}, " if AGGREGATION else ""  # the shipped aggregation labels (cluster)
    ranks = _squash(f'topk by ({agg}job, instance, gpu) (1, gpufeed_workload_info{{job_id!=""}})')
    assert ranks in shipped and ranks in _squash(raw.expr) and ranks in _squash(own.expr)
    assert _squash(source) in shipped and f"[{left_open(H)}:1m])" in raw.expr and raw.expr.endswith("* 60")
    assert 'cause!="latency_bound"' in own.expr and "[3600000ms]" in own.expr
    loaded = {JOB_COLLECTIVE_RULE: RuleInfo(JOB_COLLECTIVE_RULE, "gpufeed-jobs", 60.0, "ok", "")}
    (rule, _), source = straggler_queries(W, loaded)
    assert source == JOB_COLLECTIVE_RULE
    assert rule.expr == f"sum by (namespace, job_id) (sum_over_time({JOB_COLLECTIVE_RULE}[3599999ms])) * 60"
