"""Exposition: metric families from the newest snapshot, rendered off the scrape path and cached.

A scrape only writes bytes that were rendered before it arrived; rendering happens shortly before a scrape
is due (exporter/pacing.py; at most once per ``--web.render-interval``), and only the stages whose samples
changed are formatted again, so a slow collector never delays a scrape and a render costs what changed.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import buildinfo, expfmt, log
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
    """gpufeed's own health: per-collector success/availability/CPU, per-sampler overruns and last
    success, sampler restarts, stuck worker threads, dropped log lines, withheld counter regressions, build info.

    Per sampler only what an alert reads per sampler (overruns, last success); the age of a sampler's newest
    sample is ``time()`` minus its last success, and restarts (a crash, logged with the sampler's name) are one
    total -- the host-level series budget (DESIGN.md).

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
        "0 for a collector whose source does not exist on this host (e.g. PSI disabled, no NFS client, no GPU "
        "driver); absent for the available ones, which have a gpufeed_collector_success series instead.",
        labels=["collector"],
    )
    overruns = CounterMetricFamily(
        "gpufeed_sampler_overruns",
        "Sampling ticks missed because a run took longer than the sampler's interval (or its previous call "
        "is still blocked past its deadline); a sampler's series appears with its first missed tick.",
        labels=["sampler"],
    )
    restarts = CounterMetricFamily(
        "gpufeed_sampler_restarts",
        "Times a crashed sampler task was restarted, all samplers together (the log's sampler_crashed events "
        "name it).",
    )
    last_ok = GaugeMetricFamily(
        "gpufeed_sampler_last_success_timestamp_seconds",
        "Unix time of the sampler's newest successful sample. Alert on time() minus this: it keeps growing "
        "even if the exporter stopped publishing.",
        labels=["sampler"],
    )
    cpu = CounterMetricFamily(
        "gpufeed_collector_cpu_seconds",
        "CPU time gpufeed spent in the collector's sampler runs (the running thread's CPU clock, so waits for "
        "I/O or the GIL are not counted): what each collector costs.",
        labels=["collector"],
    )
    by_collector: dict[str, list[tuple[bool, bool, float, int]]] = {}
    cpu_of: dict[str, float] = {}
    for st in snap.status.values():
        by_collector.setdefault(st.collector, []).append((st.success, st.available, st.duration, st.runs))
        cpu_of[st.collector] = cpu_of.get(st.collector, 0.0) + st.cpu_seconds
        if st.overruns:  # absent while 0 (the host-level series budget): the alert's rate() counts from the first
            overruns.add_metric([st.name], float(st.overruns))
        if st.last_success is not None and st.available:  # a source gone by design is not a stale one
            last_ok.add_metric([st.name], st.last_success + offset)
    restarts.add_metric([], float(sum(st.restarts for st in snap.status.values())))
    for name in sorted(by_collector):
        rows = [r for r in by_collector[name] if r[3] > 0]
        if not rows:
            continue
        avail = any(r[1] for r in rows)
        # The 1s would only repeat that a success series exists (the host-level series budget): 0s only.
        if not avail:
            available.add_metric([name], 0.0)
        else:
            success.add_metric([name], 1.0 if all(r[0] for r in rows if r[1]) else 0.0)
        cpu.add_metric([name], cpu_of[name])
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
    info = buildinfo.labels()
    build = GaugeMetricFamily(
        "gpufeed_build_info",
        "A metric with a constant '1' value labeled by the version, source revision and Python version gpufeed "
        "runs with.", labels=list(info),
    )
    build.add_metric(list(info.values()), 1.0)
    yield from (success, available, cpu, overruns, restarts, last_ok, abandoned, dropped, withheld, build)


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
        self._lives: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self.regressions = 0

    def apply(self, families: list[Metric]) -> list[Metric]:
        """``families`` with the regressions withheld. A family may say which life of a series each ``pid``
        label value is (``lives``: pid -> the process's start time, exporter/collectors/proc.py): a pid whose
        life changed is another process, and its lower value a reset that ``rate()`` handles, not a
        regression."""
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        lives_seen: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        for fam in families:
            if fam.type != "counter":
                continue
            lives: Mapping[str, int] = getattr(fam, "lives", {})
            kept = []
            for sample in fam.samples:
                if not sample.name.endswith("_total"):
                    kept.append(sample)
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                prev = self._last.get(key)
                life = lives.get(sample.labels.get("pid", ""))
                if life is not None:
                    lives_seen[key] = life
                    if self._lives.get(key, life) != life:
                        prev = None  # another process under the same pid and name: a new life
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
        self._lives = lives_seen
        return families


@dataclass(frozen=True, slots=True)
class Payload:
    """One rendered exposition, with its gzip form."""

    body: bytes
    gz: bytes
    content_type: str


def _payload(body: bytes, content_type: str) -> Payload:
    return Payload(body=body, gz=gzip.compress(body, compresslevel=1), content_type=content_type)


@dataclass(slots=True)
class _Chunk:
    """One stage's part of the payload, and the samples it was rendered from (kept alive, compared by identity:
    a stage whose samplers published nothing new renders the same bytes, so they are reused).

    ``families`` are kept only until both formats are formatted (text at once, OpenMetrics with it while a
    scraper asks for it, else when first asked for): after that nothing reads them, and each is a few hundred
    tracked objects (a Metric, a Sample per series) that every garbage collection of the old generation would
    otherwise traverse until the stage renders again."""

    inputs: tuple[object, ...]
    families: list[Metric] | None
    text: bytes
    om: bytes | None = None


# A format asked for within this long is re-rendered in the background with every new snapshot; one not
# asked for is rendered only on demand. Prometheus asks for OpenMetrics, curl and most tools for text.
WARM_SECONDS = 300.0


class Renderer:
    """Renders the snapshot into cached payloads, in the background, in the formats scrapers ask for.

    The payload is the self metrics followed by every stage's families, in stage order. A stage's families
    depend only on its own samplers' newest samples (the ``Stage.metrics`` contract), so a stage whose samples
    did not change since the last render reuses its bytes: a render costs what changed, not the whole payload
    (most samplers run every few seconds, the fastest every 100 ms). Each format asked for in the last
    ``WARM_SECONDS`` is formatted with every new snapshot, so that a scrape, whatever it negotiates, only copies
    bytes; a format nobody asked for recently is formatted on its first request and kept warm from then on.
    """

    def __init__(self, stages: Sequence[Stage], *, offset: Callable[[], float] | None = None,
                 extra: Callable[[], Sequence[Metric]] | None = None) -> None:
        self.stages = list(stages)
        self.offset = offset
        self.extra = extra  # more self metrics, read at every render (the web config in force)
        self._inputs = [tuple(sorted({spec.name for spec in st.samplers()})) for st in self.stages]
        self._chunks: list[_Chunk | None] = [None] * len(self.stages)
        # One guard per stage: a stage's chunk is checked when it is formatted again (a reused chunk is the
        # bytes that passed last time).
        self._guards = [MonotonicGuard() for _ in self.stages]
        self._self: list[Metric] = []
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

    @property
    def regressions(self) -> int:
        """Counter samples withheld so far because they were below the last exported value (all stages)."""
        return sum(g.regressions for g in self._guards)

    def _families_of(self, i: int, snap: Snapshot) -> list[Metric]:
        st = self.stages[i]
        try:
            return list(st.metrics(snap))
        except Exception as e:
            if log.once(("metrics_failed", st.name)):
                _log.error("collector_metrics_failed", collector=st.name, error=repr(e), exc_info=e)
            return []

    def render(self, snap: Snapshot) -> None:
        """Collect ``snap``'s families and format the warm formats (background, never on the scrape path)."""
        with self._lock:
            if snap.version == self._version:
                return
            now = time.monotonic()
            om_warm = now - self._om_asked < WARM_SECONDS
            for i, names in enumerate(self._inputs):
                inputs = tuple(snap.latest.get(n) for n in names)
                old = self._chunks[i]
                if old is not None and len(old.inputs) == len(inputs) and all(
                        a is b for a, b in zip(old.inputs, inputs, strict=True)):
                    continue
                fams = self._guards[i].apply(self._families_of(i, snap))
                if om_warm:  # both formats now, each sample line formatted once for the two
                    text, om = expfmt.both(fams)
                    self._chunks[i] = _Chunk(inputs, None, text, om)
                else:
                    self._chunks[i] = _Chunk(inputs, fams, expfmt.text(fams))
            offset = self.offset() if self.offset is not None else 0.0
            self._self = list(self_metrics(snap, offset=offset, regressions=self.regressions))
            if self.extra is not None:
                self._self.extend(self.extra())
            if now - self._text_asked < WARM_SECONDS or not om_warm:
                self._format_text(snap.version)
            if om_warm:
                self._format_om(snap.version)
            self._version = snap.version

    def _format_text(self, version: int) -> Payload:
        body = b"".join([expfmt.text(self._self), *(c.text for c in self._chunks if c is not None)])
        payload = _payload(body, TEXT_CONTENT_TYPE)
        self._text = (version, payload)
        return payload

    def _format_om(self, version: int) -> Payload:
        parts = [expfmt.openmetrics(self._self)]
        for c in self._chunks:
            if c is None:
                continue
            if c.om is None:
                assert c.families is not None  # dropped only once both formats are formatted
                c.om = expfmt.openmetrics(c.families)
                c.families = None
            parts.append(c.om)
        payload = _payload(b"".join([*parts, expfmt.OM_EOF]), OPENMETRICS_CONTENT_TYPE)
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
