"""A capture bundle on disk: one folder per capture, written whole or not at all, the folder kept bounded.

A bundle is written into ``.tmp-<name>`` beside the others and renamed to ``<name>`` when complete (rename(2)
is atomic within a filesystem): a reader, or the pruning of a later capture, never sees half a bundle. Names
start with the UTC time (``20260612T141503Z-gpu3-verdict``), so name order is age order; the oldest bundles
are removed first until at most ``max_count`` remain and they take at most ``max_bytes``. Leftover temporary
folders (a daemon killed mid-write) are removed by the next write.

Files: ``summary.md`` (to paste in a ticket), ``capture.json`` (verdict history, evidence, the stacks'
summary, what went wrong), ``stacks.speedscope.json`` (open it at speedscope.app), ``stacks.raw`` (py-spy's
raw output), ``samples.json`` (the engine's raw samples of the GPU's window), ``host.json`` (PCIe chain, NUMA
placement, CPU governors, cgroup limits as the collectors last read them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TMP_PREFIX = ".tmp-"


@dataclass(frozen=True, slots=True)
class BundleInfo:
    """One bundle on disk."""

    name: str
    path: Path
    bytes: int


def jsonable(value: Any, depth: int = 0) -> Any:
    """A sample (frozen dataclasses, mappings, tuples, sets) as JSON-ready values; non-finite floats as None,
    anything else as its repr."""
    if depth > 32:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((jsonable(v, depth + 1) for v in value), key=repr)
    return repr(value)


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def bundles(folder: Path) -> list[BundleInfo]:
    """The complete bundles in ``folder``, oldest first."""
    try:
        entries = sorted(e for e in os.listdir(folder) if not e.startswith("."))
    except OSError:
        return []
    return [BundleInfo(e, folder / e, _size(folder / e)) for e in entries if (folder / e).is_dir()]


def prune(folder: Path, max_count: int, max_bytes: int, keep: str | None = None) -> list[str]:
    """Remove the oldest bundles until at most ``max_count`` remain within ``max_bytes`` (never ``keep``, the
    newest one); the names removed."""
    removed: list[str] = []
    for entry in os.listdir(folder) if folder.is_dir() else []:
        if entry.startswith(TMP_PREFIX) and entry != f"{TMP_PREFIX}{keep}":
            shutil.rmtree(folder / entry, ignore_errors=True)
    found = bundles(folder)
    total = sum(b.bytes for b in found)
    for b in found:
        if len(found) - len(removed) <= max_count and total <= max_bytes:
            break
        if b.name == keep:
            continue
        shutil.rmtree(b.path, ignore_errors=True)
        removed.append(b.name)
        total -= b.bytes
    return removed


def write(folder: Path, name: str, files: Mapping[str, bytes], *, max_count: int, max_bytes: int) -> Path:
    """Write ``files`` as bundle ``name`` in ``folder`` atomically, then prune; the bundle's path.

    OSError (no space, no permission) propagates, with the temporary folder removed."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{TMP_PREFIX}{name}"
    final = folder / name
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(mode=0o750)
        for fname, data in files.items():
            with open(tmp / fname, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(folder, max_count, max_bytes, keep=name)
    return final


def dumps(value: Any) -> bytes:
    """JSON bytes of a JSON-ready value, indented for people."""
    return (json.dumps(value, indent=1, sort_keys=False) + "\n").encode()
