"""Scenario time under ``gpufeed serve --simulate``: one origin and one speed for the renderers and the daemon.

The renderer children draw the scenario at scenario time ``(monotonic - origin) x speed``. The daemon must
measure with the same clock: its rates divide counter deltas by engine time, its verdict windows (15 s),
state integrals and sampler intervals are engine time, and the scenario's rates and phase lengths are
scenario time. On the wall clock, a 4x playback made every rate 4x too high and every 15 s window span 60 s
of scenario (a GPU copying 70% of the time read ``healthy``). So under simulation the engine runs on
:class:`ScaledClock`: engine time *is* scenario time, every sampler runs at its interval of scenario time,
and the renderers redraw each group at that interval divided by the speed (:func:`render_periods`). A
fast-forwarded run then takes the same samples of the same host as a run at speed 1, only sooner.

:class:`Playback` is the renderers' side: which groups are due at a moment of the base clock, the scenario
time to draw them at, and the fake NVML state. The child process (:mod:`exporter.sim.live`) drives it with
the wall clock; the tests drive it, with the daemon's pipeline on a :class:`ScaledClock`, from a virtual one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from exporter.config import Settings
from exporter.engine import Clock, RealClock
from exporter.sampling import Stage
from exporter.sim.model import Model
from exporter.sim.player import sampler_groups
from exporter.sim.render import GROUPS, nvml_state

# Never redraw a group more often than this many seconds of the base clock: the renderer is one Python
# process, and at high speeds the scaled periods would ask for more redraws than it can make. The trees
# (procfs, sysfs: many files) have the longer floor; the NVML state is one small JSON file that the
# fast GPU sampler reads every 100 ms of scenario time.
MIN_TREE_PERIOD_S = 0.05
MIN_NVML_PERIOD_S = 0.005
# The fake's PCIe byte counters wrap at 32 bits like the driver's fields; played faster, a 32-bit counter
# could wrap more than once between two reads of the fast sampler, so it is widened instead.
WRAP_SAFE_FRACTION = 0.25


class ScaledClock:
    """Scenario time: ``(base - origin) x speed``; waits are the base clock's, divided by the speed.

    ``base`` is the wall clock (:class:`~exporter.engine.RealClock`) in the daemon, a virtual one in tests.
    """

    def __init__(self, speed: float, origin: float, base: Clock | None = None) -> None:
        if not speed > 0 or math.isinf(speed):
            raise ValueError(f"speed must be a positive number, not {speed!r}")
        self.speed = float(speed)
        self.origin = float(origin)
        self.base: Clock = base or RealClock()

    def now(self) -> float:
        return (self.base.now() - self.origin) * self.speed

    def to_base(self, t: float) -> float:
        """The base clock's time at which scenario time ``t`` is reached."""
        return self.origin + t / self.speed

    def delay(self, t: float) -> float:
        """Real seconds until scenario time ``t`` (the base clock's ``delay``; TypeError for a base without one,
        a virtual clock)."""
        delay = getattr(self.base, "delay", None)
        if delay is None:
            raise TypeError(f"{type(self.base).__name__} has no real-time delay()")
        return float(delay(self.to_base(t)))

    async def sleep_until(self, t: float) -> None:
        await self.base.sleep_until(self.to_base(t))


def group_intervals(settings: Settings, registry: Mapping[str, type[Stage]]) -> dict[str, float]:
    """Scenario seconds between two reads of each file group: the interval of the fastest sampler reading it."""
    intervals: dict[str, float] = {}
    for name, cls in registry.items():
        if not settings.enabled.get(name, cls.default_enabled):
            continue
        opts = settings.collector.get(name, {})
        for sampler, option in cls.sampler_names().items():
            if option == "interval":
                intervals[sampler] = float(opts.get("interval", cls.default_interval))
            elif option in opts:
                intervals[sampler] = float(opts[option])
    groups = sampler_groups(registry)
    out: dict[str, float] = {}
    for sampler, iv in intervals.items():
        for g in groups[sampler]:
            out[g] = min(out.get(g, math.inf), iv)
    # The derived layer shortens proc_threads to 0.5 s while a GPU waits.
    out["threads"] = min(out.get("threads", math.inf), 0.5)
    longest = _longest_buffered_read(settings, registry)
    if longest is not None:
        out[SAMPLES_LONGEST] = longest
    return {g: iv for g, iv in out.items() if math.isfinite(iv) and iv > 0}


# Not a file group: the longest interval at which the GPU collector reads the driver's sample buffer (its steady
# one, --collector.gpu.samples-steady-interval), which the simulated buffer must cover.
SAMPLES_LONGEST = "nvml_samples_longest"
BUFFERED_OPTIONS = ("samples-interval", "samples-steady-interval")


def _longest_buffered_read(settings: Settings, registry: Mapping[str, type[Stage]]) -> float | None:
    """The longest interval the GPU collector's buffered sampler may read at (None when the collector is off)."""
    cls = registry.get("gpu")
    if cls is None or not settings.enabled.get("gpu", cls.default_enabled):
        return None
    opts = settings.collector.get("gpu", {})
    defaults = {o.name: o.default for o in cls.options}
    return max(float(opts.get(k, defaults.get(k, 1.0))) for k in BUFFERED_OPTIONS)


def render_periods(intervals: Mapping[str, float], speed: float) -> dict[str, float]:
    """Base-clock redraw period of each group, from its read interval in scenario time (:func:`group_intervals`).

    A group is redrawn as often as its fastest reader reads it, the NVML state twice as often (at the same
    rate reader and writer alias, and two GPM samples 100 ms apart can see one state: an invalid pair), all
    divided by the speed, never below the floors above.
    """
    out: dict[str, float] = {}
    for g, iv in intervals.items():
        if g == "nvml":
            out[g] = max(MIN_NVML_PERIOD_S, iv / 2 / speed)
        else:
            out[g] = max(MIN_TREE_PERIOD_S, iv / speed)
    return out


class Playback:
    """What a renderer draws and when: the groups due at a base-clock time, and the scenario time to draw at.

    ``intervals``: each group's read interval in scenario time (:func:`group_intervals`; a group not listed
    is read every second); ``groups``: the groups this renderer owns (the tree child and the NVML child own
    different ones).
    """

    def __init__(self, model: Model, intervals: Mapping[str, float], *, origin: float, speed: float,
                 groups: frozenset[str] = frozenset({*GROUPS, "nvml"})) -> None:
        self.model = model
        self.clock = ScaledClock(speed, origin)
        every = {g: 1.0 for g in (*GROUPS, "nvml", "nvml_samples")}
        every.update({g: iv for g, iv in intervals.items() if g in every})
        periods = render_periods(every, speed)
        self.periods = {g: p for g, p in periods.items() if g in groups}
        self._due = dict.fromkeys(self.periods, origin)
        self.max_rate = max((max(p.vs) for tr in model.gpu_tracks.values()
                             for key in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s") for p in tr[key].phases),
                            default=0.0)
        # Scenario seconds between two states two reads of the fast GPU sampler may see.
        gap = 2 * periods["nvml"] * speed
        self.counter_bits = 32 if self.max_rate * gap < 2**32 * WRAP_SAFE_FRACTION else 64
        # The driver's utilisation buffer: twice the buffered reader's interval of scenario time, never under 2 s,
        # and its longest (steady) interval with 2 s to spare: a read finds every sample since the previous one.
        self.buffer_s = max(2.0, 2.0 * every["nvml_samples"], 2.0 * periods["nvml"] * speed,
                            intervals.get(SAMPLES_LONGEST, 0.0) + 2.0)

    @property
    def origin(self) -> float:
        return self.clock.origin

    def scenario_time(self, now: float) -> float:
        """Scenario time at base-clock time ``now``."""
        return (now - self.clock.origin) * self.clock.speed

    def next_due(self) -> float:
        """Base-clock time of the next redraw."""
        return min(self._due.values(), default=math.inf)

    def due(self, now: float) -> list[str]:
        """The groups due at ``now``, each rescheduled one period on (skipping what a late redraw missed)."""
        groups = [g for g, d in self._due.items() if d <= now]
        for g in groups:
            self._due[g] = max(self._due[g] + self.periods[g], now)
        return groups

    def nvml(self, t: float) -> dict[str, Any]:
        """The fake NVML's state at scenario time ``t``."""
        return nvml_state(self.model, t, counter_bits=self.counter_bits, buffer_s=self.buffer_s)
