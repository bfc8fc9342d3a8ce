"""The backend and the strict fake against the installed binding (nvidia-ml-py's ``pynvml``): a name or a
signature the real module lacks fails here, not on a customer's host.

The backend's calls are read from its source (tests/support/nvmlsurface.py); the fake's functions are compared
with the binding's by ``inspect.signature``; the raw buffers the backend unpacks with ``struct`` are compared
with the binding's ctypes layouts; the fake's return values are the binding's own types.
"""

from __future__ import annotations

import ctypes
import inspect
import struct
from typing import Any

import pynvml
import pytest

from exporter.gpu import binding, constants
from exporter.sim import fakenvml
from exporter.sim.fakenvml import FakeNvml
from tests.support.nvmlsurface import backend_functions, backend_uses, problems, uses_in


def _fake_functions() -> dict[str, Any]:
    return {n: getattr(FakeNvml, n) for n in dir(FakeNvml) if n.startswith("nvml") and callable(getattr(FakeNvml, n))}


def _one_gpu(**kw: Any) -> FakeNvml:
    fake = FakeNvml({"devices": [{"pci_bus_id": "0000:82:00.0", **kw}]})
    fake.nvmlInit()
    return fake


def test_every_nvml_name_the_backend_uses_exists_in_the_installed_binding_with_the_arity_used() -> None:
    uses = backend_uses()
    assert len({u.name for u in uses}) > 40, "the source reader found the backend's calls"
    assert list(problems(uses, pynvml)) == []


def test_the_check_fails_on_a_call_the_real_binding_lacks_or_an_arity_it_rejects() -> None:
    # The bug that hid behind a fake implementing it: the slow path called a function pynvml never defined.
    source = '''
def slow(self, g, h):
    nvml = self._nvml
    width = self._opt(g, "nvmlDeviceGetGpuMaxPcieLinkWidth", nvml.nvmlDeviceGetGpuMaxPcieLinkWidth, h)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, 0)
    name = getattr(nvml, "nvmlDeviceGetTotallyMadeUp")
'''
    found = list(problems(uses_in(source, "bad.py"), pynvml))
    assert any("nvmlDeviceGetGpuMaxPcieLinkWidth is not defined" in p for p in found), found
    assert any("nvmlDeviceGetComputeRunningProcesses_v3 called with 2 argument(s)" in p for p in found), found
    assert any("nvmlDeviceGetTotallyMadeUp is not defined" in p for p in found), found


def test_every_function_of_the_fake_has_the_real_bindings_signature() -> None:
    fake = _fake_functions()
    assert len(fake) > 40
    for name, fn in sorted(fake.items()):
        real = getattr(pynvml, name, None)
        assert real is not None, f"FakeNvml.{name} is not a function of the installed binding"
        params = list(inspect.signature(fn).parameters.values())[1:]  # without self
        theirs = list(inspect.signature(real).parameters.values())
        assert [(p.name, p.kind, p.default) for p in params] == [(p.name, p.kind, p.default) for p in theirs], (
            f"FakeNvml.{name}{inspect.signature(fn)} differs from pynvml.{name}{inspect.signature(real)}")


def test_the_fake_implements_every_function_the_backend_calls() -> None:
    missing = sorted(set(backend_functions()) - set(_fake_functions()))
    assert missing == []


def test_the_fake_has_no_attribute_the_binding_lacks_exactly_like_the_real_module() -> None:
    fake = _one_gpu()
    with pytest.raises(AttributeError, match="nvmlDeviceGetGpuMaxPcieLinkWidth"):
        _ = fake.nvmlDeviceGetGpuMaxPcieLinkWidth
    with pytest.raises(AttributeError):
        getattr(pynvml, "nvmlDeviceGetGpuMaxPcieLinkWidth")  # noqa: B009 - the point is that it raises
    # A binding function the fake does not model is a loud test failure, not a silent value.
    with pytest.raises(AssertionError, match="not modelled"):
        _ = fake.nvmlDeviceGetFanSpeed
    with pytest.raises(AssertionError, match="never be called"):
        _ = fake.nvmlDeviceGetPcieThroughput


def test_the_fake_state_may_only_name_functions_the_binding_defines() -> None:
    with pytest.raises(ValueError, match="nvmlDeviceGetGpuMaxPcieLinkWidth"):
        FakeNvml({"devices": [{"pci_bus_id": "0000:82:00.0", "unsupported": ["nvmlDeviceGetGpuMaxPcieLinkWidth"]}]})
    with pytest.raises(ValueError, match="nvmlMadeUp"):
        FakeNvml({"devices": [{"pci_bus_id": "0000:82:00.0", "errors": {"nvmlMadeUp": "unknown"}}]})


def _offsets(cls: Any) -> list[tuple[str, int, int]]:
    return [(name, getattr(cls, name).offset, getattr(cls, name).size) for name, *_ in cls._fields_]


def _ends(fmt: str) -> list[int]:
    """Where each item of a little-endian struct format ends (pad bytes 'Nx' are one item)."""
    items, i, body = [], 0, fmt[1:]
    while i < len(body):
        j = i
        while body[j].isdigit():
            j += 1
        items.append(body[i : j + 1])
        i = j + 1
    return [struct.calcsize("<" + "".join(items[: k + 1])) for k in range(len(items))]


def test_the_raw_field_value_and_gpm_metric_buffers_match_the_bindings_struct_layouts() -> None:
    # The backend unpacks c_nvmlFieldValue_t arrays and the GPM metrics with one struct call each: every item
    # of the format must end exactly where the binding's field does.
    pairs = ((binding.FIELD_VALUE, pynvml.c_nvmlFieldValue_t), (binding.GPM_METRIC, pynvml.c_nvmlGpmMetric_t))
    for fmt, cls in pairs:
        assert ctypes.sizeof(cls) == fmt.size, cls
        assert _ends(fmt.format) == [o + n for _, o, n in _offsets(cls)], cls
    assert [name for name, *_ in pynvml.c_nvmlFieldValue_t._fields_] == [
        "fieldId", "scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn", "value"]
    assert [name for name, *_ in pynvml.c_nvmlGpmMetric_t._fields_] == ["metricId", "nvmlReturn", "value", "metricInfo"]
    # The fake fills the driver's sample buffers and GPM results through their memory the same way.
    assert ctypes.sizeof(pynvml.c_nvmlSample_t) == fakenvml.SAMPLE.size
    assert _ends(fakenvml.SAMPLE.format) == [o + n for _, o, n in _offsets(pynvml.c_nvmlSample_t)]
    assert [(o, n) for _, o, n in _offsets(pynvml.c_nvmlGpmMetric_t)][1:3] == [(4, 4), (8, 8)]
    assert _ends(fakenvml.GPM_RESULT.format) == [8 - 4, 16 - 4]  # nvmlReturn, value: packed at offset 4
    head = _offsets(pynvml.c_nvmlGpmMetricsGet_t)
    assert [name for name, *_ in head] == ["version", "numMetrics", "sample1", "sample2", "metrics"]
    assert [o + n for _, o, n in head[:4]] == [struct.calcsize("@" + fakenvml.GPM_REQUEST.format[1:][:k])
                                              for k in range(1, 5)]
    assert head[4][1] == fakenvml.GPM_METRICS_AT
    # The metrics array the fast unpacking reads sits inside the real request struct.
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    assert isinstance(mg.metrics, ctypes.Array) and ctypes.sizeof(mg.metrics._type_) == binding.GPM_METRIC.size


def test_return_codes_value_types_and_nvml_constants_are_the_bindings() -> None:
    for name, value in (("SUCCESS", binding.SUCCESS), ("ERROR_UNINITIALIZED", binding.ERR_UNINITIALIZED),
                        ("ERROR_INVALID_ARGUMENT", binding.ERR_INVALID_ARGUMENT),
                        ("ERROR_NOT_SUPPORTED", binding.ERR_NOT_SUPPORTED),
                        ("ERROR_NO_PERMISSION", binding.ERR_NO_PERMISSION), ("ERROR_NOT_FOUND", binding.ERR_NOT_FOUND),
                        ("ERROR_DRIVER_NOT_LOADED", binding.ERR_DRIVER_NOT_LOADED),
                        ("ERROR_TIMEOUT", binding.ERR_TIMEOUT),
                        ("ERROR_LIBRARY_NOT_FOUND", binding.ERR_LIBRARY_NOT_FOUND),
                        ("ERROR_FUNCTION_NOT_FOUND", binding.ERR_FUNCTION_NOT_FOUND),
                        ("ERROR_GPU_IS_LOST", binding.ERR_GPU_IS_LOST), ("ERROR_UNKNOWN", binding.ERR_UNKNOWN)):
        assert getattr(pynvml, f"NVML_{name}") == value, name
    for name, value in (("DOUBLE", binding.VT_DOUBLE), ("UNSIGNED_INT", binding.VT_UINT),
                        ("UNSIGNED_LONG", binding.VT_ULONG), ("UNSIGNED_LONG_LONG", binding.VT_ULL),
                        ("SIGNED_LONG_LONG", binding.VT_SLL), ("SIGNED_INT", binding.VT_SINT),
                        ("UNSIGNED_SHORT", binding.VT_USHORT)):
        assert getattr(pynvml, f"NVML_VALUE_TYPE_{name}") == value, name
    for name, value in (("GRAPHICS_UTIL", constants.GPM_GRAPHICS_UTIL), ("SM_UTIL", constants.GPM_SM_UTIL),
                        ("SM_OCCUPANCY", constants.GPM_SM_OCCUPANCY),
                        ("ANY_TENSOR_UTIL", constants.GPM_ANY_TENSOR_UTIL),
                        ("DRAM_BW_UTIL", constants.GPM_DRAM_BW_UTIL),
                        ("PCIE_TX_PER_SEC", constants.GPM_PCIE_TX_PER_SEC),
                        ("PCIE_RX_PER_SEC", constants.GPM_PCIE_RX_PER_SEC)):
        assert getattr(pynvml, f"NVML_GPM_METRIC_{name}") == value, name
    assert pynvml.NVML_GPU_UTILIZATION_SAMPLES == constants.GPU_UTILIZATION_SAMPLES
    assert pynvml.NVML_MEMORY_UTILIZATION_SAMPLES == constants.MEMORY_UTILIZATION_SAMPLES
    assert pynvml.NVML_DEVICE_MIG_ENABLE == 1
    for reason, bit in constants.CLOCK_EVENT_REASONS.items():
        camel = {"gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
                 "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
                 "sw_thermal": "SwThermalSlowdown", "hw_thermal": "HwThermalSlowdown",
                 "hw_power_brake": "HwPowerBrakeSlowdown", "display_clock": "DisplayClockSetting"}[reason]
        assert getattr(pynvml, f"nvmlClocksEventReason{camel}") == bit, reason


def test_the_fake_returns_the_bindings_own_types() -> None:
    fake = _one_gpu(processes=[{"pid": 42, "used_memory_bytes": None}], mig=None)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    again = fake.nvmlDeviceGetHandleByIndex(0)
    assert ctypes.cast(h, ctypes.c_void_p).value == ctypes.cast(again, ctypes.c_void_p).value, "one handle per GPU"
    procs = fake.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert isinstance(procs[0], pynvml.nvmlFriendlyObject)
    assert set(vars(procs[0])) == {f[0] for f in pynvml.c_nvmlProcessInfo_v3_t._fields_}
    assert procs[0].usedGpuMemory is None  # pynvml's own rule for NVML_VALUE_NOT_AVAILABLE
    assert isinstance(fake.nvmlGpmSampleAlloc(), pynvml.c_nvmlGpmSample_t)
    assert isinstance(fake.nvmlGpmQueryDeviceSupport(h), pynvml.c_nvmlGpmSupport_t)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert isinstance(fake.nvmlDeviceGetPciInfo(h), pynvml.nvmlPciInfo_t)
    assert isinstance(fake.nvmlEventSetCreate(), pynvml.c_nvmlEventSet_t)
    fake.set_state({"devices": [{"pci_bus_id": "0000:82:00.0", "pcie_tx_bytes": (1 << 32) + 5,
                                 "energy_mj": 1 << 40, "unsupported": ["field:94"]}]})
    arr = fake.nvmlDeviceGetFieldValues(h, [197, (83, 0), 94])
    assert isinstance(arr[0], pynvml.c_nvmlFieldValue_t)
    # Read back through the binding's own attributes, as pynvml users do.
    assert (arr[0].fieldId, arr[0].valueType, arr[0].nvmlReturn, arr[0].value.uiVal) == (
        197, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_SUCCESS, 5)
    assert (arr[1].fieldId, arr[1].valueType, arr[1].value.ullVal) == (
        83, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 1 << 40)
    assert (arr[2].fieldId, arr[2].nvmlReturn) == (94, pynvml.NVML_ERROR_NOT_SUPPORTED)
    # The GPM request is the binding's struct: the fake reads the real sample pointers out of it.
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 1
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    mg.sample1 = fake.nvmlGpmSampleGet(h, fake.nvmlGpmSampleAlloc())
    fake.set_state({"t": 1.0, "devices": [{"pci_bus_id": "0000:82:00.0", "sm_active_integral": 0.5}]})
    mg.sample2 = fake.nvmlGpmSampleGet(h, fake.nvmlGpmSampleAlloc())
    assert fake.nvmlGpmMetricsGet(mg).metrics[0].value == pytest.approx(50.0)
    assert (mg.metrics[0].nvmlReturn, mg.metrics[0].metricId) == (pynvml.NVML_SUCCESS, pynvml.NVML_GPM_METRIC_SM_UTIL)
    # The driver's sample buffer: what the binding returns, c_samples[0:count], a list of c_nvmlSample_t.
    fake.set_state({"devices": [{"pci_bus_id": "0000:82:00.0", "util_samples": [[10, 5], [20, 70], [30, 99]]}]})
    vt, samples = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 10)
    assert vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and isinstance(samples, list)
    assert all(isinstance(x, pynvml.c_nvmlSample_t) for x in samples)
    assert [(x.timeStamp, x.sampleValue.uiVal) for x in samples] == [(20, 70), (30, 99)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 30)
