"""Scrape latency: p50/p99 of /metrics at 1, 10 and 50 concurrent scrapers, gpufeed vs node_exporter.

Both exporters run side by side in the same run: gpufeed at default settings on the synthetic 8-GPU host
(its default series set), node_exporter with its default collectors on this host. Each level is a
closed loop (every scraper sends its next request as soon as the previous one is answered) with the
headers Prometheus sends (OpenMetrics preferred, gzip), then once more with plain text.
"""

from __future__ import annotations

import time

from bench import procs, scrape
from bench.common import STEADY, Context, Options, scenario_args, series_count, start_ready
from bench.report import Section, fmt_ms

BUDGET_P99 = 0.002  # seconds, one scraper, default series set
BUDGET_RATIO = 0.5  # gpufeed p50 / node_exporter p50


def run(ctx: Context, opts: Options) -> Section:
    sec = Section("latency", "Scrape latency (gpufeed vs node_exporter, same run)")
    gport, nport = procs.free_port(), procs.free_port()
    sim = scenario_args(ctx, opts, STEADY)
    g = procs.gpufeed(gport, sim, name="gpufeed-latency")
    n = procs.node_exporter(nport)
    results: dict[str, dict[str, scrape.ScrapeResult]] = {}
    with procs.running(g, n):
        body = start_ready(g, gport, gpus=8 if sim else 0)
        procs.wait_ready(n, nport)
        time.sleep(opts.warmup)
        _, body = procs.get(gport, headers=scrape.TEXT_HEADERS)
        _, nbody = procs.get(nport, headers=scrape.TEXT_HEADERS)
        for mode, headers in (("prometheus", scrape.PROMETHEUS_HEADERS), ("text", scrape.TEXT_HEADERS)):
            for level in opts.latency_levels:
                for name, port, proc in (("gpufeed", gport, g), ("node_exporter", nport, n)):
                    proc.check_alive()
                    r = scrape.scrape(port, concurrency=level, seconds=opts.latency_seconds, headers=headers)
                    results.setdefault(f"{mode}/{level}", {})[name] = r
    gseries, nseries = series_count(body), series_count(nbody)
    for key, pair in results.items():
        mode, lvl = key.split("/")
        level = int(lvl)
        gr, nr = pair["gpufeed"], pair["node_exporter"]
        ratio = gr.p50 / nr.p50 if nr.p50 > 0 else float("nan")
        sec.raw[key] = {name: {"p50": r.p50, "p99": r.p99, "n": len(r.latencies), "errors": r.errors,
                               "rate": r.rate, "client_cpu_pct": 100 * r.client_cpu / r.wall,
                               "bytes_per_req": r.bytes / max(1, len(r.latencies))} for name, r in pair.items()}
        first = mode == "prometheus" and level == 1
        sec.add(f"{mode} headers, {level} scraper(s): gpufeed p50 / p99",
                f"{fmt_ms(gr.p50)} / {fmt_ms(gr.p99)} ({len(gr.latencies)} req, {gr.errors} errors)",
                f"p99 <= {fmt_ms(BUDGET_P99)}" if level == 1 else "", gr.p99 <= BUDGET_P99 if level == 1 else None)
        sec.add(f"{mode} headers, {level} scraper(s): node_exporter p50 / p99",
                f"{fmt_ms(nr.p50)} / {fmt_ms(nr.p99)} ({len(nr.latencies)} req, {nr.errors} errors)")
        sec.add(f"{mode} headers, {level} scraper(s): p50 ratio gpufeed / node_exporter", f"{ratio:.3f}",
                f"<= {BUDGET_RATIO}" if first else "", ratio <= BUDGET_RATIO if first else None)
    sec.note(f"gpufeed serves {gseries} series ({'simulated 8-GPU host' if sim else 'this host, no simulator'}), "
             f"node_exporter {nseries} (default collectors, this host). node_exporter collects on every scrape; "
             "gpufeed serves a payload rendered in the background.")
    sec.note(f"Client: one asyncio loop, raw HTTP/1.1 keep-alive connections, {opts.latency_seconds:g} s per level, "
             "closed loop. Client and servers share this machine's "
             f"{opts.cpus} CPUs, so at 10 and 50 scrapers the figures include queueing behind the client itself "
             "(client CPU per level is in the raw results). Errors are non-200 answers: node_exporter answers 503 "
             "beyond its --web.max-requests (40 by default).")
    return sec
