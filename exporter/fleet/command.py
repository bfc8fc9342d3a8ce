"""``gpufeed report``: flags, validation, progress, exit codes; the glue of collect -> figures -> renderers.

Exit status: 0 written; 2 bad flag or http config (one line naming it); 3 Prometheus unreachable (connection,
TLS); 4 credentials missing or refused (401/403); 5 no gpufeed data in the range; 6 recording rules missing
with ``--source rules``; 7 Prometheus rejected a query or answered unexpectedly; 8 the plotting library
(``gpufeed[report]``) is not installed or cannot start (no writable cache directory); 9 an answer larger
than ``--max-answer-size`` or queries past ``--deadline``. Never 70: a malformed answer is one line naming it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from exporter import log
from exporter.fleet import page, ticket
from exporter.fleet.collect import SELECTOR, CollectOptions, MissingRulesError, NoDataError, collect
from exporter.fleet.figures import build_report, to_json
from exporter.fleet.model import BY_LABEL, Window
from exporter.fleet.promapi import HttpConfigError, HttpOptions, PromError, PrometheusClient, load_http_config

EXIT_USAGE = 2
EXIT_NO_PLOTTING = 8
DEFAULT_RANGE = "7d"
DEFAULT_STEP = "1h"
# Raw per-workload rollups tile each step with 5-minute increases (collect.SUBSTEP): the step is a multiple.
STEP_MULTIPLE_S = 300
MAX_STEPS = 11000  # Prometheus refuses range queries with more points per series
_DUR = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_SIZE = re.compile(r"(\d+)(B|KiB|MiB|GiB)")
_UNIT_B = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
DEFAULT_MAX_ANSWER = "64MiB"
DEFAULT_DEADLINE = "10m"

_log = log.get_logger(component="report")


class UsageError(ValueError):
    """A bad flag value: the message names the flag."""


def parse_duration(text: str, flag: str) -> float:
    """A Prometheus duration ("7d", "1h30m", "90s") in seconds."""
    parts = _DUR.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise UsageError(f"{flag}: {text!r} is not a duration like 7d, 12h or 1h30m")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"{flag}: must be more than 0")
    return float(seconds)


def parse_size(text: str, flag: str) -> int:
    """A size with a binary unit ("64MiB", "1GiB") in bytes."""
    m = _SIZE.fullmatch(text)
    if m is None or int(m[1]) <= 0:
        raise UsageError(f"{flag}: {text!r} is not a size like 64MiB or 1GiB")
    return int(m[1]) * _UNIT_B[m[2]]


def parse_time(text: str, flag: str, now: float) -> float:
    """``now``, a Unix timestamp or an RFC 3339 time ("2025-11-24T00:00:00Z") as Unix seconds."""
    if text == "now":
        return now
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not now, a Unix timestamp or an RFC 3339 time") from None
    if t.tzinfo is None:
        raise UsageError(f"{flag}: {text!r} has no time zone (add Z for UTC)")
    return t.timestamp()


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``report`` subcommand's parser (values are validated by :func:`options`, one line per error)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "report", help="fleet capacity review from a Prometheus that scrapes gpufeed (HTML, JSON, Markdown)",
        allow_abbrev=False, description="Where did the GPU-hours go? Queries Prometheus over its HTTP API and "
        "writes report.html (self-contained), report.json (docs/report.schema.json) and report.md.")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://prometheus:9090 (required)")
    p.add_argument("--range", default=DEFAULT_RANGE, metavar="DURATION", help="how far back from --end (default 7d)")
    p.add_argument("--end", default="now", metavar="TIME", help="end of the range: now, Unix seconds or RFC 3339")
    p.add_argument("--step", default=DEFAULT_STEP, metavar="DURATION",
                   help="resolution of the timeline, a multiple of 5m (default 1h)")
    p.add_argument("--by", default="host", metavar="namespace|job|host",
                   help="rank workloads by Kubernetes namespace, Slurm job or host (default host)")
    p.add_argument("--out", default=".", metavar="DIR", help="directory to write the report to (default .)")
    p.add_argument("--source", default="auto", metavar="auto|rules|raw",
                   help="recording rules, raw series, or rules where loaded (default auto)")
    p.add_argument("--selector", default="", metavar="'{LABEL=\"VALUE\",...}'",
                   help="read only the series with these labels, e.g. '{cluster=\"eu-1\"}' (with the recording "
                        "rules, labels they keep: thresholds.yaml aggregation_labels)")
    p.add_argument("--cluster", default="", metavar="NAME", help="shorthand for --selector '{cluster=\"NAME\"}'")
    p.add_argument("--compare", default="", metavar="previous",
                   help="compare with the range of the same length just before (per cause and per --by, deltas)")
    p.add_argument("--price-per-gpu-hour", dest="price_per_gpu_hour", default="", metavar="PRICE",
                   help="what one GPU-hour costs: prices the waiting GPU-hours (any currency)")
    p.add_argument("--price-per-kwh", dest="price_per_kwh", default="", metavar="PRICE",
                   help="what one kWh costs (same currency): prices the energy GPUs drew while waiting")
    p.add_argument("--top", default="10", metavar="N", help="rows in the top-waiting tables (default 10)")
    p.add_argument("--timeout", default="60s", metavar="DURATION",
                   help="one request, from its start to the end of its answer (default 60s)")
    p.add_argument("--deadline", default=DEFAULT_DEADLINE, metavar="DURATION",
                   help=f"every query together (default {DEFAULT_DEADLINE})")
    p.add_argument("--max-answer-size", default=DEFAULT_MAX_ANSWER, metavar="SIZE",
                   help=f"the largest answer read, e.g. 256MiB (default {DEFAULT_MAX_ANSWER}; parsed, an "
                   "answer takes about 15 times its size in memory, four at a time)")
    p.add_argument("--http.config.file", dest="http_config_file", metavar="FILE",
                   help="basic_auth / authorization / tls_config, the file promtool takes")
    p.add_argument("--user", metavar="USER", help="basic auth user (password from --password-file)")
    p.add_argument("--password-file", metavar="FILE", help="file holding the basic auth password")
    p.add_argument("--ca-file", metavar="FILE", help="CA certificates to verify the server with")
    p.add_argument("--cert-file", metavar="FILE", help="client certificate (mutual TLS)")
    p.add_argument("--key-file", metavar="FILE", help="client certificate key")
    p.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the server certificate")
    p.add_argument("--log.level", dest="log_level", default="warn", metavar="LEVEL", help="debug, info, warn, error")
    return p


@dataclass(frozen=True, slots=True)
class Options:
    prometheus: str
    window: Window
    by: str
    out: Path
    source: str
    top: int
    log_level: str
    selector: str = ""  # matchers without braces
    compare: bool = False
    price_per_gpu_hour: float | None = None
    price_per_kwh: float | None = None


def _price(text: str, flag: str) -> float | None:
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise UsageError(f"{flag}: must be a finite number of at least 0")
    return v


def selector(ns: argparse.Namespace) -> str:
    """The label matchers of --selector or --cluster, without braces ("" for none)."""
    if ns.selector and ns.cluster:
        raise UsageError("--cluster: give --cluster or --selector, not both")
    cluster, text = str(ns.cluster), str(ns.selector).strip()
    if cluster:
        return 'cluster="' + cluster.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if not text:
        return ""
    if not SELECTOR.fullmatch(text):
        raise UsageError(f"--selector: {text!r} is not a series selector like '{{cluster=\"eu-1\"}}'")
    return text[1:-1].strip().rstrip(",").strip()


def options(ns: argparse.Namespace, now: float) -> Options:
    """Validated options; UsageError naming the flag."""
    if not ns.prometheus:
        raise UsageError("--prometheus: required (the base URL of the Prometheus server)")
    if ns.by not in BY_LABEL:
        raise UsageError(f"--by: {ns.by!r} is not one of namespace, job, host")
    if ns.source not in ("auto", "rules", "raw"):
        raise UsageError(f"--source: {ns.source!r} is not one of auto, rules, raw")
    if ns.log_level not in log.LEVELS:
        raise UsageError(f"--log.level: {ns.log_level!r} is not one of {', '.join(log.LEVELS)}")
    try:
        top = int(ns.top)
    except ValueError:
        raise UsageError(f"--top: {ns.top!r} is not a whole number") from None
    if top < 1:
        raise UsageError("--top: must be at least 1")
    rng = parse_duration(ns.range, "--range")
    step = parse_duration(ns.step, "--step")
    if step % STEP_MULTIPLE_S:
        raise UsageError(f"--step: {ns.step} is not a multiple of 5m")
    if rng % step:
        raise UsageError(f"--range: {ns.range} is not a whole number of steps of {ns.step} (--step)")
    if rng / step > MAX_STEPS:
        raise UsageError(f"--step: {ns.range} in steps of {ns.step} is more than {MAX_STEPS} points; use a longer step")
    end = parse_time(ns.end, "--end", now)
    if end > now + 60:
        raise UsageError("--end: in the future")
    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a directory")
    if ns.compare not in ("", "previous"):
        raise UsageError(f"--compare: {ns.compare!r} is not previous")
    return Options(prometheus=ns.prometheus, window=Window(start=end - rng, end=end, step=step), by=ns.by, out=out,
                   source=ns.source, top=top, log_level=ns.log_level, selector=selector(ns),
                   compare=ns.compare == "previous",
                   price_per_gpu_hour=_price(ns.price_per_gpu_hour, "--price-per-gpu-hour"),
                   price_per_kwh=_price(ns.price_per_kwh, "--price-per-kwh"))


def http_options(ns: argparse.Namespace) -> HttpOptions:
    """HttpOptions from --http.config.file, overridden by the explicit flags."""
    opts = load_http_config(Path(ns.http_config_file)) if ns.http_config_file else HttpOptions()
    if ns.password_file and not ns.user:
        raise HttpConfigError("--password-file: needs --user")
    if ns.user:
        password = None
        if ns.password_file:
            try:
                password = Path(ns.password_file).read_text().strip()
            except OSError as e:
                raise HttpConfigError(f"--password-file: cannot read {ns.password_file}: {e.strerror}") from e
        opts = replace(opts, username=ns.user, password=password, authorization=None)
    for flag in ("ca_file", "cert_file", "key_file"):
        value = getattr(ns, flag)
        if value is not None:
            if not Path(value).is_file():
                raise HttpConfigError(f"--{flag.replace('_', '-')}: {value} is not a readable file")
            opts = replace(opts, **{flag: value})
    if ns.insecure_skip_verify:
        opts = replace(opts, insecure_skip_verify=True)
    return replace(opts, timeout_s=parse_duration(ns.timeout, "--timeout"),
                   deadline_s=parse_duration(ns.deadline, "--deadline"),
                   max_answer_bytes=parse_size(ns.max_answer_size, "--max-answer-size"))


class _Progress:
    """One self-overwriting status line on a terminal (stderr); nothing when stderr is not a TTY."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream if stream.isatty() else None
        self.shown = False

    def __call__(self, done: int, total: int, what: str) -> None:
        if self.stream is None:
            return
        width = 24
        filled = width * done // total if total else width
        self.stream.write(f"\r\x1b[Kgpufeed report: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                          f"queries, {what}")
        self.stream.flush()
        self.shown = True

    def say(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(f"\r\x1b[Kgpufeed report: {text}")
            self.stream.flush()
            self.shown = True

    def end(self) -> None:
        if self.stream is not None and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _fail(code: int, message: str) -> int:
    print(f"gpufeed report: error: {message}", file=sys.stderr)
    return code


def run_report(ns: argparse.Namespace) -> int:
    """The ``gpufeed report`` command."""
    t0 = time.monotonic()
    now = time.time()
    try:
        opts = options(ns, now)
    except UsageError as e:
        return _fail(EXIT_USAGE, str(e))
    log.configure(opts.log_level)
    try:
        from exporter.fleet import plots
    except ImportError as e:
        return _fail(EXIT_NO_PLOTTING, f"the report's plots need matplotlib ({e.name} is missing): "
                     "pip install matplotlib (from a clone of gpufeed: pip install '.[report]')")
    except OSError as e:  # matplotlib wants a writable cache directory (MPLCONFIGDIR, else a temporary one)
        return _fail(EXIT_NO_PLOTTING, f"matplotlib cannot start: {e}")
    progress = _Progress(sys.stderr)
    try:
        client = PrometheusClient(opts.prometheus, http_options(ns))
    except (HttpConfigError, UsageError) as e:
        return _fail(EXIT_USAGE, str(e))
    try:
        progress.say(f"asking {client.url} for its recording rules")
        copts = CollectOptions(window=opts.window, by=opts.by, source=opts.source, selector=opts.selector)
        data = collect(client, copts, progress)
    except (PromError, NoDataError, MissingRulesError) as e:
        progress.end()
        return _fail(e.exit_code, str(e))
    previous = None
    if opts.compare:
        w = opts.window
        try:
            previous = collect(client, replace(copts, window=Window(start=w.start - w.seconds, end=w.start,
                                                                     step=w.step)), progress)
        except NoDataError:
            data = replace(data, notes=(*data.notes, "No gpufeed data in the period before this one: nothing to "
                                                     "compare with (--compare previous)."))
        except (PromError, MissingRulesError) as e:
            progress.end()
            return _fail(e.exit_code, str(e))
    t_query = time.monotonic() - t0
    progress.say("computing figures and drawing plots")
    report = build_report(data, prometheus=client.url, generated_at=now, top=opts.top,
                          price_per_gpu_hour=opts.price_per_gpu_hour, price_per_kwh=opts.price_per_kwh,
                          previous=previous)
    svgs = plots.render_all(report)
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
        paths = {"html": opts.out / "report.html", "json": opts.out / "report.json", "md": opts.out / "report.md"}
        paths["html"].write_text(page.render(report, svgs), encoding="utf-8")
        paths["json"].write_text(json.dumps(to_json(report), indent=1) + "\n", encoding="utf-8")
        paths["md"].write_text(ticket.render(report), encoding="utf-8")
    except OSError as e:
        progress.end()
        return _fail(EXIT_USAGE, f"--out: cannot write to {opts.out}: {e.strerror}")
    progress.end()
    took = time.monotonic() - t0
    _log.info("report_written", out=str(opts.out), seconds=round(took, 2), query_seconds=round(t_query, 2),
              gpus=report.fleet.gpus)
    print(report.summary)
    used = ", ".join(f"{s.family}={s.kind}" for s in report.sources)
    print(f"sources: {used}" + "".join(f"\n  {s.family}: {s.note}" for s in report.sources if s.note))
    print(f"wrote {paths['html']}, {paths['json']}, {paths['md']} in {took:.1f} s")
    return 0
