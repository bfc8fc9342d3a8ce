"""The NVML field values gpufeed reads, declared once: what to ask the driver for and what it becomes.

Every entry is read on the fast path in ONE ``nvmlDeviceGetFieldValues`` call per GPU (a batched driver call:
the cheapest way to many values, DESIGN.md "GPU access"); the backend unwraps counters and scales units, the GPU
collector exports each entry as its metric family, and the strict fake NVML answers each one from its device
state (``fake_key``, starting at ``fake_default``). Adding a field is one entry here plus, when the entry needs
a state key of its own, nothing else: the fake derives its default from the table (docs/architecture.md).

Field ids are nvml.h's ``NVML_FI_DEV_*`` (``nvml_name``; a test checks each against the installed
``pynvml``). Counters are cumulative device counters that may wrap (at the width of their value type) or reset
(driver reload, GPU reset); ``max_rate`` (raw units per second) tells a wrap from a reset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

COUNTER = "counter"
GAUGE = "gauge"
# How the driver returns a field (nvmlValueType_t): a 32-bit or 64-bit unsigned integer; "pcie" follows the
# device's PCIe byte-counter width (32 bits on every driver seen so far; the fake models both).
UINT, ULL, PCIE = "uint", "ull", "pcie"


@dataclass(frozen=True, slots=True)
class Field:
    """One NVML field and the series it becomes.

    ``key`` names the value in ``GpuFast.fields``; ``scale`` converts the raw unit to the exported base unit
    (milliwatts -> watts: 1e-3); ``labels`` are constant labels of this entry's series (several entries may
    share one ``metric`` with different label values, e.g. the throttle reasons).
    """

    key: str
    field_id: int
    nvml_name: str
    kind: str
    metric: str
    help: str
    scale: float = 1.0
    value_type: str = UINT
    max_rate: float = 0.0
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    fake_key: str = ""  # the fake's device-state key (default: ``key``); "a.b" is key b of mapping a
    fake_default: int = 0
    fake_scale: float = 1.0  # raw value = round(state value x fake_scale)

    @property
    def state_key(self) -> str:
        return self.fake_key or self.key


def _throttle(reason: str, field_id: int, nvml_name: str) -> Field:
    return Field(
        key=f"throttle_{reason}", field_id=field_id, nvml_name=nvml_name, kind=COUNTER,
        metric="gpufeed_gpu_throttle_seconds", scale=1e-9, value_type=ULL, max_rate=1e9,
        labels=MappingProxyType({"reason": reason}), fake_key=f"throttle_ns.{reason}",
        help="Time the clocks were held down for the reason, from NVML's cumulative clock-event counters.",
    )


# Plausibility bounds: above any PCIe link (Gen6 x16 ~ 121 GB/s per direction), a replay storm, real time
# for nanosecond counters, and 100 kW for an energy counter in millijoules.
FIELDS: tuple[Field, ...] = (
    Field("pcie_tx_bytes", 197, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", COUNTER, "gpufeed_gpu_pcie_tx_bytes",
          "Bytes the GPU sent over PCIe (device to host), NVML field 197 unwrapped.", value_type=PCIE,
          max_rate=256e9),
    Field("pcie_rx_bytes", 198, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", COUNTER, "gpufeed_gpu_pcie_rx_bytes",
          "Bytes the GPU received over PCIe (host to device), NVML field 198 unwrapped.", value_type=PCIE,
          max_rate=256e9),
    Field("pcie_replays", 94, "NVML_FI_DEV_PCIE_REPLAY_COUNTER", COUNTER, "gpufeed_gpu_pcie_replays",
          "PCIe replays (link-level retransmissions) seen by the GPU, NVML field 94.", max_rate=1e7),
    Field("power", 186, "NVML_FI_DEV_POWER_INSTANT", GAUGE, "gpufeed_gpu_power_watts",
          "Power draw (instantaneous where the GPU reports it).", scale=1e-3, fake_key="power_w", fake_scale=1e3),
    Field("energy", 83, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", COUNTER, "gpufeed_gpu_energy_joules",
          "Energy the GPU consumed since the driver loaded, NVML field 83 (millijoules, exported in joules).",
          scale=1e-3, value_type=ULL, max_rate=1e8, fake_key="energy_mj"),
    # NVML_FI_DEV_CLOCKS_EVENT_REASON_* (nvml.h; 74 and 76 are the older PERF_POLICY_* names of the same
    # counters), nanoseconds; the DCGM equivalents are documented "in ns" since dcgm-exporter PR #589.
    _throttle("sw_power_cap", 74, "NVML_FI_DEV_PERF_POLICY_POWER"),
    _throttle("sync_boost", 76, "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    _throttle("sw_thermal", 269, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"),
    _throttle("hw_thermal", 270, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
    _throttle("hw_power_brake", 271, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN"),
)
BY_ID: Mapping[int, Field] = MappingProxyType({f.field_id: f for f in FIELDS})
BY_KEY: Mapping[str, Field] = MappingProxyType({f.key: f for f in FIELDS})
# Throttle reason -> field key, for the consumers that read the time per reason.
THROTTLE_KEYS: Mapping[str, str] = MappingProxyType(
    {f.labels["reason"]: f.key for f in FIELDS if f.metric == "gpufeed_gpu_throttle_seconds"})
