"""Per-CPU times from /proc/stat and the NUMA node of each CPU from /sys/devices/system/node."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from operator import ge
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collectors import register
from exporter.cpulist import CpulistError, parse_cpulist
from exporter.samples.host import CpuSample, CpuTimes
from exporter.sampling import CPU, CPU_WINDOW_MAX, Collector, CollectorContext, CollectorError, Option, SamplerSpec
from exporter.snapshot import Snapshot
from exporter.sources import USER_HZ, read_source, read_text

MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# node_exporter's cpu collector (cpu_linux.go, jumpBackSeconds): idle going back by this much is not a
# counter glitch but a CPU that went offline and came back (its counters restarted), so the CPU is reset.
JUMP_BACK_SECONDS = 3.0

Ticks = tuple[int, ...]  # one CPU's 8 counters in USER_HZ ticks, in MODES order (integers: sums stay exact)
IDLE = MODES.index("idle")
WIDTH = len(MODES)
JUMP_BACK_TICKS = JUMP_BACK_SECONDS * USER_HZ


def parse_stat(text: str) -> dict[int, Ticks]:
    """Parse the ``cpuN`` lines of /proc/stat into ticks per mode (the aggregate ``cpu`` line is skipped)."""
    out: dict[int, Ticks] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        parts = line.split()
        try:
            cpu = int(parts[0][3:])
        except ValueError as e:
            raise CollectorError(f"/proc/stat: bad cpu line {line[:60]!r}") from e
        if len(parts) < 9:
            # Kernels since 2.6.11 print at least 8 times (steal); fewer means a truncated read.
            raise CollectorError(f"/proc/stat: cpu{cpu} has {len(parts) - 1} fields, expected at least 8")
        try:
            out[cpu] = tuple(map(int, parts[1:9]))
        except ValueError as e:
            raise CollectorError(f"/proc/stat: cpu{cpu}: non-numeric field in {line[:80]!r}") from e
    if not out:
        raise CollectorError("/proc/stat: no cpuN lines")
    return out


def to_times(ticks: Iterable[int]) -> CpuTimes:
    """Ticks -> seconds per mode."""
    return CpuTimes(*[t / USER_HZ for t in ticks])


class TimesView(Mapping[int, CpuTimes]):
    """Read-only CPU -> :class:`CpuTimes` over one packed array of ticks, converted on each access.

    A 192-CPU host sampled every 0.25 s would otherwise build 768 objects a second that the derived layer
    mostly never reads (it compares a window's ends). Nothing is cached, and the ticks are packed: one int64
    array per sample, row ``index[cpu]`` for each CPU, with an index shared by every sample of one CPU set. A dict
    of per-CPU tuples is tracked by the cycle collector until a full collection finds its tuples untracked, so
    each middle collection walked every kept sample's 192 entries; the array is one object with nothing to walk
    (issue 14). The derived layer keeps the per-CPU deltas it computes from a pair
    (exporter/derived/hostshape.py core_deltas).
    """

    __slots__ = ("_index", "_ticks")

    def __init__(self, rows: Mapping[int, Ticks], index: Mapping[int, int] | None = None) -> None:
        """``index`` (CPU -> row, rows numbered 0..n-1): pass the previous view's (:attr:`index`) to share it; a new
        one is built when the CPUs differ."""
        if index is None or index.keys() != rows.keys():
            index = {cpu: i for i, cpu in enumerate(rows)}
        self._index = index
        self._ticks = array("q", chain.from_iterable(rows[cpu] for cpu in index))

    @property
    def index(self) -> Mapping[int, int]:
        """CPU -> row: shared with the next view of the same CPUs."""
        return self._index

    def __getitem__(self, cpu: int) -> CpuTimes:
        at = self._index[cpu] * WIDTH
        return to_times(self._ticks[at:at + WIDTH])

    def __iter__(self) -> Iterator[int]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._index

    def __repr__(self) -> str:
        return f"TimesView({len(self._index)} CPUs)"


class CpuState:
    """Counter hygiene across samples: cleaned per-CPU counters and monotonic per-node sums (in ticks).

    A node's sum is ``offset[node] + sum(cleaned counters of its online CPUs)``; the offset absorbs CPUs that
    leave (their last value is kept), CPUs that appear after start (they count from their first sighting) and
    hotplug resets, so the sum never goes backwards. Pure bookkeeping (no I/O): testable with plain tables.
    """

    def __init__(self) -> None:
        self.cpus: dict[int, Ticks] = {}
        self.nodes: dict[int, Ticks] = {}
        self._offset: dict[int, list[int]] = {}
        self._node_of: dict[int, int] = {}
        self.started = False

    def _shift(self, node: int, plus: Ticks, minus: Ticks) -> None:
        off = self._offset.setdefault(node, [0] * len(MODES))
        for i, (a, b) in enumerate(zip(plus, minus, strict=True)):
            off[i] += a - b

    def update(self, raw: Mapping[int, Ticks], node_of: Mapping[int, int]) -> tuple[int, ...]:
        """Fold one /proc/stat reading in; returns the CPUs treated as hotplugged (reset)."""
        zero = (0,) * len(MODES)
        reset: list[int] = []
        prev_cpus, prev_node = self.cpus, self._node_of
        cleaned: dict[int, Ticks] = {}
        for cpu, new in raw.items():
            prev = prev_cpus.get(cpu)
            if prev is None:
                # First reading: lifetime counters seed the node sums. A CPU appearing later (onlined) counts
                # only from now on, so the node sum does not jump by its lifetime.
                if self.started:
                    self._shift(node_of.get(cpu, 0), zero, new)
                cleaned[cpu] = new
            elif all(map(ge, new, prev)):
                cleaned[cpu] = new
            elif prev[IDLE] - new[IDLE] >= JUMP_BACK_TICKS:
                # node_exporter: idle jumping back this far is a CPU that went offline and came back.
                reset.append(cpu)
                self._shift(prev_node.get(cpu, 0), prev, new)
                cleaned[cpu] = new
            else:
                # node_exporter: a field that went backwards (a glitch) keeps its previous value.
                cleaned[cpu] = tuple(map(max, prev, new))
        for cpu, prev in prev_cpus.items():
            if cpu not in cleaned:  # went offline: its counted time stays in the node sum
                self._shift(prev_node.get(cpu, 0), prev, zero)
        members: dict[int, list[Ticks]] = {}
        node_map: dict[int, int] = {}
        for cpu, ticks in cleaned.items():
            node = node_of.get(cpu, 0)
            node_map[cpu] = node
            members.setdefault(node, []).append(ticks)
        nodes: dict[int, Ticks] = {}
        for node in set(members) | set(self._offset) | set(self.nodes):
            cols = [sum(col) for col in zip(*members[node], strict=True)] if node in members else [0] * len(MODES)
            off = self._offset.get(node, [0] * len(MODES))
            total = tuple(c + o for c, o in zip(cols, off, strict=True))
            # Belt and braces: a node sum never decreases, whatever the input did.
            old = self.nodes.get(node)
            nodes[node] = total if old is None or all(map(ge, total, old)) else tuple(map(max, total, old))
        self.cpus, self.nodes, self._node_of = cleaned, nodes, node_map
        self.started = True
        return tuple(reset)


@register
class CpuCollector(Collector):
    """Per-core CPU times at high rate, kept for the derived layer; exported as per-NUMA-node sums."""

    name = CPU
    help = "Per-CPU times from /proc/stat with NUMA nodes from sysfs; per-node sums by default."
    default_interval = 0.25
    options = (
        Option("per-core", "bool", False, "Also export per-core series gpufeed_cpu_seconds_total{cpu,mode}."),
    )

    def __init__(self, ctx: CollectorContext) -> None:
        super().__init__(ctx)
        self.per_core = bool(ctx.options.get("per-core", False))
        self._state = CpuState()
        self._cpu_set: frozenset[int] = frozenset()
        self._node_of: Mapping[int, int] = MappingProxyType({})
        # The newest views' row indexes (TimesView.index), shared with the next sample's while the CPUs stay.
        self._cpu_index: Mapping[int, int] | None = None
        self._node_index: Mapping[int, int] | None = None

    def samplers(self) -> list[SamplerSpec]:
        # The derived layer reads a window of at most CPU_WINDOW_MAX (its two ends): 12 s of 192-CPU samples,
        # not --engine.history's 30 s (120 samples at 250 ms, ~3 MB of tuples).
        return [SamplerSpec(self.name, self.interval, self.update, history=CPU_WINDOW_MAX + 2.0)]

    def update(self) -> CpuSample:
        raw = parse_stat(read_source(self.ctx.proc("stat")))
        cpus = frozenset(raw)
        if cpus != self._cpu_set:
            # NUMA layout is read at start and again only when CPUs come or go (hotplug).
            self._node_of = self._read_nodes()
            if self._cpu_set:
                self.log.info("cpu_set_changed", cpus=len(cpus), previous=len(self._cpu_set))
            self._cpu_set = cpus
        reset = self._state.update(raw, self._node_of)
        if reset:
            self.log.info("cpu_counters_reset", cpus=",".join(map(str, reset)), reason="idle jumped back (hotplug)")
        per_cpu = TimesView(self._state.cpus, self._cpu_index)
        per_node = TimesView(self._state.nodes, self._node_index)
        self._cpu_index, self._node_index = per_cpu.index, per_node.index
        return CpuSample(cpus=per_cpu, node_of=self._node_of, node_totals=per_node)

    def _read_nodes(self) -> Mapping[int, int]:
        """CPU -> NUMA node from /sys/devices/system/node/node*/cpulist (empty when the host has no NUMA info)."""
        base = self.ctx.sys("devices", "system", "node")
        out: dict[int, int] = {}
        try:
            entries = sorted(os.listdir(base))
        except FileNotFoundError:
            self.log.debug("numa_info_absent", path=str(base), hint="all CPUs counted in node 0")
            return MappingProxyType({})
        except OSError as e:
            raise CollectorError(f"{base}: {e.strerror or e}") from e
        for entry in entries:
            if not entry.startswith("node") or not entry[4:].isdigit():
                continue
            node = int(entry[4:])
            path = base / entry / "cpulist"
            try:
                cpus = parse_cpulist(read_text(path))
            except FileNotFoundError:
                continue
            except (OSError, CpulistError) as e:
                raise CollectorError(f"{path}: {e}") from e
            for cpu in cpus:
                out[cpu] = node
        return MappingProxyType(out)

    def metrics(self, snap: Snapshot) -> Iterator[Metric]:
        sample: CpuSample | None = snap.value(self.name)
        if sample is None:
            return
        node_seconds = CounterMetricFamily(
            "gpufeed_cpu_node_seconds",
            "Seconds the CPUs of a NUMA node spent in each mode, from /proc/stat; never decreases across CPU "
            "hotplug (node 0 holds every CPU when the host has no NUMA information).",
            labels=["node", "mode"],
        )
        for node, times in sorted(sample.node_totals.items()):
            for mode in MODES:
                node_seconds.add_metric([str(node), mode], getattr(times, mode))
        yield node_seconds
        node_cpus = GaugeMetricFamily(
            "gpufeed_cpu_node_cpus", "Online CPUs of a NUMA node (from /proc/stat and node*/cpulist).",
            labels=["node"],
        )
        counts: dict[int, int] = dict.fromkeys(sample.node_totals, 0)
        for cpu in sample.cpus:
            node = sample.node_of.get(cpu, 0)
            counts[node] = counts.get(node, 0) + 1
        for node, n in sorted(counts.items()):
            node_cpus.add_metric([str(node)], float(n))
        yield node_cpus
        if self.per_core:
            per_core = CounterMetricFamily(
                "gpufeed_cpu_seconds", "Seconds each CPU spent in each mode, from /proc/stat.",
                labels=["cpu", "mode"],
            )
            for cpu, times in sorted(sample.cpus.items()):
                for mode in MODES:
                    per_core.add_metric([str(cpu), mode], getattr(times, mode))
            yield per_core
