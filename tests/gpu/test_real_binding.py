"""The backend and the whole pipeline through the installed pynvml binding, over a stand-in C library.

Every other GPU test runs on the strict fake NVML, a Python object: it checks names and signatures against the
binding, but no argument ever crosses a ctypes call there. Here the real ``pynvml`` calls
``bench/nvmlstub/nvml_stub.c`` (built with the C compiler; skipped, with the reason, where there is none): every
wrapper marshals its arguments and buffers as on a host with a driver, and the values the stub answers must come
out of the backend and the exposition unchanged. The stub's layouts are checked against the binding's first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from bench import nvmlstub
from exporter import pipeline
from exporter.config import resolve
from exporter.engine import VirtualClock
from exporter.exposition import Renderer
from exporter.gpu.backend import NvmlBackend
from exporter.samples.gpu import GpuBuffered, GpuFast, GpuSlow

# nvml.h's name (the stub's) -> the binding's ctypes mirror.
LAYOUTS = {
    "nvmlFieldValue_t": pynvml.c_nvmlFieldValue_t,
    "nvmlSample_t": pynvml.c_nvmlSample_t,
    "nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
    "nvmlMemory_t": pynvml.c_nvmlMemory_t,
    "nvmlMemory_v2_t": pynvml.c_nvmlMemory_v2_t,
    "nvmlUtilization_t": pynvml.c_nvmlUtilization_t,
    "nvmlProcessInfo_t": pynvml.c_nvmlProcessInfo_v3_t,
    "nvmlProcessUtilizationSample_t": pynvml.c_nvmlProcessUtilizationSample_t,
    "nvmlGpmSupport_t": pynvml.c_nvmlGpmSupport_t,
    "nvmlGpmMetric_t": pynvml.c_nvmlGpmMetric_t,
    "nvmlGpmMetricsGet_t": pynvml.c_nvmlGpmMetricsGet_t,  # its metrics array is the caller's: offsets only
    "nvmlEventData_t": pynvml.c_nvmlEventData_t,
}
UNKNOWN = ctypes.c_size_t(-1).value


@pytest.fixture
def binding(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The installed pynvml calling the stub; the binding's library, pointer cache and refcount restored after
    (other tests expect no NVML library on this host)."""
    try:
        path = nvmlstub.build()
    except nvmlstub.StubError as e:
        pytest.skip(f"the NVML stub library cannot be built here: {e}")
    monkeypatch.setenv("NVML_STUB_GPUS", "8")
    saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
    try:
        yield nvmlstub.load(path)
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
        pynvml._nvmlLib_refcount = saved[2]


def test_the_stub_lays_out_every_struct_as_the_binding_does(binding: Any) -> None:
    layout = binding.nvmlLib.nvml_stub_layout
    for name, struct in LAYOUTS.items():
        for field, _ in struct._fields_:
            assert layout(name.encode(), field.encode()) == getattr(struct, field).offset, (name, field)
        if name != "nvmlGpmMetricsGet_t":
            assert layout(name.encode(), None) == ctypes.sizeof(struct), name
    assert layout(b"nvmlFieldValue_t", b"no_such_field") == UNKNOWN  # the check can fail


def test_the_backend_reads_every_path_through_real_ctypes_calls(binding: Any) -> None:
    now = [100.0]
    backend = NvmlBackend(lambda: binding, clock=lambda: now[0], fast_interval=0.1, steady_interval=None)
    try:
        fast = backend.fast()
        for _ in range(10):  # one second at the fast rate, the stub's clock in step with the backend's
            now[0] += 0.1
            nvmlstub.advance(0.1)
            fast = backend.fast()
        backend.buffered()
        now[0] += 1.0
        nvmlstub.advance(1.0)
        buffered = backend.buffered()
        slow = backend.slow()
    finally:
        backend.close()
    ids = fast.identities
    assert sorted(ids) == list(range(8))
    assert ids[3].uuid == "GPU-5f0c0000-0000-4000-8000-000000000003"
    assert ids[3].name == "NVIDIA H100 80GB HBM3"
    assert ids[3].pci_bus_id == "0000:48:00.0"  # NVML's 8-digit domain, in sysfs form
    assert ids[3].gpm and not ids[3].mig_mode
    assert ids[3].cpu_affinity == frozenset(range(64)) and ids[3].numa_node == 0
    g = fast.gpus[3]
    assert isinstance(g, GpuFast)
    # GPM metrics answer 60 + id % 7 percent: SM activity (id 2), occupancy (3), DRAM bandwidth (10).
    assert g.sm_active == pytest.approx(0.62) and g.sm_occupancy == pytest.approx(0.63)
    assert g.dram_active == pytest.approx(0.63)
    assert g.sm_clock_hz == 1980e6
    assert g.fields["power"] == 500.0  # field 186, milliwatts
    assert g.fields["energy"] > 0 and g.fields["pcie_replays"] == 0.0
    b = buffered.gpus[3]
    assert isinstance(b, GpuBuffered)
    assert [round(p.value, 2) for p in b.gpu_util][-6:] == [0.95] * 6  # a sample every 1/6 s, 95% each
    assert b.busy_seconds == pytest.approx(0.95, abs=0.17)  # one second at 95%, to a sample period
    s = slow.gpus[3]
    assert isinstance(s, GpuSlow)
    assert (s.link_gen, s.link_width, s.max_link_gen, s.max_link_width) == (5, 16, 5, 16)
    assert s.temperature_c == 62.0 and s.power_limit_w == 700.0 and s.max_sm_clock_hz == 1980e6
    assert (s.memory_used_bytes, s.memory_total_bytes) == (40 * 2**30, 80 * 2**30)
    assert s.clock_event_reasons == frozenset()
    assert [(p.pid, p.used_memory_bytes, p.sm_ratio) for p in s.processes] == [(20003, 40 * 2**30, 0.9)]
    assert not fast.lost and not slow.lost


def test_the_pipeline_exports_what_the_binding_answers(binding: Any, tmp_path: Any) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    settings = resolve(pipeline.registry(), {}, {
        "path.procfs": str(tmp_path / "proc"), "path.sysfs": str(tmp_path / "sys"),
        "collector.gpu.hostname": "stub"})
    clock = VirtualClock(0.0)
    pipe = pipeline.build(settings, clock=clock, nvml=binding, inline=True)
    try:
        t = 0.0
        pipe.engine.run_until(t)
        while t < 6.0:
            t += 0.1
            nvmlstub.advance(0.1)
            pipe.engine.run_until(t)
        renderer = Renderer(pipe.stages)
        renderer.render(pipe.engine.snapshot)
        text = renderer.text().body.decode()
    finally:
        pipe.close()
    lines = text.splitlines()
    info = [x for x in lines if x.startswith("gpufeed_gpu_info{")]
    assert len(info) == 8
    assert any('gpu="0"' in x and 'gpu_bdf="0000:18:00.0"' in x and 'pci_bus_id="00000000:18:00.0"' in x for x in info)
    assert 'gpufeed_gpu_power_watts{gpu="5"} 500.0' in lines
    assert 'gpufeed_collector_success{collector="gpu"} 1.0' in lines
