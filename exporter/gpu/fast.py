"""The fast sampling path (default every 100 ms): GPM sample pairs >= 100 ms apart on Hopper and newer; one
``nvmlDeviceGetFieldValues`` call per GPU for the fast fields of the table (PCIe byte counters, replays,
instantaneous power, throttle time); the current SM clock. A steady GPU is read at the steady rate only
(exporter/gpu/pace.py)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu import fields as F  # noqa: N812
from exporter.gpu.binding import M64, SUCCESS, read_gpm_metrics
from exporter.gpu.fieldvalues import FieldValues
from exporter.gpu.pace import EARLY_SHARE, classify
from exporter.gpu.state import DROPPED_GPM, GPM_METRICS, NO_FIELDS, GpmStream, GpuState
from exporter.samples.gpu import GpuFast, HeldFast

# Longest a fast tick waits so its GPM sample is >= 100 ms after the previous one (scheduling jitter).
GPM_MAX_WAIT_S = 0.005
# The SM clock is read at most once a second (shorter by EARLY_SHARE of it: jitter); the reads in between carry
# the newest value. What reads it -- the clock-ratio evidence (the window's mean clock against the board's
# maximum) and gpufeed_gpu_sm_clock_hertz at a scrape -- needs no 100 ms resolution, and at 100 ms it was one
# NVML call in four of a waiting GPU's reads (3,600 in the benchmark's 180 s with two GPUs waiting).
CLOCK_INTERVAL_S = 1.0
# A GPU at its steady rate (exporter/gpu/pace.py) takes its GPM pair and its SM clock at most every 2 s (shorter
# by EARLY_SHARE: jitter), every other steady read; the field values -- the PCIe byte counters that the wrap guard
# watches among them -- at every one. GPM's values are integrals too (SM-active and graphics-active seconds), so
# a 2 s pair loses no time, only resolution that a steady GPU does not have to give: every driver sample of it
# is >= 90% busy or idle. The reads in between carry the pair's values with its ``counter_t`` (the derived layer
# drops such repeats). A dip in the pair, or in the driver samples, sends the GPU to the fast rate, where every
# read takes its pair again. GPM was ~40% of a steady 8-GPU host's fast path. (In MIG mode every read takes them.)
STEADY_PAIR_S = 2.0


class FastPath(FieldValues):
    """GPM, field values and SM clock of each GPU due now."""

    _sleep: Callable[[float], None]
    _tick_s: float  # the fast sampler's interval now

    def _fast_tick(self, g: GpuState, now: float) -> GpuFast | HeldFast:
        """Read GPU ``g``'s fast path if it is due (exporter/gpu/pace.py), else show its newest read."""
        pace = g.pace
        if self._steady_s is not None and g.held is not None and not pace.due(now, self._steady_s, self._tick_s):
            return g.held
        value = self._fast_one(g, now)
        pace.last_read = now
        g.held = HeldFast(value, now)
        if self._steady_s is not None:
            if g.pcie_modulus < M64 and g.pcie_sustained:
                pace.traffic(max(g.pcie_sustained.values()), g.pcie_modulus, self._steady_s)
            steady = pace.steady(now)
            if steady != pace.steady_now:
                pace.steady_now = steady
                self._log.info("gpu_fast_rate_changed", gpu=g.index,
                               interval_s=self._steady_s if steady else self._fast_s,
                               reason="steady" if steady else pace.reason)
        return value

    def _fast_one(self, g: GpuState, now: float) -> GpuFast:
        nvml, h = self._nvml, g.handle
        mig: dict[int, GpuFast] = {}
        if g.identity.mig_mode:
            now = self._wait_for_pair([g.gpm, *(m.gpm for m in g.mig.values())], now)
            for gi, m in sorted(g.mig.items()):
                self._gpm_pair(g, m.gpm, now, functools.partial(nvml.nvmlGpmMigSampleGet, h, gi),
                               "nvmlGpmMigSampleGet", source=f"gpm:{gi}")
                mig[gi] = self._gpm_values(g, m.gpm)
        steady = self._steady_s is not None and not g.identity.mig_mode and g.pace.steady(now)
        if not steady or g.gpm.prev is None or now - g.gpm.prev[1] >= STEADY_PAIR_S * (1.0 - EARLY_SHARE):
            self._gpm(g, now)
        values = self._fields(g, now, F.FAST)
        every = STEADY_PAIR_S if steady else CLOCK_INTERVAL_S
        if g.clock is None or now - g.clock[1] >= every * (1.0 - EARLY_SHARE):
            g.clock = (self._opt(g, "nvmlDeviceGetClockInfo", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                       now)
        clock = g.clock[0]
        power = F.BY_KEY["power"]
        if "power" not in values and power.field_id in g.disabled_fields:
            # No instantaneous field (pre-Ampere boards): the getter's value, 1 s averaged on Ampere+.
            power_mw = self._opt(g, "nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, h)
            if power_mw is not None:
                values["power"] = float(power_mw) * power.scale
        # The dict itself, not a proxy over it: see GpuFast.fields.
        # In MIG mode the whole GPU's own GPM too, where the driver answers it (nvml.h allows it; unverified on
        # hardware): a driver that refuses it there leaves the GPU-level series absent, the instances' stay.
        return self._gpm_values(g, g.gpm if g.gpm.samples else None, fields=values,
                                sm_clock_hz=float(clock) * 1e6 if clock is not None else None,
                                mig=MappingProxyType(mig) if mig else NO_FIELDS)

    def _gpm_values(self, g: GpuState, gpm: GpmStream | None, *, fields: Mapping[str, float] = NO_FIELDS,
                    sm_clock_hz: float | None = None, mig: Mapping[int, GpuFast] = NO_FIELDS) -> GpuFast:
        """A GpuFast with the GPM values of one stream (None everywhere without GPM, or for ``gpm`` None: a GPU
        in MIG mode has GPM per instance only) and the given fields, clock and instances."""
        if not g.gpm_ok or gpm is None:
            return GpuFast(sm_active=None, sm_occupancy=None, tensor_active=None, dram_active=None,
                           pcie_tx_bytes_per_s=None, pcie_rx_bytes_per_s=None, fields=fields, sm_clock_hz=sm_clock_hz,
                           sm_active_seconds=None, busy_seconds=None, mig=mig)
        last = gpm.last
        return GpuFast(
            sm_active=_scaled(last.get(C.GPM_SM_UTIL), 0.01),
            sm_occupancy=_scaled(last.get(C.GPM_SM_OCCUPANCY), 0.01),
            tensor_active=_scaled(last.get(C.GPM_ANY_TENSOR_UTIL), 0.01),
            dram_active=_scaled(last.get(C.GPM_DRAM_BW_UTIL), 0.01),
            pcie_tx_bytes_per_s=_scaled(last.get(C.GPM_PCIE_TX_PER_SEC), C.MIB),
            pcie_rx_bytes_per_s=_scaled(last.get(C.GPM_PCIE_RX_PER_SEC), C.MIB),
            fields=fields,
            sm_clock_hz=sm_clock_hz,
            sm_active_seconds=gpm.sm_active_seconds,
            busy_seconds=gpm.graphics_seconds,
            counter_t=gpm.t,
            mig=mig,
        )

    def _gpm(self, g: GpuState, now: float) -> None:
        """The whole GPU's GPM stream: one sample, and the metrics of the pair when it is old enough."""
        if not g.gpm_ok or not g.gpm.samples:
            return
        now = self._wait_for_pair([g.gpm], now)
        self._gpm_pair(g, g.gpm, now, functools.partial(self._nvml.nvmlGpmSampleGet, g.handle), "nvmlGpmSampleGet")

    def _wait_for_pair(self, streams: list[GpmStream], now: float) -> float:
        """The time to sample at: ``now``, or a few ms later when the newest previous sample of ``streams`` is
        short of 100 ms only by scheduling jitter (else every other 100 ms pair would be skipped)."""
        prevs = [s.prev[1] for s in streams if s.prev is not None and s.samples]
        if not prevs:
            return now
        deficit = C.GPM_MIN_PAIR_SECONDS - (now - max(prevs))
        if deficit <= 1e-6 or deficit > GPM_MAX_WAIT_S:
            return now
        self._sleep(deficit)
        return float(self._clock())

    def _gpm_pair(self, g: GpuState, gpm: GpmStream, now: float, take: Callable[[Any], Any], name: str,
                  *, source: str = "gpm") -> None:
        """Take a GPM sample with ``take``; with the previous one >= 100 ms old, read the pair's metrics and
        integrate. Too close a pair is skipped: the next tick spans the whole interval."""
        if not g.gpm_ok or not gpm.samples:
            return
        prev = gpm.prev
        if prev is not None and now - prev[1] < C.GPM_MIN_PAIR_SECONDS - 1e-6:
            return
        cur = gpm.samples[1] if prev is not None and prev[0] is gpm.samples[0] else gpm.samples[0]
        try:
            got = self._opt(g, name, take, cur, raising=g.identity.mig_mode)
        except self._nvml.NVMLError as e:  # only for MIG instances: the instance is gone
            self._mig_gone(g, e)
            gpm.prev = None
            return
        if got is None:
            if name in g.disabled and g.identity.mig_mode and name == "nvmlGpmSampleGet":
                self._free_samples(gpm, g.index)  # the whole GPU's GPM refused in MIG mode: its instances' stay
            elif name in g.disabled:
                g.gpm_ok = False
                gpm.last = {}
                g.identity = dataclasses.replace(g.identity, gpm=False)
            gpm.prev = None
            return
        if prev is None:
            gpm.prev = (cur, now)
            if gpm.t is None:  # the integrals start here (a later re-anchor keeps the last integrated time)
                gpm.t = now
            return
        nvml = self._nvml
        mg = gpm.mg
        mg.sample1, mg.sample2 = prev[0], cur
        res = self._opt(g, "nvmlGpmMetricsGet", nvml.nvmlGpmMetricsGet, mg)
        gpm.prev = (cur, now)
        if res is None:
            gpm.last = {}
            return
        dt = now - prev[1]
        vals: dict[int, float | None] = {}
        for mid, (got_id, ret, value) in zip(GPM_METRICS, read_gpm_metrics(mg, len(GPM_METRICS)), strict=True):
            ok = ret == SUCCESS and got_id == mid
            if ok and not math.isfinite(value):
                # SUCCESS with NaN or Inf (nvml.h does not rule it out): one such value integrated would make
                # the counters NaN for the rest of the process's life. Dropped, counted and logged.
                self._drop(g, DROPPED_GPM, metric=mid, value=repr(value))
                ok = False
            vals[mid] = value if ok else None
        gpm.last = vals
        sm, gr = vals.get(C.GPM_SM_UTIL), vals.get(C.GPM_GRAPHICS_UTIL)
        if gr is not None:
            # Kernels resident over the pair: the adaptive rate's GPM source (one per stream: GPU or instance).
            g.pace.observe(source, classify([min(max(gr, 0.0), 100.0) / 100.0]), now)
        if sm is not None and gpm.sm_active_seconds is not None:
            gpm.sm_active_seconds += min(max(sm, 0.0), 100.0) / 100.0 * dt
            gpm.t = now
        if gr is not None and gpm.graphics_seconds is not None:
            gpm.graphics_seconds += min(max(gr, 0.0), 100.0) / 100.0 * dt
            gpm.t = now


def _scaled(v: float | None, k: float) -> float | None:
    return None if v is None else max(0.0, v) * k

