"""One door to procfs and sysfs: every collector reads files through these helpers, and kernel units.

``read_bytes`` is the single raw reader: ``os.open``/``os.read`` (the buffered text layer costs several times
the two or three syscalls, and a deep pass reads ~150 thread files per process), a size cap (a hostile or
broken file -- a 1 GB file mounted over ``/proc/<pid>/stat`` -- must not grow the daemon), and the
``OSError`` left as it is so a caller can tell "gone" (ENOENT, ESRCH: a process exited mid-read) from
"failed". ``read_source`` is the common case: text, with a failure as :class:`CollectorError` naming the
file and, when asked, a missing file as :class:`NoDataError` (the source does not exist on this host).
:class:`KeptFiles` re-reads small files through descriptors kept open (the per-thread files of a deep pass,
cpufreq's attributes).
"""

from __future__ import annotations

import errno
import os
import resource
import threading
import time
from pathlib import Path

from exporter.sampling import CollectorError, NoDataError

# Clock ticks of /proc/stat and /proc/<pid>/stat times: "units of USER_HZ (1/100ths of a second on most
# architectures, use sysconf(_SC_CLK_TCK) to obtain the right value)" -- proc(5).
USER_HZ = os.sysconf("SC_CLK_TCK")
# /proc/diskstats and /sys/block/*/size count 512-byte sectors whatever the device's sector size
# (Documentation/admin-guide/iostats.rst, include/linux/types.h SECTOR_SHIFT).
SECTOR_BYTES = 512
# /proc/meminfo and /proc/<pid>/status values carry a "kB" unit that means KiB (proc(5): "kB" fields, 1024 bytes
# each; the kernel prints them with K(x) = x << (PAGE_SHIFT - 10) in fs/proc/meminfo.c).
BYTES_PER_KB = 1024

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


# Descriptors all KeptFiles together keep open at most, and the share of the soft RLIMIT_NOFILE they may use.
KEPT_MAX = 8192
KEPT_SHARE = 4
# Descriptors left to everything else: a collector's read in flight (one per sampler thread), NVML's device
# files, the log, the listeners.
FD_RESERVE = 64
# What a kept file's read asks for first (a page: every per-thread procfs file is shorter).
FIRST_READ = 4096
# A kept descriptor not read for this long is closed (a thread that exited, a process no longer inspected).
KEPT_IDLE_S = 300.0


def blind_reason(procfs: Path, sysfs: Path) -> str | None:
    """Why this host cannot be seen through ``procfs`` and ``sysfs`` (None: it can be sampled).

    A procfs always has ``stat`` (proc(5)); a path that does not exist, is empty or is a file is not one, and
    sampling it would only produce a report with nothing in it that reads like a quiet host -- or, for ``serve``,
    an exporter whose /healthz is 200 while it sees nothing (a container started without the host's /proc
    mounted). ``diagnose`` exits 3 on it, ``serve`` and ``check-config`` refuse to start with exit 3.
    """
    for flag, root in (("--path.procfs", procfs), ("--path.sysfs", sysfs)):
        try:
            if not root.exists():
                return f"{flag} {root}: no such directory"
            if not root.is_dir():
                return f"{flag} {root}: not a directory"
        except OSError as e:  # a name too long, a loop of links
            return f"{flag} {str(root)[:80]}: {e.strerror or e}"
    try:
        read_bytes(procfs / "stat", limit=CHUNK)
    except OSError as e:
        return f"--path.procfs {procfs}: not a procfs ({procfs / 'stat'}: {e.strerror or e})"
    return None


def kept_capacity(soft: int | None = None) -> int:
    """How many descriptors all :class:`KeptFiles` together may keep: a ``KEPT_SHARE``-th of the soft
    RLIMIT_NOFILE (``soft``, else the limit in force), at most ``KEPT_MAX``. What a process without a web server
    keeps (diagnose, tests); the daemon splits the limit with :func:`fd_budget` instead."""
    if soft is None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = KEPT_MAX * KEPT_SHARE
    return max(0, min(KEPT_MAX, soft // KEPT_SHARE))


def fd_budget(nofile: int, max_connections: int) -> tuple[int, int]:
    """Split the soft RLIMIT_NOFILE ``nofile`` between every kind of descriptor the daemon holds: (kept
    descriptors, connections), with ``FD_RESERVE`` left to the rest. Kept descriptors are only a faster way to
    read (past their budget a file is read by path), so they give way first: they get what the configured
    ``max_connections`` and the reserve leave, at most :func:`kept_capacity`; connections are lowered only
    when the reserve alone leaves fewer than configured. At 256: 0 kept, 192 connections (a GPU process with 300
    children held 64 kept descriptors there, on top of 192 connections and the reserve: EMFILE in 10 collectors);
    at the systemd unit's 4096: 1024 kept, 512 connections."""
    if nofile == resource.RLIM_INFINITY:
        nofile = (KEPT_MAX + FD_RESERVE + max_connections) * 2
    connections = max(1, min(max_connections, nofile - FD_RESERVE))
    kept = max(0, min(kept_capacity(nofile), nofile - FD_RESERVE - connections))
    return kept, connections


class _Budget:
    """The process-wide count of kept descriptors against :func:`kept_capacity` (samplers run on several
    threads, each with its own KeptFiles)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.limit: int | None = None
        self.used = 0

    def set_limit(self, limit: int) -> None:
        """The daemon's share for kept descriptors (:func:`fd_budget`), set before any sampler runs."""
        with self._lock:
            self.limit = limit

    def take(self) -> bool:
        with self._lock:
            if self.limit is None:
                self.limit = kept_capacity()
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self, n: int = 1) -> None:
        with self._lock:
            self.used -= n


BUDGET = _Budget()


class KeptFiles:
    """Small files re-read often, through descriptors kept open: one ``pread`` at offset 0 per read instead of
    open, read and close (and a path built) -- on a deep pass over 8 trainers of 150 threads, 0.8 against 13 us
    a file, measured on the simulated host.

    procfs generates a file's content at each read from offset 0, so a kept descriptor always reads the current
    content. A descriptor of a thread or process that has exited fails with ESRCH (even when its id was reused
    since: the descriptor stays bound to the old one); the file is then opened again by path, and ENOENT there
    means gone, as for :func:`read_bytes`. A file on a regular filesystem -- a captured or simulated tree, whose
    files are replaced by renames -- may be a different file at the same path by the next read: a descriptor
    whose file shows a size at open (procfs files show 0) is read as long as its inode has not lost a link
    since (one ``fstat``; a rename over the path unlinks the old inode), and after that only while the path
    still names it (one ``stat``), else opened again. (A ``stat`` of the path at every read was a fifth of a
    simulated deep pass, a cost a procfs read never has.) At most ``capacity`` descriptors stay open in one
    instance (the least recently read closed first) and :func:`kept_capacity` in all (past it, files are read by path);
    :meth:`sweep` closes those not read for ``KEPT_IDLE_S``, :meth:`close` (or the instance's end) all. Not
    thread-safe: one instance per sampler.
    """

    def __init__(self, capacity: int | None = None, *, limit: int = CHUNK) -> None:
        self.capacity = KEPT_MAX if capacity is None else capacity
        self.limit = limit
        # path -> fd, least recently read first (a read moves its path to the end: a plain dict keeps insertion
        # order); per fd: its inode (None on procfs) and link count, set at open, and when it was last read. A read
        # updates a float in place: a new (fd, inode, links, time) tuple per read was ~3,300 objects per deep pass
        # for the young collection to examine (issue 14, GC pauses). Plain dicts of strings and numbers are not
        # tracked by the cycle collector at all; an OrderedDict always is, and a dict of (inode, links) tuples until
        # a full collection: 3,600 entries each, on the benchmark's host, for every full collection to walk.
        self._fds: dict[str, int] = {}
        self._ino: dict[int, int | None] = {}
        self._links: dict[int, int] = {}
        self._read_at: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._fds)

    def read(self, path: str) -> bytes:
        """The file's content (at most ``limit`` bytes, else SourceTooLargeError); OSError as raised."""
        fd = self._fds.get(path)
        if fd is not None:
            try:
                ino = self._ino[fd]
                if ino is not None and (now_links := os.fstat(fd).st_nlink) < self._links[fd]:
                    # It lost a link since it was opened (a rename over its path does that): if the path still
                    # names it, it is still the file, else it was replaced.
                    if os.stat(path).st_ino != ino:
                        raise FileNotFoundError(errno.ENOENT, "replaced", path)
                    self._links[fd] = now_links
                data = self._pread(fd)
                self._read_at[fd] = time.monotonic()
                del self._fds[path]
                self._fds[path] = fd
                return self._checked(path, data)
            except OSError as e:
                if e.errno not in GONE:
                    self.forget(path)
                    raise
            self.forget(path)  # exited, or replaced: by path again
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = self._pread(fd)
            st = os.fstat(fd)
            ino = st.st_ino if st.st_size > 0 else None
            links = st.st_nlink
        except BaseException:
            os.close(fd)
            raise
        if self.capacity > 0 and len(self._fds) >= self.capacity:
            self._close(self._fds.pop(next(iter(self._fds))))
            BUDGET.give()
        if self.capacity > 0 and BUDGET.take():
            self._fds[path] = fd
            self._ino[fd], self._links[fd] = ino, links
            self._read_at[fd] = time.monotonic()
        else:
            os.close(fd)
        return self._checked(path, data)

    def _pread(self, fd: int) -> bytes:
        """The file from offset 0: a page first (every per-thread file fits), the whole limit only when the page
        was full -- a 64 KiB buffer per read, thousands a second from several threads, fragments the
        allocator's per-thread arenas for nothing."""
        data = os.pread(fd, FIRST_READ, 0)
        if len(data) == FIRST_READ and self.limit >= FIRST_READ:
            data = os.pread(fd, self.limit + 1, 0)
        return data

    def _checked(self, path: str, data: bytes) -> bytes:
        if len(data) > self.limit:
            raise SourceTooLargeError(f"{path}: longer than {self.limit} bytes (not a kernel file?)")
        return data

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor, if one is kept."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._close(fd)
            BUDGET.give()

    def _close(self, fd: int) -> None:
        del self._ino[fd], self._links[fd], self._read_at[fd]
        os.close(fd)

    def sweep(self, idle: float = KEPT_IDLE_S) -> None:
        """Close the descriptors not read for ``idle`` seconds (least recently read first, so it stops at the
        first one read since)."""
        cutoff = time.monotonic() - idle
        n = 0
        while self._fds:
            path, fd = next(iter(self._fds.items()))
            if self._read_at[fd] >= cutoff:
                break
            del self._fds[path]
            self._close(fd)
            n += 1
        if n:
            BUDGET.give(n)

    def close(self) -> None:
        """Close every kept descriptor."""
        n = len(self._fds)
        while self._fds:
            self._close(self._fds.popitem()[1])
        if n:
            BUDGET.give(n)

    def __del__(self) -> None:
        # A collector dropped without close() (tests build many) must not leak its descriptors.
        fds = getattr(self, "_fds", None)
        if fds:
            self.close()
