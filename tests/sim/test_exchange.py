"""The simulator's state exchange: numbers through shared memory, JSON only when the shape changes, a reader that
never takes half a write, and a fake NVML served from it exactly as from the JSON file."""

from __future__ import annotations

import copy
import json
import math
import struct
import threading
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.sim import exchange
from exporter.sim.fakenvml import FakeNvml, advance_state, normalize_state
from tests.support.gctrack import cyclic_garbage, tracked_inside

DEV = {"pci_bus_id": "0000:82:00.0", "power_w": 120.5, "sm_clock_mhz": 1410}


def _state(n: int = 2) -> dict[str, Any]:
    return normalize_state({"t": 1.0, "devices": [dict(DEV, pci_bus_id=f"0000:8{i}:00.0") for i in range(n)]})


def _advanced(state: dict[str, Any], dt: float) -> dict[str, Any]:
    """``state`` moved on by ``dt``: counters, integrals, time (the sample buffers' lengths stay)."""
    s = copy.deepcopy(state)
    samples = [d.pop("util_samples") for d in s["devices"]], [d.pop("mem_util_samples") for d in s["devices"]]
    advance_state(s, dt, {0: {"gpu_util": 0.8, "sm_active": 0.6, "pcie_tx_bytes_per_s": 1e9}})
    for d, u, m in zip(s["devices"], *samples, strict=True):
        d["util_samples"], d["mem_util_samples"] = u, m
    s["devices"][0]["power_w"] += 10.0
    return normalize_state(s)


def _served(tmp_path: Path, state: dict[str, Any], **kw: Any) -> tuple[exchange.Writer, FakeNvml, Any]:
    """``state`` published, a fake serving the exchange (``from_exchange`` keywords), and GPU 0's handle."""
    w = exchange.Writer(tmp_path)
    w.write(state)
    fake = FakeNvml.from_exchange(tmp_path, **kw)
    fake.nvmlInit()
    return w, fake, fake.nvmlDeviceGetHandleByIndex(0)


def test_a_change_of_values_reaches_the_reader_without_reading_json(tmp_path: Path) -> None:
    w = exchange.Writer(tmp_path)
    s0 = _advanced(_state(), 0.1)
    w.write(s0)
    r = exchange.Reader(tmp_path, normalize_state)
    got = r.poll()
    assert got is not None and got[1] and got[0] == s0
    assert r.poll() is None  # nothing new: one read of mapped memory
    s1 = _advanced(s0, 0.5)
    assert exchange.walk(s1)[2] == exchange.walk(s0)[2], "the test needs a change of values only"
    w.write(s1)
    got = r.poll()
    assert got is not None and not got[1]
    assert got[0] == s1 and r.shape_loads == 1
    assert isinstance(got[0]["devices"][0]["pcie_tx_bytes"], int)
    assert isinstance(got[0]["devices"][0]["power_w"], float)


def test_clock_event_reasons_travel_as_their_bitmask_not_as_shape(tmp_path: Path) -> None:
    # A waiting GPU's reasons flip with every idle gap: as shape, each flip cost the daemon a JSON parse.
    w = exchange.Writer(tmp_path)
    s0 = _state()
    s0["devices"][0]["clock_event_reasons"] = []
    w.write(s0)
    r = exchange.Reader(tmp_path, normalize_state)
    assert r.poll() is not None
    for reasons in (["gpu_idle", "sw_power_cap"], [], ["hw_slowdown"]):
        s1 = copy.deepcopy(s0)
        s1["devices"][0]["clock_event_reasons"] = reasons
        w.write(s1)
        got = r.poll()
        assert got is not None and not got[1]
        assert set(got[0]["devices"][0]["clock_event_reasons"]) == set(reasons)
        assert got[0]["devices"][1]["clock_event_reasons"] == s0["devices"][1]["clock_event_reasons"]
    assert r.shape_loads == 1
    fake = FakeNvml.from_exchange(tmp_path)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonHwSlowdown


def test_a_change_of_shape_rewrites_the_json_and_the_reader_revalidates(tmp_path: Path) -> None:
    w = exchange.Writer(tmp_path)
    w.write(_state(1))
    r = exchange.Reader(tmp_path, normalize_state)
    assert r.poll() is not None
    bigger = _state(3)  # more devices: more numbers, a larger values file
    w.write(bigger)
    got = r.poll()
    assert got is not None and got[1] and got[0] == bigger and r.shape_loads == 2
    procs = copy.deepcopy(bigger)
    procs["devices"][1]["processes"] = [{"pid": 4242, "used_memory_bytes": 1 << 30}]
    w.write(procs)
    got = r.poll()
    assert got is not None and got[1] and got[0]["devices"][1]["processes"][0]["pid"] == 4242


def test_a_write_in_progress_or_torn_is_never_taken(tmp_path: Path) -> None:
    w = exchange.Writer(tmp_path)
    s0 = _advanced(_state(), 0.1)
    w.write(s0)
    r = exchange.Reader(tmp_path, normalize_state)
    assert r.poll() is not None
    w.write(_advanced(s0, 1.0))
    # Freeze the file mid-write: an odd sequence is a writer inside a write.
    path = tmp_path / exchange.VALUES_FILE
    raw = bytearray(path.read_bytes())
    seq = struct.unpack_from("<Q", raw, 8)[0]
    struct.pack_into("<Q", raw, 8, seq + 1)
    path.write_bytes(bytes(raw))
    r2 = exchange.Reader(tmp_path, normalize_state)
    assert r2.poll() is None and r2.state is None  # nothing complete to take yet
    assert r.poll() is None  # the first reader keeps what it had
    raw[8:16] = struct.pack("<Q", seq + 2)  # the write completed
    path.write_bytes(bytes(raw))
    got = r2.poll()
    assert got is not None and got[0] == _advanced(s0, 1.0)


def test_a_restarted_writer_never_reuses_the_ids_a_reader_saw(tmp_path: Path) -> None:
    w = exchange.Writer(tmp_path)
    w.write(_state(2))
    r = exchange.Reader(tmp_path, normalize_state)
    assert r.poll() is not None
    w.close()
    w2 = exchange.Writer(tmp_path)  # the daemon restarted a killed simulator child
    assert w2.sequence >= w.sequence
    other = _state(1)
    w2.write(other)
    got = r.poll()
    assert got is not None and got[1] and got[0] == other  # a new shape, whatever ids the first writer used


def test_a_fake_served_from_the_exchange_answers_as_from_the_state(tmp_path: Path) -> None:
    s0 = _state()
    w, fake, h = _served(tmp_path, s0)
    assert fake.nvmlDeviceGetPowerUsage(h) == 120500
    s1 = copy.deepcopy(s0)
    s1["devices"][0]["power_w"] = 250.0
    w.write(s1)
    assert fake.nvmlDeviceGetPowerUsage(h) == 250000
    s2 = copy.deepcopy(s1)
    s2["devices"][0]["lost"] = True  # a shape change: the fake installs the revalidated state
    w.write(s2)
    with pytest.raises(pynvml.NVMLError):
        fake.nvmlDeviceGetPowerUsage(h)
    assert fake.reload_errors == 0


def test_an_invalid_shape_keeps_the_previous_state_and_is_counted(tmp_path: Path) -> None:
    w = exchange.Writer(tmp_path)
    w.write(_state())
    fake = FakeNvml.from_exchange(tmp_path)
    fake.nvmlInit()
    bad = _state()
    bad["devices"][0]["no_such_key"] = 1  # what a buggy simulator could publish
    w.write(bad)
    assert fake.nvmlDeviceGetCount() == 2
    assert fake.nvmlDeviceGetCount() == 2
    assert fake.reload_errors == 1  # once per state published, not once per call
    json.loads((tmp_path / exchange.SHAPE_FILE).read_text())  # the shape file itself is whole JSON


def test_a_change_of_values_assigns_only_the_numbers_that_moved(tmp_path: Path) -> None:
    # The reader compares the new words with the ones it applied: a 50 ms step moves a tenth of the numbers.
    w = exchange.Writer(tmp_path)
    s0 = _state(3)
    w.write(s0)
    r = exchange.Reader(tmp_path, normalize_state)
    assert r.poll() is not None
    first = r.assigned
    ints, floats, _ = exchange.walk(s0)
    assert first == len(ints) + len(floats), "a new shape applies every number"
    s1 = copy.deepcopy(s0)
    s1["devices"][2]["power_w"] = 300.0
    s1["devices"][0]["pcie_rx_bytes"] = 1 << 40
    w.write(s1)
    got = r.poll()
    assert got is not None and got[0] == s1 and r.assigned - first == 2
    w.write(s1)  # a new sequence, the same numbers
    got = r.poll()
    assert got is not None and got[0] == s1 and r.assigned - first == 2


def test_numbers_outside_the_devices_in_several_runs_each_reach_the_reader(tmp_path: Path) -> None:
    # The reader takes each device and the state's own numbers with one precompiled unpack that skips the bytes
    # between their runs (ints first in the file, floats after): numbers of both types before, between and after
    # the devices, and in a nested list, must each land in their own slot.
    def shaped(k: int) -> dict[str, Any]:
        return {"a": k, "t": 1.5 + k, "devices": [{"x": 10 + k, "y": 0.25 * k, "s": "dev"}, {"x": 20, "y": 2.5}],
                "b": [3 + k, 4.5, {"c": 7, "d": -1.0 - k}], "e": 9}

    w = exchange.Writer(tmp_path)
    w.write(shaped(0))
    r = exchange.Reader(tmp_path, lambda s: s)
    assert r.poll() == (shaped(0), True)
    for k in (1, 2):
        w.write(shaped(k))
        got = r.poll(settle=False)
        assert got is not None and not got[1]
        state = got[0]
        expected = (k, 1.5 + k, [3 + k, 4.5, {"c": 7, "d": -1.0 - k}], 9)
        assert (state["a"], state["t"], state["b"], state["e"]) == expected
        assert state["devices"][0] == shaped(k - 1)["devices"][0], "a device waits for its read"
        r.settle_group(state["devices"][0])
        assert state == dict(shaped(k), devices=[{"x": 10 + k, "y": 0.25 * k, "s": "dev"}, {"x": 20, "y": 2.5}])


def test_a_float_is_compared_by_its_bits(tmp_path: Path) -> None:
    # -0.0 == 0.0 for Python, not for the driver's bytes: the reader must not keep the old sign.
    w = exchange.Writer(tmp_path)
    s0 = _state(1)
    s0["devices"][0]["power_w"] = 0.0
    w.write(s0)
    r = exchange.Reader(tmp_path, normalize_state)
    assert r.poll() is not None
    s1 = copy.deepcopy(s0)
    s1["devices"][0]["power_w"] = -0.0
    w.write(s1)
    got = r.poll()
    assert got is not None and math.copysign(1.0, got[0]["devices"][0]["power_w"]) == -1.0


class _CountingCondition(threading.Condition):
    notified = 0

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


def test_new_numbers_wake_event_waiters_only_when_an_xid_event_may_come_due(tmp_path: Path) -> None:
    # The real nvmlEventSetWait_v2 blocks in the driver for free; waking the watcher thread at every new state
    # was a cost only the simulation paid. A pending event must still be delivered as soon as t reaches it.
    w = exchange.Writer(tmp_path)
    s0 = _advanced(_state(), 0.1)
    w.write(s0)
    fake = FakeNvml.from_exchange(tmp_path)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake._cond = cond = _CountingCondition(fake._lock)
    s1 = _advanced(s0, 0.5)
    w.write(s1)
    assert fake.nvmlDeviceGetPowerUsage(h) == 140500 and cond.notified == 0
    s2 = copy.deepcopy(s1)
    s2["devices"][0]["xid_events"] = [{"t": 3.0, "xid": 79}]  # a new shape: waiters are woken
    w.write(s2)
    es = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    assert cond.notified == 1
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(es, 0)  # t = 1.6: not due yet
    s3 = _advanced(s2, 2.0)  # t = 3.6: new numbers, and now they matter
    w.write(s3)
    assert fake.nvmlDeviceGetPowerUsage(h) == 150500 and cond.notified == 2
    assert fake.nvmlEventSetWait_v2(es, 0).eventData == 79


class _WaitCountingCondition(threading.Condition):
    waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_an_event_wait_with_nothing_undelivered_sleeps_to_its_timeout_and_a_new_shape_wakes_it(
        tmp_path: Path) -> None:
    # The real call blocks in the driver until an event or its timeout; a wait that looked at the exchange
    # every 250 ms was simulation-only CPU. A new shape (an Xid event) installed by another caller wakes it.
    w = exchange.Writer(tmp_path)
    s0 = _advanced(_state(), 0.1)
    w.write(s0)
    fake = FakeNvml.from_exchange(tmp_path)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    es = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    fake._cond = cond = _WaitCountingCondition(fake._lock)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(es, 600)
    assert cond.waits == 1, "one sleep to the timeout, no looks in between"
    s1 = copy.deepcopy(s0)
    s1["devices"][0]["xid_events"] = [{"t": 0.1, "xid": 79}]  # due at once
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(fake.nvmlEventSetWait_v2(es, 5000).eventData))
    waiter.start()
    w.write(s1)
    fake.nvmlDeviceGetPowerUsage(h)  # a GPU sampler's call installs the new shape
    waiter.join(timeout=2.0)
    assert not waiter.is_alive() and got == [79], "woken by the install, long before its 5 s timeout"


def test_the_sample_buffers_are_applied_when_read_and_never_stale(tmp_path: Path) -> None:
    # More than half of the numbers, read once a second against 10-20 new states: a new state moves them into
    # the fake's buffers only when a call reads them, and that call sees the newest state taken.
    w = exchange.Writer(tmp_path)
    s0 = _state(2)
    for d in s0["devices"]:
        d["util_samples"] = [[1_000_000 + i, i] for i in range(12)]
        d["process_util"] = [{"pid": 7, "ts_us": 1_000_000, "sm_pct": 5, "mem_pct": 1}]
    w.write(s0)
    fake = FakeNvml.from_exchange(tmp_path)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(1)
    reader = fake._exchange
    assert reader is not None
    s1 = copy.deepcopy(s0)
    for d in s1["devices"]:  # the buffers slide by one sample
        d["util_samples"] = [*d["util_samples"][1:], [1_000_012, 99]]
        d["process_util"][0].update(ts_us=1_000_012, sm_pct=42)
    s1["devices"][1]["power_w"] = 200.0
    w.write(s1)
    before = reader.assigned
    assert fake.nvmlDeviceGetPowerUsage(h) == 200000
    assert reader.assigned - before == 1, "the buffers wait for a read"
    _, samples = fake.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 1_000_010)
    assert [(x.timeStamp, x.sampleValue.uiVal) for x in samples] == [(1_000_011, 11), (1_000_012, 99)]
    assert reader.assigned - before == 1 + 2 * 12, "only the buffer read"
    assert fake.nvmlDeviceGetUtilizationRates(h).gpu == 99
    assert [p.smUtil for p in fake.nvmlDeviceGetProcessUtilization(h, 0)] == [42]
    s2 = copy.deepcopy(s1)
    s2["devices"][1]["util_samples"][-1][1] = 55
    w.write(s2)  # read again at once: the newest state, not the one applied before
    assert fake.nvmlDeviceGetUtilizationRates(h).gpu == 55
    assert fake.state == s2, "the state hook sees every buffer"
    r = exchange.Reader(tmp_path, normalize_state)
    got = r.poll()
    assert got is not None and got[0] == s2  # poll() settles everything by default


def test_a_device_s_numbers_are_assigned_when_a_call_reads_that_device(tmp_path: Path) -> None:
    # A fast tick reads the waiting GPUs only: unpacking and comparing every device's numbers at each new state
    # was most of what the daemon paid the simulation. A device read gets the newest numbers taken, all of them.
    s0 = _state(3)
    w, fake, h0 = _served(tmp_path, s0)
    h2 = fake.nvmlDeviceGetHandleByIndex(2)
    reader = fake._exchange
    assert reader is not None
    s1 = copy.deepcopy(s0)
    s1["t"] = 2.0
    s1["devices"][0]["power_w"] = 300.0
    s1["devices"][2]["power_w"] = 250.0
    s1["devices"][2]["sm_clock_mhz"] = 990
    w.write(s1)
    before = reader.assigned
    assert fake.nvmlDeviceGetPowerUsage(h2) == 250000
    assert reader.assigned - before == 3, "the state's time and device 2's two numbers; device 0 waits"
    assert fake.nvmlDeviceGetClockInfo(h2, pynvml.NVML_CLOCK_SM) == 990
    assert reader.assigned - before == 3, "device 2 is current: nothing again"
    s2 = copy.deepcopy(s1)
    s2["devices"][0]["power_w"] = 310.0
    w.write(s2)  # device 0 skipped a state: it reads the newest one
    assert fake.nvmlDeviceGetPowerUsage(h0) == 310000
    assert reader.assigned - before == 4
    s3 = copy.deepcopy(s2)
    s3["devices"][1]["power_w"] = 5.5
    w.write(s3)
    assert fake.nvmlDeviceGetPowerUsage(h0) == 310000  # takes s3; device 1 is not read
    assert reader.assigned - before == 4
    assert fake.state == s3, "the state hook brings every device up to date"


def test_calls_within_the_shortest_poll_interval_look_at_the_exchange_once(tmp_path: Path) -> None:
    # serve --simulate: the dozen calls of one sampling tick take one look; the next tick's first call takes the
    # newest state. An event wait still installs a new shape (an Xid) at once.
    s0 = _state(2)
    w, fake, h = _served(tmp_path, s0, min_poll_s=0.2)
    now = [fake._polled_at + 10.0]  # a stepped clock, from well after the set-up's last look
    fake._monotonic = lambda: now[0]
    assert fake.nvmlDeviceGetPowerUsage(h) == 120500
    s1 = copy.deepcopy(s0)
    s1["devices"][0]["power_w"] = 300.0
    w.write(s1)
    now[0] += 0.15
    assert fake.nvmlDeviceGetPowerUsage(h) == 120500, "within 200 ms of the last look: the state it took"
    now[0] += 0.1
    assert fake.nvmlDeviceGetPowerUsage(h) == 300000
    # A look that meets a write in progress (odd sequence) does not start the 200 ms: the next call looks again.
    s2 = copy.deepcopy(s1)
    s2["devices"][0]["power_w"] = 310.0
    w.write(s2)
    assert w._map is not None
    exchange._SEQ.pack_into(w._map, 8, w.sequence + 1)  # the writer is inside its next write
    now[0] += 0.3
    assert fake.nvmlDeviceGetPowerUsage(h) == 300000
    exchange._SEQ.pack_into(w._map, 8, w.sequence)  # that write "aborted": s2 is complete
    assert fake.nvmlDeviceGetPowerUsage(h) == 310000, "looked again at the same instant"
    es = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    s2 = copy.deepcopy(s1)
    s2["devices"][0]["xid_events"] = [{"t": 0.5, "xid": 48}]
    w.write(s2)
    assert fake.nvmlEventSetWait_v2(es, 0).eventData == 48


def test_the_reader_keeps_fewer_tracked_objects_than_the_numbers_it_applies(tmp_path: Path) -> None:
    # Every full collection of the daemon under simulation traverses what the reader keeps beside the state. A
    # (container, key) pair per number -- two, with the plans' copies -- was ~1,700 tracked tuples on the 8-GPU
    # host that a real host does not have; the plans hold each set of slots as two tuples instead.
    def kept(n: int) -> tuple[int, int]:
        d = tmp_path / str(n)
        d.mkdir()
        s = _state(n)
        exchange.Writer(d).write(s)
        r = exchange.Reader(d, normalize_state)
        assert r.poll() is not None
        assert r.state is not None
        in_state = {id(o) for o in tracked_inside(r.state)}
        ints, floats, _ = exchange.walk(s)
        return sum(1 for o in tracked_inside(r) if id(o) not in in_state), len(ints) + len(floats)

    (objs2, nums2), (objs8, nums8) = kept(2), kept(8)
    assert nums8 - nums2 > 100, "the test needs devices with numbers to apply"
    assert objs8 - objs2 < nums8 - nums2, (objs8 - objs2, nums8 - nums2)


def test_a_new_shape_leaves_no_cyclic_garbage(tmp_path: Path) -> None:
    # A shape change walks the whole state; the walk's two recursive closures held each other, and through their
    # cells the state, its slots and its groups, until a full collection of the daemon freed them (#14).
    s0 = _state(4)
    assert cyclic_garbage(lambda: exchange.walk(s0, [], [])) == []
    w, fake, h = _served(tmp_path, s0)
    grown = _state(5)
    w.write(grown)
    assert cyclic_garbage(lambda: fake.nvmlDeviceGetPowerUsage(h)) == []
    assert fake.nvmlDeviceGetCount() == 5
