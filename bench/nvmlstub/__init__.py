"""A stand-in ``libnvidia-ml.so.1`` (nvml_stub.c) for the real pynvml binding, built on demand with the C compiler.

``build()`` compiles it once per source content into a cache directory and returns the library's path
(:class:`StubError` naming the reason where it cannot: no C compiler, a failed compile). ``load(path)`` makes
the installed pynvml use it: the binding loads its library once, into ``pynvml.nvmlLib``; set there before
``nvmlInit`` it is what every wrapper calls. Used by bench/simcost.py (what the real binding costs per call,
next to the fake NVML) and by tests/gpu/test_real_binding.py (the backend through real ctypes calls).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "nvml_stub.c"
LIBRARY = "libnvidia-ml.so.1"


class StubError(RuntimeError):
    """The stub library cannot be built here (the message says why)."""


def _private(base: Path) -> Path:
    """``base``, created if needed, when it is a directory of this user's that nobody else may write: the library
    in it is loaded into the process, so a directory another user could have made first is refused."""
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = base.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StubError(f"{base}: not a directory of this user's that only it may write; remove it or set "
                        "XDG_CACHE_HOME")
    return base


def build(cache: Path | None = None) -> Path:
    """The compiled stub (cached by the source's hash, under ``cache`` or $XDG_CACHE_HOME/gpufeed-nvmlstub);
    StubError when it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise StubError("no C compiler (cc or gcc) on PATH")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    base = _private(cache or Path(xdg) / "gpufeed-nvmlstub")
    out = base / digest / LIBRARY
    if out.exists():
        return out
    _private(out.parent)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(tmp), str(SOURCE)],
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise StubError(f"{cc} failed to build {SOURCE.name}: {proc.stderr.strip()[-500:]}")
    tmp.replace(out)
    return out


def load(path: Path) -> Any:
    """Make the installed pynvml call the stub at ``path``; returns the pynvml module."""
    import pynvml

    lib = ctypes.CDLL(str(path))
    lib.nvml_stub_layout.restype = ctypes.c_size_t
    lib.nvml_stub_layout.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.nvml_stub_advance.argtypes = [ctypes.c_ulonglong]
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


def advance(seconds: float) -> None:
    """Move the loaded stub's clock forward (its counters and buffered samples follow)."""
    import pynvml

    pynvml.nvmlLib.nvml_stub_advance(int(seconds * 1e6))
