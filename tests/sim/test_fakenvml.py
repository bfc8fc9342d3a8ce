"""The strict fake NVML itself: it must behave like pynvml where the backend looks, and fail loudly elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.sim.fakenvml import FakeNvml, StateError, advance_state

DEV = {"pci_bus_id": "0000:82:00.0"}


def test_fake_raises_the_real_pynvml_error_subclasses() -> None:
    f = FakeNvml({"devices": [dict(DEV, unsupported=["nvmlDeviceGetTemperature"])]})
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        f.nvmlDeviceGetCount()
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        f.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_NotFound):  # empty sample buffer
        f.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml({"init_error": "library_not_found"}).nvmlInit()


def test_lost_gpu_answers_gpu_is_lost_then_the_configured_error() -> None:
    f = FakeNvml({"devices": [dict(DEV, lost=True, lost_error="unknown")]})
    f.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        f.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_Unknown):
        f.nvmlDeviceGetHandleByIndex(0)


def test_fake_fails_loudly_on_unmodelled_calls_and_never_allows_pcie_throughput() -> None:
    f = FakeNvml({"devices": [DEV]})
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(AssertionError, match="unexpected call nvmlDeviceGetEccMode"):
        f.nvmlDeviceGetEccMode(h)
    with pytest.raises(AssertionError, match="must never be called"):
        f.nvmlDeviceGetPcieThroughput(h, 0)
    with pytest.raises(AssertionError, match="unmodelled field id 999"):
        f.nvmlDeviceGetFieldValues(h, [999])
    assert f.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST  # constants come from the real module


def test_state_with_an_unknown_key_is_rejected_naming_it() -> None:
    with pytest.raises(StateError, match="sm_actve"):
        FakeNvml({"devices": [dict(DEV, sm_actve=1.0)]})
    with pytest.raises(StateError, match="pci_bus_id"):
        FakeNvml({"devices": [{}]})


def test_gpm_pair_answers_the_average_of_the_integrals() -> None:
    state = {"devices": [DEV]}
    f = FakeNvml(state)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = f.nvmlGpmSampleAlloc(), f.nvmlGpmSampleAlloc()
    f.nvmlGpmSampleGet(h, s1)
    st = f.state
    advance_state(st, 0.25, {0: {"sm_active": 0.8, "pcie_tx_bytes_per_s": 3 * 2**20}})
    f.set_state(st)
    f.nvmlGpmSampleGet(h, s2)
    mg = f.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 2, s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    mg.metrics[1].metricId = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    f.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].value == pytest.approx(80.0)
    assert mg.metrics[1].value == pytest.approx(3.0)
    assert f.gpm_short_pairs == 0


def test_from_file_reloads_on_change_and_keeps_last_good_state(tmp_path: Path) -> None:
    p = tmp_path / "nvml.json"
    p.write_text(json.dumps({"devices": [DEV]}))
    f = FakeNvml.from_file(p)
    f.nvmlInit()
    assert f.nvmlDeviceGetCount() == 1
    tmp = tmp_path / "tmp.json"
    tmp.write_text(json.dumps({"devices": [DEV, {"pci_bus_id": "0000:83:00.0"}]}))
    os.replace(tmp, p)
    assert f.nvmlDeviceGetCount() == 2
    p.write_text("{not json")
    assert f.nvmlDeviceGetCount() == 2
    assert f.reload_errors == 1


def test_a_new_state_is_seen_by_the_next_field_values_call_planned_or_not() -> None:
    # The fake plans a request once per state shape: a field made unsupported, a counter's width, a new value
    # must all show at the very next call.
    f = FakeNvml({"devices": [dict(DEV, pcie_tx_bytes=(1 << 32) + 7, pcie_replays=3)]})
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    req = [197, 94]
    arr = f.nvmlDeviceGetFieldValues(h, req)
    assert (arr[0].value.uiVal, arr[1].value.uiVal) == (7, 3)
    f.set_state({"devices": [dict(DEV, pcie_tx_bytes=(1 << 32) + 8, pcie_counter_bits=64,
                                  unsupported=["field:94"])]})
    arr = f.nvmlDeviceGetFieldValues(h, req)
    assert (arr[0].valueType, arr[0].value.ullVal) == (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, (1 << 32) + 8)
    assert arr[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(AssertionError, match="unmodelled field id 1234"):
        f.nvmlDeviceGetFieldValues(h, [197, 1234])
    with pytest.raises(AssertionError, match="unmodelled field id 1234"):
        f.nvmlDeviceGetFieldValues(h, [197, 1234])  # every time: a failed plan is not kept


def test_forwarded_constants_are_the_bindings_own_objects_every_time() -> None:
    f = FakeNvml({"devices": [DEV]})
    assert f.NVML_CLOCK_SM is pynvml.NVML_CLOCK_SM and f.NVML_CLOCK_SM is pynvml.NVML_CLOCK_SM
    assert f.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t
    for _ in range(2):
        with pytest.raises(AttributeError):
            _ = f.nvmlNoSuchFunction
        with pytest.raises(AssertionError, match="not modelled"):
            _ = f.nvmlDeviceGetFanSpeed


def _fields(f: FakeNvml, ids: list[int]) -> list[tuple[int, int, int, int]]:
    """(fieldId, nvmlReturn, valueType, timestamp) of one field read of GPU 0."""
    arr = f.nvmlDeviceGetFieldValues(f.nvmlDeviceGetHandleByIndex(0), ids)
    return [(int(v.fieldId), int(v.nvmlReturn), int(v.valueType), int(v.timestamp)) for v in arr]


def test_fields_newer_than_the_driver_branch_answer_the_chosen_per_field_error() -> None:
    f = FakeNvml({"driver_version": "535.183.01", "driver_fields": "invalid_argument", "devices": [DEV]})
    f.nvmlInit()
    got = {fid: ret for fid, ret, _, _ in _fields(f, [197, 94, 269])}
    assert got == {197: pynvml.NVML_ERROR_INVALID_ARGUMENT, 94: pynvml.NVML_SUCCESS,
                   269: pynvml.NVML_ERROR_INVALID_ARGUMENT}
    f.set_state({"driver_version": "575.51.03", "driver_fields": "invalid_argument", "devices": [DEV]})
    assert {ret for _, ret, _, _ in _fields(f, [197, 94, 269])} == {pynvml.NVML_SUCCESS}
    with pytest.raises(StateError, match="driver_fields"):
        FakeNvml({"driver_fields": "no_such_error"})


def test_a_field_refreshed_every_second_holds_its_value_and_timestamp_in_between() -> None:
    state: dict[str, Any] = {"devices": [dict(DEV, field_refresh_s={"74": 1.0}, throttle_ns={"sw_power_cap": 0})]}
    f = FakeNvml(state)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)

    def read(t: float, ns: int) -> tuple[int, int]:
        state["t"], state["devices"][0]["throttle_ns"] = t, {"sw_power_cap": ns}
        f.set_state(state)
        v = f.nvmlDeviceGetFieldValues(h, [74])[0]
        return int(v.timestamp), int(v.value.ullVal)

    assert read(0.0, 0) == (0, 0)
    assert read(0.5, 500) == (0, 0), "between refreshes: the newest refresh's value and time"
    assert read(1.0, 1000) == (1_000_000, 1000)
    assert read(1.2, 1200)[1] == 1000


def test_a_32_bit_pcie_counter_can_be_reported_in_a_64_bit_slot() -> None:
    f = FakeNvml({"devices": [dict(DEV, pcie_counter_bits=32, pcie_counter_value_type="ull",
                                   pcie_rx_bytes=(1 << 32) + 5)]})
    f.nvmlInit()
    v = f.nvmlDeviceGetFieldValues(f.nvmlDeviceGetHandleByIndex(0), [198])[0]
    assert int(v.valueType) == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and int(v.value.ullVal) == 5


def test_a_gpu_refusing_its_handle_answers_only_that_index() -> None:
    f = FakeNvml({"devices": [DEV, dict(DEV, pci_bus_id="0000:83:00.0",
                                        errors={"nvmlDeviceGetHandleByIndex": "insufficient_power"})]})
    f.nvmlInit()
    f.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InsufficientPower):
        f.nvmlDeviceGetHandleByIndex(1)


def test_two_compute_instances_of_one_gpu_instance_are_two_mig_devices() -> None:
    f = FakeNvml({"devices": [dict(DEV, mig=[{"gi": 3, "ci": 0}, {"gi": 3, "ci": 1}])]})
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    devs = [f.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(2)]
    assert [(f.nvmlDeviceGetGpuInstanceId(d), f.nvmlDeviceGetComputeInstanceId(d)) for d in devs] == [(3, 0), (3, 1)]
    assert len({f.nvmlDeviceGetUUID(d) for d in devs}) == 2
    with pytest.raises(StateError, match="not unique"):
        FakeNvml({"devices": [dict(DEV, mig=[{"gi": 3}, {"gi": 3}])]})
