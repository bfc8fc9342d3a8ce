"""Per-CPU shares of a /proc/stat pair summed over a GPU's allowed CPUs, shared by the GPUs of one evaluation."""

from __future__ import annotations

import pytest

from exporter.derived.hostshape import core_deltas, core_sums, cpu_shape
from tests.support.builders import ThreadSpec, cpu_window, proc_window


def test_sums_are_per_allowed_set_and_equal_the_deltas_summed() -> None:
    w = cpu_window(8, {0: (0.9, 0.05), 1: (0.5, 0.0), 6: (0.2, 0.1)}, 0.0, 10.0, iowait=0.01)
    deltas = core_deltas(w[0], w[-1])
    for allowed in (None, frozenset({0, 1}), frozenset({6, 7, 99})):
        cpus = [c for c in deltas if allowed is None or c in allowed]
        n, busy, user, iow, saturated = core_sums(w[0], w[-1], allowed)
        assert n == len(cpus)
        assert busy == pytest.approx(sum(deltas[c][0] for c in cpus))
        assert user == pytest.approx(sum(deltas[c][1] for c in cpus))
        assert iow == pytest.approx(sum(deltas[c][2] for c in cpus))
        assert saturated == sum(1 for c in cpus if deltas[c][0] >= 0.9)
    n, busy, *_ = core_sums(w[0], w[-1], frozenset({0, 1}))
    assert n == 2 and busy == pytest.approx(0.95 + 0.5)
    assert core_sums(w[0], w[-1], frozenset({6, 7}))[0] == 2  # another set on the same pair: its own sums


def test_two_gpus_on_different_nodes_see_their_own_cores() -> None:
    cpus = cpu_window(8, {c: (0.95, 0.0) for c in range(4)}, 0.0, 10.0)
    near = proc_window(100, [ThreadSpec(1, 0.5, 0.0)], 0.0, 10.0, cpus_allowed=frozenset(range(4)))
    far = proc_window(200, [ThreadSpec(1, 0.5, 0.0)], 0.0, 10.0, cpus_allowed=frozenset(range(4, 8)))
    a = cpu_shape([], near, cpus, [100])
    b = cpu_shape([], far, cpus, [200])
    assert (a.allowed_saturated, b.allowed_saturated) == (4, 0)
    assert a.allowed_busy_cores == pytest.approx(3.8)
    assert b.allowed_busy_cores == pytest.approx(4 * 0.03)
    assert a.allowed_iowait == pytest.approx(0.0) and b.allowed_iowait == pytest.approx(0.0)
