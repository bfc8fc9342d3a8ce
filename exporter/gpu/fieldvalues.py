"""The field table's values (exporter/gpu/fields.py), read in one ``nvmlDeviceGetFieldValues`` call per GPU and
sampling path: counters unwrapped, units scaled; on the fast path, the PCIe byte counters' rates that guard
the adaptive rate, and the check that the configured rate sees every wrap."""

from __future__ import annotations

from exporter import log
from exporter.gpu import fields as F  # noqa: N812
from exporter.gpu.binding import (
    DISABLING,
    ERR_GPU_IS_LOST,
    ERR_INVALID_ARGUMENT,
    ERR_NOT_FOUND,
    ERROR_NAMES,
    M64,
    MODULUS,
    SUCCESS,
    read_field_values,
)
from exporter.gpu.session import NvmlSession
from exporter.gpu.state import GpuLostError, GpuState


class FieldValues(NvmlSession):
    """The batched field read of both sampling paths that read fields (fast and slow)."""

    # The fast path's two rates (set by NvmlBackend): its sampler's, and the steady one (None: no steady rate).
    _fast_s: float
    _steady_s: float | None

    def _fields(self, g: GpuState, now: float, path: str) -> dict[str, float]:
        """One nvmlDeviceGetFieldValues call for every still-supported field of the table on ``path``; every
        such field's newest value in base units by key (counters unwrapped; a field that failed this once
        keeps its last)."""
        nvml = self._nvml
        ids = [f.field_id for f in F.ON_PATH[path] if f.field_id not in g.disabled_fields]
        if not ids:
            return {}
        arr = self._opt(g, "nvmlDeviceGetFieldValues", nvml.nvmlDeviceGetFieldValues, g.handle, ids)
        self.array_types.hold(arr)
        out = g.field_values[path]
        if arr is None:
            if "nvmlDeviceGetFieldValues" in g.disabled:
                g.disabled_fields.update(f.field_id for f in F.FIELDS)
            return {k: v for k, v in out.items() if F.BY_KEY[k].kind == F.COUNTER}
        prev_t = g.fields_prev_t.get(path)
        spacing = None if prev_t is None else now - prev_t
        g.fields_prev_t[path] = now
        for fid, ret, vt, raw, ts_us in read_field_values(arr):
            f = F.BY_ID.get(fid)
            if f is None:
                continue
            if ret != SUCCESS:
                if f.kind == F.GAUGE:
                    out.pop(f.key, None)  # an instantaneous value not read now is unknown, not the last one
                if ret in DISABLING or ret in (ERR_NOT_FOUND, ERR_INVALID_ARGUMENT):
                    # INVALID_ARGUMENT: a field id this driver does not know (older than the field's branch),
                    # for good like NOT_SUPPORTED -- and said so, never a series silently missing.
                    g.disabled_fields.add(fid)
                    out.pop(f.key, None)
                    if log.once(("gpu_field_disabled", self._tag, str(g.index), str(fid))):
                        self._log.info("gpu_field_disabled", gpu=g.index, field=fid, key=f.key,
                                       reason=ERROR_NAMES.get(ret, ret), driver=self.driver_version,
                                       needs_driver=f"R{f.driver_branch}+" if f.driver_branch else "any",
                                       instead=f.instead)
                elif ret == ERR_GPU_IS_LOST:
                    raise GpuLostError()
                continue
            if raw is None:
                continue
            if f.kind == F.COUNTER:
                counter = g.counters[fid]
                # The driver's timestamp of the value (0: none given) tells a refresh step from a reset.
                total = counter.update(raw, MODULUS.get(vt, M64), now, ts_us / 1e6 if ts_us > 0 else None)
                modulus = counter.width(MODULUS.get(vt, M64))
                out[f.key] = total * f.scale
                if f.value_type == F.PCIE:
                    self._pcie_rate(g, fid, total, modulus, now)
                    # Only reads at the configured rate say whether that rate is too slow for the counter (a
                    # steady GPU is read at the steady rate only while the guard above allows it).
                    if not g.wrap_warned and spacing is not None and spacing <= 1.5 * self._fast_s:
                        self._check_wrap_window(g, modulus, spacing)
            else:
                out[f.key] = raw * f.scale
        return dict(out)

    def _pcie_rate(self, g: GpuState, fid: int, total: int, modulus: int, now: float) -> None:
        """The adaptive rate's guard input: a byte counter's mean rate over at least a steady interval (a
        driver, or the simulator, may update the counter in steps coarser than 100 ms: a rate over one fast
        interval would read those steps as bursts), and the lower of the two newest such rates (one late
        update makes one span short and the next one long: only both together say the traffic stayed there).
        The first rate stands for both."""
        ref = g.pcie_ref.get(fid)
        if ref is None or total < ref[1] or now < ref[0]:
            g.pcie_ref[fid] = (now, total)
            return
        span = now - ref[0]
        if span >= (self._steady_s or self._fast_s):
            rate = (total - ref[1]) / span
            g.pcie_sustained[fid] = min(rate, g.pcie_rates.get(fid, rate))
            g.pcie_rates[fid] = rate
            g.pcie_modulus = min(g.pcie_modulus, modulus)
            g.pcie_ref[fid] = (now, total)

    def _check_wrap_window(self, g: GpuState, modulus: int, spacing: float | None) -> None:
        """Warn once if the link could move a whole counter period between two reads (wraps would be missed)."""
        cap = g.link_capacity
        if g.wrap_warned or cap is None or spacing is None or spacing <= 0:
            return
        if cap * spacing >= modulus:
            g.wrap_warned = True
            self._log.info("gpu_pcie_counter_may_wrap_unseen", gpu=g.index, interval_s=round(spacing, 3),
                              link_bytes_per_s=cap, counter_modulus=modulus,
                              hint="shorten --collector.gpu.interval")
