"""GPM integrals under real-time jitter: a fast tick too soon for a GPM pair must not read as idle time.

NVML needs GPM sample pairs >= 100 ms apart. With scheduling jitter a 100 ms sampler ticks 90 ms after
the previous GPM sample on a large share of ticks; the backend then keeps the integrals where they were.
Those integrals are only right when paired with the time they were integrated up to (``counter_t``),
not with the tick's stamp: paired with the stamp, every skipped tick is an idle interval and the next
one is above 100% and clipped, so a 90%-busy GPU looked half idle and ``latency_bound``.
"""

from __future__ import annotations

import itertools

import pytest

from exporter.derived.gpuview import gpu_view
from exporter.gpu.backend import NvmlBackend
from exporter.samples.gpu import GpuFast, GpuSample
from exporter.sim.fakenvml import FakeNvml, advance_device
from exporter.snapshot import Stamped
from tests.support.gpurig import device


class JitteryHost:
    """The backend over the strict fake on a hand-moved clock; the GPU is 90% active all along."""

    def __init__(self) -> None:
        self.fake = FakeNvml({"devices": [device(0, name="NVIDIA H100 80GB HBM3")]})
        self.now = 0.0
        self.slept: list[float] = []
        self.backend = NvmlBackend(lambda: self.fake, clock=lambda: self.now, sleep=self._sleep)

    def at(self, t: float) -> None:
        st = self.fake.state
        advance_device(st["devices"][0], float(st["t"]), t, gpu_util=0.9, sm_active=0.9, sm_occupancy=0.5)
        st["t"] = t
        self.fake.set_state(st)
        self.now = t

    def _sleep(self, s: float) -> None:
        self.slept.append(s)
        self.at(self.now + s)

    def ticks(self, gaps: list[float]) -> list[Stamped[GpuSample]]:
        """Run the fast path at the cumulative ``gaps``; the samples stamped with each tick's start."""
        out: list[Stamped[GpuSample]] = []
        t = 1.0
        for gap in gaps:
            t += gap
            self.at(t)
            out.append(Stamped(t, self.backend.fast()))
        return out


def fast_of(window: list[Stamped[GpuSample]]) -> list[tuple[float, GpuFast]]:
    out = []
    for s in window:
        g = s.value.gpus[0]
        assert isinstance(g, GpuFast)
        out.append((s.t, g))
    return out


def test_gpm_integrals_pair_with_their_own_time_so_jittered_ticks_give_the_true_rate() -> None:
    host = JitteryHost()
    window = host.ticks([0.09, 0.11] * 30)  # every other tick is 90 ms after the last GPM sample
    fast = fast_of(window)
    assert host.fake.gpm_short_pairs == 0
    assert host.slept == [], "10 ms early is beyond the few ms the sampler may wait"
    assert all(g.counter_t is not None for _, g in fast)
    distinct = {g.counter_t for _, g in fast}
    assert len(distinct) <= len(fast) // 2 + 1, "the test must exercise ticks without a GPM pair"
    for (_, a), (t1, b) in itertools.pairwise(fast):
        assert a.counter_t is not None and b.counter_t is not None
        assert b.counter_t <= t1
        if b.counter_t == a.counter_t:
            # A tick without a pair: nothing was integrated, and its counter time says so.
            assert b.sm_active_seconds == a.sm_active_seconds
            assert b.busy_seconds == a.busy_seconds
            assert t1 - b.counter_t < 0.1
            continue
        assert a.sm_active_seconds is not None and b.sm_active_seconds is not None
        assert a.busy_seconds is not None and b.busy_seconds is not None
        dt = b.counter_t - a.counter_t
        assert dt >= 0.1 - 1e-9
        assert (b.sm_active_seconds - a.sm_active_seconds) / dt == pytest.approx(0.9, abs=1e-6)
        assert (b.busy_seconds - a.busy_seconds) / dt == pytest.approx(0.9, abs=1e-6)
        assert b.sm_active == pytest.approx(0.9, abs=1e-6)
    # Over the whole run the integral is exact from the first GPM sample to the last.
    first, last = fast[0][1], fast[-1][1]
    assert first.counter_t is not None and last.counter_t is not None
    assert last.sm_active_seconds is not None and first.sm_active_seconds is not None
    assert (last.sm_active_seconds - first.sm_active_seconds) / (last.counter_t - first.counter_t) == \
        pytest.approx(0.9, abs=1e-6)


def test_busy_gpu_sampled_with_jitter_is_not_seen_idle_by_the_derived_layer() -> None:
    host = JitteryHost()
    window = host.ticks([0.09, 0.11, 0.1, 0.095, 0.105] * 30)
    view = gpu_view(0, window, [], [])
    assert view.gpm
    assert view.util == pytest.approx(0.9, abs=1e-3)
    assert view.sm_active == pytest.approx(0.9, abs=1e-3)
    assert view.burst.idle_ratio == 0.0
    assert view.burst.gaps == ()
    assert all(p.value == pytest.approx(0.9, abs=1e-6) for p in view.util_points)
    assert all(p.value == pytest.approx(0.9, abs=1e-6) for p in view.shape_points)


def test_gpu_without_gpm_has_no_counter_time() -> None:
    fake = FakeNvml({"devices": [device(0, gpm=False, name="NVIDIA A100-SXM4-80GB")]})
    b = NvmlBackend(lambda: fake, clock=lambda: 5.0, sleep=lambda _s: None)
    g = b.fast().gpus[0]
    assert isinstance(g, GpuFast)
    assert g.counter_t is None and g.sm_active_seconds is None

