"""Tables of per-CPU, per-thread and per-point values that the cycle collector does not traverse.

The engine's ring buffers hold a minute of samples, and a sample of a 192-CPU host or of 8 processes of ~150
threads holds one value per CPU or per thread. CPython's cycle collector tracks every instance of a frozen
slotted dataclass and every instance of a tuple subclass -- ``typing.NamedTuple`` included: only an *exact*
tuple whose items are all untracked is untracked at its first collection (``untrack_tuples`` in
Modules/gcmodule.c checks ``PyTuple_CheckExact``), and a dict of such values is never tracked at all. One object
per CPU or thread per sample made every full collection traverse ~50k objects (issue 14: 20-37 ms pauses, budget
10 ms). So these tables store each row as an exact tuple and hand out the row's ``NamedTuple`` (its field
names, properties and docstring) when it is read: the table is one tracked object however many rows it has,
and a row read is a short-lived object freed by reference counting.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, Protocol, TypeVar, cast, overload

R = TypeVar("R", bound=tuple[Any, ...])
K = TypeVar("K")


class _Named(Protocol):
    """What a NamedTuple type has that ``tuple`` has not (mypy cannot bound a TypeVar by NamedTuple)."""

    _fields: tuple[str, ...]


class Rows(Sequence[R]):
    """An immutable sequence of ``row`` values (a NamedTuple type), stored as exact tuples.

    Equal to another Rows or to a tuple holding the same rows; hashable like a tuple.
    """

    __slots__ = ("_row", "_rows")

    def __init__(self, row: type[R], rows: Iterable[Iterable[Any]] = ()) -> None:
        self._row = row
        # tuple() of an exact tuple is that tuple; of a NamedTuple, a plain copy sharing its items.
        self._rows: tuple[tuple[Any, ...], ...] = tuple(map(tuple, rows))

    @overload
    def __getitem__(self, i: int) -> R: ...

    @overload
    def __getitem__(self, i: slice) -> Rows[R]: ...

    def __getitem__(self, i: int | slice) -> R | Rows[R]:
        if isinstance(i, slice):
            return Rows(self._row, self._rows[i])
        return tuple.__new__(self._row, self._rows[i])

    def __iter__(self) -> Iterator[R]:
        return map(tuple.__new__, repeat(self._row), self._rows)

    def column(self, name: str) -> Iterator[Any]:
        """Field ``name`` of every row, in order, without building the rows: for a scan of one field over many
        rows (a row read costs ~0.3 us; the derived layer counts D-state threads over every deep sample)."""
        return map(itemgetter(cast(_Named, self._row)._fields.index(name)), self._rows)

    def tuples(self) -> tuple[tuple[Any, ...], ...]:
        """The rows as stored: exact tuples in the row type's field order. A table built from them keeps the same
        objects -- a row carried over unchanged is then no new object for the cycle collector to examine (an
        exact tuple of untracked items is untracked after the first collection that sees it)."""
        return self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows):
            return self._rows == other._rows
        if isinstance(other, tuple):
            return self._rows == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._rows)

    def __repr__(self) -> str:
        return f"Rows({self._row.__name__}, {len(self._rows)} rows)"


class RowMap(Mapping[K, R]):
    """An immutable mapping of keys (numbers or strings) to ``row`` values (a NamedTuple type), stored as a dict
    of exact tuples."""

    __slots__ = ("_row", "_rows")

    def __init__(self, row: type[R], rows: Mapping[K, Iterable[Any]] | Iterable[tuple[K, Iterable[Any]]] = ()) -> None:
        self._row = row
        items = rows.items() if isinstance(rows, Mapping) else rows
        self._rows: dict[K, tuple[Any, ...]] = {k: tuple(v) for k, v in items}

    def __getitem__(self, key: K) -> R:
        return tuple.__new__(self._row, self._rows[key])

    def __iter__(self) -> Iterator[K]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __repr__(self) -> str:
        return f"RowMap({self._row.__name__}, {len(self._rows)} rows)"
