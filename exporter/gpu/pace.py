"""How often one GPU's fast path is read: at the steady rate while the GPU is steadily busy or steadily idle, at
the configured (fast) rate as soon as a dip or a gap appears. Pure, no I/O (DESIGN.md "Sampling that pays only
for what it learns").

What says "steady" is what the driver already buffered, so learning it costs no extra NVML call:

- the driver's utilisation samples (``nvmlDeviceGetSamples``, one per 1/6-1 s, read every second by the
  buffered path): a batch is *busy* when every new sample is >= :data:`BUSY_LEVEL`, *idle* when every one is
  <= :data:`IDLE_LEVEL` (or the buffer has nothing new: the driver's buffer runs dry on an idle GPU), and a
  *dip* otherwise -- a sample between the two levels, or busy and idle samples mixed. A gap in the samples'
  timestamps (a period missing: the GPU went idle in between) is a dip too;
- the GPM pair of each fast read (Hopper and newer): the graphics-active ratio (kernels resident, what the
  driver samples measure) over the pair, classified the same way, per GPU or per MIG instance;
- a change of class from one batch or pair to the next (busy to idle: a gap opens; idle to busy: work starts)
  counts as a dip: onsets and gaps are what the verdict needs resolution for.

A dip sends the GPU to the fast rate at once (the next fast tick reads it); it returns to the steady rate once
every source has been steady for :data:`STEADY_AFTER_S` (10 s: the hysteresis, two thirds of the classifier's
15 s window, so the window around a dip is sampled finely and a GPU with a dip every few seconds -- a bursty,
waiting GPU -- stays at the fast rate for as long as it is bursty). A GPU whose activity nothing reports (no
driver samples, no GPM) is never steady.

Counters stay exact at either rate: they are device integrals (GPM integrals, energy, throttle time, PCIe bytes)
read less often, not sampled values. The one limit is the width of the PCIe byte counters (fields 197/198
wrap at 2**32 bytes, 4.3 GB: an unwrapped total needs less than one wrap between two reads), so a GPU moving
at least :data:`WRAP_GUARD` of a counter period per steady interval stays at the fast rate (see
:meth:`Pace.traffic`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter.samples.derived import IDLE_LEVEL

BUSY_LEVEL = 0.90  # every driver sample >= 90% busy: at most 10% waiting, under the verdict's 15-20% band
STEADY_AFTER_S = 10.0
# A steady GPU is read when waiting for the next tick would leave more than its interval (plus this share of
# it, scheduling jitter) between two reads.
EARLY_SHARE = 0.05
WRAP_GUARD = 0.5  # of a PCIe counter period per steady interval

BUSY, IDLE, DIP = "busy", "idle", "dip"


def classify(values: Iterable[float]) -> str:
    """BUSY, IDLE or DIP for a batch of activity ratios (0..1); an empty batch is IDLE (nothing ran)."""
    busy = idle = mid = False
    for v in values:
        if v >= BUSY_LEVEL:
            busy = True
        elif v <= IDLE_LEVEL:
            idle = True
        else:
            mid = True
    if mid or (busy and idle):
        return DIP
    return BUSY if busy else IDLE


@dataclass
class Pace:
    """The rate state of one GPU. ``quiet_since`` is when the newest dip ended (None: a dip was seen and
    nothing steady since, or nothing was classified yet); ``classes`` the last class per source."""

    quiet_since: float | None = None
    classes: dict[str, str] = field(default_factory=dict)
    last_read: float | None = None
    steady_now: bool = False  # as of the newest fast read (for logging the change)
    reason: str = "start"  # what sent it to the fast rate last

    def observe(self, source: str, cls: str, now: float) -> bool:
        """Record a class from ``source`` at ``now``; True when it is a dip (the GPU goes to the fast rate)."""
        prev = self.classes.get(source)
        self.classes[source] = cls
        if cls == DIP or (prev is not None and prev != cls):
            self.heat(f"{source}:dip" if cls == DIP else f"{source}:{prev}_to_{cls}")
            return True
        if self.quiet_since is None:
            self.quiet_since = now
        return False

    def heat(self, reason: str) -> None:
        """Back to the fast rate; the hold (STEADY_AFTER_S) starts again at the next steady observation."""
        self.quiet_since = None
        self.reason = reason

    def traffic(self, sustained: float, modulus: int, steady_s: float) -> bool:
        """PCIe guard: at the rate a counter of ``modulus`` sustained over its two newest spans (bytes/s), could
        it wrap more than WRAP_GUARD of a period between two steady reads? Then the GPU stays at the fast rate
        (True). One long span after a short one (an update that came late) is inside the guard's margin; traffic
        that stays over it holds the GPU at the fast rate from its second span on, while a 1 s read still sees
        every wrap (a counter period per second is twice the guard)."""
        if sustained * steady_s >= WRAP_GUARD * modulus:
            self.heat("pcie_traffic")
            return True
        return False

    def steady(self, now: float) -> bool:
        """Whether the GPU may be read at the steady rate now."""
        return self.quiet_since is not None and now - self.quiet_since >= STEADY_AFTER_S

    def due(self, now: float, steady_s: float, next_tick_s: float) -> bool:
        """Whether a fast tick at ``now`` reads this GPU: always unless steady; a steady GPU when the next tick
        (``next_tick_s`` away) would come more than its steady interval after its last read."""
        if self.last_read is None or not self.steady(now):
            return True
        return now + next_tick_s - self.last_read > steady_s * (1.0 + EARLY_SHARE)

    def reset(self) -> None:
        """Forget everything (the GPU was lost and came back: a new start)."""
        self.quiet_since, self.last_read, self.steady_now, self.reason = None, None, False, "start"
        self.classes.clear()
