"""Workloads: what reading the GPU processes' process trees and cgroups costs (DESIGN.md "Workloads").

The 8-GPU, 192-CPU host as Kubernetes runs it (bench/scenarios/host8x192_workloads.yaml: eight pods, each a
150-thread trainer and eight DataLoader worker processes in its container's cgroup v2, the scenario's
kubelet on a socket) is rendered once into a tmpfs tree; the collectors run in this process against it,
each pass timed with the thread's CPU clock (``time.thread_time``), and the cost is charged at the
default intervals:

- ``workload`` (every 5 s): the incremental process table, /proc/<pid>/cgroup of the GPU processes, the
  container cgroups' members and files (limits every 30 s) -- the process tree and cgroups;
- the ``proc`` collector's extra reads for the 64 worker processes: none while every GPU works (they are
  read in deep passes focused on a waiting GPU only), and, while one GPU waits, its 8 workers in the
  0.5 s focused passes (its trainer's own reads are the peer in the same run);
- ``kubernetes`` (every 5 s, cached; one ``List`` per 60 s refresh).

Files on tmpfs cost less to read than procfs generates them, so the absolute numbers are a floor; the
ratio against the proc collector's own reads of the same processes is what carries over.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SCENARIOS, Context, Options
from bench.report import Section, fmt_pct

WORKLOADS = SCENARIOS / "host8x192_workloads.yaml"
BUDGET = 0.2  # % of one core: the budget for the process tree and cgroups on this host
RENDER_AT = 30.0


def _cpu_per_call(fn: Callable[[], Any], calls: int) -> float:
    """Mean CPU seconds of one call (thread CPU clock), after one warm-up call."""
    fn()
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls


def measure(calls: int) -> dict[str, float]:
    """Per-pass CPU of each part, and the share of a core at the default intervals (percent)."""
    from exporter.collectors.kubernetes import KubernetesCollector
    from exporter.collectors.proc import ProcCollector
    from exporter.collectors.workload import WorkloadCollector
    from exporter.sampling import CollectorContext, Targets
    from exporter.sim.kubelet import Kubelet
    from exporter.sim.model import Model
    from exporter.sim.player import fast_tmpdir, kubelet_socket
    from exporter.sim.render import Renderer
    from exporter.sim.scenario import load

    sc = load(WORKLOADS)
    trainers = {str(p.gpus[0]): [p.pid] for p in sc.processes if p.gpus}
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-wl-", dir=fast_tmpdir()) as tmp:
        root = Path(tmp)
        r = Renderer(Model(sc), root, atomic=False)
        r.setup()
        r.render(RENDER_AT)
        targets = Targets()
        targets.publish(trainers)

        def ctx(options: dict[str, Any]) -> CollectorContext:
            return CollectorContext(procfs=root / "proc", sysfs=root / "sys", options=options, targets=targets)

        wl = WorkloadCollector(ctx({"container-env": True, "max-processes": 2048}))
        workload_s = _cpu_per_call(wl.update, calls)
        members = sorted(targets.workload_pids())
        proc = ProcCollector(ctx({"pids": (), "threads-interval": 5.0}))
        with_workers = _cpu_per_call(proc.update, calls)
        deep_with = _cpu_per_call(proc.update_threads, max(1, calls // 4))
        targets.publish_workload(())
        alone = _cpu_per_call(proc.update, calls)
        deep_alone = _cpu_per_call(proc.update_threads, max(1, calls // 4))
        # One GPU waits: deep passes focus on its trainer, with and without its 8 workers.
        targets.publish_workload(members)
        gpu0 = trainers["0"][0]
        targets.set_focus([gpu0, *(p for p in members if gpu0 < p < gpu0 + 1000)])
        focused_with = _cpu_per_call(proc.update_threads, max(1, calls // 4))
        targets.set_focus([gpu0])
        focused_alone = _cpu_per_call(proc.update_threads, max(1, calls // 4))
        sock = kubelet_socket(root)
        kubelet = Kubelet(sc, sock)
        try:
            kube = KubernetesCollector(ctx({"socket": str(sock), "timeout": 2.0, "refresh": 60.0}))
            cached_s = _cpu_per_call(kube.update, calls)
            kube._cached = None  # one real List
            t0 = time.thread_time()
            kube.update()
            list_s = time.thread_time() - t0
            kube.close()
        finally:
            kubelet.stop()
    out = {
        "workers": float(len(members)),
        "workload_pass_s": workload_s,
        "workload_pct": 100 * workload_s / WorkloadCollector.default_interval,
        "proc_alone_pct": 100 * alone / 1.0,
        "proc_extra_pct": 100 * max(0.0, with_workers - alone) / 1.0,
        "deep_extra_pct": 100 * max(0.0, deep_with - deep_alone) / 5.0,
        "waiting_extra_pct": 100 * max(0.0, focused_with - focused_alone) / 0.5,
        "waiting_peer_pct": 100 * focused_alone / 0.5,
        "kubernetes_pct": 100 * (cached_s / KubernetesCollector.default_interval + list_s / 60.0),
    }
    out["tree_cgroups_pct"] = out["workload_pct"] + out["kubernetes_pct"]
    out["total_pct"] = out["tree_cgroups_pct"] + out["proc_extra_pct"] + out["deep_extra_pct"]
    return out


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("workload", "Workloads (process trees, cgroups, the kubelet)")
    r = measure(5 if opts.smoke else 200)
    sec.raw["measure"] = r
    sec.add("process tree + cgroups + kubelet (workload every 5 s, kubernetes every 5 s)",
            f"{fmt_pct(r['tree_cgroups_pct'])} of one core ({1000 * r['workload_pass_s']:.2f} ms per workload pass)",
            f"<= {BUDGET}% of one core", r["tree_cgroups_pct"] <= BUDGET)
    sec.add(f"proc: the {r['workers']:.0f} worker processes' reads, every GPU working",
            f"{fmt_pct(r['proc_extra_pct'] + r['deep_extra_pct'])} of one core (peer: the 8 trainers' 1 s reads, "
            f"{fmt_pct(r['proc_alone_pct'])})")
    sec.add("all of it, every GPU working", f"{fmt_pct(r['total_pct'])} of one core", f"<= {BUDGET}% of one core",
            r["total_pct"] <= BUDGET)
    sec.add("one GPU waiting: its 8 workers in the 0.5 s focused deep passes",
            f"{fmt_pct(r['waiting_extra_pct'])} of one core (peer: its 150-thread trainer's, "
            f"{fmt_pct(r['waiting_peer_pct'])})")
    sec.note(f"In-process, on {WORKLOADS.name} rendered into tmpfs at t={RENDER_AT:g} s; CPU from the thread's "
             "clock per pass, charged at the default intervals. tmpfs reads are cheaper than procfs generating "
             "the same files: a floor, with the proc collector's reads of the trainers as the peer.")
    return sec
