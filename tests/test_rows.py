"""Rows and RowMap: a sample's per-CPU / per-thread / per-point values as one object the cycle collector
tracks, read as their NamedTuple rows (issue 14)."""

from __future__ import annotations

from typing import NamedTuple

from exporter.samples.host import ThreadStat
from exporter.samples.rows import RowMap, Rows
from tests.support.gctrack import tracked_inside


class Point(NamedTuple):
    """A test row with a property, like CpuTimes."""

    t: float
    value: float

    @property
    def doubled(self) -> float:
        return 2 * self.value


def test_rows_read_back_as_their_named_tuple_with_fields_and_properties() -> None:
    rows = Rows(Point, [Point(1.0, 0.5), (2.0, 0.25)])
    assert list(rows) == [Point(1.0, 0.5), Point(2.0, 0.25)]
    assert all(type(p) is Point for p in rows)
    assert rows[1].t == 2.0 and rows[-1].doubled == 0.5 and type(rows[0]) is Point
    assert len(rows) == 2 and list(rows[1:]) == [Point(2.0, 0.25)]
    assert not Rows(Point) and max(rows, key=lambda p: p.value) == Point(1.0, 0.5)


def test_a_column_reads_one_field_of_every_row_in_order() -> None:
    rows = Rows(Point, [Point(1.0, 0.5), (2.0, 0.25)])
    assert list(rows.column("value")) == [0.5, 0.25] and list(rows.column("t")) == [1.0, 2.0]
    assert list(Rows(Point).column("t")) == []


def test_rows_equal_the_tuple_of_the_same_rows_and_hash_like_it() -> None:
    rows = Rows(Point, [Point(1.0, 0.5)])
    assert rows == (Point(1.0, 0.5),) and rows == Rows(Point, [(1.0, 0.5)])
    assert rows != (Point(1.0, 0.75),) and rows != [Point(1.0, 0.5)]
    assert hash(rows) == hash(Rows(Point, [(1.0, 0.5)]))
    assert Rows(Point) == ()


def test_row_map_reads_rows_by_key_and_compares_like_a_mapping() -> None:
    m = RowMap(Point, {3: Point(1.0, 0.5), 1: (2.0, 0.25)})
    assert list(m) == [3, 1] and m[1] == Point(2.0, 0.25) and type(m[3]) is Point
    assert m.get(7) is None and 3 in m and 7 not in m and len(m) == 2
    assert m == {3: Point(1.0, 0.5), 1: Point(2.0, 0.25)}
    assert dict(RowMap(Point, [(5, (0.0, 1.0))])) == {5: Point(0.0, 1.0)}


def test_a_table_of_a_thousand_threads_is_one_object_for_the_cycle_collector() -> None:
    threads = Rows(ThreadStat, (ThreadStat(tid, "python3", "S", 1.5, 0.5, tid % 192, 0.25, (10, 2), 2.0)
                                for tid in range(1000)))
    assert tracked_inside(threads) == [threads]
    table = RowMap(Point, {c: Point(float(c), 0.5) for c in range(1000)})
    assert tracked_inside(table) == [table]


def test_a_tuple_of_named_tuples_stays_tracked_which_is_why_rows_exist() -> None:
    # CPython untracks exact tuples only (Modules/gcmodule.c untrack_tuples: PyTuple_CheckExact).
    kept = tuple(ThreadStat(tid, "python3", "S", 1.5, 0.5, 0) for tid in range(10))
    assert len(tracked_inside(kept)) == 11
