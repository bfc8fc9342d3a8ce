"""System call numbers gpufeed recognises in ``/proc/<pid>/task/<tid>/syscall`` (proc(5): the number and
arguments of the call a blocked thread is in), per architecture: receives whose first argument is a
descriptor, and waits on descriptors (poll, select, epoll) -- a socket read with a timeout waits in those.
Sources: arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h (arm64)."""

from __future__ import annotations

import os

# (receives: read, readv, pread64, recvfrom, recvmsg, recvmmsg; waits: poll, select, epoll_wait, pselect6,
#  ppoll, epoll_pwait, epoll_pwait2)
TABLES = {
    "x86_64": (frozenset({0, 17, 19, 45, 47, 299}), frozenset({7, 23, 232, 270, 271, 281, 441})),
    "aarch64": (frozenset({63, 65, 67, 207, 212, 243}), frozenset({22, 72, 73, 441})),
}
RECVFROM = {"x86_64": 45, "aarch64": 207}
MACHINE = os.uname().machine
RECEIVES, WAITS = TABLES.get(MACHINE, (frozenset(), frozenset()))
