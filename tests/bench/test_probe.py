"""bench/probe.py's end-of-window full collection, which the soak and overhead benchmarks report."""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench import probe

GcCallback = Callable[[str, dict[str, Any]], None]


@pytest.fixture
def callbacks() -> Iterator[list[GcCallback]]:
    """gc callbacks for the test, the probe's first (as in the daemon); all removed afterwards."""
    added: list[GcCallback] = [probe._gc_callback]
    gc.callbacks.append(probe._gc_callback)
    try:
        yield added
    finally:
        for cb in added:
            gc.callbacks.remove(cb)


def test_the_window_end_times_one_full_collection(callbacks: list[GcCallback]) -> None:
    probe._freeze(signal.SIGUSR2, None)
    probe._await_full_collection()
    (pause,) = probe._frozen[0]["gc_full_now"]
    wall, cpu = pause
    assert wall > 0 and cpu >= 0


def test_the_window_end_times_a_full_collection_when_its_signal_lands_inside_another_collection(
        callbacks: list[GcCallback]) -> None:
    # A signal handler runs at the next bytecode the main thread runs, which may be a GC callback or a finalizer
    # of a collection in progress; gc.collect() there does nothing. The soak benchmark on a loaded CI machine
    # got no full collection from the window's end that way.
    handled: list[str] = []

    def signal_arrives(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and not handled:
            handled.append(phase)
            probe._freeze(signal.SIGUSR2, None)

    callbacks.append(signal_arrives)
    gc.callbacks.append(signal_arrives)
    gen0_before = probe._gc_pauses[0].count
    gc.collect(0)
    probe._await_full_collection()
    assert handled
    (pause,) = probe._frozen[0]["gc_full_now"]
    assert pause[0] > 0
    # the collection in progress was an ordinary one: it counts in the window, not as the end's full collection
    assert probe._gc_pauses[0].count > gen0_before
