"""NUMA placement: a process pinned to the wrong socket is a mismatch with its reason; one node never is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.collectors.numa import NumaCollector, parse_static_pids, placement
from exporter.pci import normalize as normalize_bdf
from exporter.samples.topology import NumaSample, Placement
from exporter.sampling import CollectorError, NoDataError, Targets
from tests.support.hosts import context, snapshot_of
from tests.support.hosts import family_series as series
from tests.support.hosts import family_value as value

TWO_NODES = {0: frozenset(range(16)), 1: frozenset(range(16, 32))}
N0, N1 = TWO_NODES[0], TWO_NODES[1]


def place(cpus: frozenset[int], mems: frozenset[int] | None, *, gpu_node: int | None = 0,
          nodes: dict[int, frozenset[int]] | None = None, gpu_cpus: frozenset[int] = N0) -> Placement:
    return placement("0", 100, "python3", gpu_node=gpu_node, gpu_cpus=gpu_cpus,
                     nodes=TWO_NODES if nodes is None else nodes, cpus_allowed=cpus, mems_allowed=mems)


def test_process_pinned_to_the_gpus_socket_is_local() -> None:
    p = place(N0, frozenset({0}))
    assert (p.local_cpu_ratio, p.memory_local, p.reasons, p.mismatch) == (1.0, True, (), False)


def test_process_pinned_to_the_other_socket_is_cpus_and_memory_remote() -> None:
    p = place(N1, frozenset({1}))
    assert p.local_cpu_ratio == 0.0 and p.memory_local is False
    assert p.reasons == ("cpus_remote", "memory_remote") and p.mismatch


def test_local_cpus_with_memory_bound_to_the_other_node_is_memory_remote_only() -> None:
    p = place(N0, frozenset({1}))
    assert p.local_cpu_ratio == 1.0 and p.reasons == ("memory_remote",)


def test_partially_local_process_reports_its_ratio_without_a_mismatch() -> None:
    p = place(frozenset(range(8, 24)), frozenset({0, 1}))
    assert p.local_cpu_ratio == 0.5 and p.memory_local is True and not p.mismatch


def test_unpinned_process_counts_only_cpus_that_exist() -> None:
    # Cpus_allowed_list of an unpinned task spans every possible CPU (here 0-63 on a 32-CPU host).
    p = place(frozenset(range(64)), frozenset({0, 1}))
    assert p.local_cpu_ratio == 0.5 and not p.mismatch


def test_single_node_host_never_mismatches() -> None:
    one = {0: frozenset(range(8))}
    p = place(frozenset({6, 7}), frozenset({0}), nodes=one, gpu_cpus=frozenset(range(8)))
    assert p.local_cpu_ratio == 1.0 and not p.mismatch


def test_gpu_without_numa_affinity_never_mismatches() -> None:
    p = place(N1, frozenset({1}), gpu_node=None, gpu_cpus=frozenset())
    assert p.local_cpu_ratio is None and p.memory_local is None and not p.mismatch


def test_gpu_node_minus_one_with_local_cpulist_still_gives_a_ratio_but_no_verdict() -> None:
    p = place(N1, frozenset({1}), gpu_node=None, gpu_cpus=N0)
    assert p.local_cpu_ratio == 0.0 and not p.mismatch


# ---- the collector on the riser box ------------------------------------------------------------------------

RISER_PIDS = ("0000:01:00.0=4242", "0000:41:00.0=4243", "0000:01:00.0=4244", "0000:01:00.0=4245")


def riser_sample(**kw: Any) -> tuple[NumaCollector, NumaSample]:
    c = NumaCollector(context("riser", **kw))
    return c, c.update()


def test_riser_static_pids_give_each_placement_its_reason() -> None:
    c, s = riser_sample(options={"pids": RISER_PIDS})
    assert dict(s.nodes) == TWO_NODES
    by_pid = {p.pid: p for p in s.placements}
    assert by_pid[4242].gpu == "0000:01:00.0" and by_pid[4242].gpu_node == 0
    assert by_pid[4242].reasons == ("cpus_remote", "memory_remote")
    assert by_pid[4243].gpu_node == 1 and by_pid[4243].reasons == () and by_pid[4243].local_cpu_ratio == 1.0
    assert by_pid[4244].reasons == ("memory_remote",)
    assert by_pid[4245].local_cpu_ratio == 0.5 and by_pid[4245].reasons == ()
    fams = list(c.metrics(snapshot_of("numa", s)))
    assert value(fams, "gpufeed_process_numa_mismatch", pid="4242", reason="cpus_remote") == 1
    assert value(fams, "gpufeed_process_numa_mismatch", pid="4244", reason="cpus_remote") is None  # its CPUs are local
    assert value(fams, "gpufeed_process_numa_mismatch", pid="4244", reason="memory_remote") == 1
    assert value(fams, "gpufeed_process_numa_local_cpu_ratio", pid="4245", gpu="0000:01:00.0", comm="python3") == 0.5
    assert not series(fams, "gpufeed_numa_node_cpus"), "each node's CPUs are the cpu collector's gpufeed_cpu_node_cpus"


def test_gpu_collector_targets_are_resolved_through_published_bus_ids() -> None:
    targets = Targets()
    targets.publish({"0": [4242], "1": [4243]}, {"0": "00000000:01:00.0", "1": "0000:41:00.0"})
    _c, s = riser_sample(targets=targets)
    by_pid = {p.pid: p for p in s.placements}
    assert by_pid[4242].gpu == "0" and by_pid[4242].mismatch
    assert by_pid[4243].gpu == "1" and not by_pid[4243].mismatch


def test_gpu_index_without_a_bus_id_is_skipped_not_guessed() -> None:
    targets = Targets()
    targets.publish({"0": [4242]})
    _, s = riser_sample(targets=targets)
    assert s.placements == ()


def test_gpu_keyed_by_bdf_works_without_the_gpu_collector() -> None:
    targets = Targets()
    targets.publish({"0000:41:00.0": [4242]})
    _, s = riser_sample(targets=targets)
    assert [(p.gpu, p.pid, p.local_cpu_ratio) for p in s.placements] == [("0000:41:00.0", 4242, 1.0)]


def test_exited_process_is_skipped() -> None:
    _, s = riser_sample(options={"pids": ("0000:01:00.0=4242", "0000:01:00.0=999999")})
    assert [p.pid for p in s.placements] == [4242]


def test_malformed_status_is_skipped(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(context("riser").sysfs, tmp_path / "sys", symlinks=True)
    (tmp_path / "proc" / "77").mkdir(parents=True)
    (tmp_path / "proc" / "77" / "status").write_text("Name:\tx\nCpus_allowed_list:\t0-\n")
    c = NumaCollector(context(tmp_path, options={"pids": ("0000:01:00.0=77",)}))
    assert c.update().placements == ()


@pytest.mark.parametrize("bad", ["4242", "=4242", "0000:01:00.0=", "0=abc", "0=-1"])
def test_bad_static_pid_entry_is_rejected_with_the_entry_named(bad: str) -> None:
    with pytest.raises(ValueError, match="bad entry"):
        parse_static_pids((bad,))


def test_bus_ids_from_nvml_are_normalised_to_sysfs_form() -> None:
    assert normalize_bdf("00000000:41:00.0") == "0000:41:00.0"
    assert normalize_bdf("0000:AB:00.1") == "0000:ab:00.1"
    assert normalize_bdf("0") is None


def test_kernel_without_numa_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    with pytest.raises(NoDataError):
        NumaCollector(context(tmp_path)).update()


def test_corrupt_node_cpulist_is_a_failure_naming_the_file(tmp_path: Path) -> None:
    node = tmp_path / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-x\n")
    with pytest.raises(CollectorError, match="node0/cpulist"):
        NumaCollector(context(tmp_path)).update()


def test_this_hosts_real_nodes_are_read() -> None:
    from exporter.sampling import CollectorContext

    c = NumaCollector(CollectorContext(procfs=Path("/proc"), sysfs=Path("/sys")))
    if not Path("/sys/devices/system/node/node0").is_dir():
        with pytest.raises(NoDataError):
            c.update()
        return
    s = c.update()
    assert 0 in s.nodes and s.nodes[0] and s.placements == ()
