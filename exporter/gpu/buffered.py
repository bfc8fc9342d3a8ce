"""The buffered sampling path (default every 1 s): ``nvmlDeviceGetSamples`` for GPU utilisation, carrying
``lastSeenTimeStamp`` from the returned samples (driver clock, not ours); without them,
``nvmlDeviceGetUtilizationRates`` integrated on our clock.

The driver's memory-utilisation samples (NVML_MEMORY_UTILIZATION_SAMPLES) are not read: nothing derived or
exported used them (DRAM activity comes from GPM, ``gpufeed_gpu_dram_active_ratio``), and they were half of this
path's calls -- 8 GPUs every second while one waits."""

from __future__ import annotations

from exporter.gpu import constants as C  # noqa: N812 - short, used everywhere
from exporter.gpu.binding import ERR_NOT_FOUND, code, sample_value
from exporter.gpu.pace import IDLE, classify
from exporter.gpu.session import NvmlSession
from exporter.gpu.state import GpuState
from exporter.samples.gpu import GpuBuffered, UtilPoint
from exporter.samples.rows import Rows

ACTIVE_LEVEL = 0.05  # a driver sample above this is work: the derived layer's idle level (derived/series.py)
SAMPLES = "nvmlDeviceGetSamples"
# How a refused GetSamples is remembered in GpuState.disabled (the one sample type read: GPU utilisation).
SAMPLES_KEY = f"{SAMPLES}:{C.GPU_UTILIZATION_SAMPLES}"


class BufferedPath(NvmlSession):
    """The driver's buffered utilisation samples of each GPU since the previous call, integrated."""

    def _buffered_one(self, g: GpuState, now: float) -> GpuBuffered:
        util = self._samples(g, now)
        if util is not None:
            # Activity started or stopped (an empty buffer is an idle GPU): a workload came or went, so the next
            # slow cycle enumerates the processes whenever the last enumeration was.
            active = any(p.value > ACTIVE_LEVEL for p in util)
            # The adaptive rate's driver-sample source: nothing new (the buffer ran dry) is an idle GPU; a stretch
            # without samples between two (the GPU went idle in between) is a gap, hence a dip.
            if g.util.gapped and SAMPLES_KEY not in g.disabled:
                g.pace.heat("samples:gap")
                g.pace.classes["samples"] = classify(p.value for p in util)
            else:
                g.pace.observe("samples", classify(p.value for p in util) if util else IDLE, now)
            if g.active is not None and active != g.active:
                g.processes_t = None
            g.active = active
        # An empty buffer (NOT_FOUND) is an idle GPU: busy time stays where it was (0 at start).
        busy = g.util.seconds if util is not None else None
        return GpuBuffered(gpu_util=util or (), busy_seconds=busy)

    def _samples(self, g: GpuState, now: float) -> Rows[UtilPoint] | None:
        """New utilisation samples since the last seen timestamp; None when the GPU gives none at all."""
        nvml = self._nvml
        integ = g.util
        if SAMPLES_KEY in g.disabled:
            return self._rates_fallback(g, now)
        try:
            _vt, raw = self._timed(SAMPLES, nvml.nvmlDeviceGetSamples, g.handle, C.GPU_UTILIZATION_SAMPLES,
                                   integ.last_ts or 0)
        except nvml.NVMLError as e:
            if code(e) == ERR_NOT_FOUND:  # empty buffer: normal on an idle GPU
                g.unknown_streak = 0
                integ.gapped = False
                return Rows(UtilPoint)
            self._failed(g, SAMPLES_KEY, e)
            if SAMPLES_KEY in g.disabled:
                return self._rates_fallback(g, now)
            return None
        g.unknown_streak = 0
        self.array_types.hold(raw)
        pts = [(int(s.timeStamp), float(sample_value(s.sampleValue, _vt))) for s in raw]
        new = integ.add(pts)
        return Rows(UtilPoint, ((ts / 1e6, min(max(v, 0.0), 100.0) / 100.0) for ts, v in new))

    def _rates_fallback(self, g: GpuState, now: float) -> Rows[UtilPoint] | None:
        """Without buffered samples: nvmlDeviceGetUtilizationRates, integrated on our clock (sample-and-hold)."""
        rates = self._opt(g, "nvmlDeviceGetUtilizationRates", self._nvml.nvmlDeviceGetUtilizationRates, g.handle)
        if rates is None:
            return None
        new = g.util.add([(int(now * 1e6), float(rates.gpu))])
        return Rows(UtilPoint, ((t / 1e6, min(max(v, 0.0), 100.0) / 100.0) for t, v in new))
