"""``gpufeed`` under a Python audit hook (run as a subprocess by test_privilege.py).

Every event that would write to the filesystem, change it, or start a program is reported on stderr as
``AUDIT <event> <args>``; the test asserts there are none while the daemon serves, reloads and stops.
"""

from __future__ import annotations

import os
import sys
from typing import Any

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty", "os.spawn",
    "pty.spawn", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
    "os.link", "os.symlink", "os.utime", "shutil.copyfile", "shutil.rmtree", "shutil.move", "ctypes.dlopen",
})


def _hook(event: str, args: tuple[Any, ...]) -> None:
    bad = False
    if event == "open" and len(args) == 3:
        _path, mode, flags = args
        if isinstance(mode, str):
            bad = any(c in mode for c in "wax+")
        elif isinstance(flags, int):
            bad = bool(flags & WRITE_FLAGS)
    elif event in EVENTS:
        # NVML's bindings dlopen libnvidia-ml (absent here): loading a library is not a write or a spawn.
        bad = event != "ctypes.dlopen"
    if bad:
        os.write(2, f"AUDIT {event} {args!r}\n".encode(errors="replace"))


if __name__ == "__main__":
    sys.addaudithook(_hook)
    from exporter.cli import main

    raise SystemExit(main(sys.argv[1:]))
