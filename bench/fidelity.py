"""Sampling fidelity under CPU saturation: jitter of the real daemon's sample times, and overruns.

The daemon runs under bench/probe.py -- the unmodified ``gpufeed serve`` that, on exit, writes the
monotonic time of every buffered sample. stress-ng then burns every core for a bounded time, and the
actual intervals between samples that overlap that window (a stall across it counts as one long interval)
are compared with the configured ones. The same is done without a burner (baseline), with the daemon at
Nice=-5, and -- where a writable cgroup-v1 cpu controller exists -- in its own cgroup with cpu.shares
equivalent to systemd's CPUWeight=1000.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import procs, procstat, scrape
from bench.common import STEADY, Context, Options, scenario_args, start_ready, sum_metric
from bench.report import Section, fmt_ms

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CPU_WEIGHT = 1000  # systemd CPUWeight=; on cgroup v1 systemd writes cpu.shares = weight * 1024 / 100


@contextlib.contextmanager
def cpu_cgroup(pid: int, weight: int, before_remove: Callable[[], object]) -> Iterator[str]:
    """Move ``pid`` into a fresh cgroup-v1 cpu group with cpu.shares for ``weight``; removed afterwards.

    Yields a description; raises OSError when the controller is absent or not writable.
    """
    group = CGROUP_V1_CPU / f"gpufeed-bench-{os.getpid()}"
    if not (CGROUP_V1_CPU / "cpu.shares").exists():
        raise OSError("no cgroup-v1 cpu controller at /sys/fs/cgroup/cpu")
    group.mkdir()
    try:
        shares = weight * 1024 // 100
        (group / "cpu.shares").write_text(str(shares))
        (group / "cgroup.procs").write_text(str(pid))
        yield f"cgroup-v1 cpu.shares={shares} (= CPUWeight={weight})"
    finally:
        # Only an empty group can be removed: stop the daemon (and its children) first.
        before_remove()
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def intervals(dump: dict[str, Any], t0: float, t1: float) -> dict[str, list[float]]:
    """Per sampler (interval <= 1 s), the actual intervals between consecutive samples that overlap [t0, t1]:
    a stall across the whole window is one long interval, not an empty window."""
    out: dict[str, list[float]] = {}
    for name, s in dump["samplers"].items():
        if s["interval"] > 1.0:
            continue
        out[name] = [b - a for a, b in itertools.pairwise(sorted(s["t"])) if b > t0 and a < t1]
    return out


def summarize(dump: dict[str, Any], t0: float, t1: float) -> dict[str, Any]:
    """Jitter of every fast sampler in the window: actual/configured interval ratios and absolute error."""
    ratios: list[float] = []
    errors: list[float] = []
    late_ticks = 0
    per: dict[str, Any] = {}
    for name, diffs in intervals(dump, t0, t1).items():
        iv = dump["samplers"][name]["interval"]
        per[name] = {"interval": iv, "n": len(diffs), "p50": scrape.percentile(diffs, 50),
                     "p99": scrape.percentile(diffs, 99), "max": max(diffs) if diffs else float("nan")}
        ratios += [d / iv for d in diffs]
        errors += [abs(d - iv) for d in diffs]
        late_ticks += sum(1 for d in diffs if d > 1.5 * iv)
    return {
        "ratio_p50": scrape.percentile(ratios, 50), "ratio_p99": scrape.percentile(ratios, 99),
        "err_p50": scrape.percentile(errors, 50), "err_p99": scrape.percentile(errors, 99),
        "samples": len(ratios), "skipped": late_ticks, "per_sampler": per,
    }


def history_flags(opts: Options) -> list[str]:
    """The history the daemon keeps here: the dump at exit must still hold every sample of the burn, so more than
    the warm-up and the burn together (the default history is shorter than a long --fidelity-seconds)."""
    return ["--engine.history", f"{math.ceil(opts.warmup + opts.fidelity_seconds + 60)}s"]


def condition(ctx: Context, opts: Options, label: str, *, burn: bool, nice: int | None = None,
              weight: int | None = None) -> dict[str, Any]:
    port = procs.free_port()
    sim = scenario_args(ctx, opts, STEADY)
    fd, tmp = tempfile.mkstemp(prefix="gpufeed-bench-probe-", suffix=".json")
    os.close(fd)
    out = Path(tmp)
    out.unlink()
    # Every GPU at the fast rate on every tick: a steady GPU's 1 s reads (exporter/gpu/pace.py) are not
    # scheduling jitter, and a tick that reads no GPU leaves no sample to time.
    steady_off = ["--collector.gpu.steady-interval", "100ms"]
    proc = procs.gpufeed(port, [*sim, *steady_off, *history_flags(opts)], name="gpufeed-fidelity", nice=nice,
                         probe_out=out)
    how = "default scheduling"
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(proc)
            start_ready(proc, port, gpus=8 if sim else 0)
            if nice:
                how = f"Nice={nice}"
            if weight is not None:
                group = stack.enter_context(cpu_cgroup(proc.pid, weight, proc.stop))
                how = f"{how} + {group}" if nice else group
            time.sleep(opts.warmup)
            _, body0 = procs.get(port)
            h0 = procstat.host_busy_seconds()
            t0 = time.monotonic()
            if burn:
                stack.enter_context(procs.stress(opts.cpus, opts.fidelity_seconds + 1))
            # One Prometheus-like scraper at 4 Hz: is /metrics still fast while every core is busy?
            lat = scrape.scrape(port, concurrency=1, seconds=opts.fidelity_seconds, interval=0.25)
            t1 = time.monotonic()
            host_busy = (procstat.host_busy_seconds() - h0) / (t1 - t0)
            proc.check_alive()
            _, body1 = procs.get(port)
            proc.stop()
        dump = json.loads(out.read_text())
    finally:
        with contextlib.suppress(OSError):
            out.unlink()
    r = summarize(dump, t0, t1)
    r |= {"label": label, "how": how,
          "overruns": sum_metric(body1, "gpufeed_sampler_overruns_total")
          - sum_metric(body0, "gpufeed_sampler_overruns_total"),
          "scrape_p50": lat.p50, "scrape_p99": lat.p99, "scrape_errors": lat.errors, "host_busy_cores": host_busy}
    return r


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("fidelity", "Sampling fidelity under CPU saturation")
    conds: list[tuple[str, dict[str, Any]]] = [
        ("no burner", {"burn": False}),
        ("all cores burning, default scheduling", {"burn": True}),
        ("all cores burning, Nice=-5", {"burn": True, "nice": -5}),
        (f"all cores burning, CPUWeight={CPU_WEIGHT}", {"burn": True, "weight": CPU_WEIGHT}),
        (f"all cores burning, Nice=-5 + CPUWeight={CPU_WEIGHT}", {"burn": True, "nice": -5, "weight": CPU_WEIGHT}),
    ]
    if opts.smoke:  # idle, Nice and cgroup paths
        conds = [conds[0], conds[2], conds[3]]
    for label, kw in conds:
        try:
            r = condition(ctx, opts, label, **kw)
        except (procs.BenchError, OSError, json.JSONDecodeError, KeyError) as e:
            sec.note(f"{label}: not measured ({type(e).__name__}: {str(e)[:200]})")
            continue
        sec.raw[label] = r
        sec.add(f"{label}: interval actual/configured p50 / p99",
                f"{r['ratio_p50']:.3f} / {r['ratio_p99']:.3f} ({r['samples']} intervals)")
        sec.add(f"{label}: |interval error| p50 / p99", f"{fmt_ms(r['err_p50'])} / {fmt_ms(r['err_p99'])}")
        sec.add(f"{label}: overruns / skipped ticks", f"{r['overruns']:.0f} / {r['skipped']}")
        sec.add(f"{label}: /metrics at 4 Hz p50 / p99", f"{fmt_ms(r['scrape_p50'])} / {fmt_ms(r['scrape_p99'])}")
        sec.add(f"{label}: host CPU busy during the window", f"{r['host_busy_cores']:.2f} of {opts.cpus} cores")
    sec.note(f"Burner: stress-ng --cpu {opts.cpus} (every core) for {opts.fidelity_seconds:g} s; intervals "
             "from the engine's own sample timestamps (every sampler with interval <= 1 s), "
             f"{'simulated 8-GPU host' if ctx.simulate else 'this host'}.")
    sec.note("Skipped ticks: intervals longer than 1.5x the configured one (the engine skips a tick it "
             "could not start in time rather than bunching up).")
    return sec
