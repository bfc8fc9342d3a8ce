"""The GPU path as real drivers behave (issue 38; ../shared/reference/reviews/gpu_readiness.md): per-GPU handle
errors, counters the driver refreshes in steps, PCIe counters missing before R555 or wrapping at 2^32 in a
64-bit slot, non-finite GPM values, garbage pids, a missing NVML library on a host with NVIDIA GPUs. Each test
makes the strict fake behave as the driver does and checks what gpufeed exports."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


@pytest.mark.parametrize("error", ["no_permission", "insufficient_power", "irq_issue"])
def test_one_gpu_refusing_its_handle_is_unavailable_and_the_others_keep_sampling(rig: MakeRig, error: str) -> None:
    r = rig([device(0), device(1, errors={"nvmlDeviceGetHandleByIndex": error}), device(2)])
    for i in (0, 2):
        r.rates(i, {"gpu_util": 1.0, "sm_active": 0.5})
    with capture_logs() as logs:
        r.run_until(6.0)
    assert r.failures() == {}
    assert r.value("gpufeed_collector_available", collector="gpu") is None
    assert r.value("gpufeed_gpu_unavailable", gpu="1", reason=error) == 1.0
    assert r.value("gpufeed_gpu_lost", gpu="1") is None, "unavailable is not lost"
    assert set(r.history("gpu")[-1][1].gpus) == {0, 2}
    assert (r.value("gpufeed_gpu_sm_active_seconds_total", gpu="2") or 0.0) > 2.0
    assert [(e["gpu"], e["reason"]) for e in logs if e["event"] == "gpu_unavailable"] == [(1, error)]


def test_an_unavailable_gpu_is_sampled_once_its_handle_is_granted(rig: MakeRig) -> None:
    r = rig([device(0), device(1, errors={"nvmlDeviceGetUUID": "no_permission"})])
    r.at(8.0, lambda st: st["devices"][1].update(errors={}))
    r.run_until(6.0)
    assert r.value("gpufeed_gpu_unavailable", gpu="1", reason="no_permission") == 1.0
    r.run_until(40.0)
    assert r.value("gpufeed_gpu_unavailable", gpu="1", reason="no_permission") is None
    assert set(r.history("gpu")[-1][1].gpus) == {0, 1}
    info = [dict(k[1]) for k in r.metrics() if k[0] == "gpufeed_gpu_info"]
    assert [(i["gpu"], i["uuid"]) for i in info] == [("0", "GPU-test-0"), ("1", "GPU-test-1")]
