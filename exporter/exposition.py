"""Exposition: metric families from the newest snapshot, rendered off the scrape path and cached.

A scrape only writes bytes that were rendered before it arrived; rendering happens at most once per
``min_interval`` and only when the snapshot changed, so a slow collector never delays a scrape.
"""

from __future__ import annotations

import gzip
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest as generate_text
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporter import __version__, log
from exporter.sampling import Stage
from exporter.snapshot import Snapshot

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_log = log.get_logger(component="exposition")

def unix_offset() -> float:
    """Unix time minus the monotonic clock, now: turns an engine (monotonic) instant into a Unix timestamp.

    Read at every render, so a wall-clock step (NTP) moves the timestamps with it; nothing is scheduled or
    measured with it. The one use of wall time outside logs and certificate expiry.
    """
    return time.time() - time.monotonic()  # wall clock: *_timestamp_seconds are Unix times by convention


def self_metrics(snap: Snapshot, *, offset: float = 0.0, regressions: int = 0) -> Iterator[Metric]:
    """gpufeed's own health: per-collector success/availability/duration, per-sampler overruns, restarts and
    sample age, stuck worker threads, dropped log lines, withheld counter regressions, build info.

    ``offset`` turns engine-clock times into Unix times (:func:`unix_offset` for the daemon's monotonic clock;
    0 under a virtual clock, whose timestamps are then virtual seconds).
    """
    success = GaugeMetricFamily(
        "gpufeed_collector_success",
        "Whether the collector's last run succeeded (1) or failed (0); absent when its source does not "
        "exist on this host (see gpufeed_collector_available).",
        labels=["collector"],
    )
    available = GaugeMetricFamily(
        "gpufeed_collector_available",
        "Whether the collector's source exists on this host (0: e.g. PSI disabled, no NFS client, no GPU driver).",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "gpufeed_collector_duration_seconds",
        "Duration of the collector's last run (the slowest of its samplers).",
        labels=["collector"],
    )
    overruns = CounterMetricFamily(
        "gpufeed_sampler_overruns",
        "Sampling ticks missed because a run took longer than the sampler's interval (or its previous call "
        "is still blocked past its deadline).",
        labels=["sampler"],
    )
    restarts = CounterMetricFamily(
        "gpufeed_sampler_restarts",
        "Times a crashed sampler task was restarted.",
        labels=["sampler"],
    )
    age = GaugeMetricFamily(
        "gpufeed_sample_age_seconds",
        "Age of the sampler's newest successful sample when this payload was published; grows while the "
        "sampler fails or is blocked. Absent until its first success and while its source does not exist.",
        labels=["sampler"],
    )
    last_ok = GaugeMetricFamily(
        "gpufeed_sampler_last_success_timestamp_seconds",
        "Unix time of the sampler's newest successful sample. Alert on time() minus this: it keeps growing "
        "even if the exporter stopped publishing.",
        labels=["sampler"],
    )
    by_collector: dict[str, list[tuple[bool, bool, float, int]]] = {}
    for st in snap.status.values():
        by_collector.setdefault(st.collector, []).append((st.success, st.available, st.duration, st.runs))
        overruns.add_metric([st.name], float(st.overruns))
        restarts.add_metric([st.name], float(st.restarts))
        if st.last_success is not None and st.available:  # a source gone by design is not a stale one
            age.add_metric([st.name], max(0.0, snap.t - st.last_success))
            last_ok.add_metric([st.name], st.last_success + offset)
    for name in sorted(by_collector):
        rows = [r for r in by_collector[name] if r[3] > 0]
        if not rows:
            continue
        avail = any(r[1] for r in rows)
        available.add_metric([name], 1.0 if avail else 0.0)
        if avail:
            success.add_metric([name], 1.0 if all(r[0] for r in rows if r[1]) else 0.0)
        duration.add_metric([name], max(r[2] for r in rows))
    abandoned = GaugeMetricFamily(
        "gpufeed_sampler_abandoned_threads",
        "Worker threads stuck in a sampler call that passed its deadline (each was replaced; bounded).",
    )
    abandoned.add_metric([], float(snap.abandoned_threads))
    dropped = CounterMetricFamily(
        "gpufeed_log_messages_dropped", "Log lines that could not be written (stderr closed, full or broken)."
    )
    dropped.add_metric([], float(log.dropped()))
    withheld = CounterMetricFamily(
        "gpufeed_exposition_regressions_withheld",
        "Counter samples withheld because they were lower than the value last exported for the same series.",
    )
    withheld.add_metric([], float(regressions))
    build = GaugeMetricFamily(
        "gpufeed_build_info", "gpufeed version and Python version, value 1.", labels=["version", "python"]
    )
    build.add_metric([__version__, platform.python_version()], 1.0)
    yield from (success, available, duration, overruns, restarts, age, last_ok, abandoned, dropped, withheld,
                build)


class MonotonicGuard:
    """Counters never go backwards while a series lives: a ``_total`` sample lower than the one exported for
    the same series at the previous render is withheld (the series is absent from this payload) and counted.

    A decrease that is not a reset -- a source falling back to an older sample -- makes ``rate()`` invent a
    spike the size of the whole counter; absence is honest (an unknown value is omitted). The high-water mark
    is kept while the source keeps producing the series and forgotten once it stops (process gone, device
    removed), so a real reset after that is a new series life that ``rate()`` handles. Bounded by the series
    of one payload.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.regressions = 0

    def apply(self, families: list[Metric]) -> list[Metric]:
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in families:
            if fam.type != "counter":
                continue
            kept = []
            for sample in fam.samples:
                if not sample.name.endswith("_total"):
                    kept.append(sample)
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                prev = self._last.get(key)
                if prev is not None and sample.value < prev:
                    self.regressions += 1
                    seen[key] = prev
                    if log.once(("counter_regression", sample.name)):
                        _log.error("counter_regression", metric=sample.name, labels=dict(key[1]), value=sample.value,
                                   previous=prev, action="sample withheld until the series passes its last value")
                    continue
                seen[key] = sample.value
                kept.append(sample)
            fam.samples = kept
        self._last = seen
        return families


class SnapshotCollector:
    """A client_python custom collector over the current snapshot; ``collect`` does no I/O."""

    def __init__(self, stages: Sequence[Stage], offset: Callable[[], float] | None = None) -> None:
        self.stages = list(stages)
        self.snapshot = Snapshot(version=0, t=0.0)
        self.offset = offset
        self.guard = MonotonicGuard()

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        families: list[Metric] = []
        for c in self.stages:
            try:
                families.extend(c.metrics(snap))
            except Exception as e:
                if log.once(("metrics_failed", c.name)):
                    _log.error("collector_metrics_failed", collector=c.name, error=repr(e), exc_info=e)
        self.guard.apply(families)
        offset = self.offset() if self.offset is not None else 0.0
        yield from self_metrics(snap, offset=offset, regressions=self.guard.regressions)
        yield from families


@dataclass(frozen=True, slots=True)
class Payload:
    """One rendered exposition, with its gzip form."""

    body: bytes
    gz: bytes
    content_type: str


def _payload(body: bytes, content_type: str) -> Payload:
    return Payload(body=body, gz=gzip.compress(body, compresslevel=1), content_type=content_type)


class _Families:
    """A collector that yields an already-built list of families: collect once, format twice."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> list[Metric]:
        return self.families


# A format asked for within this long is re-rendered in the background with every new snapshot; one not
# asked for is rendered only on demand. Prometheus asks for OpenMetrics, curl and most tools for text.
WARM_SECONDS = 300.0


class Renderer:
    """Renders the snapshot into cached payloads, in the background, in the formats scrapers ask for.

    The metric families are collected once per snapshot and formatted into text and/or OpenMetrics --
    each format that was asked for in the last ``WARM_SECONDS`` -- so that a scrape, whatever it
    negotiates, only copies bytes. A format nobody asked for recently is formatted on its first request
    (from the families already collected) and kept warm from then on.
    """

    def __init__(self, stages: Sequence[Stage], *, offset: Callable[[], float] | None = None) -> None:
        self.source = SnapshotCollector(stages, offset)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.source)
        self._families = _Families()
        self._formatted = CollectorRegistry(auto_describe=False)
        self._formatted.register(self._families)
        self._lock = threading.Lock()
        self._version = -1  # the snapshot whose families were collected last (set once its warm formats are done)
        # (snapshot version, payload): replaced as one reference, so a reader on another thread (the HTTP
        # server's) never pairs a payload with the wrong version and never waits for a render in progress.
        self._text: tuple[int, Payload] = (-1, _payload(b"", TEXT_CONTENT_TYPE))
        self._om: tuple[int, Payload] | None = None
        self._text_asked = time.monotonic()  # text is what an unconfigured client gets: warm from the start
        self._om_asked = -WARM_SECONDS

    @property
    def version(self) -> int:
        """Version of the snapshot the cached payload was rendered from."""
        return self._version

    def render(self, snap: Snapshot) -> None:
        """Collect ``snap``'s families and format the warm formats (background, never on the scrape path)."""
        with self._lock:
            if snap.version == self._version:
                return
            self.source.snapshot = snap
            self._families.families = list(self.registry.collect())
            now = time.monotonic()
            om_warm = now - self._om_asked < WARM_SECONDS
            if now - self._text_asked < WARM_SECONDS or not om_warm:
                self._format_text(snap.version)
            if om_warm:
                self._format_om(snap.version)
            self._version = snap.version

    def _format_text(self, version: int) -> Payload:
        payload = _payload(generate_text(self._formatted), TEXT_CONTENT_TYPE)
        self._text = (version, payload)
        return payload

    def _format_om(self, version: int) -> Payload:
        payload = _payload(generate_openmetrics(self._formatted), OPENMETRICS_CONTENT_TYPE)  # type: ignore[no-untyped-call]
        self._om = (version, payload)
        return payload

    def text(self) -> Payload:
        """The newest text-format payload."""
        self._text_asked = time.monotonic()
        version, payload = self._text
        if version >= self._version:
            return payload
        with self._lock:  # text went cold (nobody asked for it for a while): format it once, now
            version, payload = self._text
            return payload if version >= self._version else self._format_text(self._version)

    def openmetrics(self) -> Payload:
        """The newest OpenMetrics payload (formatted in the background once asked for)."""
        self._om_asked = time.monotonic()
        om = self._om
        if om is not None and om[0] >= self._version:
            return om[1]
        with self._lock:  # first request (or cold): format once from the families already collected
            om = self._om
            return om[1] if om is not None and om[0] >= self._version else self._format_om(self._version)
