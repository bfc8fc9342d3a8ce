"""The benchmark harness's own arithmetic and parsing: wrong here means every figure in docs/benchmarks.md
is wrong, so these are checked with plain data (no timing, no processes)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import struct
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench import common, fidelity, gcpause, procs, procstat, report, scrape, series, soak, verdicts


def test_percentile_is_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert scrape.percentile(values, 50) == 50.0
    assert scrape.percentile(values, 99) == 99.0
    assert scrape.percentile(values, 100) == 100.0
    assert scrape.percentile([7.0], 99) == 7.0
    assert math.isnan(scrape.percentile([], 50))


def test_gc_pause_bins_give_a_p99_within_a_bin_of_the_exact_one_and_pool_generations() -> None:
    young, middle = gcpause.PauseBins(), gcpause.PauseBins()
    pauses = [0.0004 + 0.00001 * i for i in range(990)] + [0.012 + 0.001 * i for i in range(10)]  # 1% over 10 ms
    for i, p in enumerate(pauses):
        (young if i % 3 else middle).add(p, p / 2)
    s = gcpause.summary([young.dump(), middle.dump()])
    exact = sorted(pauses)[int(0.99 * len(pauses))]
    assert s["count"] == 1000
    assert exact * 1000 <= s["p99_ms"] <= (exact + gcpause.BIN_S) * 1000
    assert s["p99_ms"] > 10.0, "ten pauses in a thousand over 10 ms: the p99 is over"
    assert s["max_ms"] == pytest.approx(21.0) and s["cpu_max_ms"] == pytest.approx(10.5)
    assert gcpause.summary([young.dump()])["count"] + gcpause.summary([middle.dump()])["count"] == 1000
    one = gcpause.PauseBins()
    one.add(0.2, 0.1)  # beyond the last bin: the p99 is the exact maximum, not the bins' edge
    assert gcpause.summary([one.dump()])["p99_ms"] == pytest.approx(200.0)
    assert gcpause.summary([])["count"] == 0 and gcpause.summary([])["p99_ms"] == 0.0


def test_leaking_rss_has_a_slope_outside_its_confidence_interval() -> None:
    # 1 MiB per minute on top of +/- 64 KiB of alternating noise: a leak, and the fit must say so.
    points = [(t * 15.0, 50e6 + t * 15.0 * (1048576 / 60) + (65536 if t % 2 else -65536)) for t in range(40)]
    slope, _, se = soak.fit(points)
    assert slope * 60 == pytest.approx(1048576, rel=0.02)
    assert abs(slope) > 1.96 * se


def test_flat_rss_with_noise_has_a_slope_inside_its_confidence_interval() -> None:
    points = [(t * 15.0, 50e6 + (200_000 if t % 3 == 0 else -100_000)) for t in range(40)]
    slope, intercept, se = soak.fit(points)
    assert abs(slope) <= 1.96 * se
    assert intercept == pytest.approx(50e6, rel=0.01)


def test_rss_that_settles_early_is_flat_over_the_second_half_and_a_leak_is_not() -> None:
    # The one-hour soaks: +2 MiB over the first 20 minutes, then level (+/- 64 KiB of noise) -- a plateau, which a
    # line through the whole hour calls +1.8 MiB/h. A leak of 1 MiB/h stays a leak in the second half.
    def rss(t: float, leak: float) -> int:
        settling = 2 * 1048576 * min(t, 1200.0) / 1200.0
        return int(57 * 1048576 + settling + leak * t / 3600 + (65536 if int(t / 15) % 2 else -65536))

    plateau = [(t * 15.0, rss(t * 15.0, 0.0)) for t in range(241)]
    assert not soak.slope_row(plateau, 180.0).flat
    assert soak.slope_row(plateau, 1800.0).flat
    leak = [(t * 15.0, rss(t * 15.0, 1048576.0)) for t in range(241)]
    settled = soak.slope_row(leak, 1800.0)
    assert not settled.flat and settled.slope * 3600 == pytest.approx(1048576, rel=0.1)
    assert "+1.0" in settled.text and "121 samples" in settled.text


def test_too_few_rss_samples_give_an_infinite_error_not_a_verdict() -> None:
    assert soak.fit([(0.0, 1.0), (1.0, 2.0)])[2] == math.inf


PAYLOAD = """# HELP gpufeed_gpu_info GPU identity.
# TYPE gpufeed_gpu_info gauge
gpufeed_gpu_info{gpu="0",uuid="GPU-0",name="H100",pci_bus_id="00000000:18:00.0",numa_node="0"} 1.0
gpufeed_gpu_info{gpu="1",uuid="GPU-1",name="H100",pci_bus_id="00000000:2A:00.0",numa_node="0"} 1.0
gpufeed_gpu_power_watts{gpu="0"} 350.0
gpufeed_gpu_power_watts{gpu="1"} 351.5
gpufeed_pcie_link_current_width{bdf="0000:17:00.0",role="switch_downstream",gpu_bdf="0000:18:00.0"} 16.0
gpufeed_pcie_link_current_width{bdf="0000:29:00.0",role="switch_downstream",gpu_bdf="0000:2a:00.0"} 16.0
gpufeed_pcie_aer_errors_total{bdf="0000:17:00.0",role="switch_downstream",severity="fatal"} 0.0
gpufeed_finding{check="memory_pressure",gpu=""} 0.0
gpufeed_memory_total_bytes 5.49755813888e+11
gpufeed_process_cpu_seconds_total{pid="20000",comm="python"} 12.5
gpufeed_gpu_idle_gap_seconds_bucket{gpu="0",le="0.1"} 3.0
gpufeed_gpu_idle_gap_seconds_bucket{gpu="0",le="+Inf"} 4.0
"""


def test_series_with_gpu_or_gpu_bdf_label_count_for_that_gpu_and_the_rest_for_the_host() -> None:
    per, host, total = series.attribute(PAYLOAD)
    # gpu 0: info, power, its PCIe hop (by gpu_bdf, NVML's 8-digit domain), that hop's AER counter (by bdf),
    # two histogram buckets.
    assert per == {"0": 6, "1": 3}
    # the host-wide finding (gpu=""), memory and the per-process series are host-level.
    assert host == 3
    assert total == 12
    assert common.series_count(PAYLOAD.encode()) == 12
    assert common.gpu_count(PAYLOAD.encode()) == 2


def test_sum_metric_adds_every_series_and_ignores_longer_names() -> None:
    body = (b'gpufeed_sampler_overruns_total{sampler="gpu"} 3.0\n'
            b'gpufeed_sampler_overruns_total{sampler="proc"} 2.0\n'
            b'gpufeed_sampler_overruns_total_extra 100.0\n'
            b'# HELP gpufeed_sampler_overruns_total x\n')
    assert common.sum_metric(body, "gpufeed_sampler_overruns_total") == 5.0
    assert common.sum_metric(b"", "gpufeed_sampler_overruns_total") == 0.0


def test_sampler_intervals_are_those_overlapping_the_burn_window() -> None:
    dump = {"samplers": {
        "cpu": {"interval": 0.25, "t": [0.0, 0.25, 0.5, 0.76, 1.0, 1.6, 1.75, 2.0, 2.25]},
        "pcie": {"interval": 5.0, "t": [0.0, 5.0]},  # slow samplers say nothing about jitter
    }}
    iv = fidelity.intervals(dump, 0.2, 1.8)
    assert list(iv) == ["cpu"]
    # The intervals running into and out of the window count; 2.0 -> 2.25 lies wholly after it.
    assert iv["cpu"] == pytest.approx([0.25, 0.25, 0.26, 0.24, 0.6, 0.15, 0.25])
    s = fidelity.summarize(dump, 0.2, 1.8)
    assert s["samples"] == 7
    assert s["skipped"] == 1  # the 0.6 s gap: more than 1.5x the interval
    assert s["ratio_p50"] == pytest.approx(1.0)
    assert s["ratio_p99"] == pytest.approx(2.4)


def test_a_sampler_stalled_across_the_whole_window_is_one_long_interval_not_an_empty_window() -> None:
    dump = {"samplers": {"gpu": {"interval": 0.1, "t": [0.0, 0.1, 1.4, 1.5]}}}
    s = fidelity.summarize(dump, 0.2, 1.2)
    assert fidelity.intervals(dump, 0.2, 1.2)["gpu"] == pytest.approx([1.3])
    assert s["samples"] == 1 and s["skipped"] == 1
    assert s["ratio_p50"] == pytest.approx(13.0)


def test_report_puts_every_budget_row_in_the_summary_and_escapes_cells() -> None:
    sec = report.Section("x", "Example")
    sec.add("p99 | one scraper", "1.5 ms", "<= 2 ms", True)
    sec.add("context only", "42")
    sec.note("a note")
    failed = report.Section("y", "Broken", error="node_exporter not installed")
    text = report.markdown([sec, failed], {"CPU": "test"}, __import__("datetime").datetime(2026, 1, 1), 60.0, [])
    assert "| Example | p99 \\| one scraper | 1.5 ms | <= 2 ms | yes |" in text
    assert "Not measured: node_exporter not installed" in text
    assert "- a note" in text
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.endswith("|")


def test_write_doc_keeps_the_hand_written_part_and_replaces_the_figures(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nhow to read\n\n{report.GENERATED_MARK}\n\nold figures\n")
    report.write_doc(doc, "new figures")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nhow to read\n")
    assert "new figures" in text
    assert "old figures" not in text
    assert text.count(report.GENERATED_MARK) == 1


def test_process_cpu_time_rss_and_host_busy_time_are_measured() -> None:
    pid = os.getpid()
    before = procstat.cpu_seconds(pid)
    x = 0
    while procstat.cpu_seconds(pid) - before < 0.05:  # burn until the kernel has charged us 50 ms
        x += 1
    assert procstat.cpu_seconds(pid) >= before + 0.05
    assert procstat.rss_bytes(pid) > 1_000_000
    assert procstat.thread_count(pid) >= 1
    h0 = procstat.host_busy_seconds()
    c0 = procstat.cpu_seconds(pid)
    while procstat.cpu_seconds(pid) - c0 < 0.05:
        x += 1
    assert procstat.host_busy_seconds() - h0 >= 0.04  # our own burn is host busy time too (tick granularity)


@contextlib.contextmanager
def _server(chunked: bool, close: bool = False) -> Iterator[int]:
    """A tiny HTTP/1.1 keep-alive server on 127.0.0.1 answering every request with 'hello' (with ``close``, it
    closes the connection after each answer, as a server past its idle timeout would)."""
    loop = asyncio.new_event_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                if chunked:
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                await writer.drain()
                if close:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    import threading

    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield int(port)
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_scrape_client_reads_whole_bodies_over_keep_alive(chunked: bool) -> None:
    with _server(chunked) as port:
        r = scrape.scrape(port, concurrency=3, seconds=0.3)
    assert r.errors == 0
    assert len(r.latencies) >= 3
    assert r.bytes == 5 * len(r.latencies)
    assert all(x > 0 for x in r.latencies)


def test_the_overhead_scraper_keeps_one_connection_like_a_prometheus() -> None:
    with _server(chunked=False) as port, procs.Scraper(port) as scraper:
        got = [scraper.get() for _ in range(5)]
        assert scraper.connections == 1
    assert got == [(200, b"hello")] * 5


def test_the_overhead_scraper_reconnects_when_the_server_closed_the_connection() -> None:
    with _server(chunked=False, close=True) as port, procs.Scraper(port) as scraper:
        got = [scraper.get() for _ in range(3)]
        assert scraper.connections == 3
    assert got == [(200, b"hello")] * 3


def test_the_overhead_scraper_does_not_retry_a_new_connection_that_fails() -> None:
    with procs.Scraper(procs.free_port()) as scraper:
        with pytest.raises(ConnectionRefusedError):
            scraper.get()
        assert scraper.connections == 1


def test_scrape_client_counts_a_refused_connection_as_an_error_not_a_latency() -> None:
    from bench.procs import free_port

    r = scrape.scrape(free_port(), concurrency=1, seconds=0.1)
    assert r.latencies == ()
    assert r.errors >= 1


def test_a_verdict_settles_at_the_first_evaluation_from_which_it_holds_to_the_end() -> None:
    evals = [(1.0, "idle"), (2.0, "launch_bound"), (3.0, "idle"), (4.0, "launch_bound"), (5.0, "launch_bound")]
    assert verdicts.settle_time(evals, ["launch_bound"]) == 4.0
    assert verdicts.settle_time(evals, ["launch_bound", "idle"]) == 1.0  # a list: any of them


def test_a_verdict_gone_again_by_the_phase_end_or_never_seen_has_no_settle_time() -> None:
    assert verdicts.settle_time([(1.0, "launch_bound"), (2.0, None)], ["launch_bound"]) is None
    assert verdicts.settle_time([(1.0, "healthy")], ["launch_bound"]) is None
    assert verdicts.settle_time([], ["launch_bound"]) is None


def test_a_mig_instance_s_expected_verdict_is_timed_too() -> None:
    # expect[].mig: the instances of a GPU in MIG mode are judged one by one, and so is their latency.
    scenario = Path(__file__).resolve().parents[1] / "derived" / "scenarios" / "mig_instances.yaml"
    found = verdicts.latencies(scenario)
    mig = [x for x in found if x.mig is not None]
    assert mig, "the scenario expects MIG instance verdicts"
    assert all(x.seconds < verdicts.BUDGET_S for x in mig), mig
    assert all(x.raw()["seconds"] is not None for x in mig)


def test_fidelity_keeps_every_sample_of_the_burn_whatever_its_length() -> None:
    from exporter import cli
    from exporter.durations import parse_duration

    for seconds in (common.Options().fidelity_seconds, 600.0):
        opts = common.Options(fidelity_seconds=seconds)
        flags = fidelity.history_flags(opts)
        assert flags[0] == "--engine.history" and parse_duration(flags[1]) >= opts.warmup + seconds + 30.0, flags
        assert cli.main(["check-config", *flags]) == 0  # the daemon takes it as it is


def test_pace_events_count_only_changes_inside_the_window_and_not_returns_to_steady() -> None:
    from bench import overhead

    log = "\n".join([
        "ts=2026-12-02T11:49:45.572525Z level=info event=started component=daemon collectors=cpu,gpu,derived",
        "ts=2026-12-02T11:49:46.568310Z level=info event=verdict_changed collector=derived gpu=0 cause=healthy "
        "previous= confidence=0.95",
        "ts=2026-12-02T11:50:10.000000Z level=info event=gpu_fast_rate_changed component=gpu_backend gpu=3 "
        "interval_s=0.1 reason=dip",
        "ts=2026-12-02T11:50:12.000000Z level=info event=verdict_changed collector=derived gpu=3 cause=input_bound "
        "previous=healthy",
        "ts=2026-12-02T11:50:20.000000Z level=info event=gpu_fast_rate_changed component=gpu_backend gpu=3 "
        "interval_s=1.0 reason=steady",
        "ts=2026-12-02T11:50:21.000000Z level=info event=gpu_fast_rate_changed component=gpu_backend gpu=5 "
        "interval_s=0.1 reason=gap",
        "ts=not-a-time level=info event=gpu_fast_rate_changed gpu=1 reason=dip",
        "ts=2026-12-02T11:50:22.000000Z level=info event=sampler_crashed reason=dip",
        "ts=2026-12-02T11:50:23.000000Z level=info event=deep_focus_changed collector=derived sampler=proc_threads "
        "pids=20000,21000",
        "ts=2026-12-02T11:50:29.000000Z level=info event=deep_focus_changed collector=derived sampler=proc_threads "
        "pids=all",
        "ts=2026-12-02T11:51:00.000000Z level=info event=gpu_fast_rate_changed component=gpu_backend gpu=2 "
        "interval_s=0.1 reason=traffic",
    ])
    t0 = datetime(2026, 12, 2, 11, 50, 0, tzinfo=timezone.utc).timestamp()
    t1 = datetime(2026, 12, 2, 11, 50, 30, tzinfo=timezone.utc).timestamp()
    assert overhead.pace_events(log, t0, t1) == {"left_steady": 2, "verdict_changes": 1, "deep_focused": 1,
                                                 "left_reasons": ["gpu 3: dip", "gpu 5: gap"]}
    assert overhead.pace_events(log, 0.0, 2e9) == {"left_steady": 3, "verdict_changes": 2, "deep_focused": 1,
                                                   "left_reasons": ["gpu 3: dip", "gpu 5: gap", "gpu 2: traffic"]}
    assert overhead.pace_events(log.splitlines()[0], t0, t1) == {"left_steady": 0, "verdict_changes": 0,
                                                                 "deep_focused": 0, "left_reasons": []}
    # A log at warn, or in JSON, holds none of these lines: no count rather than a count of zero.
    for unreadable in ("", log.replace("level=info event=started", "level=warn event=something"),
                       '{"ts": "2026-12-02T11:49:45Z", "level": "info", "event": "started"}'):
        with pytest.raises(procs.BenchError, match="not countable"):
            overhead.pace_events(unreadable, t0, t1)
    assert "2 time(s) a GPU left the steady rate, 1 verdict change(s)" in overhead.fmt_pace(
        {"left_steady": 2, "verdict_changes": 1})
    assert "1 time(s) a GPU left the steady rate (gpu 3: dip), 0 verdict change(s) in" in overhead.fmt_pace(
        {"left_steady": 1, "verdict_changes": 0, "left_reasons": ["gpu 3: dip"]})
    assert "0 verdict change(s), deep sampling focused on waiting GPUs 2 time(s) in" in overhead.fmt_pace(
        {"left_steady": 0, "verdict_changes": 0, "deep_focused": 2})


def test_cpus_awake_holds_a_zero_latency_request_while_open_and_says_why_when_it_cannot(tmp_path: Path) -> None:
    from bench.latency import cpus_awake

    dev = tmp_path / "cpu_dma_latency"
    dev.write_bytes(b"")
    with cpus_awake(str(dev)) as why:
        assert why is None
        assert dev.read_bytes() == struct.pack("=i", 0)  # the request the kernel holds while the file is open
    with cpus_awake(str(tmp_path / "absent")) as why:
        assert why is not None and "not writable" in why
