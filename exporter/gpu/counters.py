"""Monotonic totals from driver counters that wrap or reset, and integrals of ratio samples. Pure, no I/O."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

M32 = 1 << 32


@dataclass
class WrappingCounter:
    """Turns successive raw readings of a wrapping device counter into a monotonic total.

    ``update(raw, modulus, t, ts)`` takes the raw value, the width it wraps at (``2**32`` for an NVML
    ``UNSIGNED_INT`` field, ``2**64`` for ``UNSIGNED_LONG_LONG``), the reading time and the driver's own
    timestamp of the value (``nvmlFieldValue_t.timestamp`` in seconds; None when unknown). A reading below the
    previous one is a wrap (``raw - prev + modulus``) unless that delta is beyond ``max_rate`` x elapsed time:
    then the device counter was reset (driver reload, GPU reset) and counting restarts from ``raw``.

    Elapsed time is the longer of the reading times' and the value timestamps' difference: a driver that
    refreshes a counter every second shows a 100 ms reader a second's increment in one step, which the
    reader's 100 ms cannot explain but the value's own clock does (nvml.h documents neither cadence).

    A counter typed 64-bit whose readings all stay below ``2**32`` and that goes down by an amount a 32-bit wrap
    explains (a 32-bit hardware counter in a 64-bit slot: nvml.h says only "value can be wrapped" for the PCIe
    byte counters) is taken as 32 bits wide from then on (``narrow``; :meth:`width` says so), until a reading
    at or above ``2**32`` shows it is not. A true reset of such a counter below ``2**32`` then counts as a wrap
    (an increment bounded by ``max_rate`` x elapsed time): rare, and bounded.

    The first reading starts the total at ``raw`` (the device's own count), so a restart of gpufeed is a
    plain counter reset to Prometheus.
    """

    max_rate: float
    total: int | None = None
    prev: int | None = None
    prev_t: float | None = None
    prev_ts: float | None = None
    wraps: int = 0
    resets: int = 0
    narrow: bool = False

    def width(self, modulus: int) -> int:
        """The modulus the counter wraps at as far as its readings show (``modulus``, or 2**32 when narrow)."""
        return M32 if self.narrow and modulus > M32 else modulus

    def update(self, raw: int, modulus: int, t: float, ts: float | None = None) -> int:
        """Feed one raw reading; return the unwrapped total."""
        raw = int(raw) % modulus
        if raw == self.prev and self.total is not None:
            # Unchanged (most error counters, an idle link's bytes): the steps below would add 0.
            self.prev_t, self.prev_ts = t, ts
            return self.total
        if raw >= M32:
            self.narrow = False
        if self.total is None:
            self.total = raw
        prev, prev_t, prev_ts = self.prev, self.prev_t, self.prev_ts
        self.prev, self.prev_t, self.prev_ts = raw, t, ts
        if prev is None or prev_t is None:
            return self.total
        span = max(t - prev_t, 0.0)
        if ts is not None and prev_ts is not None:
            span = max(span, ts - prev_ts)
        limit = self.max_rate * span * 1.5 + 1
        delta = raw - prev
        wrapped = delta < 0
        if wrapped:
            width = self.width(modulus)
            if width > M32 and prev < M32 and raw - prev + M32 <= limit:
                width = M32
                self.narrow = True
            delta += width
        if delta > limit:
            # Implausibly large: the device counter restarted. Count what it has seen since, if plausible.
            self.resets += 1
            delta = raw if raw <= limit else 0
        elif wrapped:
            self.wraps += 1
        self.total += delta
        return self.total

    def rebase(self) -> None:
        """Forget the previous raw reading (the GPU was lost or reset): the next one only sets a baseline."""
        self.prev = None
        self.prev_t = None
        self.prev_ts = None


# Spacings below 10 ms are not a sample period (duplicate or jittered timestamps); ignore them for the cap.
MIN_PERIOD_US = 10_000


@dataclass
class SampleIntegrator:
    """Integral over driver time of buffered utilisation samples (nvmlDeviceGetSamples).

    Each sample ``(ts_us, percent)`` is the utilisation over the period that ends at ``ts_us``. The
    integral adds ``percent/100 x (ts - previous ts)``, with the period capped at ``max_period_s`` and at
    1.5x the shortest recent spacing: the driver's buffer runs dry while the GPU is idle, so a long gap
    before a sample is idle time, not time at the sample's level. The first batch only sets the baseline.
    """

    max_period_s: float = 1.0
    seconds: float = 0.0
    last_ts: int | None = None
    # Whether the newest batch had a spacing longer than the capped period: a stretch without samples, which
    # the driver leaves when the GPU goes idle in between (the adaptive rate counts it as a dip).
    gapped: bool = False
    _gaps: deque[int] = field(default_factory=lambda: deque(maxlen=32))
    _shortest: int | None = None  # min(_gaps), kept as gaps come and go (it was recomputed for every sample)

    def add(self, samples: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """Integrate samples newer than the last one seen (sorted here); return those that were new."""
        new = sorted((ts, v) for ts, v in samples if self.last_ts is None or ts > self.last_ts)
        prev = self.last_ts
        self.gapped = False
        for ts, v in new:
            if prev is not None:
                gap_us = ts - prev
                if gap_us >= MIN_PERIOD_US:
                    self._remember(gap_us)
                if self.last_ts is not None:  # not the baseline batch
                    period_us = self.max_period_s * 1e6
                    if self._shortest is not None:
                        period_us = min(period_us, 1.5 * self._shortest)
                    self.gapped = self.gapped or gap_us > period_us
                    self.seconds += max(0.0, min(v, 100.0)) / 100.0 * min(gap_us, period_us) / 1e6
            prev = ts
        if new:
            self.last_ts = new[-1][0]
        return new

    def _remember(self, gap_us: int) -> None:
        gaps = self._gaps
        evicted = gaps[0] if len(gaps) == gaps.maxlen else None
        gaps.append(gap_us)
        if self._shortest is None or gap_us <= self._shortest:
            self._shortest = gap_us
        elif evicted == self._shortest:
            self._shortest = min(gaps)
