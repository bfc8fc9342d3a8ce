"""NVML facts shared by the backend and the fake NVML: clock-event reasons, GPM metric ids, sampling types.

Values are the ones in nvml.h (API v13) and nvidia-ml-py's ``pynvml.py``; see
shared/reference/anchors-gpu-nvml.md sections 4.3-4.4. Kept as plain ints here so the fake and the
backend agree without importing ``pynvml`` at module import time.
"""

from __future__ import annotations

from exporter import clockevents

# Clock-event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h, by name: exporter/clockevents.py.
CLOCK_EVENT_REASONS = clockevents.CLOCK_EVENT_REASONS

# The field values (NVML_FI_DEV_*) gpufeed reads are declared in exporter/gpu/fields.py.

# GPM metric ids (nvml.h L13506-13520); utilisations are 0.0-100.0, PCIe rates MiB/s.
GPM_GRAPHICS_UTIL = 1
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21

# nvmlDeviceGetSamples sampling types.
GPU_UTILIZATION_SAMPLES = 1
MEMORY_UTILIZATION_SAMPLES = 2

# Below this spacing two GPM samples do not give a valid metric ("should be greater than 100ms due to
# the internal sample refresh rate", nvml.h L13871-13988).
GPM_MIN_PAIR_SECONDS = 0.1

MIB = 1 << 20


def decode_reasons(mask: int) -> frozenset[str]:
    """Clock-event reason names set in an nvmlDeviceGetCurrentClocksEventReasons bitmask."""
    return frozenset(name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit)


def encode_reasons(names: object) -> int:
    """The bitmask of a list of reason names; ValueError naming an unknown one."""
    if not isinstance(names, list | tuple | set | frozenset):
        raise ValueError(f"clock_event_reasons must be a list of names, not {names!r}")
    mask = 0
    for n in names:
        bit = CLOCK_EVENT_REASONS.get(str(n))
        if bit is None:
            raise ValueError(f"unknown clock event reason {n!r} (known: {', '.join(CLOCK_EVENT_REASONS)})")
        mask |= bit
    return mask
