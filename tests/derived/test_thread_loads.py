"""Per-thread loads between the ends of a deep window, reused across evaluations of the same samples."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from exporter.derived.hostshape import thread_loads
from exporter.samples.host import ProcSample
from exporter.snapshot import Stamped
from tests.support.builders import ThreadSpec, proc_window

PID = 4242


def test_the_hot_thread_leads_and_an_unchanged_window_gives_the_same_loads() -> None:
    w = proc_window(PID, [ThreadSpec(1, 0.5, 0.1, "R"), ThreadSpec(3, 0.01, 0.0)], 0.0, 10.0)
    first = thread_loads(w, [PID])
    assert first[0].tid == PID and first[0].cores == pytest.approx(0.6)
    assert first[0].system_share == pytest.approx(0.1 / 0.6)
    assert len(first) == 4 and all(t.context for t in first)
    again = thread_loads(w, [PID])
    assert again == first and again[0] is first[0]  # the same samples: computed once


def test_new_samples_are_computed_again_even_after_the_old_ones_are_dropped() -> None:
    w = proc_window(PID, [ThreadSpec(1, 0.5, 0.1, "R")], 0.0, 10.0)
    assert thread_loads(w, [PID])[0].cores == pytest.approx(0.6)
    del w  # fresh samples must never be taken for the old ones (ids reused after a free)
    w2 = proc_window(PID, [ThreadSpec(1, 0.9, 0.0, "R")], 0.0, 10.0)
    assert thread_loads(w2, [PID])[0].cores == pytest.approx(0.9)
    shorter = w2[:5]  # another last sample: another pair
    assert thread_loads(shorter, [PID])[0].cores == pytest.approx(0.9)


def test_whether_a_process_holds_the_gpu_context_is_part_of_each_answer() -> None:
    w = proc_window(PID, [ThreadSpec(1, 0.5, 0.1, "R")], 0.0, 10.0)
    assert not thread_loads(w, [PID], context=[])[0].context
    assert thread_loads(w, [PID])[0].context


def test_a_process_whose_hot_thread_is_listed_last_still_leads_with_it() -> None:
    w = proc_window(PID, [ThreadSpec(3, 0.01, 0.0), ThreadSpec(1, 0.7, 0.0, "R")], 0.0, 10.0)
    loads = thread_loads(w, [PID])
    assert [t.tid for t in loads] == [PID + 3, PID, PID + 1, PID + 2]  # busiest first, then by tid
    assert thread_loads(w, [PID]) is loads  # one process: its cached loads themselves


def test_threads_of_several_processes_are_merged_busiest_first() -> None:
    other = 5000
    a = proc_window(PID, [ThreadSpec(1, 0.2, 0.0), ThreadSpec(1, 0.6, 0.0)], 0.0, 10.0)
    b = proc_window(other, [ThreadSpec(1, 0.4, 0.0), ThreadSpec(1, 0.2, 0.0)], 0.0, 10.0)
    both = [Stamped(x.t, ProcSample(MappingProxyType({PID: x.value.processes[PID],
                                                      other: y.value.processes[other]}), True))
            for x, y in zip(a, b, strict=True)]
    loads = thread_loads(both, [PID, other], context=[PID])
    assert [(t.tid, round(t.cores, 6)) for t in loads] == [
        (PID + 1, 0.6), (other, 0.4), (PID, 0.2), (other + 1, 0.2)]
    assert [t.context for t in loads] == [True, False, True, False]
