"""Memory headroom and writeback from /proc/meminfo, OOM kills from /proc/vmstat."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors import register
from exporter.samples.host import MemorySample
from exporter.sampling import MEMORY, Collector, CollectorError
from exporter.snapshot import Snapshot
from exporter.sources import BYTES_PER_KB, read_source

FIELDS = {
    "MemTotal": "total", "MemAvailable": "available", "Dirty": "dirty", "Writeback": "writeback",
    "Mlocked": "mlocked",
}
GAUGES = (
    ("total", "gpufeed_memory_total_bytes", "Usable RAM (MemTotal in /proc/meminfo)."),
    ("available", "gpufeed_memory_available_bytes",
     "Memory available for new work without swapping (MemAvailable in /proc/meminfo)."),
    ("dirty", "gpufeed_memory_dirty_bytes", "Memory waiting to be written back to storage (Dirty in /proc/meminfo)."),
    ("writeback", "gpufeed_memory_writeback_bytes", "Memory being written back now (Writeback in /proc/meminfo)."),
    ("mlocked", "gpufeed_memory_mlocked_bytes",
     "Locked memory, e.g. CUDA pinned host buffers (Mlocked in /proc/meminfo)."),
)


def parse_meminfo(text: str) -> dict[str, int]:
    """The fields gpufeed uses from /proc/meminfo, in bytes; CollectorError naming a missing or bad field."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        attr = FIELDS.get(key)
        if attr is None:
            continue
        parts = rest.split()
        try:
            value = int(parts[0])
        except (ValueError, IndexError) as e:
            raise CollectorError(f"/proc/meminfo: bad {key} line {line[:60]!r}") from e
        out[attr] = value * BYTES_PER_KB if parts[1:] == ["kB"] else value
    missing = [k for k, a in FIELDS.items() if a not in out]
    if missing:
        # MemAvailable exists since 3.14; anything older or a truncated read lands here.
        raise CollectorError(f"/proc/meminfo: missing {', '.join(missing)}")
    return out


def parse_oom_kills(text: str) -> int | None:
    """``oom_kill`` from /proc/vmstat (kernel >= 4.13); None when the kernel does not count it."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError as e:
                raise CollectorError(f"/proc/vmstat: bad oom_kill value {value[:40]!r}") from e
    return None


@register
class MemoryCollector(Collector):
    """Memory pressure inputs: headroom, dirty/writeback backlog, pinned memory, OOM kills."""

    name = MEMORY
    help = "Memory from /proc/meminfo (MemTotal, MemAvailable, Dirty, Writeback, Mlocked) and /proc/vmstat oom_kill."
    default_interval = 1.0

    def update(self) -> MemorySample:
        vals = parse_meminfo(self._read("meminfo"))
        return MemorySample(
            total=vals["total"], available=vals["available"], dirty=vals["dirty"], writeback=vals["writeback"],
            mlocked=vals["mlocked"], oom_kills=parse_oom_kills(self._read("vmstat")),
        )

    def _read(self, name: str) -> str:
        """/proc/meminfo or /proc/vmstat."""
        return read_source(self.ctx.proc(name))

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: MemorySample | None = snap.value(self.name)
        if sample is None:
            return
        for attr, name, doc in GAUGES:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(getattr(sample, attr)))
            yield g
        if sample.oom_kills is not None:
            c = CounterMetricFamily(
                "gpufeed_oom_kills", "Processes killed by the OOM killer (oom_kill in /proc/vmstat)."
            )
            c.add_metric([], float(sample.oom_kills))
            yield c
