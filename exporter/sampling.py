"""The sampling contract: what the engine runs and the exposition renders, and how its parts talk.

- :class:`Stage` -- anything the engine schedules: a name, samplers (periodic tasks), metric families from a
  snapshot. :class:`Collector` is a stage that does I/O and parsing through configurable roots and never
  raises into the engine (``exporter/collectors/``); the derived layer's analyzer is the other kind
  (``exporter/derived/analyzer.py``).
- :class:`Option` -- a per-stage setting; registration turns it into a flag and a config key.
- :class:`Targets` -- the typed channel between stages: which processes use which GPU (and its PCI address),
  published by the GPU collector, read by the proc and numa collectors and the analyzer; and the focus of
  deep (per-thread) sampling, the analyzer's cadence (``exporter/derived/cadence.py``) sets it.
- :class:`CollectorContext` -- what a collector is given: roots, its options, the targets, the NVML module to
  use (the real ``pynvml`` when None) and the clock.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from prometheus_client.core import Metric

from exporter.durations import parse_duration
from exporter.log import get_logger
from exporter.snapshot import Snapshot

# ---- sampler names: each spelled once, here, and used by the stages' registration (Stage.name and
# Stage.sampler_intervals) and by every reader of a sampler's samples (the analyzer, diagnose, the simulator).
# A stage runs one sampler named after it unless it lists several in ``sampler_intervals``.
GPU_FAST = "gpu"  # GPM pairs, field values, SM clock (100 ms)
GPU_SAMPLES = "gpu_samples"  # the driver's buffered utilisation samples (1 s)
GPU_SLOW = "gpu_slow"  # link state, clock-event reasons, temperature, memory, processes (5 s)
GPU_SAMPLERS = (GPU_FAST, GPU_SAMPLES, GPU_SLOW)
PROC = "proc"  # process-level /proc/<pid> files of the inspected processes
PROC_THREADS = "proc_threads"  # per-thread /proc/<pid>/task/<tid>/stat (deep, on demand)
CPU = "cpu"
CPUFREQ = "cpufreq"
MEMORY = "memory"
PRESSURE = "pressure"
DISK = "disk"
NFS = "nfs"
PCIE = "pcie"
NUMA = "numa"
NIC = "nic"  # network adapters (InfiniBand, RoCE, Ethernet) beside the GPUs
SELF = "self"  # the daemon's own /proc/self
DERIVED = "derived"  # the analyzer: verdicts, findings, state seconds
WORKLOAD = "workload"  # process trees and cgroups of the GPU processes
KUBERNETES = "kubernetes"  # the kubelet's pod-resources API: which pod holds which GPU
CAPTURE = "capture"  # --capture.enabled: the capture stage's counters and each GPU's newest capture

# The longest window the analyzer judges CPU shape over (its cpu window is min(window, this)): deep
# (per-thread) samples older than this are never read, so the deep sampler keeps only this much.
CPU_WINDOW_MAX = 10.0
# The most samples a sampler's ring buffer holds, whatever its interval and --engine.history.
BUFFER_MAX_SAMPLES = 4096
# --engine.history's default: seconds of samples each sampler keeps. Twice the classifier's default window (15 s),
# the longest any reader of the buffers looks back by default (the slow path's 11 s, the tripwire's few seconds
# since the last evaluation). It was 120 s, four times what anything read: on the 8-GPU benchmark host with two
# GPUs waiting, 30,000 tracked objects that every full collection traversed (15-23 ms; issue 14).
HISTORY_DEFAULT = 30.0


class Unchanged:
    """The type of :data:`UNCHANGED`."""

    _instance: ClassVar[Unchanged | None] = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


# What a sampler returns when its newest sample still stands (the analyzer while every verdict holds): the
# run counts as a success, its previous sample stays the newest, nothing is buffered or published again --
# the renderer does not format the stage's families again for a sample that did not change.
UNCHANGED = Unchanged()


class NoDataError(Exception):
    """The source does not exist on this host by design (PSI disabled, no NFS client, no driver).

    Distinct from a failure: logged once at debug/info, ``gpufeed_collector_available`` goes to 0 and no
    ``gpufeed_collector_success`` series is exported for the collector.
    """


class CollectorError(Exception):
    """A source exists but could not be read or parsed; the message says which file and why."""


OPTION_KINDS = ("bool", "int", "float", "duration", "str", "list")


@dataclass(frozen=True)
class Option:
    """A per-collector setting: flag ``--collector.<name>.<option>``, config key ``collectors.<name>.<option>``."""

    name: str
    kind: str
    default: Any
    help: str

    def parse(self, value: object) -> Any:
        """Convert a flag or config value to this option's type; ValueError with a reason otherwise."""
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if self.kind == "int":
            if isinstance(value, bool):
                raise ValueError(f"not an integer: {value!r}")
            return int(str(value), 10)
        if self.kind == "float":
            if isinstance(value, bool):
                raise ValueError(f"not a number: {value!r}")
            return float(str(value))
        if self.kind == "duration":
            return parse_duration(value)
        if self.kind == "list":
            if isinstance(value, list | tuple):
                return tuple(str(v) for v in value)
            return tuple(v.strip() for v in str(value).split(",") if v.strip())
        return str(value)


class Targets:
    """The processes worth inspecting and where their GPUs sit, shared between stages.

    The GPU collector publishes, on every slow cycle, the pids per GPU (key: NVML index as a string) and each
    GPU's PCI address (sysfs form); the proc and numa collectors inspect exactly those processes; the analyzer
    narrows deep (per-thread) inspection to the waiting GPUs' processes. Every value is replaced atomically;
    readers get immutable mappings.
    """

    def __init__(self, static: Iterable[int] = ()) -> None:
        self._lock = threading.Lock()
        self._static = frozenset(static)
        self._by_gpu: Mapping[str, frozenset[int]] = MappingProxyType({})
        self._bus_ids: Mapping[str, str] = MappingProxyType({})
        self._focus: frozenset[int] | None = None
        self._full = False
        self._workload: frozenset[int] = frozenset()

    def publish(self, by_gpu: Mapping[str, Iterable[int]], bus_ids: Mapping[str, str] | None = None) -> None:
        """Replace the GPU -> pids map and, when given, the GPU -> PCI address map."""
        frozen = MappingProxyType({str(k): frozenset(v) for k, v in by_gpu.items()})
        buses = None if bus_ids is None else MappingProxyType({str(k): v for k, v in bus_ids.items() if v})
        with self._lock:
            self._by_gpu = frozen
            if buses is not None:
                self._bus_ids = buses

    def bus_ids(self) -> Mapping[str, str]:
        """GPU (NVML index as a string) -> PCI address in sysfs form, as last published."""
        with self._lock:
            return self._bus_ids

    def by_gpu(self) -> Mapping[str, frozenset[int]]:
        """GPU -> pids, as last published."""
        with self._lock:
            return self._by_gpu

    def pids(self) -> frozenset[int]:
        """Every pid to inspect: all GPU processes plus the static ones."""
        with self._lock:
            out = set(self._static)
            for v in self._by_gpu.values():
                out |= v
            return frozenset(out)

    def set_focus(self, pids: Iterable[int] | None) -> None:
        """Narrow deep (per-thread) inspection to ``pids`` -- the processes of the GPUs that wait; None lifts
        the focus (every target is inspected in depth)."""
        frozen = None if pids is None else frozenset(int(p) for p in pids)
        with self._lock:
            self._focus = frozen

    def focus(self) -> frozenset[int] | None:
        """The pids deep inspection is narrowed to, or None when it is not narrowed."""
        with self._lock:
            return self._focus

    def request_full(self) -> None:
        """Ask the next deep pass to read every target once despite the focus."""
        with self._lock:
            self._full = True

    # ---- workloads: what feeds the GPUs besides their NVML processes (the workload collector) ------------------

    def publish_workload(self, pids: Iterable[int]) -> None:
        """Replace the set of workload processes that hold no GPU context (data-loader workers, tokenizer pools,
        the other processes of a GPU process's container or job): the proc collector inspects them too."""
        frozen = frozenset(int(p) for p in pids)
        with self._lock:
            self._workload = frozen

    def workload_pids(self) -> frozenset[int]:
        """The workload processes as last published (without the GPU processes themselves)."""
        with self._lock:
            return self._workload

    def take_focus(self) -> frozenset[int] | None:
        """The focus for one deep pass: None (read everything) when a full pass was requested, which this
        consumes; otherwise :meth:`focus`."""
        with self._lock:
            if self._full:
                self._full = False
                return None
            return self._focus


@dataclass
class CollectorContext:
    """What a collector is given: roots, its options, the shared targets, the NVML module and the clock.

    ``nvml`` is a module-like object with pynvml's API -- the simulator's strict fake or a test's -- or None
    for the real ``pynvml``, imported on first use. ``clock`` is the engine's (virtual time under
    ``diagnose --scenario``), monotonic seconds. ``background`` says whether the collector may run a thread of
    its own for a source that blocks (the GPU collector's Xid event waiter); False under an inline engine,
    which then polls such sources from a sampler so a virtual-time run plays the same way every time.
    """

    procfs: Path
    sysfs: Path
    options: Mapping[str, Any] = field(default_factory=dict)
    targets: Targets = field(default_factory=Targets)
    nvml: Any = None
    clock: Callable[[], float] = time.monotonic
    background: bool = False

    def proc(self, *parts: str | int) -> Path:
        """A path under --path.procfs."""
        return self.procfs.joinpath(*(str(p) for p in parts))

    def sys(self, *parts: str | int) -> Path:
        """A path under --path.sysfs."""
        return self.sysfs.joinpath(*(str(p) for p in parts))


@dataclass(frozen=True)
class SamplerSpec:
    """One periodic task of a collector: ``fn`` runs every ``interval`` seconds.

    ``blocking`` samplers (file or driver I/O) run in a worker thread so they never stall the event loop.
    ``history``, when set, caps how many seconds of this sampler's samples the engine keeps (at most
    ``--engine.history``): for heavy samples whose consumers only look a short way back. ``deadline``, when
    set, replaces the engine's rule for how long one blocking call may take (see exporter.engine). ``pace``,
    when set, says the interval the sampler wants now (cheap, non-blocking, called on the engine's thread
    after each run of any sampler of its stage): the engine applies it from the next tick on.
    """

    name: str
    interval: float
    fn: Callable[[], Any]
    blocking: bool = True
    history: float | None = None
    deadline: float | None = None
    pace: Callable[[], float] | None = None


class Stage(ABC):
    """Anything the engine schedules. The class attributes are its registration: ``name`` gives the flags
    ``--collector.<name>`` / ``--no-collector.<name>`` and ``--collector.<name>.<option>`` for each option."""

    name: ClassVar[str]
    help: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    default_interval: ClassVar[float] = 1.0
    options: ClassVar[tuple[Option, ...]] = ()
    # Each sampler this stage runs and the option that sets its interval; empty: one sampler named after the
    # stage, set by ``interval``. ``samplers()`` returns exactly these (tests/collectors/test_registry.py).
    sampler_intervals: ClassVar[Mapping[str, str]] = MappingProxyType({})

    @classmethod
    def sampler_names(cls) -> dict[str, str]:
        """The samplers this stage registers, each with the option that sets its interval."""
        return dict(cls.sampler_intervals) or {cls.name: "interval"}

    @abstractmethod
    def samplers(self) -> list[SamplerSpec]:
        """The periodic tasks of this stage."""

    @abstractmethod
    def metrics(self, snap: Snapshot) -> Iterable[Metric]:
        """Metric families from the snapshot; pure, no I/O."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (open files, driver handles)."""


class Collector(Stage):
    """Base of every collector. Subclasses register with :func:`exporter.collectors.register`.

    ``update`` does the I/O and parsing and returns an immutable sample (or raises NoDataError /
    CollectorError / OSError); ``metrics`` turns the newest snapshot into metric families and does no I/O.
    """

    def __init__(self, ctx: CollectorContext) -> None:
        self.ctx = ctx
        self.log = get_logger(collector=self.name)

    @property
    def interval(self) -> float:
        """This collector's main sampling interval in seconds."""
        return float(self.ctx.options.get("interval", self.default_interval))

    def samplers(self) -> list[SamplerSpec]:
        """The periodic tasks of this collector; by default one, named after the collector."""
        return [SamplerSpec(self.name, self.interval, self.update)]

    @abstractmethod
    def update(self) -> Any:
        """Read and parse the source; return an immutable sample."""
