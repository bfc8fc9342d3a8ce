"""The NVML field values gpufeed reads, declared once: what to ask the driver for and what it becomes.

Every entry of one path is read in ONE ``nvmlDeviceGetFieldValues`` call per GPU (a batched driver call: the
cheapest way to many values, DESIGN.md "GPU access"): the ``fast`` entries on the fast path (100 ms: activity,
power, throttle time), the ``slow`` ones on the slow path (5 s: ECC and row-remapping counters, which change
rarely and need no sub-second resolution). The backend unwraps counters and scales units, the GPU collector
exports each entry as its metric family from the sample of its path, and the strict fake NVML answers each one
from its device state (``fake_key``, starting at ``fake_default``). Adding a field is one entry here plus, when
the entry needs a state key of its own, nothing else: the fake derives its default from the table
(docs/architecture.md).

Field ids are nvml.h's ``NVML_FI_DEV_*`` (``nvml_name``; a test checks each against the installed
``pynvml``). Counters are cumulative device counters that may wrap (at the width of their value type) or reset
(driver reload, GPU reset); ``max_rate`` (raw units per second) tells a wrap from a reset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter import clockevents as R  # noqa: N812

COUNTER = "counter"
GAUGE = "gauge"
# How the driver returns a field (nvmlValueType_t): a 32-bit or 64-bit unsigned integer; "pcie" follows the
# device's PCIe byte-counter width (32 bits on every driver seen so far; the fake models both).
UINT, ULL, PCIE = "uint", "ull", "pcie"
# Which sampling path reads the field (exporter/gpu/fast.py, slow.py): the fast one, or the slow one.
FAST, SLOW = "fast", "slow"


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
    path: str = FAST
    # The first driver branch whose nvml.h declares the field (0: every branch gpufeed supports), and what stands
    # in for it on older drivers: both go into the log line that says the field is not available there.
    driver_branch: int = 0
    instead: str = "nothing"

    @property
    def state_key(self) -> str:
        return self.fake_key or self.key


def _throttle(reason: str, field_id: int, nvml_name: str, driver_branch: int = 0) -> Field:
    return Field(
        key=R.throttle_key(reason), field_id=field_id, nvml_name=nvml_name, kind=COUNTER,
        metric="gpufeed_gpu_throttle_seconds", scale=1e-9, value_type=ULL, max_rate=1e9,
        labels=MappingProxyType({"reason": reason}), fake_key=f"throttle_ns.{reason}",
        help="Time the clocks were held down for the reason, from NVML's cumulative clock-event counters.",
        driver_branch=driver_branch,
        instead="the clock-event reason bits of each slow cycle (gpufeed_gpu_clock_event_reason)",
    )


def _ecc(error: str, counter: str, field_id: int, nvml_name: str) -> Field:
    return Field(
        key=f"ecc_{error}_{counter}", field_id=field_id, nvml_name=nvml_name, kind=COUNTER,
        metric="gpufeed_gpu_ecc_errors", value_type=ULL, max_rate=1e6, path=SLOW,
        labels=MappingProxyType({"error": error, "counter": counter}), fake_key=f"ecc.{error}_{counter}",
        help="ECC errors in device memory, caches and register files (NVML ECC totals): error is corrected "
             "(single-bit) or uncorrected (double-bit); counter is volatile (since the driver loaded) or "
             "aggregate (lifetime, from the InfoROM).",
    )


def _remapped(cause: str, field_id: int, nvml_name: str) -> Field:
    return Field(
        key=f"remapped_rows_{cause}", field_id=field_id, nvml_name=nvml_name, kind=GAUGE,
        metric="gpufeed_gpu_remapped_rows", labels=MappingProxyType({"cause": cause}),
        fake_key=f"remapped_rows.{cause}", path=SLOW,
        help="Rows of device memory remapped to spare rows (recorded in the InfoROM), by the kind of ECC error "
             "that caused them.",
    )


# Fields 197/198 first appear in the NVML 12.5 header (R555): on R535/R550 the driver answers an error per field.
_PCIE_INSTEAD = ("GPM's PCIe rates in the transfer verdicts (Hopper and newer); no PCIe byte counts on older GPUs "
                 "(nvmlDeviceGetPcieThroughput blocks ~20 ms and is never called)")
# Fields 269-271 first appear in the NVML 12.9 header (R575). Branches from go-nvml's header history
# (../shared/reference/reviews/gpu_readiness.md section 3).
# Plausibility bounds: above any PCIe link (Gen6 x16 ~ 121 GB/s per direction), a replay storm, real time
# for nanosecond counters, and 100 kW for an energy counter in millijoules.
FIELDS: tuple[Field, ...] = (
    Field("pcie_tx_bytes", 197, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", COUNTER, "gpufeed_gpu_pcie_tx_bytes",
          "Bytes the GPU sent over PCIe (device to host), NVML field 197 unwrapped.", value_type=PCIE,
          max_rate=256e9, driver_branch=555, instead=_PCIE_INSTEAD),
    Field("pcie_rx_bytes", 198, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", COUNTER, "gpufeed_gpu_pcie_rx_bytes",
          "Bytes the GPU received over PCIe (host to device), NVML field 198 unwrapped.", value_type=PCIE,
          max_rate=256e9, driver_branch=555, instead=_PCIE_INSTEAD),
    Field("pcie_replays", 94, "NVML_FI_DEV_PCIE_REPLAY_COUNTER", COUNTER, "gpufeed_gpu_pcie_replays",
          "PCIe replays (link-level retransmissions) seen by the GPU, NVML field 94.", max_rate=1e7),
    Field("power", 186, "NVML_FI_DEV_POWER_INSTANT", GAUGE, "gpufeed_gpu_power_watts",
          "Power draw (instantaneous where the GPU reports it).", scale=1e-3, fake_key="power_w", fake_scale=1e3),
    Field("energy", 83, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", COUNTER, "gpufeed_gpu_energy_joules",
          "Energy the GPU consumed since the driver loaded, NVML field 83 (millijoules, exported in joules).",
          scale=1e-3, value_type=ULL, max_rate=1e8, fake_key="energy_mj"),
    # NVML_FI_DEV_CLOCKS_EVENT_REASON_* (nvml.h; 74 and 76 are the older PERF_POLICY_* names of the same
    # counters), nanoseconds; the DCGM equivalents are documented "in ns" since dcgm-exporter PR #589.
    _throttle(R.SW_POWER_CAP, 74, "NVML_FI_DEV_PERF_POLICY_POWER"),
    _throttle(R.SYNC_BOOST, 76, "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    _throttle(R.SW_THERMAL, 269, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", 575),
    _throttle(R.HW_THERMAL, 270, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", 575),
    _throttle(R.HW_POWER_BRAKE, 271, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", 575),
    # Memory errors, slow path. ECC totals over every memory of the device (nvml.h: "Total single/double bit
    # volatile/aggregate ECC errors"); NVML calls single-bit errors corrected and double-bit ones uncorrected
    # (nvmlMemoryErrorType_t). Volatile counts reset when the driver reloads, aggregate ones persist in the
    # InfoROM. Absent (NOT_SUPPORTED) on boards without ECC or with ECC off.
    _ecc("corrected", "volatile", 3, "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    _ecc("uncorrected", "volatile", 4, "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    _ecc("corrected", "aggregate", 5, "NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
    _ecc("uncorrected", "aggregate", 6, "NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
    # Row remapping (Ampere and newer; NVIDIA "A100 GPU memory error management"): rows of HBM replaced by
    # spares, recorded in the InfoROM -- a count that only grows, bounded by the spare rows, so a gauge. A
    # pending remap takes effect at the next GPU reset; a failure means the spares could not take the row.
    # nvmlDeviceGetRemappedRows answers the same four values in one getter; the fields batch them with ECC.
    _remapped("correctable", 142, "NVML_FI_DEV_REMAPPED_COR"),
    _remapped("uncorrectable", 143, "NVML_FI_DEV_REMAPPED_UNC"),
    Field("row_remap_pending", 144, "NVML_FI_DEV_REMAPPED_PENDING", GAUGE, "gpufeed_gpu_row_remap_pending",
          "1 while a row remapping waits for the next GPU reset to take effect (NVML field 144).",
          fake_key="remapped_rows.pending", path=SLOW),
    Field("row_remap_failure", 145, "NVML_FI_DEV_REMAPPED_FAILURE", GAUGE, "gpufeed_gpu_row_remap_failure",
          "1 once a row remapping has failed on this GPU (NVML field 145): its memory cannot be repaired.",
          fake_key="remapped_rows.failure", path=SLOW),
)
BY_ID: Mapping[int, Field] = MappingProxyType({f.field_id: f for f in FIELDS})
BY_KEY: Mapping[str, Field] = MappingProxyType({f.key: f for f in FIELDS})
# The entries of each sampling path, in table order.
ON_PATH: Mapping[str, tuple[Field, ...]] = MappingProxyType(
    {p: tuple(f for f in FIELDS if f.path == p) for p in (FAST, SLOW)})
# Throttle reason -> field key, for the consumers that read the time per reason.
THROTTLE_KEYS: Mapping[str, str] = MappingProxyType(
    {f.labels["reason"]: f.key for f in FIELDS if f.metric == "gpufeed_gpu_throttle_seconds"})
