"""The workload shapes real hosts showed wrong (reviews/realism.md), as tables: CPU shape in, verdict and
evidence out -- the pure side of tests/test_workload_real.py."""

from __future__ import annotations

from exporter.derived.hostshape import CpuShape, ProcLoad, ThreadLoad
from exporter.derived.verdict import _cpu_verdict, corroborated, input_side, network_wait


def shape(threads: tuple[ThreadLoad, ...] = (), processes: tuple[ProcLoad, ...] = (), **kw: object) -> CpuShape:
    base: dict[str, object] = dict(
        pids=tuple(sorted({p.pid for p in processes} | {t.pid for t in threads})), allowed_cpus=2,
        process_cores=sum(p.cores for p in processes if p.context), process_system_share=0.05, threads=threads,
        allowed_busy_cores=None, allowed_saturated=0, allowed_user_share=None, allowed_iowait=None,
        d_state_threads=0.0, read_bytes_per_s=None, read_syscalls_per_s=None, processes=processes)
    base.update(kw)
    return CpuShape(**base)  # type: ignore[arg-type]


def test_eight_starved_workers_say_the_cpu_they_want_beside_saturated() -> None:
    workers = tuple(ProcLoad(200 + i, "pt_data_worker", 100, 0.05, False) for i in range(8))
    threads = tuple(ThreadLoad(200 + i, 200 + i, "pt_data_worker", 0.05, 0.02, "R", 0.9, None, False)
                    for i in range(8))
    s = shape((*threads, ThreadLoad(100, 100, "python", 0.01, 0.1, "S")),
              (ProcLoad(100, "python", 1, 0.01, True), *workers))
    cause, _, why = _cpu_verdict(s, input_side(s))
    assert cause == "input_bound"
    assert "8 pt_data_worker processes of pid 100 at 0.4 cores wanting 7.6" in why[0] and "run delay" in why[0]
    assert any("own run queue" in w for w in why)  # 7.6 cores wanted on 2 CPUs: its own, not neighbours'


def test_a_saturated_main_thread_without_workers_names_loading_in_the_main_process() -> None:
    s = shape((ThreadLoad(100, 100, "python", 0.9, 0.05, "R"),), (ProcLoad(100, "python", 1, 0.9, True),))
    cause, _, why = _cpu_verdict(s, input_side(s))
    assert cause == "launch_bound"
    assert any("num_workers=0" in w for w in why)


def test_filling_the_cpus_without_a_stage_never_says_preprocessing_holds_nothing() -> None:
    threads = tuple(ThreadLoad(100, 101 + i, f"worker{i}", 0.24, 0.05, "R") for i in range(8))
    s = shape(threads, (ProcLoad(100, "python", 1, 1.9, True),))
    cause, _, why = _cpu_verdict(s, input_side(s))
    assert cause == "input_bound"
    assert not any("holds 0.00" in w for w in why) and any("share them" in w for w in why)


def test_page_cache_reads_corroborate_nothing_unless_read_bytes_is_unknown() -> None:
    cached = shape(read_bytes_per_s=8e6, read_syscalls_per_s=2000.0, storage_read_bytes_per_s=0.0)
    assert corroborated(cached) == ""
    assert corroborated(cached, network_fs=True) == "it reads"  # NFS reads may not show in read_bytes
    assert corroborated(shape(read_bytes_per_s=8e6, read_syscalls_per_s=2000.0)) == "it reads"


def test_idle_workers_asleep_on_sockets_name_the_remote_and_busy_ones_do_not() -> None:
    workers = (ProcLoad(200, "pt_data_worker", 100, 0.01, False), ProcLoad(201, "pt_data_worker", 100, 0.01, False))
    net = ((200, 1, ("10.0.0.8:443",)), (201, 1, ("10.0.0.9:443",)))
    lines = network_wait(shape(processes=workers, network=net))
    assert lines and "10.0.0.8:443, 10.0.0.9:443" in lines[0] and "2 worker processes" in lines[0]
    busy = (ProcLoad(200, "pt_data_worker", 100, 0.9, False), workers[1])
    assert network_wait(shape(processes=busy, network=net)) == []  # on the CPU: not waiting on the network
    assert network_wait(shape(processes=workers, network=((200, 0, ("10.0.0.8:443",)),))) == []  # not receiving
