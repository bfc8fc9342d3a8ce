"""Overhead: CPU (% of one core) and RSS of the daemon process alone over a fixed window.

``gpufeed serve --simulate`` on the synthetic 8-GPU, 192-CPU host (bench/scenarios/), scraped like a
Prometheus server would (every ``overhead_scrape_every`` s). CPU is the daemon pid's utime+stime from
/proc/<pid>/stat; the simulator renders in a child process and is reported separately, not counted.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import procs, procstat
from bench.common import STEADY, WAITING, Context, Options, fastest_flags, scenario_args, series_count, start_ready
from bench.common import sum_metric as metric_sum
from bench.report import Section, fmt_mib, fmt_pct

BUDGET_STEADY = 1.0  # % of one core, DESIGN.md "Budgets"
BUDGET_WAITING = 3.0
OVERRUNS = "gpufeed_sampler_overruns_total"


def measure(ctx: Context, opts: Options, scenario: Path, flags: list[str], warmup: float) -> dict[str, float]:
    """Run one configuration; CPU %, RSS, simulator CPU, host busy cores, series, overruns."""
    port = procs.free_port()
    sim = scenario_args(ctx, opts, scenario)
    proc = procs.gpufeed(port, [*sim, *flags], name="gpufeed-overhead")
    with proc:
        start_ready(proc, port, gpus=8 if sim else 0)
        time.sleep(warmup)
        proc.check_alive()
        kids = procstat.children(proc.pid)
        pids = {"daemon": proc.pid} | {f"child{i}": k for i, k in enumerate(kids)}
        _, body0 = procs.get(port)
        window = procstat.CpuWindow(pids)
        rss0 = procstat.rss_bytes(proc.pid)
        window.start()
        t_end = time.monotonic() + opts.overhead_seconds
        rss_max = rss0
        body = body0
        scrapes = 0
        while True:
            now = time.monotonic()
            if now >= t_end:
                break
            time.sleep(min(opts.overhead_scrape_every, t_end - now))
            proc.check_alive()
            rss_max = max(rss_max, procstat.rss_bytes(proc.pid))
            _, body = procs.get(port)
            scrapes += 1
        readings, host_busy = window.stop()
        rss1 = procstat.rss_bytes(proc.pid)
        threads = procstat.thread_count(proc.pid)
    daemon = readings["daemon"]
    sim_cpu = sum(r.core_percent for k, r in readings.items() if k != "daemon")
    return {
        "cpu_pct": daemon.core_percent,
        "cpu_s": daemon.seconds,
        "wall_s": daemon.wall,
        "rss_start": rss0,
        "rss_end": rss1,
        "rss_max": max(rss_max, rss1),
        "threads": threads,
        "sim_cpu_pct": sim_cpu,
        "host_busy_cores": host_busy,
        "other_busy_cores": max(0.0, host_busy - (daemon.seconds + sum(
            r.seconds for k, r in readings.items() if k != "daemon")) / daemon.wall),
        "series": series_count(body),
        "overruns": metric_sum(body, OVERRUNS) - metric_sum(body0, OVERRUNS),
        "scrapes": scrapes,
    }


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("overhead", "Overhead (CPU and memory of the daemon process)")
    sim = ctx.simulator_active(opts)
    host = "8 GPUs, 192 CPUs, 8 x 150-thread GPU processes (simulated)" if sim else "this host (no simulator)"
    fast = fastest_flags()
    configs = [
        ("defaults, all GPUs working", STEADY, [], opts.warmup, BUDGET_STEADY),
        ("fastest settings, all GPUs working", STEADY, fast, opts.warmup, None),
        ("defaults, 2 GPUs waiting (deep sampling on)", WAITING, [], opts.deep_warmup, BUDGET_WAITING),
        ("fastest settings, 2 GPUs waiting", WAITING, fast, opts.deep_warmup, None),
    ]
    if opts.smoke:  # one default and one fastest configuration exercise every code path
        configs = configs[1:3]
    for label, scenario, flags, warmup, budget in configs:
        try:
            r = measure(ctx, opts, scenario, flags, warmup)
        except procs.BenchError as e:
            sec.add(f"CPU, {label}", f"failed: {str(e)[:300]}", f"<= {budget}% of one core" if budget else "",
                    False if budget else None)
            continue
        sec.raw[label] = r
        met = None if budget is None else r["cpu_pct"] <= budget
        sec.add(f"CPU, {label}", f"{fmt_pct(r['cpu_pct'])} of one core ({r['cpu_s']:.2f} s in {r['wall_s']:.0f} s)",
                f"<= {budget}% of one core" if budget is not None else "", met)
        sec.add(f"RSS, {label}", f"{fmt_mib(r['rss_end'])} (max {fmt_mib(r['rss_max'])}, {r['threads']:.0f} threads)")
        sec.add(f"series / overruns, {label}", f"{r['series']:.0f} series, {r['overruns']:.0f} overruns in window")
        sec.add(f"noise, {label}", f"simulator child {fmt_pct(r['sim_cpu_pct'])} (not counted); "
                f"other load on host {r['other_busy_cores']:.2f} cores")
    sec.note(f"Host: {host}. {ctx.simulate_detail}.")
    sec.note("Fastest settings: every collector duration option and --web.render-interval at 100 ms "
             "(the GPM hardware floor) -- a worst case, not a recommendation.")
    sec.note(f"Scraped every {opts.overhead_scrape_every:g} s during the window (a Prometheus at that interval); "
             f"window {opts.overhead_seconds:g} s after {opts.warmup:g} s warm-up "
             f"({opts.deep_warmup:g} s for the waiting scenario, so that the waiting verdict has switched deep "
             "sampling on).")
    return sec
