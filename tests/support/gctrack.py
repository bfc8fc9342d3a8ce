"""What the cycle collector still tracks inside a sample: every tracked object a sample keeps in the engine's
ring buffers is traversed by each full collection (issue 14, "GC p99 pause <= 10 ms")."""

from __future__ import annotations

import gc
import types
from collections.abc import Callable

# Shared by every sample (not per sample): never descended into.
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _tracked_reachable(root: object) -> list[object]:
    """The objects reachable from ``root`` (itself included) that the cycle collector tracks now."""
    seen: set[int] = set()
    out: list[object] = []
    todo = [root]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, _SHARED):
            continue
        seen.add(id(o))
        if gc.is_tracked(o):
            out.append(o)
        todo.extend(gc.get_referents(o))
    return out


def tracked_inside(root: object) -> list[object]:
    """The objects reachable from ``root`` (itself included) that the cycle collector still tracks after two
    full collections. CPython untracks an exact tuple whose items are all untracked at a collection (so a tuple
    of such tuples at the next) and a dict of untracked keys and values at a full one."""
    gc.collect()
    gc.collect()
    return _tracked_reachable(root)


def walk_now(root: object) -> int:
    """What a collection holding ``root`` visits through it right now, before any full collection has untracked
    what it could: the referents of every tracked object reachable from it."""
    return sum(len(gc.get_referents(o)) for o in _tracked_reachable(root))


def cyclic_garbage(run: Callable[[], object]) -> list[object]:
    """The objects that ``run`` left for the cycle collector to free: unreachable, held only by reference cycles.
    Automatic collection is off meanwhile, so nothing ``run`` leaves is freed before it is counted."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def young_survivors(run: Callable[[], None]) -> list[object]:
    """The tracked objects that ``run`` allocated and that are still alive after it: what the next young collection
    has to examine (automatic collection off meanwhile; a full collection first empties the young generation)."""
    gc.collect()
    gc.disable()
    try:
        run()
        return [o for o in gc.get_objects(generation=0) if o is not run]
    finally:
        gc.enable()
