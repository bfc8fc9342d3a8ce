"""Failing reads of chosen paths, for the tests that break a source the way a non-root daemon or a failing disk
sees it (tests run as root: chmod 000 would not stop a read)."""

from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path
from typing import Any, Protocol

import pytest

from exporter.sources import KeptFiles


class Deny(Protocol):
    def __call__(self, path: Path, code: int = errno.EACCES) -> None:
        """From now on opening, listing or reading ``path`` fails with OSError(``code``); code 0 heals it."""


def deny_reads(monkeypatch: pytest.MonkeyPatch) -> Deny:
    """Patch open(), io.open, os.open (collectors use raw os.open/os.read on hot paths), os.listdir and reads
    through a kept descriptor (exporter/sources.py KeptFiles) so that the paths given to the returned function
    fail with their errno (EACCES by default)."""
    denied: dict[str, int] = {}
    real_open, real_listdir, real_os_open = io.open, os.listdir, os.open
    real_kept_read = KeptFiles.read

    def check(file: Any) -> None:
        if isinstance(file, str | os.PathLike) and os.fspath(file) in denied:
            code = denied[os.fspath(file)]
            raise OSError(code, os.strerror(code), os.fspath(file))

    def fake_open(file: Any, *a: Any, **kw: Any) -> Any:
        check(file)
        return real_open(file, *a, **kw)

    def fake_listdir(path: Any = ".") -> list[str]:
        check(path)
        return real_listdir(path)

    def fake_os_open(path: Any, *a: Any, **kw: Any) -> int:
        check(path)
        return real_os_open(path, *a, **kw)

    def fake_kept_read(kept: KeptFiles, path: str) -> bytes:
        check(path)
        return real_kept_read(kept, path)

    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "listdir", fake_listdir)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(KeptFiles, "read", fake_kept_read)

    def add(path: Path, code: int = errno.EACCES) -> None:
        if code:
            denied[os.fspath(path)] = code
        else:
            denied.pop(os.fspath(path), None)

    return add
