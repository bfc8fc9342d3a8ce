"""The binding sizes its result buffers per call (``c_nvmlFieldValue_t * len(fieldIds)``, ``count *
c_nvmlSample_t``); ctypes caches an array type only while something references it, so without a holder each
call's type became cyclic garbage for the collector (issue 14). The backend holds the types it has seen."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable

import pynvml

from exporter.gpu.binding import ArrayTypes
from tests.support.gctrack import cyclic_garbage
from tests.support.gpurig import Rig, device

MakeRig = Callable[..., Rig]


def _array_type_garbage(run: Callable[[], None]) -> list[str]:
    """Names of the ctypes array types that ``run`` left for the cycle collector."""
    return [o.__name__ for o in cyclic_garbage(run) if isinstance(o, type) and issubclass(o, ctypes.Array)]


def test_a_held_length_gets_the_same_type_from_ctypes_every_call() -> None:
    keep = ArrayTypes()
    keep.hold((pynvml.c_nvmlFieldValue_t * 7)())
    first = pynvml.c_nvmlFieldValue_t * 7
    gc.collect()
    assert pynvml.c_nvmlFieldValue_t * 7 is first


def test_samples_sliced_out_of_an_array_hold_that_array_type() -> None:
    keep = ArrayTypes()
    arr = (5 * pynvml.c_nvmlSample_t)()
    keep.hold(arr[0:3])  # what nvmlDeviceGetSamples returns
    keep.hold([])  # an empty buffer: nothing to hold
    keep.hold(None)  # a failed call
    keep.hold(("not", "ctypes"))
    assert len(keep) == 1
    t = type(arr)
    del arr
    gc.collect()
    assert 5 * pynvml.c_nvmlSample_t is t


def test_the_holder_is_bounded() -> None:
    keep = ArrayTypes(limit=3)
    for n in range(1, 10):
        keep.hold((ctypes.c_uint * n)())
    assert len(keep) == 3


def test_steady_fast_and_buffered_reads_leave_no_array_types_to_collect(rig: MakeRig) -> None:
    r = rig([device(0), device(1)], options={"interval": 0.1})
    r.rates(0, {"gpu_util": 1.0, "sm_active": 0.8})
    r.rates(1, {"gpu_util": 0.3, "sm_active": 0.2})
    r.run_until(5.0)  # every buffer length the steady reads use has been seen once
    assert _array_type_garbage(lambda: r.run_until(30.0)) == []
    assert r.fake.calls["nvmlDeviceGetFieldValues"] > 100 and r.fake.calls["nvmlDeviceGetSamples"] > 20


def test_without_the_holder_the_same_reads_do_leave_them(rig: MakeRig) -> None:
    # The control: the fake builds its buffers as pynvml does, so the garbage above is absent because of the
    # holder, not because nothing builds types.
    r = rig([device(0), device(1)], options={"interval": 0.1})
    r.rates(0, {"gpu_util": 1.0, "sm_active": 0.8})
    r.run_until(5.0)
    r.collector._get_backend().array_types.limit = 0
    r.collector._get_backend().array_types._held.clear()
    assert _array_type_garbage(lambda: r.run_until(30.0)) != []
