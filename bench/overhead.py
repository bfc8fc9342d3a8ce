"""Overhead: CPU (% of one core) and RSS of the daemon process alone over a fixed window.

``gpufeed serve --simulate`` on the synthetic 8-GPU, 192-CPU host (bench/scenarios/), scraped like a
Prometheus server would (every ``overhead_scrape_every`` s). CPU is the daemon pid's utime+stime from
/proc/<pid>/stat; the simulator renders in a child process and is reported separately, not counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import gcpause, procs, procstat, simcost
from bench.common import (
    STEADY,
    WAITING,
    Context,
    Options,
    fastest_flags,
    registry,
    scenario_args,
    series_count,
    start_ready,
)
from bench.common import sum_metric as metric_sum
from bench.probe import SIM_RELOAD
from bench.report import Section, fmt_mib, fmt_pct

BUDGET_STEADY = 1.0  # % of one core, DESIGN.md "Budgets"
BUDGET_WAITING = 3.0
BUDGET_SIM_SHARE = 0.2  # points of one core the simulated daemon may pay that a real host would not (#14)
OVERRUNS = "gpufeed_sampler_overruns_total"
# What the steady-state budget would take with today's code: the rates an adaptive daemon would use while
# every GPU is working (GPU fast path and verdicts at 1 s, payload re-rendered every 5 s).
TUNED = ["--collector.gpu.interval", "1s", "--collector.derived.interval", "2s", "--web.render-interval", "5s"]
TUNED_LABEL = "what-if: GPU fast path 1 s, verdicts every 2 s, render every 5 s, deep sampling held off"


# The daemon's info-log events that change its pace: a GPU leaving (or regaining) the steady fast-path rate, and
# a verdict change (which steers deep sampling). Logged only when something changes, so logging at info costs
# the measured window nothing it would not pay anyway.
_PACE_EVENT = re.compile(r"^ts=(\S+) .*?\bevent=(gpu_fast_rate_changed|verdict_changed|deep_focus_changed)\b(.*)$",
                         re.M)
_FOCUS_ALL = re.compile(r"\bpids=all(?:\s|$)")
_TO_STEADY = re.compile(r"\breason=steady(?:\s|$)")
_GPU_FIELD = re.compile(r"\bgpu=(\S+)")
_REASON_FIELD = re.compile(r"\breason=(\S+)")
_STARTED = re.compile(r"^ts=\S+ level=info event=started\b", re.M)  # every daemon logs it once, at info


def pace_events(log: str, t0: float, t1: float) -> dict[str, Any]:
    """From the daemon's log, what changed its pace between wall-clock times ``t0`` and ``t1``: how many times a
    GPU left the steady fast-path rate (a dip, a gap, PCIe traffic), each as ``"gpu N: reason"`` in
    ``left_reasons``, how many verdicts changed, and how many times deep sampling was focused on waiting GPUs'
    processes (``deep_focused``: an evaluation judged a GPU waiting, with or without a verdict change -- the
    configuration's CPU then includes deep sampling). BenchError for a log without the daemon's info-level logfmt
    lines: zero changes would be read from nothing."""
    if not _STARTED.search(log):
        raise procs.BenchError("the daemon's log has no info-level logfmt 'started' line: pace changes not countable")
    out: dict[str, Any] = {"left_steady": 0, "verdict_changes": 0, "deep_focused": 0, "left_reasons": []}
    for m in _PACE_EVENT.finditer(log):
        try:
            ts = datetime.fromisoformat(m[1]).timestamp()
        except ValueError:
            continue
        if not t0 <= ts <= t1:
            continue
        if m[2] == "verdict_changed":
            out["verdict_changes"] += 1
        elif m[2] == "deep_focus_changed":
            out["deep_focused"] += 0 if _FOCUS_ALL.search(m[3]) else 1
        elif not _TO_STEADY.search(m[3]):
            out["left_steady"] += 1
            gpu, reason = _GPU_FIELD.search(m[3]), _REASON_FIELD.search(m[3])
            out["left_reasons"].append(f"gpu {gpu[1] if gpu else '?'}: {reason[1] if reason else '?'}")
    return out


def fmt_pace(ev: Mapping[str, Any]) -> str:
    why = ev.get("left_reasons") or []
    focused = ev.get("deep_focused", 0)
    return (f"{ev['left_steady']:.0f} time(s) a GPU left the steady rate{' (' + ', '.join(why) + ')' if why else ''}, "
            f"{ev['verdict_changes']:.0f} verdict change(s)"
            f"{f', deep sampling focused on waiting GPUs {focused:.0f} time(s)' if focused else ''} in the window")


def measure(ctx: Context, opts: Options, scenario: Path, flags: list[str], warmup: float) -> dict[str, float]:
    """Run one configuration; CPU %, RSS, simulator CPU, host busy cores, series, overruns, pace changes."""
    port = procs.free_port()
    sim = scenario_args(ctx, opts, scenario)
    proc = procs.gpufeed(port, [*sim, *flags], name="gpufeed-overhead", log_level="info")
    with proc:
        start_ready(proc, port, gpus=8 if sim else 0)
        time.sleep(warmup)
        proc.check_alive()
        kids = procstat.children(proc.pid)
        pids = {"daemon": proc.pid} | {f"child{i}": k for i, k in enumerate(kids)}
        with procs.Scraper(port) as scraper:  # one kept-alive connection, like a Prometheus
            _, body0 = scraper.get()
            window = procstat.CpuWindow(pids)
            rss0 = procstat.rss_bytes(proc.pid)
            window.start()
            w0 = time.time()
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
                _, body = scraper.get()
                scrapes += 1
            readings, host_busy = window.stop()
        pace = pace_events(proc.log_text(), w0, time.time())
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
        "left_steady": pace["left_steady"],
        "left_reasons": pace["left_reasons"],
        "verdict_changes": pace["verdict_changes"],
        "deep_focused": pace["deep_focused"],
    }


def breakdown(ctx: Context, opts: Options, scenario: Path, flags: list[str], warmup: float) -> dict[str, Any]:
    """Where the daemon's CPU goes: the same configuration under bench/probe.py, CPU charged per sampler."""
    port = procs.free_port()
    sim = scenario_args(ctx, opts, scenario)
    fd, tmp = tempfile.mkstemp(prefix="gpufeed-bench-probe-", suffix=".json")
    os.close(fd)
    out = Path(tmp)
    out.unlink()
    proc = procs.gpufeed(port, [*sim, *flags], name="gpufeed-breakdown", probe_out=out, log_level="info")
    try:
        with proc:
            start_ready(proc, port, gpus=8 if sim else 0)
            time.sleep(warmup)
            c0 = procstat.cpu_seconds(proc.pid)
            os.kill(proc.pid, signal.SIGUSR1)
            w0 = time.time()
            t_end = time.monotonic() + opts.overhead_seconds
            with procs.Scraper(port) as scraper:
                while (left := t_end - time.monotonic()) > 0:
                    time.sleep(min(opts.overhead_scrape_every, left))
                    proc.check_alive()
                    scraper.get()
            os.kill(proc.pid, signal.SIGUSR2)
            c1 = procstat.cpu_seconds(proc.pid)
            pace = pace_events(proc.log_text(), w0, time.time())
            proc.stop()
        dump: dict[str, Any] = json.loads(out.read_text())
    finally:
        with contextlib.suppress(OSError):
            out.unlink()
    wall = dump["window"]["wall_s"]
    parts = {k: v["cpu_s"] for k, v in dump["cpu"].items()}
    total = c1 - c0  # /proc/<pid>/stat, as in the main measurement
    # The fake-NVML reload is nested inside the GPU samplers' time: report it, do not count it twice.
    rest = max(0.0, total - sum(v for k, v in parts.items() if k != SIM_RELOAD))
    # The probe's own wrapper around each charge of the exchange's work (thousands of them), measured: not the
    # simulation's cost. Hot-loop figure, so what stays on the line is still an upper bound.
    if SIM_RELOAD in parts:
        wrapper = dump.get("charge_cost_s", 0.0) * dump["cpu"][SIM_RELOAD]["calls"]
        parts[SIM_RELOAD] = max(0.0, parts[SIM_RELOAD] - wrapper)
    shares = sorted(parts.items(), key=lambda kv: -kv[1])
    # The event-loop thread's own CPU minus what ran on it and was charged (non-blocking samplers, renders).
    loop = dump["window"].get("loop_thread_cpu_s")
    on_loop = dump["window"].get("loop_charged_s", 0.0)
    return {"wall_s": wall, "total_s": total, "parts": dict(shares), "rest_s": rest,
            "loop_overhead_s": None if loop is None else max(0.0, loop - on_loop),
            "calls": {k: v["calls"] for k, v in dump["cpu"].items()},
            "nvml_calls": dump.get("nvml_calls", {}),
            "gc": {gen: gcpause.summary([p]) for gen, p in dump.get("gc", {}).items()},
            "gc_all": gcpause.summary(dump.get("gc", {}).values()),
            "gc_full_now": gcpause.full_pauses(dump.get("gc_full_now", [])),
            "pace": pace}


def _nvml_costs(sec: Section, opts: Options) -> dict[str, dict[str, float]] | None:
    """CPU per NVML call of the fake and of the real binding over the stub library (bench/simcost.py); None,
    with a note, where the stub cannot be built."""
    try:
        costs = simcost.per_call(rounds=60 if opts.smoke else simcost.ROUNDS)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        sec.note(f"Simulation-only share: per-call costs not measured ({str(e)[:300]}); only the state reload "
                 "is counted.")
        return None
    sec.raw["nvml_per_call_s"] = costs
    return costs


def _simulation_share(sec: Section, label: str, b: dict[str, Any], costs: dict[str, dict[str, float]] | None) -> None:
    """What only the simulation cost the daemon in the breakdown's window: the fake's state reload and, where
    measured, its per-call cost beyond the real binding's floor (an upper bound: the driver's work is zero)."""
    w = b["wall_s"]
    reload = b["parts"].get(SIM_RELOAD, 0.0)
    if costs is None:
        sec.add(f"simulation-only share, {label}", f"{100 * reload / w:.2f} points (state reload only; per-call "
                "costs not measured)", f"<= {BUDGET_SIM_SHARE:g} points", None)
        return
    extra, parts = simcost.excess(b["nvml_calls"], costs)
    total = reload + extra
    top = ", ".join(f"{k} {100 * v / w:.3f}" for k, v in list(parts.items())[:4])
    b["simulation_share_s"] = {"reload": reload, "per_call_excess": extra, "by_function": parts}
    sec.add(f"simulation-only share, {label}",
            f"{100 * total / w:.2f} points: fake NVML state reload {100 * reload / w:.2f}, the fake's calls beyond "
            f"the real binding's {100 * extra / w:.2f} ({sum(b['nvml_calls'].values())} calls; {top})",
            f"<= {BUDGET_SIM_SHARE:g} points", total / w * 100 <= BUDGET_SIM_SHARE)


def deep_off_flags() -> list[str]:
    """Flags that keep per-thread sampling at its slow rate whatever the verdict (steady state by force)."""
    from exporter.config import collector_options

    cls = registry().get("derived")
    if cls is None or not any(o.name == "deep-interval" for o in collector_options(cls)):
        return []
    return ["--collector.derived.deep-interval", "5s"]


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("overhead", "Overhead (CPU and memory of the daemon process)")
    sim = ctx.simulator_active(opts)
    host = "8 GPUs, 192 CPUs, 8 x 150-thread GPU processes (simulated)" if sim else "this host (no simulator)"
    fast = fastest_flags()
    hold = deep_off_flags()
    configs = [
        ("defaults, all GPUs working", STEADY, [], opts.warmup, BUDGET_STEADY),
        ("defaults, all GPUs working, deep sampling held off", STEADY, hold, opts.warmup, BUDGET_STEADY),
        ("fastest settings, all GPUs working", STEADY, fast, opts.warmup, None),
        ("defaults, 2 GPUs waiting (deep sampling on)", WAITING, [], opts.deep_warmup, BUDGET_WAITING),
        (TUNED_LABEL, STEADY, [*hold, *TUNED], opts.warmup, None),
    ]
    if opts.smoke:  # one default and one fastest configuration exercise every code path
        configs = configs[2:4]
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
                f"other load on host {r['other_busy_cores']:.2f} cores; {fmt_pace(r)}")
    costs = _nvml_costs(sec, opts) if sim else None
    for label, scenario, warmup in (("defaults, all GPUs working", STEADY, opts.warmup),
                                    ("defaults, 2 GPUs waiting", WAITING, opts.deep_warmup)):
        if opts.smoke and scenario is WAITING:
            continue
        try:
            b = breakdown(ctx, opts, scenario, [], warmup)
        except (procs.BenchError, OSError, ValueError, KeyError) as e:
            sec.note(f"CPU breakdown ({label}) failed: {str(e)[:300]}")
            continue
        sec.raw[f"breakdown: {label}"] = b
        w = b["wall_s"]
        top = [(k, v) for k, v in b["parts"].items()][:8]
        cells = [f"{k} {100 * v / w:.2f}% ({b['calls'][k]} runs)" for k, v in top]
        cells.append(f"everything else (rest) {100 * b['rest_s'] / w:.2f}%")
        if b["loop_overhead_s"] is not None:
            cells.append(f"of which event-loop thread outside samplers and renders "
                         f"{100 * b['loop_overhead_s'] / w:.2f}%")
        cells.append(fmt_pace(b["pace"]))
        sec.add(f"CPU breakdown, {label} (% of one core)",
                f"total {100 * b['total_s'] / w:.2f}%: " + "; ".join(cells))
        if sim:
            _simulation_share(sec, label, b, costs)
        pooled, now = b["gc_all"], b["gc_full_now"]
        if now["count"]:
            # Every generation: a young collection stalls a 100 ms tick or a scrape as much as a full one does. With
            # 10-60 collections in the window the p99 is their maximum: the budget is judged over the soak's hour
            # (bench/soak.py), these say what one window and the heap at its end cost.
            per_gen = ", ".join(f"gen {g} {v['count']:.0f} (max {v['max_ms']:.1f} ms, CPU {v['cpu_max_ms']:.1f})"
                                for g, v in sorted(b["gc"].items()))
            sec.add(f"GC pauses in the window, every generation, {label}",
                    f"{pooled['count']:.0f} collections in {w:.0f} s, max {pooled['max_ms']:.1f} ms (CPU "
                    f"{pooled['cpu_max_ms']:.1f} ms): {per_gen}; a full collection at the window's end "
                    f"{now['max_ms']:.1f} ms (CPU {now['cpu_max_ms']:.1f} ms)")
    sec.note(f"Host: {host}. {ctx.simulate_detail}.")
    sec.note("CPU breakdown: a second run of the same configuration under bench/probe.py, which charges each "
             "sampler run and each payload render with the CPU time of the thread that ran it.")
    sec.note("Simulation-only share: the fake NVML's state reload (charged by the probe) plus its calls in the "
             "window weighted by their CPU per call beyond the installed pynvml's over a C stub of libnvidia-ml "
             "(bench/simcost.py, bench/nvmlstub/): the real driver's own work counted as zero, so an upper bound.")
    sec.note("Fastest settings: every collector duration option and --web.render-interval at 100 ms "
             "(the GPM hardware floor) -- a worst case, not a recommendation.")
    sec.note(f"Scraped every {opts.overhead_scrape_every:g} s during the window (a Prometheus at that interval); "
             f"window {opts.overhead_seconds:g} s after {opts.warmup:g} s warm-up "
             f"({opts.deep_warmup:g} s for the waiting scenario, so that the waiting verdict has switched deep "
             "sampling on).")
    return sec
