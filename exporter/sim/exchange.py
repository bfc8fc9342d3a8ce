"""How the simulator hands the fake NVML's state to the daemon: cheap for the reader, whatever the writer pays.

A real driver costs the daemon nothing between two NVML calls; a fake that re-parsed and re-validated a JSON
state file at every change (20 times a second, 2.9 ms each on the 8-GPU bench host) charged the daemon six
points of a core that no real host pays, and distorted every measurement made under simulation. Here the
state is split in two, in the directory the simulator and the daemon share:

- ``nvml.json``, the *shape*: the whole normalised state (``fakenvml.normalize_state``) as JSON, rewritten
  (atomically, ``os.replace``) only when something other than a number changed -- a process came or went, a
  GPU was lost, a MIG layout, an Xid event, a sample buffer's length (not a GPU's clock-event reasons: they
  travel as their NVML bitmask, a number). The reader validates it in full, as
  before; it is also what a person reads to see the simulated driver's state.
- ``nvml.bin``, the *values*: every number of the state (ints as int64, floats as float64), in the order a depth-first
  walk of the normalised state meets them -- except the numbers of the driver's sample buffers and of its NVLinks
  (:data:`DEFERRED`), which come after all the others of their type -- in a fixed binary layout mapped into memory,
  behind a sequence lock. The writer bumps the sequence to odd, writes, bumps it to even; a reader copies the block and
  keeps it only if the sequence was even and unchanged around the copy. Checking whether anything changed is one 8-byte
  read of mapped memory (no system call); a change costs a copy of the numbers' bytes, and for each device *when a call
  reads it* (:meth:`Reader.settle_group`) a comparison with the words it applied last and one assignment per number that
  *moved* -- a 50 ms step of the 8-GPU bench host moves ~80 of its ~770 numbers (~360 when the driver's sample buffers
  slide), and assigning all of them was most of what the daemon paid the simulator. The sample buffers are more than
  half of the numbers and read once a second (nvmlDeviceGetSamples), against 10-20 new states a second: a reader may
  defer them (``poll(settle=False)``), keeping their bytes, and apply one buffer when it is read (:meth:`Reader.settle`)
  -- never stale, since the read applies the newest state the reader took.

Layout of ``nvml.bin`` (little endian)::

    0   8s  magic b"GPUFEED3"
    8   Q   sequence (odd while the writer is inside a write)
    16  Q   shape id: bumped with every new nvml.json; a reader whose shape is older reloads the JSON first
    24  I   number of int64 values      28  I  number of float64 values
    32  ... the int64 values, then the float64 values (each: the others first, then the DEFERRED ones)

The file is sized for the values of the current shape, so a new shape with more numbers grows it: the writer
truncates it larger before it writes, a reader maps it again when its size changed. Both sides walk the
normalised state the same way (dicts in key order, lists in order; ``bool`` is not a number), which is
stable because ``normalize_state`` is idempotent and keeps key order.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.gpu.constants import CLOCK_EVENT_REASONS, encode_reasons

SHAPE_FILE = "nvml.json"
VALUES_FILE = "nvml.bin"
MAGIC = b"GPUFEED3"  # 2: the DEFERRED numbers last; 3: a device's NVLinks deferred too
_HEADER = struct.Struct("<8sQQII")
_SEQ = struct.Struct("<Q")
_SEQ_AT = 8

# A slot is where one number lives: (container, key-or-index).
Slot = tuple[Any, Any]
REASONS = "clock_event_reasons"
# Keys whose numbers a reader may apply only when they are read: the driver's sample buffers, and a device's
# NVLinks (18 links of 9 numbers each on an H100, their data counters moving at every state, read every 5 s).
DEFERRED = frozenset({"util_samples", "mem_util_samples", "process_util", "nvlink"})
# The top-level list whose elements' numbers a reader may apply per element, when that element is read.
GROUPED = "devices"


@dataclass
class Plan:
    """How a reader takes one set of slots from the values block: one ``unpack_from`` at byte ``at`` of ``bits``
    (every number as its int64 word, to compare) and, when they moved, of ``values`` (ints as int64, floats as
    float64); number ``i`` in the block's order lives at ``containers[i][keys[i]]``, and ``reasons`` lists the
    ones that are a reasons bitmask. Precompiled per shape: a device read after a sleep runs with cold caches, and
    the Python executed per settle, not the bytes copied, was what the daemon paid. Parallel tuples, not a tuple
    per number: a (container, key) pair per number was ~1,500 tracked tuples on the 8-GPU host that every
    collection of the daemon's long-lived objects traversed -- a cost a real host does not pay."""

    at: int = 0
    bits: struct.Struct = field(default_factory=lambda: struct.Struct("<"))
    values: struct.Struct = field(default_factory=lambda: struct.Struct("<"))
    containers: tuple[Any, ...] = ()
    keys: tuple[Any, ...] = ()
    reasons: tuple[int, ...] = ()


@dataclass
class Region:
    """The numbers under one DEFERRED key of one mapping: slots ``ints[i0:i1]`` and ``floats[f0:f1]``."""

    container: Any
    key: str
    i0: int
    i1: int
    f0: int
    f1: int
    gen: int = -1  # the reader's values generation last applied
    applied: tuple[int, ...] | None = None  # its words then
    plan: Plan = field(default_factory=Plan)


@dataclass
class Group:
    """The eager numbers of one device: int slots ``[i0, i1)`` and float slots ``[f0, f1)`` (applied lazily: a
    reader brings a device up to the newest values taken when a call reads that device)."""

    container: Any
    i0: int
    i1: int
    f0: int
    f1: int
    # The reader's side: the words of its slots last compared (None: never, so the first settle assigns every
    # number) and the values generation last applied.
    seen: tuple[int, ...] | None = None
    gen: int = -1
    plan: Plan = field(default_factory=Plan)


def _plan(spans: list[tuple[int, int, str]], slots: list[Slot]) -> Plan:
    """The :class:`Plan` of ``spans`` -- (first byte in the block, how many numbers, ``"q"`` or ``"d"``) in
    increasing byte order -- whose numbers are ``slots``; the bytes between two spans are skipped (``x``)."""
    spans = [s for s in spans if s[1] > 0]
    if not spans:
        return Plan()
    at = pos = spans[0][0]
    bits, values = ["<"], ["<"]
    for start, n, kind in spans:
        if start > pos:
            bits.append(f"{start - pos}x")
            values.append(f"{start - pos}x")
        bits.append(f"{n}q")
        values.append(f"{n}{kind}")
        pos = start + 8 * n
    return Plan(at, struct.Struct("".join(bits)), struct.Struct("".join(values)),
                containers=tuple(c for c, _ in slots), keys=tuple(k for _, k in slots),
                reasons=tuple(i for i, (_, k) in enumerate(slots) if k == REASONS))


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """The maximal runs ``[lo, hi)`` of true flags."""
    out: list[tuple[int, int]] = []
    lo = None
    for i, f in enumerate([*flags, False]):
        if f and lo is None:
            lo = i
        elif not f and lo is not None:
            out.append((lo, i))
            lo = None
    return out


class _Walk:
    """One :func:`walk`'s state. Methods, not two closures calling each other through their cells: that cycle kept
    the walked state, its slots and groups alive until a full collection of the daemon -- ~1,000 objects of
    cyclic garbage per shape change, freed by the daemon's longest pause (#14)."""

    def __init__(self, state: Any, groups: list[Group] | None) -> None:
        self.state, self.groups = state, groups
        self.eager: tuple[list[Slot], list[Slot]] = ([], [])
        self.deferred: tuple[list[Slot], list[Slot]] = ([], [])
        self.ints, self.floats = self.eager
        self.found: list[tuple[Any, str, int, int, int, int]] = []
        self.shape: list[Any] = []

    def visit(self, node: Any) -> None:
        shape = self.shape
        if isinstance(node, dict):
            shape.append("{")
            for k, v in node.items():
                shape.append(k)
                self.leaf(node, k, v)
            shape.append("}")
        elif isinstance(node, list):
            shape.append(("[", len(node)))
            for i, v in enumerate(node):
                self.leaf(node, i, v)

    def leaf(self, container: Any, key: Any, v: Any) -> None:
        shape, eager = self.shape, self.eager
        if key == REASONS and isinstance(v, list):
            shape.append("r")
            self.ints.append((container, key))
        elif isinstance(v, bool) or v is None or isinstance(v, str):
            shape.append(v if not isinstance(v, str) else ("s", v))
        elif isinstance(v, int):
            shape.append("i")
            self.ints.append((container, key))
        elif isinstance(v, float):
            shape.append("f")
            self.floats.append((container, key))
        elif self.groups is not None and container is self.state and key == GROUPED and isinstance(v, list):
            shape.append(("[", len(v)))
            for i, item in enumerate(v):
                i0, f0 = len(eager[0]), len(eager[1])
                self.leaf(v, i, item)
                if isinstance(item, dict):
                    self.groups.append(Group(item, i0, len(eager[0]), f0, len(eager[1])))
        elif key in DEFERRED and isinstance(container, dict) and self.ints is eager[0]:
            self.ints, self.floats = self.deferred
            i0, f0 = len(self.ints), len(self.floats)
            self.visit(v)
            self.found.append((container, key, i0, len(self.ints), f0, len(self.floats)))
            self.ints, self.floats = eager
        else:
            self.visit(v)


def walk(state: Any, regions: list[Region] | None = None,
         groups: list[Group] | None = None) -> tuple[list[Slot], list[Slot], list[Any]]:
    """The int slots, the float slots (each: the DEFERRED ones last), and the shape signature of ``state``
    (everything but the numbers); ``regions``, if given, receives each DEFERRED key's slot ranges, ``groups``
    each device's (an element of the top-level ``devices`` list) eager slot ranges.

    A device's ``clock_event_reasons`` (a list of names) is a number too: its NVML bitmask, an int slot (the
    reasons of a waiting GPU flip with every idle gap, and as shape each flip cost a JSON parse and a full
    validation). The writer encodes it, the reader decodes it (:func:`_reasons_of`)."""
    w = _Walk(state, groups)
    w.visit(state)
    eager, deferred = w.eager, w.deferred
    n_int, n_float = len(eager[0]), len(eager[1])
    if regions is not None:
        regions.extend(Region(c, k, n_int + i0, n_int + i1, n_float + f0, n_float + f1)
                       for c, k, i0, i1, f0, f1 in w.found)
    return eager[0] + deferred[0], eager[1] + deferred[1], w.shape


def _int_of(v: Any) -> int:
    return encode_reasons(v) if isinstance(v, list) else int(v)


@functools.lru_cache(maxsize=256)
def _reason_names(mask: int) -> tuple[str, ...]:
    return tuple(name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit)


def _reasons_of(mask: int) -> list[str]:
    """The reason names of a bitmask, in CLOCK_EVENT_REASONS order (a fresh list: the state's own)."""
    return list(_reason_names(mask))


class Writer:
    """The simulator's side: :meth:`write` a normalised state; JSON only when its shape changed."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._shape: list[Any] | None = None
        # A restarted writer (the daemon restarts a killed simulator child) must not reuse the ids a reader
        # saw: shape ids start at random, the sequence continues from the file's.
        self._shape_id = int.from_bytes(os.urandom(6), "little") << 8
        self._fd = os.open(self.dir / VALUES_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = sequence(self.dir) + 1 & ~1 if os.fstat(self._fd).st_size >= _HEADER.size else 0
        self._map: mmap.mmap | None = None
        self._size = 0

    def write(self, state: dict[str, Any]) -> None:
        """Publish ``state`` (already normalised: ``fakenvml.normalize_state``)."""
        ints, floats, shape = walk(state)
        if shape != self._shape:
            _write_json(self.dir / SHAPE_FILE, state)
            self._shape, self._shape_id = shape, self._shape_id + 1
        size = _HEADER.size + 8 * (len(ints) + len(floats))
        if self._map is None or size > self._size:
            os.ftruncate(self._fd, size)
            if self._map is not None:
                self._map.close()
            self._map, self._size = mmap.mmap(self._fd, size), size
        m = self._map
        self._seq += 1  # odd: inside a write
        _SEQ.pack_into(m, _SEQ_AT, self._seq)
        _HEADER.pack_into(m, 0, MAGIC, self._seq, self._shape_id, len(ints), len(floats))
        at = _HEADER.size
        struct.pack_into(f"<{len(ints)}q", m, at, *(_int_of(c[k]) for c, k in ints))
        struct.pack_into(f"<{len(floats)}d", m, at + 8 * len(ints), *(c[k] for c, k in floats))
        self._seq += 1  # even: complete
        _SEQ.pack_into(m, _SEQ_AT, self._seq)

    @property
    def sequence(self) -> int:
        return self._seq

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self._fd)


class Reader:
    """The fake NVML's side. :meth:`poll` answers None while nothing changed (one read of mapped memory), else
    ``(state, new_shape)``: the state dict, updated in place for a change of values, a new validated dict
    after a change of shape. ``load_shape`` validates a shape's JSON (``fakenvml.normalize_state``).

    With ``poll(settle=False)`` a change of values updates only the state's own numbers (its time): a device's
    numbers are brought up to date by :meth:`settle_group` (its mapping), a sample buffer's by :meth:`settle`,
    everything by :meth:`settle_all` -- a caller reading a device must settle it first. ``busy`` says whether
    the last poll that answered None met a write in progress (the caller may look again at once)."""

    def __init__(self, directory: Path, load_shape: Any) -> None:
        self.dir = directory
        self._load_shape = load_shape
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._seq = -1
        self._shape_id = -1
        self.state: dict[str, Any] | None = None
        self._counts = (0, 0)  # the shape's ints and floats (its slots live on in the plans only)
        # The values of the newest state taken (every number's word: ints, then floats, as in the file) and its
        # generation; the devices' groups by id of their mapping, the state's own numbers (its time: outside every
        # group) as a group of their own, and the DEFERRED buffers by (id of the mapping, key). A group or buffer
        # is current when its gen is the reader's; each settles from the block with its precompiled Plan.
        self._block = b""
        self._values_gen = 0
        self._groups: dict[int, Group] = {}
        self._top = Group(None, 0, 0, 0, 0)
        self._regions: dict[tuple[int, str], Region] = {}
        self.busy = False  # the last poll met a write in progress (see the class docstring)
        self.shape_loads = 0  # JSON shapes read (tests: value changes must not read JSON)
        self.assigned = 0  # numbers written into the state (tests: only the ones that moved)

    def _mapped(self) -> mmap.mmap | None:
        if self._map is None:
            try:
                self._fd = os.open(self.dir / VALUES_FILE, os.O_RDONLY)
                size = os.fstat(self._fd).st_size
                if size < _HEADER.size:
                    os.close(self._fd)
                    self._fd = None
                    return None
                self._map = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)
            except OSError:
                return None
        return self._map

    def _remap(self) -> mmap.mmap | None:
        self.close()
        return self._mapped()

    def shape_pending(self) -> bool:
        """Whether the writer published a shape newer than the one installed (one read of mapped memory); an
        unreadable exchange counts as pending, so the caller's :meth:`poll` reports it."""
        m = self._mapped()
        if m is None:
            return True
        magic, _, shape_id, _, _ = _HEADER.unpack_from(m, 0)
        return bool(magic != MAGIC or shape_id != self._shape_id)

    def poll(self, settle: bool = True) -> tuple[dict[str, Any], bool] | None:
        """None: nothing new (or a write in progress: the previous state stands, and :attr:`busy` is set). Raises
        OSError/ValueError (and the shape loader's errors) for an unreadable or invalid exchange; the caller keeps
        its state. ``settle=False``: of a change of values only the state's own numbers are applied; the devices'
        and the DEFERRED buffers' wait for :meth:`settle_group` and :meth:`settle` (a new shape applies
        everything)."""
        m = self._mapped()
        if m is None:
            raise OSError(f"{self.dir / VALUES_FILE}: missing or empty")
        (seq,) = _SEQ.unpack_from(m, _SEQ_AT)
        self.busy = bool(seq & 1)
        if seq == self._seq or seq & 1:
            return None
        magic, _, shape_id, n_int, n_float = _HEADER.unpack_from(m, 0)
        if magic != MAGIC:
            raise ValueError(f"{self.dir / VALUES_FILE}: not a gpufeed state exchange (magic {magic!r})")
        end = _HEADER.size + 8 * (n_int + n_float)
        if end > len(m):
            m = self._remap()  # the writer grew the file for a larger shape
            if m is None or end > len(m):
                return None
        new_shape = shape_id != self._shape_id or (n_int, n_float) != self._counts
        if new_shape:
            loaded = self._load(seq, n_int, n_float)
            if loaded is None:
                self.busy = True
                return None  # the JSON of a newer shape than these values (or older): poll again
            state, ints, floats, regions, groups = loaded
        # Straight from the mapped memory (a slice copies: every number, eager and DEFERRED), then the sequence
        # again: a torn copy is dropped. Unpacked only where a device or a buffer is read.
        block = m[_HEADER.size:end]
        (again,) = _SEQ.unpack_from(m, _SEQ_AT)
        if again != seq:
            self.busy = True
            return None  # written meanwhile: the next poll reads the newer one
        if new_shape:
            self.state, self._counts, self._shape_id = state, (n_int, n_float), shape_id
            self._install_plans(ints, floats, regions, groups)
        # Taken, not yet applied: the state's own numbers (its time) at once, each device's when a call reads it
        # (settle_group) -- a fast tick reads the waiting GPUs, and unpacking and comparing all eight devices'
        # numbers at every new state was most of what the daemon paid the simulation (cold caches: 100-300 us).
        self._block, self._values_gen = block, self._values_gen + 1
        self._settle(self._top)
        self._seq = seq
        if settle or new_shape:
            self.settle_all()
        assert self.state is not None
        return self.state, new_shape

    def _install_plans(self, ints: list[Slot], floats: list[Slot], regions: list[Region],
                       groups: list[Group]) -> None:
        """Precompile how each device, the state's own numbers and each DEFERRED buffer are taken from the block
        of a shape whose numbers live at ``ints`` and ``floats`` (a float slot ``j`` is word ``len(ints) + j``)."""
        n_int, n_float = len(ints), len(floats)
        ne_int, ne_float = _eager_counts(n_int, n_float, regions)

        def slots(i0: int, i1: int, f0: int, f1: int) -> list[Slot]:
            return ints[i0:i1] + floats[f0:f1]

        def plan(i0: int, i1: int, f0: int, f1: int) -> Plan:
            return _plan([(8 * i0, i1 - i0, "q"), (8 * (n_int + f0), f1 - f0, "d")], slots(i0, i1, f0, f1))

        grouped_i, grouped_f = [False] * ne_int, [False] * ne_float
        for g in groups:
            g.plan = plan(g.i0, g.i1, g.f0, g.f1)
            grouped_i[g.i0:g.i1] = [True] * (g.i1 - g.i0)
            grouped_f[g.f0:g.f1] = [True] * (g.f1 - g.f0)
        self._groups = {id(g.container): g for g in groups}
        # Outside every group (the state's own numbers): runs of ints, then runs of floats, in byte order.
        spans: list[tuple[int, int, str]] = []
        top: list[Slot] = []
        for lo, hi in _runs([not x for x in grouped_i]):
            spans.append((8 * lo, hi - lo, "q"))
            top += slots(lo, hi, 0, 0)
        for lo, hi in _runs([not x for x in grouped_f]):
            spans.append((8 * (n_int + lo), hi - lo, "d"))
            top += slots(0, 0, lo, hi)
        self._top = Group(None, 0, 0, 0, 0, plan=_plan(spans, top))
        for r in regions:
            r.plan = plan(r.i0, r.i1, r.f0, r.f1)
        self._regions = {(id(r.container), r.key): r for r in regions}

    def _settle(self, g: Group) -> None:
        """Assign the numbers of ``g`` that moved since they were last assigned, from the newest values taken (the
        callers call it only when ``g`` is behind them): one unpack of their words, compared as a tuple (a float
        by its bits: -0.0 is not 0.0, a NaN equals itself); only when some moved, one unpack of their values."""
        g.gen = self._values_gen
        p = g.plan
        words = p.bits.unpack_from(self._block, p.at)
        seen = g.seen
        if words == seen:
            return
        g.seen = words
        values = p.values.unpack_from(self._block, p.at)
        moved = range(len(words)) if seen is None else [i for i, w in enumerate(words) if w != seen[i]]
        containers, keys, reasons = p.containers, p.keys, p.reasons
        for i in moved:
            containers[i][keys[i]] = _reasons_of(values[i]) if i in reasons else values[i]
        self.assigned += len(moved)

    def settle_group(self, container: Any) -> None:
        """Bring one device (an element of the state's ``devices``) up to the newest values taken."""
        g = self._groups.get(id(container))
        if g is not None and g.gen != self._values_gen:
            self._settle(g)

    def settle_groups(self) -> None:
        """Bring every device up to the newest values taken (the DEFERRED buffers excepted)."""
        for g in self._groups.values():
            if g.gen != self._values_gen:
                self._settle(g)

    def _load(self, seq: int, n_int: int,
              n_float: int) -> tuple[dict[str, Any], list[Slot], list[Slot], list[Region], list[Group]] | None:
        """The validated state of nvml.json, its slots, DEFERRED regions and device groups; None when its numbers
        are not these (a JSON newer or older than the values)."""
        try:
            with open(self.dir / SHAPE_FILE, encoding="utf-8") as f:
                state = self._load_shape(json.load(f))
        except (OSError, ValueError):
            self._seq = seq  # one error per state published, not one per call until the next
            raise
        self.shape_loads += 1
        regions: list[Region] = []
        groups: list[Group] = []
        ints, floats, _ = walk(state, regions, groups)
        if (len(ints), len(floats)) != (n_int, n_float):
            return None
        return state, ints, floats, regions, groups

    def settle(self, container: Any, key: str) -> None:
        """Apply the newest numbers of ``container[key]``, a DEFERRED buffer (nothing for any other key)."""
        r = self._regions.get((id(container), key))
        if r is not None and r.gen != self._values_gen:
            self._apply(r)

    def settle_all(self) -> None:
        """Apply every device's numbers and every deferred buffer: the state is then wholly the newest one taken."""
        self.settle_groups()
        for r in self._regions.values():
            if r.gen != self._values_gen:
                self._apply(r)

    def _apply(self, r: Region) -> None:
        """Assign a DEFERRED buffer's numbers, all of them when any word changed (a sliding buffer moves all)."""
        p = r.plan
        words = p.bits.unpack_from(self._block, p.at)
        if words != r.applied:
            values = p.values.unpack_from(self._block, p.at)
            for c, k, v in zip(p.containers, p.keys, values, strict=True):
                c[k] = v
            self.assigned += len(values)
            r.applied = words
        r.gen = self._values_gen

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _eager_counts(n_int: int, n_float: int, regions: list[Region]) -> tuple[int, int]:
    """How many ints and floats come before the DEFERRED ones."""
    return n_int - sum(r.i1 - r.i0 for r in regions), n_float - sum(r.f1 - r.f0 for r in regions)


def sequence(directory: Path) -> int:
    """The exchange's current sequence number (tests: is the simulator still writing?)."""
    with open(directory / VALUES_FILE, "rb") as f:
        head = f.read(_HEADER.size)
    return int(_HEADER.unpack(head)[1]) if len(head) == _HEADER.size else -1


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)
