"""The workload collector and the cgroup formats: process trees, container / job groups, quotas, bad files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exporter import cgroup as cg
from exporter.collectors.workload import WorkloadCollector
from exporter.samples.workload import WorkloadSample
from exporter.sampling import CollectorContext, Targets
from exporter.sim.model import Model
from exporter.sim.render import Renderer
from exporter.sim.scenario import load

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios" / "workloads"
CTR = "3b2a1c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809"


@pytest.mark.parametrize("path,kind,want", [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c2d3e_aaaa_4bbb_8ccc_0123456789ab.slice/"
     f"cri-containerd-{CTR}.scope", "container",
     {"container_id": CTR, "runtime": "containerd", "pod_uid": "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab"}),
    (f"/kubepods.slice/kubepods-pod11112222_3333_4444_5555_666677778888.slice/crio-{CTR}.scope", "container",
     {"container_id": CTR, "runtime": "cri-o", "pod_uid": "11112222-3333-4444-5555-666677778888"}),
    (f"/kubepods/burstable/pod0d1e2f3a-bbbb-4ccc-8ddd-0123456789ab/{CTR}", "container",
     {"container_id": CTR, "runtime": "cri", "pod_uid": "0d1e2f3a-bbbb-4ccc-8ddd-0123456789ab"}),
    (f"/system.slice/docker-{CTR}.scope", "container", {"container_id": CTR, "runtime": "docker"}),
    (f"/docker/{CTR}", "container", {"container_id": CTR, "runtime": "docker"}),
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "slurm_job", {"slurm_job_id": "4242"}),
    ("/slurm/uid_1000/job_77/step_batch", "slurm_job", {"slurm_job_id": "77"}),
    ("/system.slice/trainer.service", "unit", {"unit": "trainer.service"}),
    ("/user.slice/user-1000.slice/session-3.scope", "unit", {"unit": "session-3.scope"}),
])
def test_cgroup_path_names_its_owner(path: str, kind: str, want: dict[str, str]) -> None:
    o = cg.owner_of(path)
    assert o.kind == kind
    for k, v in want.items():
        assert getattr(o, k) == v
    assert o.group is not None and path.startswith(o.group)


@pytest.mark.parametrize("path", ["/", "/system.slice", "/user.slice/user-1000.slice", "/init.scope",
                                  "/kubepods.slice/kubepods-burstable.slice", "/system.slice/kubelet.service"])
def test_shared_slices_and_the_root_own_no_workload(path: str) -> None:
    assert cg.owner_of(path).group is None


def test_slurm_steps_belong_to_their_job_group() -> None:
    assert cg.owner_of("/system.slice/slurmstepd.scope/job_9/step_1/user/task_3").group == \
        "/system.slice/slurmstepd.scope/job_9"


def test_proc_cgroup_v1_v2_and_hybrid_lines() -> None:
    v2 = cg.parse_proc_cgroup("0::/system.slice/trainer.service\n")
    assert v2.path == "/system.slice/trainer.service"
    v1 = cg.parse_proc_cgroup("12:pids:/slurm/job_1\n4:cpu,cpuacct:/slurm/job_1\n1:name=systemd:/x.scope\n")
    assert v1.v1("cpu") == ("cpu,cpuacct", "/slurm/job_1") and v1.path == "/slurm/job_1"
    hybrid = cg.parse_proc_cgroup("1:cpu:/a.scope\n0::/\n")
    assert hybrid.path == "/a.scope"
    with pytest.raises(cg.CgroupFormatError):
        cg.parse_proc_cgroup("garbage\n")


def test_cgroup_file_formats() -> None:
    assert cg.parse_cpu_max("60000 100000\n") == (0.6, 100000)
    assert cg.parse_cpu_max("max 100000\n") == (None, 100000)
    assert cg.parse_cfs("-1\n", "100000\n") == (None, 100000)
    assert cg.parse_cfs("150000\n", "100000\n") == (1.5, 100000)
    assert cg.parse_memory_limit("max\n", 2) is None
    assert cg.parse_memory_limit("9223372036854771712\n", 1) is None
    assert cg.parse_memory_limit("8589934592\n", 1) == 8589934592
    for bad in ("60000\n", "x 100000\n", "60000 0\n"):
        with pytest.raises(cg.CgroupFormatError):
            cg.parse_cpu_max(bad)
    with pytest.raises(cg.CgroupFormatError):
        cg.parse_flat_keyed("nr_periods ten\n")
    env = b"PATH=/bin\0NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b\0SECRET=x\0"
    assert cg.visible_devices(env) == ("GPU-a", "GPU-b")
    assert cg.visible_devices(b"PATH=/bin\0") is None


def _rendered(tmp_path: Path, name: str, t: float = 20.0) -> Path:
    sc = load(SCENARIOS / f"{name}.yaml")
    r = Renderer(Model(sc), tmp_path, atomic=False)
    r.setup()
    r.render(t)
    return tmp_path


def _collector(root: Path, gpu_pids: dict[str, list[int]]) -> WorkloadCollector:
    targets = Targets()
    targets.publish(gpu_pids)
    return WorkloadCollector(CollectorContext(procfs=root / "proc", sysfs=root / "sys", targets=targets,
                                              options={"container-env": True, "max-processes": 2048}))


def test_descendants_of_the_gpu_process_are_its_workload_and_published_for_inspection(tmp_path: Path) -> None:
    col = _collector(_rendered(tmp_path, "dataloader_eight_workers_64cpu"), {"0": [5000]})
    s = col.update()
    assert isinstance(s, WorkloadSample)
    workers = {p for p, n in s.processes.items() if n.ppid == 5000}
    assert len(workers) == 8 and all(s.processes[p].comm == "pt_data_worker" for p in workers)
    assert col.ctx.targets.workload_pids() == frozenset(workers)


def test_container_cgroup_v2_quota_throttling_and_identity(tmp_path: Path) -> None:
    col = _collector(_rendered(tmp_path, "k8s_cpu_quota_v2"), {"0": [7100]})
    g = next(iter(col.update().groups.values()))
    assert g.kind == "container" and g.container_id == CTR and g.runtime == "containerd"
    assert g.quota_cores == pytest.approx(0.6) and g.cpu is not None and g.cpu.nr_throttled and g.cpu.nr_periods
    assert g.cpu.nr_throttled / g.cpu.nr_periods > 0.95
    assert g.members == frozenset({7100}) and not g.errors


def test_container_cgroup_v1_reads_cfs_quota_and_throttled_time_in_ns(tmp_path: Path) -> None:
    col = _collector(_rendered(tmp_path, "k8s_cpu_quota_v1"), {"0": [8100]})
    s = col.update()
    assert s.cgroup_version == 1
    g = next(iter(s.groups.values()))
    assert g.quota_cores == pytest.approx(0.6) and g.members == frozenset({8100, 8200})
    assert g.cpu is not None and g.cpu.throttled_s == pytest.approx(0.4 * 20.0, rel=0.01)
    assert g.pressure == {}  # v1 has no per-cgroup PSI


def test_a_malformed_cgroup_file_leaves_that_value_unknown_and_names_the_file(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    root = _rendered(tmp_path, "k8s_cpu_quota_v2")
    cpumax = next((root / "sys" / "fs" / "cgroup").rglob("cri-containerd-*.scope")) / "cpu.max"
    cpumax.write_text("sixty thousand\n")
    col = _collector(root, {"0": [7100]})
    g = next(iter(col.update().groups.values()))
    assert g.quota_cores is None and any("cpu.max" in e for e in g.errors)
    assert g.cpu is not None  # the rest is still read


def test_an_unreadable_cgroup_file_is_recorded_not_fatal(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "k8s_cpu_quota_v2")
    stat = next((root / "sys" / "fs" / "cgroup").rglob("cri-containerd-*.scope")) / "cpu.stat"
    stat.unlink()
    stat.mkdir()  # reading a directory fails with EISDIR: root can read every mode, not this
    g = next(iter(_collector(root, {"0": [7100]}).update().groups.values()))
    assert g.cpu is None and any("cpu.stat" in e for e in g.errors)


def test_a_malformed_proc_cgroup_keeps_the_process_tree(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "k8s_cpu_quota_v2")
    (root / "proc" / "7100" / "cgroup").write_text("not a cgroup line\n")
    s = _collector(root, {"0": [7100]}).update()
    assert 7100 in s.processes and not s.groups


def test_no_cgroup_hierarchy_is_a_note_not_a_failure(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "dataloader_one_worker")
    shutil.rmtree(root / "sys" / "fs" / "cgroup")
    s = _collector(root, {"0": [4242]}).update()
    assert s.cgroup_version is None and s.note and "cgroup" in s.note and 4300 in s.processes


def test_the_process_table_is_read_incrementally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _rendered(tmp_path, "dataloader_eight_workers_64cpu")
    col = _collector(root, {"0": [5000]})
    col.update()
    reads: list[int] = []
    real = col._stat

    def counting(pid: int) -> object:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(col, "_stat", counting)
    col.update()
    # Nothing new, nobody re-parented: only the workload's own pids are looked up again (their start times,
    # against pid reuse), not the rest of the host's table.
    assert sorted(reads) == [5000, 5101, 5103, 5105, 5107, 5109, 5111, 5113, 5115]
    reads.clear()
    shutil.rmtree(root / "proc" / "5000")  # the trainer exits: its workers are re-read (re-parented)
    col.update()
    assert sorted(reads) == [5101, 5103, 5105, 5107, 5109, 5111, 5113, 5115]


def test_a_gpu_with_no_nvml_process_finds_the_container_that_sees_it(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "pod_without_nvml_process")
    s = _collector(root, {"0": [], "1": []}).update()
    seen = [g for g in s.groups.values() if g.visible_devices]
    assert len(seen) == 1 and seen[0].members == frozenset({9000})
    assert seen[0].visible_devices == ("GPU-00000000-0000-0000-0000-000000000000",)


def test_environ_of_containers_is_not_read_when_disabled(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "pod_without_nvml_process")
    col = _collector(root, {"0": [], "1": []})
    col.container_env = False
    assert not col.update().groups
    assert os.path.exists(root / "proc" / "9000" / "environ")


def _impostor(root: Path, pid: int, *, ppid: int = 1, start: int = 999999, comm: str = "imposter") -> None:
    """Another process takes ``pid``: its stat says a new parent and a later start time."""
    f = root / "proc" / str(pid) / "stat"
    fields = f.read_text().split()
    fields[1], fields[3], fields[21] = f"({comm})", str(ppid), str(start)
    f.write_text(" ".join(fields) + "\n")


def test_a_process_that_reuses_a_workers_pid_is_not_the_gpus_workload(tmp_path: Path) -> None:
    # N5: the table was re-read only when a parent vanished; the impostor was counted as the GPU's workload.
    root = _rendered(tmp_path, "dataloader_eight_workers_64cpu")
    col = _collector(root, {"0": [5000]})
    assert 5101 in col.update().processes
    _impostor(root, 5101)
    s = col.update()
    assert 5101 not in s.processes and 5103 in s.processes
    assert 5101 not in col.ctx.targets.workload_pids()


def test_a_pid_reused_under_the_same_parent_is_read_as_the_new_process(tmp_path: Path) -> None:
    root = _rendered(tmp_path, "dataloader_eight_workers_64cpu")
    col = _collector(root, {"0": [5000]})
    col.update()
    _impostor(root, 5101, ppid=5000, comm="new_worker")  # the trainer forked again and the pid came back
    s = col.update()
    assert s.processes[5101].comm == "new_worker" and s.processes[5101].start == 999999


@pytest.mark.parametrize("name,body", [
    ("cpu.max", "9" * 400 + " 100000\n"),  # OverflowError: integer division result too large for a float
    ("cpu.stat", "usage_usec " + "9" * 400 + "\nuser_usec 1\nsystem_usec 1\nnr_periods 10\nnr_throttled 1\n"
                 "throttled_usec 5\n"),  # OverflowError: int too large to convert to float
])
def test_a_number_too_large_to_convert_is_that_value_unknown_not_a_failed_collector(
        name: str, body: str, tmp_path: Path) -> None:
    # N7: both failed the whole workload collector (the container label gone for ~16 s each).
    root = _rendered(tmp_path, "k8s_cpu_quota_v2")
    (next((root / "sys" / "fs" / "cgroup").rglob("cri-containerd-*.scope")) / name).write_text(body)
    s = _collector(root, {"0": [7100]}).update()
    g = next(iter(s.groups.values()))
    assert g.container_id == CTR and g.members == frozenset({7100}) and any(name in e for e in g.errors)
    if name == "cpu.max":
        assert g.quota_cores is None and g.cpu is not None
    else:
        assert g.quota_cores == pytest.approx(0.6)
        assert g.cpu is not None and g.cpu.usage_s is None and g.cpu.nr_throttled == 1  # the rest still read


def test_a_cgroup_procs_over_64_kib_still_gives_the_members(tmp_path: Path) -> None:
    # 12,000 pids (70 KB): the members were unknown and the container label dropped.
    root = _rendered(tmp_path, "k8s_cpu_quota_v2")
    procs = next((root / "sys" / "fs" / "cgroup").rglob("cri-containerd-*.scope")) / "cgroup.procs"
    procs.write_text("7100\n" + "".join(f"{p}\n" for p in range(1_000_000, 1_012_000)))
    g = next(iter(_collector(root, {"0": [7100]}).update().groups.values()))
    assert 7100 in g.members and len(g.members) == 12_001 and not g.errors


def test_proc_net_tcp_gives_the_remote_end_of_each_established_connection() -> None:
    from exporter.collectors.workload import parse_tcp

    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:9BC0 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 440423 1 0\n"
        "   1: 0500000A:D2F0 0A00000A:01BB 01 00000000:00000000 00:00000000 00000000  1000        0 512345 1 0\n"
        "   2: 00000000000000000000000001000000:A000 0000000000000000FFFF00000500000A:0050 01 00000000:00000000"
        " 00:00000000 00000000 0 0 777 1 0\n"
        "   3: 00000000000000000000000001000000:A001 B80D0120000000000000000001000000:0050 01 00000000:00000000"
        " 00:00000000 00000000 0 0 778 1 0\n"
    )
    assert parse_tcp(text) == {512345: "10.0.0.10:443", 777: "10.0.0.5:80", 778: "[2001:db8::1]:80"}
