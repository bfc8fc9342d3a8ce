"""Deep sampling focused on the waiting GPUs' processes: the analyzer narrows it, and evidence stays right."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from exporter.derived.analyzer import Analyzer
from exporter.derived.hostshape import cpu_shape, d_state_mean
from exporter.samples.gpu import GpuKey
from exporter.samples.host import ProcSample
from exporter.sampling import Targets
from exporter.snapshot import Stamped
from tests.derived.test_analyzer import run
from tests.support.builders import GpuSpec, ThreadSpec, const, cpu_window, gpu_windows, proc_window
from tests.support.engine import FakeEngine, analyzer

WORKING_PID = 4242
WAITING_PID = 5000


def _merge(*streams: list[Stamped[ProcSample]]) -> list[Stamped[ProcSample]]:
    """One ProcSample per instant holding every stream's processes (stream i sampled at the same times)."""
    out = []
    for parts in zip(*streams, strict=True):
        procs = {pid: p for s in parts for pid, p in s.value.processes.items()}
        out.append(Stamped(parts[0].t, ProcSample(MappingProxyType(procs), True)))
    return out


WAITING_UTIL = const(0.4)  # GPU 1's utilisation once it waits, by default


def _two_gpus(waiting_from: float, t1: float, options: dict[str, Any] | None = None,
              waiting: Callable[[float], float] = WAITING_UTIL) -> tuple[Analyzer, FakeEngine, Targets]:
    """GPU 0 busy throughout; GPU 1 busy until ``waiting_from``, then ``waiting`` busy (40% by default) behind a
    saturated thread."""
    gpus = [
        GpuSpec(index=0, bdf="0000:81:00.0", util=const(0.95), sm=const(0.7), pids=(WORKING_PID,)),
        GpuSpec(index=1, bdf="0000:c1:00.0", util=lambda t: 0.95 if t < waiting_from else waiting(t), sm=const(0.7),
                pids=(WAITING_PID,)),
    ]
    fast, buf, slow = gpu_windows(gpus, 0.0, t1)
    procs = _merge(
        proc_window(WORKING_PID, [ThreadSpec(4, 0.7, 0.05, "R")], 0.0, t1, cpus_allowed=frozenset(range(16))),
        proc_window(WAITING_PID, [ThreadSpec(1, 0.56, 0.43, "R")], 0.0, t1, cpus_allowed=frozenset(range(16, 32)),
                    total_threads=8),
    )
    eng = FakeEngine({"gpu": fast, "gpu_samples": buf, "gpu_slow": slow, "proc": procs, "proc_threads": procs,
                      "cpu": cpu_window(32, {16: (0.56, 0.43)}, 0.0, t1)})
    targets = Targets()
    targets.publish({"0": [WORKING_PID], "1": [WAITING_PID]})
    return analyzer(eng, targets=targets, options=options), eng, targets


def test_second_gpu_waiting_focuses_deep_sampling_on_its_process_only() -> None:
    an, eng, targets = _two_gpus(waiting_from=10.0, t1=60.0)
    run(an, eng, [float(t) for t in range(1, 10)])
    assert targets.focus() is None
    st = run(an, eng, [float(t) for t in range(10, 25)])
    assert st.gpus[1].cause == "launch_bound" and st.gpus[0].cause == "healthy"
    assert targets.focus() == frozenset({WAITING_PID})
    assert eng.changes[-1] == ("proc_threads", 0.5)


def test_focus_is_lifted_when_no_gpu_waits_any_more() -> None:
    an, eng, targets = _two_gpus(waiting_from=10.0, t1=60.0)
    run(an, eng, [float(t) for t in range(1, 25)])
    assert targets.focus() == frozenset({WAITING_PID})
    # GPU 1 recovers from t=25 on: both working, the deep sampler reads every process again.
    eng.streams.update(_two_gpus(waiting_from=1e9, t1=60.0)[1].streams)
    run(an, eng, [float(t) for t in range(25, 50)])
    assert targets.focus() is None
    assert eng.changes[-1] == ("proc_threads", 120.0)  # nothing waits: the quiet per-thread pace


def _full_passes(an: Analyzer, eng: FakeEngine, targets: Targets, times: range) -> int:
    targets.take_focus()  # the deep sampler's pass consumes any pending request
    full = 0
    for t in times:
        run(an, eng, [float(t)])
        if targets.take_focus() is None:
            full += 1
    return full


def test_focused_sampling_still_reads_the_working_gpus_threads_at_their_quiet_pace() -> None:
    # The working GPUs' per-thread evidence is as fresh as when nothing waits (every 120 s), no fresher: a full
    # pass over every process (1,200 threads on an 8-GPU host) every 5 s was ~1% of a core.
    an, eng, targets = _two_gpus(waiting_from=10.0, t1=280.0)
    run(an, eng, [float(t) for t in range(1, 25)])
    assert targets.focus() == frozenset({WAITING_PID})
    assert _full_passes(an, eng, targets, range(25, 265)) == 2  # 240 s: a full pass every 120 s, the others focused


def test_focused_sampling_requests_a_full_pass_every_configured_interval_without_quiet_host() -> None:
    an, eng, targets = _two_gpus(waiting_from=10.0, t1=60.0, options={"quiet-host": False})
    run(an, eng, [float(t) for t in range(1, 25)])
    assert targets.focus() == frozenset({WAITING_PID})
    assert _full_passes(an, eng, targets, range(25, 45)) == 4  # 20 s at the configured 5 s interval


def test_deep_samples_focused_on_another_gpu_do_not_dilute_d_state_evidence() -> None:
    mine = proc_window(WORKING_PID, [ThreadSpec(3, 0.0, 0.01, "D")], 0.0, 2.0)
    other = proc_window(WAITING_PID, [ThreadSpec(1, 0.9, 0.1, "R")], 3.0, 9.0)
    deep = [*mine, *other]  # then the deep sampler focused on the other GPU's process
    assert d_state_mean(deep, [WORKING_PID]) == 3.0
    shape = cpu_shape([], deep, [], [WORKING_PID])
    assert shape.d_state_threads == 3.0
    assert shape.threads and all(t.pid == WORKING_PID for t in shape.threads)


def test_a_settled_bursty_waiting_gpu_is_not_re_evaluated_by_its_one_second_swings() -> None:
    # GPU 1 waits at 40% on average, in 2 s stretches of 60% and 20%: each second swings 0.2 from the window's
    # mean, past the tripwire's 0.1 band, while any 5 s stretch stays within 0.04 of it. The tripwire compares at
    # least the recent 5 s (recent_s), so once its verdict has settled the GPU is evaluated at the stable interval
    # (15 s), not at every run.
    an, eng, _ = _two_gpus(waiting_from=10.0, t1=90.0, waiting=lambda t: 0.6 if int(t) % 4 < 2 else 0.2)
    st = run(an, eng, [float(t) for t in range(1, 50)])
    assert st.gpus[1].cause == "launch_bound"
    gpu1 = an._gpus[GpuKey(1)]
    evaluated = set()
    for t in range(50, 80):
        run(an, eng, [float(t)])
        evaluated.add(gpu1.evaluated_t)
    assert len(evaluated) <= 3, sorted(evaluated)  # every 15 s, not every run
    assert an.state is not None and an.state.gpus[1].cause == "launch_bound"
