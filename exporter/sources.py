"""One door to procfs and sysfs: every collector reads files through these helpers, and kernel units.

``read_bytes`` is the single raw reader: ``os.open``/``os.read`` (the buffered text layer costs several times
the two or three syscalls, and a deep pass reads ~150 thread files per process), a size cap (a hostile or
broken file -- a 1 GB file mounted over ``/proc/<pid>/stat`` -- must not grow the daemon), and the
``OSError`` left as it is so a caller can tell "gone" (ENOENT, ESRCH: a process exited mid-read) from
"failed". ``read_source`` is the common case: text, with a failure as :class:`CollectorError` naming the
file and, when asked, a missing file as :class:`NoDataError` (the source does not exist on this host).
``attribute`` reads a one-value sysfs file that may be absent.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from exporter.sampling import CollectorError, NoDataError

# Clock ticks of /proc/stat and /proc/<pid>/stat times: "units of USER_HZ (1/100ths of a second on most
# architectures, use sysconf(_SC_CLK_TCK) to obtain the right value)" -- proc(5).
USER_HZ = os.sysconf("SC_CLK_TCK")
# /proc/diskstats and /sys/block/*/size count 512-byte sectors whatever the device's sector size
# (Documentation/admin-guide/iostats.rst, include/linux/types.h SECTOR_SHIFT).
SECTOR_BYTES = 512

# Largest file a collector reads. /proc/stat on a 1024-CPU host is ~150 KiB and /proc/<pid>/status ~1.5
# KiB; sysfs attributes are at most a page. Anything larger is not the file the kernel writes.
MAX_BYTES = 4 << 20
CHUNK = 65536
GONE = (errno.ENOENT, errno.ESRCH)


class SourceTooLargeError(CollectorError, OSError):
    """A file longer than the cap: refused, not read whole (the message names it and the cap). An OSError
    too, so a caller that treats an unreadable optional file as absent treats this one the same way."""


def read_bytes(path: str | os.PathLike[str], *, limit: int = MAX_BYTES) -> bytes:
    """The whole file, at most ``limit`` bytes; OSError as raised, SourceTooLargeError when longer."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        size = 0
        while chunk := os.read(fd, min(CHUNK, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise SourceTooLargeError(f"{os.fspath(path)}: longer than {limit} bytes (not a kernel file?)")
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_BYTES) -> str:
    """The whole file as text (undecodable bytes replaced); errors as :func:`read_bytes`."""
    return read_bytes(path, limit=limit).decode("utf-8", "replace")


def read_source(path: Path, *, absent: str | None = None, limit: int = MAX_BYTES) -> str:
    """A whole procfs/sysfs file as text. A failed read is a CollectorError naming the file; with ``absent``,
    a missing file is instead NoDataError(absent): the source does not exist on this host by design."""
    try:
        return read_text(path, limit=limit)
    except FileNotFoundError as e:
        if absent is not None:
            raise NoDataError(absent) from e
        raise CollectorError(f"{path}: {e.strerror or e}") from e
    except OSError as e:
        raise CollectorError(f"{path}: {e.strerror or e}") from e


def attribute(path: str | os.PathLike[str]) -> str | None:
    """A one-value sysfs attribute, stripped; None when it does not exist. Other errors propagate."""
    try:
        return read_text(path, limit=CHUNK).strip()
    except FileNotFoundError:
        return None
