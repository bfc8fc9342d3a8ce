"""cpu: per-core /proc/stat at high rate, per-NUMA-node sums exported, counters monotonic across hotplug."""

from __future__ import annotations

import gc
import shutil
from array import array
from collections.abc import Mapping
from pathlib import Path

from exporter.collectors.cpu import MODES, CpuCollector, CpuState, TimesView, parse_stat
from exporter.samples.host import CpuSample
from exporter.sources import USER_HZ
from tests.support.gctrack import tracked_inside, walk_now
from tests.support.hosts import CAPTURE, LARGE, exposition, make, run_engine, series


def _stat_lines(ticks: Mapping[int, tuple[int, ...]]) -> str:
    return "cpu  0 0 0 0 0 0 0 0 0 0\n" + "".join(
        f"cpu{c} " + " ".join(map(str, t)) + " 0 0\n" for c, t in sorted(ticks.items())
    ) + "intr 1\nctxt 2\n"


def test_large_host_exports_two_numa_nodes_of_96_cpus_and_no_per_core_series() -> None:
    eng = run_engine(make("cpu", LARGE))
    s = series(exposition(eng))
    assert s['gpufeed_cpu_node_cpus{node="0"}'] == 96
    assert s['gpufeed_cpu_node_cpus{node="1"}'] == 96
    assert not any(k.startswith("gpufeed_cpu_seconds_total") for k in s)
    assert len([k for k in s if k.startswith("gpufeed_cpu_node_seconds_total")]) == 2 * len(MODES)
    # Node sums are exactly the sum of the node's per-CPU lines (first reading seeds them).
    raw = parse_stat((LARGE / "proc" / "stat").read_text())
    node0 = (*range(0, 48), *range(96, 144))
    expected_user0 = sum(raw[c][0] for c in node0) / USER_HZ
    assert s['gpufeed_cpu_node_seconds_total{mode="user",node="0"}'] == expected_user0


def test_sample_keeps_every_core_for_the_derived_layer_with_its_node() -> None:
    eng = run_engine(make("cpu", LARGE))
    sample: CpuSample = eng.snapshot.value("cpu")
    assert len(sample.cpus) == 192
    assert sample.node_of[0] == 0 and sample.node_of[47] == 0 and sample.node_of[48] == 1
    assert sample.node_of[96] == 0 and sample.node_of[144] == 1
    raw = parse_stat((LARGE / "proc" / "stat").read_text())
    assert sample.cpus[17].user == raw[17][0] / USER_HZ
    assert sample.cpus[17].iowait == raw[17][4] / USER_HZ


def test_a_cpu_sample_is_two_objects_for_the_cycle_collector_however_many_cpus() -> None:
    # Issue 14: a CpuTimes kept per CPU per sample (a 192-CPU host, 4 samples a second) made full collections
    # traverse thousands of objects. The ticks are one packed int64 array per view: nothing for a collection to
    # walk from the first one on (a dict of 192 fresh tuples stayed tracked until a full collection, and every
    # middle collection before it walked its 384 keys and values, for each of the ~50 kept samples).
    eng = run_engine(make("cpu", LARGE))
    sample: CpuSample = eng.snapshot.value("cpu")
    assert sample.cpus[17].busy > 0 and sample.node_totals[1].total > 0
    assert walk_now(sample.cpus) <= 4 and walk_now(sample.node_totals) <= 4
    assert tracked_inside(sample.cpus) == [sample.cpus, *[o for o in gc.get_referents(sample.cpus)
                                                         if isinstance(o, array)]]


def test_samples_of_one_cpu_set_share_their_row_index() -> None:
    col = make("cpu", LARGE)
    eng = run_engine(col, until=1.0)
    samples = [s.value for s in eng.history("cpu")]
    assert len(samples) >= 4
    assert {id(s.cpus.index) for s in samples if isinstance(s.cpus, TimesView)} == {id(samples[-1].cpus.index)}


def test_per_core_option_exports_every_cpu_and_mode() -> None:
    eng = run_engine(make("cpu", LARGE, options={"per-core": True}))
    s = series(exposition(eng))
    assert len([k for k in s if k.startswith("gpufeed_cpu_seconds_total")]) == 192 * len(MODES)
    assert 'gpufeed_cpu_seconds_total{cpu="191",mode="steal"}' in s


def test_captured_machine_parses_with_one_node() -> None:
    eng = run_engine(make("cpu", CAPTURE))
    assert eng.snapshot.status["cpu"].success
    sample: CpuSample = eng.snapshot.value("cpu")
    assert set(sample.node_totals) == {0}
    assert len(sample.cpus) >= 1


def test_host_without_numa_sysfs_counts_every_cpu_in_node_0(large: Path) -> None:
    shutil.rmtree(large / "sys" / "devices" / "system" / "node")
    eng = run_engine(make("cpu", large))
    sample: CpuSample = eng.snapshot.value("cpu")
    assert dict(sample.node_of) == {}
    s = series(exposition(eng))
    assert s['gpufeed_cpu_node_cpus{node="0"}'] == 192
    assert 'gpufeed_cpu_node_cpus{node="1"}' not in s


def test_counter_jumping_back_slightly_is_ignored_like_node_exporter() -> None:
    st = CpuState()
    st.update({0: (100, 0, 50, 1000, 0, 0, 0, 0)}, {})
    st.update({0: (99, 0, 60, 1100, 0, 0, 0, 0)}, {})  # user went back by one tick: keep 100
    assert st.cpus[0][0] == 100
    assert tuple(st.nodes[0]) == (100, 0, 60, 1100, 0, 0, 0, 0)


def test_idle_jumping_back_is_a_hotplug_reset_and_node_sums_stay_monotonic() -> None:
    st = CpuState()
    st.update({0: (100, 0, 50, 1000, 0, 0, 0, 0), 1: (10, 0, 5, 1000, 0, 0, 0, 0)}, {0: 0, 1: 0})
    before = st.nodes[0]
    reset = st.update({0: (110, 0, 50, 1010, 0, 0, 0, 0), 1: (1, 0, 0, 5, 0, 0, 0, 0)}, {0: 0, 1: 0})
    assert reset == (1,)
    assert tuple(st.cpus[1]) == (1, 0, 0, 5, 0, 0, 0, 0)  # per-CPU restarts, like node_exporter
    assert all(a >= b for a, b in zip(st.nodes[0], before, strict=True))
    assert st.nodes[0][0] == 120  # only cpu0's +10 user; the reset CPU contributed nothing


def test_cpu_going_offline_and_back_never_makes_node_counters_go_backwards(large: Path) -> None:
    """Hotplug through the collector: cpu5 disappears from /proc/stat, then returns with restarted counters."""
    stat = large / "proc" / "stat"
    ticks = {c: (1000 + c, 0, 500, 100_000, 10, 0, 5, 0) for c in range(8)}
    stat.write_text(_stat_lines(ticks))
    col = make("cpu", large)
    assert isinstance(col, CpuCollector)
    s1 = col.update()
    gone = {c: t for c, t in ticks.items() if c != 5}
    stat.write_text(_stat_lines(gone))
    s2 = col.update()
    back = {**{c: (t[0] + 100, *t[1:]) for c, t in gone.items()}, 5: (3, 0, 1, 40, 0, 0, 0, 0)}
    stat.write_text(_stat_lines(back))
    s3 = col.update()
    assert 5 not in s2.cpus and 5 in s3.cpus
    for a, b in ((s1, s2), (s2, s3)):
        for mode in MODES:
            assert getattr(b.node_totals[0], mode) >= getattr(a.node_totals[0], mode)
    assert s3.node_totals[0].user == s1.node_totals[0].user + 7 * 100 / USER_HZ


def test_numa_layout_is_reread_when_the_cpu_set_changes(large: Path) -> None:
    stat = large / "proc" / "stat"
    stat.write_text(_stat_lines({0: (1, 0, 1, 1, 0, 0, 0, 0), 1: (1, 0, 1, 1, 0, 0, 0, 0)}))
    nodes = large / "sys" / "devices" / "system" / "node"
    shutil.rmtree(nodes)
    (nodes / "node0").mkdir(parents=True)
    (nodes / "node0" / "cpulist").write_text("0-1\n")
    col = make("cpu", large)
    assert dict(col.update().node_of) == {0: 0, 1: 0}
    (nodes / "node0" / "cpulist").write_text("0-1\n")
    (nodes / "node1").mkdir()
    (nodes / "node1" / "cpulist").write_text("2\n")
    assert dict(col.update().node_of) == {0: 0, 1: 0}  # same CPU set: not re-read
    stat.write_text(_stat_lines({c: (1, 0, 1, 1, 0, 0, 0, 0) for c in range(3)}))
    assert dict(col.update().node_of) == {0: 0, 1: 0, 2: 1}
