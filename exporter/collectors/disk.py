"""Whole block devices from /proc/diskstats; partitions told apart through /sys/block."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from exporter import log
from exporter.collectors import register
from exporter.samples.host import DiskSample, DiskStats
from exporter.samples.rows import RowMap
from exporter.sampling import DISK, Collector, CollectorContext, CollectorError, Option
from exporter.snapshot import Snapshot
from exporter.sources import SECTOR_BYTES, read_source

# Sectors in /proc/diskstats are "standard UNIX 512-byte sectors, not any device- or filesystem-specific
# block size" (Documentation/admin-guide/iostats.rst; exporter.sources.SECTOR_BYTES); times are milliseconds.
SECONDS_PER_MS = 1e-3
DEFAULT_EXCLUDE = r"^(loop|ram|zram|dm-)\d+$"
# Used only when /sys/block cannot be read (sysfs not mounted in a container): node_exporter's partition
# patterns (diskstats_linux.go default device-exclude) tell partitions from whole devices by name.
PARTITION_FALLBACK = re.compile(r"^((h|s|v|xv)d[a-z]+\d+|nvme\d+n\d+p\d+|mmcblk\d+p\d+)$")
COUNTERS = (
    ("reads", "gpufeed_disk_reads_completed", "Reads completed successfully (field 1 of /proc/diskstats)."),
    ("writes", "gpufeed_disk_writes_completed", "Writes completed successfully (field 5 of /proc/diskstats)."),
    ("read_bytes", "gpufeed_disk_read_bytes", "Bytes read (sectors read x 512, /proc/diskstats)."),
    ("write_bytes", "gpufeed_disk_written_bytes", "Bytes written (sectors written x 512, /proc/diskstats)."),
    ("read_time", "gpufeed_disk_read_time_seconds",
     "Seconds spent by all reads (field 4); rate over reads_completed rate = read await."),
    ("write_time", "gpufeed_disk_write_time_seconds",
     "Seconds spent by all writes (field 8); rate over writes_completed rate = write await."),
    ("io_time", "gpufeed_disk_io_time_seconds",
     "Seconds the device had I/O in flight (field 10); its rate is the device's busy ratio."),
)


class RegexOption(Option):
    """A regular expression; a pattern that does not compile is a configuration error."""

    def parse(self, value: object) -> str:
        s = str(value)
        try:
            re.compile(s)
        except re.error as e:
            raise ValueError(f"bad regular expression {s!r}: {e}") from e
        return s


def parse_diskstats(text: str) -> dict[str, DiskStats]:
    """Every device line of /proc/diskstats (``major minor name`` then at least 11 counters)."""
    if not text.strip():
        # Every Linux has at least one block device line; an empty read is a broken source, not "no disks".
        raise CollectorError("/proc/diskstats: empty")
    out: dict[str, DiskStats] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 14:
            # Since 2.6.25 every line has 11 counters (later kernels append discard and flush fields).
            raise CollectorError(f"/proc/diskstats: {len(parts)} fields, expected >= 14: {line[:80]!r}")
        try:
            v = [int(x) for x in parts[3:14]]
        except ValueError as e:
            raise CollectorError(f"/proc/diskstats: non-numeric field in {line[:80]!r}") from e
        out[parts[2]] = DiskStats(
            reads=v[0], read_bytes=v[2] * SECTOR_BYTES, read_time=v[3] * SECONDS_PER_MS,
            writes=v[4], write_bytes=v[6] * SECTOR_BYTES, write_time=v[7] * SECONDS_PER_MS,
            in_flight=v[8], io_time=v[9] * SECONDS_PER_MS,
        )
    return out


@register
class DiskCollector(Collector):
    """Per whole device: operations, bytes, time (await = time/ops), in-flight."""

    name = DISK
    help = "Whole block devices from /proc/diskstats (partitions, loop, ram, zram, dm- skipped by default)."
    default_interval = 1.0
    options = (
        RegexOption("device-exclude", "str", DEFAULT_EXCLUDE,
                    "Regular expression of device names to skip (partitions are always skipped)."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.exclude = re.compile(str(ctx.options.get("device-exclude", DEFAULT_EXCLUDE)))

    def update(self) -> DiskSample:
        devices = parse_diskstats(read_source(self.ctx.proc("diskstats")))
        whole = self._whole_devices()
        out = {
            name: st for name, st in sorted(devices.items())
            if not self.exclude.search(name)
            and (name.replace("/", "!") in whole if whole is not None else not PARTITION_FALLBACK.match(name))
        }
        return DiskSample(devices=RowMap(DiskStats, out))

    def _whole_devices(self) -> frozenset[str] | None:
        """Names under /sys/block (whole devices only; partitions live below them); None when unreadable."""
        base = self.ctx.sys("block")
        try:
            return frozenset(os.listdir(base))
        except OSError as e:
            if log.once(("disk_sysfs_block_unreadable", str(base))):
                self.log.warning("sysfs_block_unreadable", path=str(base), error=e.strerror or str(e),
                                 fallback="partitions recognised by name")
            return None

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: DiskSample | None = snap.value(self.name)
        if sample is None:
            return
        for attr, name, doc in COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["device"])
            for dev, st in sample.devices.items():
                c.add_metric([dev], float(getattr(st, attr)))
            yield c
        # Not exported: I/Os in flight (field 9) is an instant that a 15 s scrape samples at random; the device's
        # busy time (io_time) and the read/write times carry what the verdicts use, as counters.
