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
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "nvml_stub.c"
LIBRARY = "libnvidia-ml.so.1"


class StubError(RuntimeError):
    """The stub library cannot be built here (the message says why)."""


def build(cache: Path | None = None) -> Path:
    """The compiled stub (cached by the source's hash); StubError when it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise StubError("no C compiler (cc or gcc) on PATH")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    base = cache or Path(tempfile.gettempdir()) / f"gpufeed-nvmlstub-{os.getuid()}"
    out = base / digest / LIBRARY
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
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
    lib.nvml_stub_sizeof.restype = ctypes.c_size_t
    lib.nvml_stub_sizeof.argtypes = [ctypes.c_char_p]
    lib.nvml_stub_advance.argtypes = [ctypes.c_ulonglong]
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


def advance(seconds: float) -> None:
    """Move the loaded stub's clock forward (its counters and buffered samples follow)."""
    import pynvml

    pynvml.nvmlLib.nvml_stub_advance(int(seconds * 1e6))
