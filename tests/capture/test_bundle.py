"""The capture folder: bundles written whole (temp folder + rename), bounded in count and bytes, oldest first."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.capture import bundle


def test_bundle_is_written_whole_and_temporary_leftovers_are_removed(tmp_path: Path) -> None:
    (tmp_path / ".tmp-20200101T000000Z-gpu0-verdict").mkdir()  # a daemon killed mid-write
    path = bundle.write(tmp_path, "20260101T000000Z-gpu0-verdict", {"summary.md": b"# hi\n"}, max_count=5,
                        max_bytes=10**6)
    assert path == tmp_path / "20260101T000000Z-gpu0-verdict"
    assert (path / "summary.md").read_bytes() == b"# hi\n"
    assert sorted(os.listdir(tmp_path)) == ["20260101T000000Z-gpu0-verdict"]


def test_oldest_bundles_go_first_by_count_and_by_bytes(tmp_path: Path) -> None:
    for i in range(5):
        bundle.write(tmp_path, f"2026010{i}T000000Z-gpu0-http", {"stacks.raw": b"x" * 1000}, max_count=3,
                     max_bytes=10**6)
    assert [b.name[:9] for b in bundle.bundles(tmp_path)] == ["20260102T", "20260103T", "20260104T"]
    bundle.write(tmp_path, "20260105T000000Z-gpu0-http", {"stacks.raw": b"x" * 1500}, max_count=3, max_bytes=2600)
    assert [b.name[:9] for b in bundle.bundles(tmp_path)] == ["20260104T", "20260105T"]
    # The newest is kept even when it alone is over the bytes.
    bundle.write(tmp_path, "20260106T000000Z-gpu0-http", {"stacks.raw": b"x" * 5000}, max_count=3, max_bytes=2600)
    assert [b.name[:9] for b in bundle.bundles(tmp_path)] == ["20260106T"]


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        bundle.write(tmp_path, "b", {"sub/dir/file": b"x"}, max_count=3, max_bytes=10**6)
    assert os.listdir(tmp_path) == []


@dataclass(frozen=True, slots=True)
class _S:
    a: float
    b: frozenset[int]


def test_samples_become_json() -> None:
    assert bundle.jsonable({1: _S(float("nan"), frozenset({2, 1})), "t": (1, 2.5)}) == {
        "1": {"a": None, "b": [1, 2]}, "t": [1, 2.5]}
