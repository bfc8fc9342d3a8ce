"""Soak: play the cycling 8-GPU scenario fast for a bounded time; the daemon's RSS must stay flat.

RSS is sampled every ``soak_every`` seconds. The first ``soak_warmup`` seconds are left out of the fit:
the engine's history buffers fill up during the first --engine.history (30 s by default), and growth
while they fill is by design. A least-squares line through the rest gives the slope; it is "flat" when
its 95% confidence interval contains zero or the projected growth is under 1% of RSS per hour.
"""

from __future__ import annotations

import math
import time

from bench import procs, procstat
from bench.common import CYCLE, Context, Options, scenario_args, start_ready
from bench.report import Section, fmt_mib, fmt_pct


def fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(slope, intercept, standard error of the slope) of a least-squares line through ``points``."""
    n = len(points)
    if n < 3:
        return 0.0, points[0][1] if points else 0.0, math.inf
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, my, math.inf
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    resid = sum((y - (intercept + slope * x)) ** 2 for x, y in points)
    se = math.sqrt(resid / (n - 2) / sxx)
    return slope, intercept, se


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("soak", "Soak (memory over time)")
    port = procs.free_port()
    sim = scenario_args(ctx, opts, CYCLE)
    args = [*sim, "--simulate-speed", f"{opts.soak_speed:g}"] if sim else []
    proc = procs.gpufeed(port, args, name="gpufeed-soak")
    samples: list[tuple[float, int]] = []
    with proc:
        start_ready(proc, port, gpus=8 if sim else 0)
        window = procstat.CpuWindow({"daemon": proc.pid})
        window.start()
        t0 = time.monotonic()
        end = t0 + opts.soak_seconds
        next_at = t0
        with procs.Scraper(port) as scraper:  # one kept-alive connection, like a Prometheus
            while True:
                now = time.monotonic()
                if now >= end:
                    break
                if now >= next_at:
                    proc.check_alive()
                    samples.append((now - t0, procstat.rss_bytes(proc.pid)))
                    scraper.get()  # scraped like a Prometheus at the sampling period
                    next_at += opts.soak_every
                time.sleep(max(0.0, min(next_at, end) - time.monotonic()))
        proc.check_alive()
        samples.append((time.monotonic() - t0, procstat.rss_bytes(proc.pid)))
        cpu, _ = window.stop()
    warm = [(t, float(r)) for t, r in samples if t >= min(opts.soak_warmup, opts.soak_seconds / 2)]
    slope, _, se = fit(warm)
    mean = sum(r for _, r in warm) / len(warm) if warm else 0.0
    per_hour = slope * 3600
    ci = 1.96 * se * 3600
    flat = (abs(per_hour) <= ci) or (mean > 0 and abs(per_hour) < 0.01 * mean)
    first, last = samples[0][1], samples[-1][1]
    sec.raw = {"samples": samples, "slope_bytes_per_s": slope, "se": se, "cpu_pct": cpu["daemon"].core_percent}
    sec.add("duration / RSS samples", f"{opts.soak_seconds / 60:.1f} min at --simulate-speed {opts.soak_speed:g}, "
            f"{len(samples)} samples every {opts.soak_every:g} s")
    sec.add("RSS first / last / max", f"{fmt_mib(first)} / {fmt_mib(last)} / {fmt_mib(max(r for _, r in samples))}")
    sec.add(f"RSS slope after {min(opts.soak_warmup, opts.soak_seconds / 2):g} s warm-up",
            f"{per_hour / 1048576:+.2f} MiB/h (95% CI +/- {ci / 1048576:.2f} MiB/h)",
            "flat: CI contains 0 or < 1% of RSS per hour", flat)
    sec.add("CPU over the soak", f"{fmt_pct(cpu['daemon'].core_percent)} of one core")
    if not sim:
        sec.note(ctx.simulate_detail)
    return sec
