"""Same work, side by side: reading /proc/stat, diskstats, pressure, meminfo and cpufreq at 4 Hz.

gpufeed runs only its ``cpu``, ``disk``, ``pressure``, ``memory`` and ``cpufreq`` collectors at 250 ms;
node_exporter runs only ``cpu``, ``diskstats``, ``pressure``, ``meminfo`` and ``cpufreq`` and is scraped at
4 Hz (it reads on scrape). Both read this host's real files over the same window; each process's CPU
comes from its own /proc/<pid>/stat. gpufeed is scraped at 4 Hz too, so its figure also pays for serving.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench import procs, procstat, scrape
from bench.common import SAME_WORK, Context, Options, only_collectors, series_count
from bench.report import Section, fmt_pct

CPUFREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq")


async def _both(gport: int, nport: int, seconds: float) -> tuple[scrape.ScrapeResult, scrape.ScrapeResult]:
    g, n = await asyncio.gather(
        *(scrape.scrape_async(port, path="/metrics", headers=dict(scrape.PROMETHEUS_HEADERS), concurrency=1,
                              seconds=seconds, interval=0.25) for port in (gport, nport)),
    )
    return g, n


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("samework", "Same work as node_exporter (host sources at 4 Hz)")
    flags, missing = only_collectors(SAME_WORK, "250ms")
    present = [c for c in SAME_WORK if c not in missing]
    gport, nport = procs.free_port(), procs.free_port()
    g = procs.gpufeed(gport, flags, name="gpufeed-samework")
    n = procs.node_exporter(nport, [SAME_WORK[c] for c in present] or list(SAME_WORK.values()))
    with procs.running(g, n):
        procs.wait_ready(g, gport)
        procs.wait_ready(n, nport)
        time.sleep(opts.warmup)
        window = procstat.CpuWindow({"gpufeed": g.pid, "node_exporter": n.pid})
        window.start()
        gres, nres = asyncio.run(_both(gport, nport, opts.samework_seconds))
        readings, host_busy = window.stop()
        g.check_alive()
        n.check_alive()
        _, gbody = procs.get(gport, headers=scrape.TEXT_HEADERS)
        _, nbody = procs.get(nport, headers=scrape.TEXT_HEADERS)
    gr, nr = readings["gpufeed"], readings["node_exporter"]
    ratio = gr.seconds / nr.seconds if nr.seconds > 0 else float("nan")
    sec.raw = {"gpufeed_cpu_pct": gr.core_percent, "node_exporter_cpu_pct": nr.core_percent, "ratio": ratio,
               "gpufeed_scrapes": len(gres.latencies), "node_exporter_scrapes": len(nres.latencies),
               "host_busy_cores": host_busy, "missing": missing,
               "gpufeed_series": series_count(gbody), "node_exporter_series": series_count(nbody)}
    sec.add("gpufeed CPU (collectors " + ", ".join(present) + " at 250 ms, scraped at 4 Hz)",
            f"{fmt_pct(gr.core_percent)} of one core ({gr.seconds:.2f} s in {gr.wall:.0f} s)")
    sec.add("node_exporter CPU (" + ", ".join(SAME_WORK[c] for c in present) + ", scraped at 4 Hz)",
            f"{fmt_pct(nr.core_percent)} of one core ({nr.seconds:.2f} s, {len(nres.latencies)} scrapes)")
    sec.add("CPU ratio gpufeed / node_exporter", f"{ratio:.2f}" if nr.seconds > 0 else
            "not measurable: node_exporter used no CPU tick in the window (window too short)")
    sec.add("series gpufeed / node_exporter", f"{sec.raw['gpufeed_series']} / {sec.raw['node_exporter_series']}")
    if missing:
        sec.note("gpufeed collectors not registered at measurement time (left out on both sides): "
                 + ", ".join(missing) + ".")
    cpufreq = "exist" if CPUFREQ.exists() else "do not exist here (virtual machine): both exporters find nothing"
    sec.note(f"This host has {opts.cpus} CPUs; its cpufreq files {cpufreq}. "
             "The scraping client's CPU is not counted for either exporter.")
    return sec
