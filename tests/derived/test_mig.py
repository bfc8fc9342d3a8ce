"""MIG: a GPU in MIG mode is judged per instance (labels gpu and mig, DESIGN.md), through the real simulator,
collectors, engine and analyzer; never ``idle`` while an instance works; no made-up verdict where nothing
measures an instance (MIG without GPM)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client.core import Metric

from exporter.derived.analyzer import Analyzer
from exporter.derived.evaluate import MIG_NO_GPM
from exporter.diagnose import report
from exporter.samples.derived import DerivedState
from exporter.samples.gpu import GpuKey
from exporter.sampling import Targets
from exporter.sim.player import PlayResult, play
from exporter.sim.scenario import load
from exporter.snapshot import Snapshot, Stamped
from tests.support.plays import played

SCENARIO = Path(__file__).parent / "scenarios" / "mig_instances.yaml"


def _samples(state: DerivedState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    snap = Snapshot(version=1, t=state.t, latest={"derived": Stamped(state.t, state)})
    fams: list[Metric] = list(Analyzer({}, Targets()).metrics(snap))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


def _mixed(res: PlayResult) -> DerivedState:
    st = next(p.state for p in res.phases if p.name == "mixed")
    assert st is not None
    return st


def test_a_mig_gpu_is_never_idle_while_an_instance_works_and_each_instance_has_its_own_verdict() -> None:
    res = played(SCENARIO)
    assert report.check(res) == []
    busy_from = 30.0 + 15.0  # the mixed phase, once the verdict had its window
    for t, st in res.timeline:
        assert 0 not in st.gpus, "the MIG GPU itself is not judged: its instances are"
        if t > busy_from:
            assert st.mig[GpuKey(0, 1)].cause == "healthy", t
            assert st.mig[GpuKey(0, 2)].cause == "launch_bound", t
    st = _mixed(res)
    # The waiting instance's evidence is its own process, not the other instance's.
    assert any("6200" in e for e in st.mig[GpuKey(0, 2)].evidence)
    assert not any("6100" in e for e in st.mig[GpuKey(0, 2)].evidence)
    assert st.mig[GpuKey(0, 1)].uuid == "MIG-00000000-0000-0000-0000-000000000000-1"


def test_state_time_and_waiting_causes_are_split_per_mig_instance_in_the_exposition() -> None:
    st = _mixed(played(SCENARIO))
    s = _samples(st)

    def v(name: str, **labels: str) -> float:
        return s[(name, tuple(sorted(labels.items())))]

    launch = v("gpufeed_gpu_waiting_seconds_total", gpu="0", mig="2", cause="launch_bound")
    assert launch > 20.0
    # A cause appears with its first waiting second: absent is none at all.
    assert s.get(("gpufeed_gpu_waiting_seconds_total", (("cause", "launch_bound"), ("gpu", "0"), ("mig", "1"))),
                 0.0) < 5.0
    assert v("gpufeed_gpu_state_seconds_total", gpu="0", mig="1", state="working") > 40.0
    assert v("gpufeed_gpu_bottleneck", gpu="0", mig="2", cause="launch_bound") == 1.0
    assert v("gpufeed_gpu_bottleneck", gpu="0", mig="5", cause="idle") == 1.0
    # The whole GPU of a MIG GPU has no verdict series; a GPU without MIG keeps its labels unchanged.
    assert not [k for k in s if k[0] == "gpufeed_gpu_bottleneck" and ("gpu", "0") in k[1] and "mig" not in dict(k[1])]
    assert v("gpufeed_gpu_bottleneck", gpu="1", cause="healthy") == 1.0
    assert not [k for k in s if ("gpu", "1") in k[1] and "mig" in dict(k[1])]


def test_the_report_lists_a_mig_gpu_once_per_instance() -> None:
    doc = report.scenario_document(played(SCENARIO), timeline=True)
    mixed = doc["phases"][-1]["gpus"]
    assert [(g["index"], g.get("mig"), g["cause"]) for g in mixed] == [
        (0, 1, "healthy"), (0, 2, "launch_bound"), (0, 5, "idle"), (1, None, "healthy")]
    assert mixed[1]["next_check"].startswith("top -H -p 6200")
    assert "mig" not in mixed[3], "entries of a GPU without MIG keep the SPEC shape"
    assert {"t", "gpu", "mig", "cause"} == set(next(r for r in doc["timeline"] if "mig" in r))


def test_mig_without_gpm_gives_no_verdict_never_idle_and_a_nonzero_exit() -> None:
    sc = load(SCENARIO)
    sc = dataclasses.replace(sc, gpus=tuple(dataclasses.replace(g, gpm=False, name="NVIDIA A100-SXM4-80GB")
                                            for g in sc.gpus))
    res = play(sc, timeline=True)
    for _, st in res.timeline:
        assert not st.mig and 0 not in st.gpus, "nothing measures a MIG instance without GPM: no verdict"
        if st.gpus:  # once the GPUs were enumerated
            assert set(st.unjudged) == {GpuKey(0, 1), GpuKey(0, 2), GpuKey(0, 5)}
    doc = report.scenario_document(res)
    entries = [g for g in doc["phases"][-1]["gpus"] if g["index"] == 0]
    assert [(g["mig"], g["cause"]) for g in entries] == [(1, None), (2, None), (5, None)]
    assert entries[0]["evidence"] == [MIG_NO_GPM]
    assert report.exit_code(doc) == 1, "no verdict is not 'all quiet'"


def test_an_expectation_on_a_mig_gpu_names_its_instances() -> None:
    failures = report.check(dataclasses.replace(
        played(SCENARIO), scenario=dataclasses.replace(load(SCENARIO), expect=(dataclasses.replace(
            load(SCENARIO).expect[1], mig={(0, 2): "healthy"}),))))
    assert failures == ["phase 'mixed': GPU 0 MIG 2: expected healthy, got launch_bound"]
