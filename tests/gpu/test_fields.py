"""The NVML field table (exporter/gpu/fields.py): every entry exists in the real binding, is read in one batched
call, answered by the strict fake, and exported by the GPU collector as declared."""

from __future__ import annotations

from collections.abc import Callable

import pynvml

from exporter import clockevents
from exporter.collectors.gpu import sparse
from exporter.gpu import fields
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


def test_every_field_id_is_the_real_bindings_constant_of_that_name() -> None:
    for f in fields.FIELDS:
        assert getattr(pynvml, f.nvml_name) == f.field_id, f.key
    assert len({f.field_id for f in fields.FIELDS}) == len(fields.FIELDS)
    assert len({f.key for f in fields.FIELDS}) == len(fields.FIELDS)


def test_entries_sharing_a_family_agree_on_kind_help_and_label_names() -> None:
    by_metric: dict[str, list[fields.Field]] = {}
    for f in fields.FIELDS:
        by_metric.setdefault(f.metric, []).append(f)
    for metric, entries in by_metric.items():
        assert len({(e.kind, e.help, tuple(e.labels)) for e in entries}) == 1, metric
        assert len({tuple(e.labels.values()) for e in entries}) == len(entries), metric


def test_every_throttle_time_field_is_a_clock_event_reason_the_samples_read_back() -> None:
    # GpuFast.throttle_seconds reads the keys of exporter/clockevents.py, not this table: an entry under another
    # reason or key would be read by the backend and never reach the derived layer.
    assert fields.THROTTLE_KEYS
    for reason, key in fields.THROTTLE_KEYS.items():
        assert clockevents.TIME_KEYS.get(reason) == key, reason


def test_all_fields_of_a_path_come_from_one_driver_call_per_gpu_per_tick(rig: MakeRig) -> None:
    r = rig([device(0), device(1)])
    r.run_until(1.0)
    ticks = len(r.history("gpu")) + len(r.history("gpu_slow"))
    assert r.fake.calls["nvmlDeviceGetFieldValues"] == 2 * ticks


def test_fast_fields_are_read_on_the_fast_path_and_slow_fields_on_the_slow_one(rig: MakeRig) -> None:
    r = rig([device(0, ecc={"corrected_volatile": 7})])
    r.run_until(6.0)
    fast = r.history("gpu")[-1][1].gpus[0]
    slow = r.history("gpu_slow")[-1][1].gpus[0]
    assert set(fast.fields) == {f.key for f in fields.ON_PATH[fields.FAST]}
    assert set(slow.fields) == {f.key for f in fields.ON_PATH[fields.SLOW]}
    assert slow.fields["ecc_corrected_volatile"] == 7
    assert {f.path for f in fields.FIELDS} == {fields.FAST, fields.SLOW}


def test_every_table_entry_is_exported_with_its_labels_and_unit(rig: MakeRig) -> None:
    r = rig([device(0, power_w=350.0)])
    r.rates(0, {"gpu_util": 0.5, "pcie_rx_bytes_per_s": 1e9, "throttle": {"sw_power_cap": 0.25}})
    r.run_until(10.0)
    for f in fields.FIELDS:
        name = f.metric + ("_total" if f.kind == fields.COUNTER else "")
        got = r.value(name, gpu="0", **f.labels)
        if sparse(f):  # exported once non-zero (the series budget): never as 0
            assert got is None or got > 0, f.key
        else:
            assert got is not None, f.key
    assert r.value("gpufeed_gpu_power_watts", gpu="0") == 350.0
    # The fake integrates the power it shows into the energy counter: 350 W for 10 s = 3500 J.
    energy = r.value("gpufeed_gpu_energy_joules_total", gpu="0")
    assert energy is not None and abs(energy - 3500.0) < 40.0
    throttled = r.value("gpufeed_gpu_throttle_seconds_total", gpu="0", reason="sw_power_cap")
    assert throttled is not None and abs(throttled - 2.5) < 0.05


def test_a_field_the_gpu_does_not_support_is_dropped_for_that_gpu_only(rig: MakeRig) -> None:
    r = rig([device(0, unsupported=["field:83"]), device(1)])
    r.run_until(2.0)
    assert r.value("gpufeed_gpu_energy_joules_total", gpu="0") is None
    assert r.value("gpufeed_gpu_energy_joules_total", gpu="1") is not None
    assert r.value("gpufeed_gpu_pcie_rx_bytes_total", gpu="0") is not None
