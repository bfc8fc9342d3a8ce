"""Clock-event ("throttle") reason names, declared once: NVML's bit for each, which ones NVML also counts time
for, and which ones mean a power or thermal limit.

The names are the ones of shared/scenarios/SPEC.md and the ``reason`` label of gpufeed_gpu_clock_event_reason
and gpufeed_gpu_throttle_seconds_total. A module of its own below every package: the NVML backend decodes the
bitmask (exporter/gpu/constants.py), the field table declares the time counters (exporter/gpu/fields.py), the
GPU samples read them back by name (exporter/samples/gpu.py), the derived layer judges them
(exporter/derived/gpuview.py) and the simulator writes them (exporter/sim/), none importing another for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

GPU_IDLE = "gpu_idle"
APPLICATIONS_CLOCKS_SETTING = "applications_clocks_setting"
SW_POWER_CAP = "sw_power_cap"
HW_SLOWDOWN = "hw_slowdown"
SYNC_BOOST = "sync_boost"
SW_THERMAL = "sw_thermal"
HW_THERMAL = "hw_thermal"
HW_POWER_BRAKE = "hw_power_brake"
DISPLAY_CLOCK = "display_clock"

# nvmlClocksEventReason* bits (nvml.h), in bit order.
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType({
    GPU_IDLE: 0x1,
    APPLICATIONS_CLOCKS_SETTING: 0x2,
    SW_POWER_CAP: 0x4,
    HW_SLOWDOWN: 0x8,
    SYNC_BOOST: 0x10,
    SW_THERMAL: 0x20,
    HW_THERMAL: 0x40,
    HW_POWER_BRAKE: 0x80,
    DISPLAY_CLOCK: 0x100,
})

# Reasons that mean power or thermal limits pulled the clocks down, and the thermal ones among them (with the
# hardware slowdown and power brake, which an overheating board also triggers).
THROTTLE_REASONS = frozenset({SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE})
THERMAL_REASONS = frozenset({SW_THERMAL, HW_THERMAL, HW_SLOWDOWN, HW_POWER_BRAKE})


def throttle_key(reason: str) -> str:
    """The field key (exporter/gpu/fields.py, ``GpuFast.fields``) of the time counter of ``reason``."""
    return f"throttle_{reason}"


# Every reason's time-counter key, in bit order; the field table declares which reasons have a counter.
TIME_KEYS: Mapping[str, str] = MappingProxyType({r: throttle_key(r) for r in CLOCK_EVENT_REASONS})
