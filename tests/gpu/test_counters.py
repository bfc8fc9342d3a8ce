"""Counter unwrapping and sample integration: the arithmetic behind every exported GPU counter."""

from __future__ import annotations

import random

import pytest

from exporter.gpu.counters import MIN_PERIOD_US, SampleIntegrator, WrappingCounter
from exporter.pci import from_nvml as bus_id_to_sysfs

M32 = 1 << 32
M64 = 1 << 64


def test_32bit_pcie_counter_wrap_continues_the_total() -> None:
    c = WrappingCounter(max_rate=256e9)
    assert c.update(M32 - 1000, M32, 0.0) == M32 - 1000
    assert c.update(500, M32, 0.1) == M32 + 500  # wrapped: 1000 + 500 bytes moved
    assert c.wraps == 1 and c.resets == 0


def test_counter_reset_after_driver_reload_is_not_a_giant_wrap() -> None:
    c = WrappingCounter(max_rate=1e7)  # replay counter bound
    c.update(1_000_000, M32, 0.0)
    total = c.update(3, M32, 0.1)  # a wrap would mean ~4.29e9 replays in 100 ms: a reset instead
    assert total == 1_000_003
    assert c.resets == 1 and c.wraps == 0


def test_rebase_after_lost_gpu_adds_nothing_for_the_gap() -> None:
    c = WrappingCounter(max_rate=256e9)
    c.update(10_000, M32, 0.0)
    c.rebase()
    assert c.update(5, M32, 300.0) == 10_000  # GPU reset its counter while lost: baseline only
    assert c.update(105, M32, 300.1) == 10_100


def test_a_step_the_values_own_timestamps_explain_is_counted_not_taken_for_a_reset() -> None:
    c = WrappingCounter(max_rate=1e9)  # throttle nanoseconds
    c.update(0, M64, 0.0, 0.0)
    assert c.update(0, M64, 0.1, 0.0) == 0  # between refreshes: the same value and timestamp
    # One second of throttling in one step, read 100 ms after the previous read: 6.7x what 100 ms allows.
    assert c.update(1_000_000_000, M64, 0.2, 1.0) == 1_000_000_000
    assert c.resets == 0


def test_a_64_bit_typed_counter_wrapping_at_32_bits_is_unwrapped_and_then_known_as_32_bits() -> None:
    c = WrappingCounter(max_rate=256e9)
    c.update(M32 - 1000, M64, 0.0)
    assert c.update(500, M64, 0.1) == M32 + 500
    assert c.narrow and c.width(M64) == M32 and c.wraps == 1 and c.resets == 0
    c.update(M32 + 7, M64, 0.2)  # a reading past 2**32: a true 64-bit counter after all
    assert not c.narrow and c.width(M64) == M64


def test_busy_integral_of_driver_samples_is_exact_and_starts_at_baseline() -> None:
    it = SampleIntegrator()
    period = 166_667
    it.add([(period * k, 50.0) for k in range(1, 7)])  # history before we started: baseline only
    assert it.seconds == 0.0
    it.add([(period * k, 100.0) for k in range(7, 13)])
    assert abs(it.seconds - 6 * 0.166667) < 1e-6


def test_idle_gap_with_dry_buffer_is_not_counted_as_busy() -> None:
    it = SampleIntegrator()
    period = 166_667
    it.add([(period * k, 100.0) for k in range(1, 13)])
    before = it.seconds
    # The buffer ran dry for 60 s (idle GPU); the next sample covers only its own period.
    it.add([(period * 12 + 60_000_000, 60.0)])
    assert abs((it.seconds - before) - 0.6 * 1.5 * period / 1e6) < 1e-6


def test_nvml_bus_id_becomes_sysfs_form() -> None:
    assert bus_id_to_sysfs("00000000:82:00.0") == "0000:82:00.0"
    assert bus_id_to_sysfs(b"00000001:C1:00.0") == "0001:c1:00.0"
    assert bus_id_to_sysfs("C1:00.0", domain=2) == "0002:c1:00.0"


def _reference_seconds(batches: list[list[tuple[int, float]]], max_period_s: float = 1.0) -> list[tuple[float, bool]]:
    """The integral as the docstring states it, the shortest recent spacing recomputed at every sample."""
    gaps: list[int] = []
    last: int | None = None
    seconds, out = 0.0, []
    for batch in batches:
        new = sorted((ts, v) for ts, v in batch if last is None or ts > last)
        prev, gapped = last, False
        for ts, v in new:
            if prev is not None:
                gap = ts - prev
                if gap >= MIN_PERIOD_US:
                    gaps = [*gaps, gap][-32:]
                if last is not None:
                    period = max_period_s * 1e6
                    if gaps:
                        period = min(period, 1.5 * min(gaps))
                    gapped = gapped or gap > period
                    seconds += max(0.0, min(v, 100.0)) / 100.0 * min(gap, period) / 1e6
            prev = ts
        if new:
            last = new[-1][0]
        out.append((seconds, gapped))
    return out


def test_the_shortest_recent_spacing_is_kept_right_as_old_spacings_leave() -> None:
    rng = random.Random(14)
    for _ in range(20):
        ts, batches = 0, []
        for _ in range(30):
            # Spacing regimes that change every few batches: the shortest spacing leaves the last 32 and a longer
            # one becomes the cap (a GPU sampled every 20 ms, then every 166 ms, then in bursts and gaps).
            regime = rng.choice([[20_000], [166_000], [166_000, 333_000], [333_000, 2_000_000]])
            batch = []
            for _ in range(rng.randint(0, 12)):
                ts += rng.choice(regime)
                batch.append((ts, rng.uniform(0, 100)))
            batches.append(batch)
        integ = SampleIntegrator()
        got = []
        for batch in batches:
            integ.add(batch)
            got.append((integ.seconds, integ.gapped))
        want = _reference_seconds(batches)
        assert [g for _, g in got] == [g for _, g in want]
        assert [s for s, _ in got] == pytest.approx([s for s, _ in want], rel=1e-12)
