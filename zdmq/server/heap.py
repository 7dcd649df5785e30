"""Large bodies and glibc's malloc: keep freed memory while busy, give it back when idle.

A 1 MiB message is several fresh 1 MiB allocations in a node: the HTTP parser's join,
the frame codec's slices, SQLite's buffers, the reply. glibc serves a block that large
with mmap, or, once its dynamic threshold has risen past it, from the heap, and then
hands the heap's free top back to the kernel as soon as more than twice the threshold
is free. Either way the next body faults its pages in again: about 570 minor page
faults per 1 MiB message through a node with glibc's defaults.

`keep_freed` raises both thresholds, so freed blocks stay in the process for the next
body, and `release` gives the free memory back to the kernel (`malloc_trim`), which the
node does once no message has moved for a housekeeping round (about a second) after some
did (`Node.monitor_once`). With a C library other than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

__all__ = ["Heap"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap (glibc's own ceiling for its dynamic
# threshold on 64-bit), and up to this much free memory stays at the heap's top.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20


class Heap:
    """The process's malloc, when it is glibc's."""

    def __init__(self) -> None:
        self._libc = _glibc()

    @property
    def tunable(self) -> bool:
        return self._libc is not None

    def keep_freed(self) -> bool:
        """Freed blocks stay in the process until `release`; False if not glibc."""
        libc = self._libc
        if libc is None:
            return False
        mmap = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        trim = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        return bool(mmap and trim)

    def release(self) -> bool:
        """Gives free memory back to the kernel; whether any was."""
        return self._libc is not None and bool(self._libc.malloc_trim(0))


def _glibc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None  # musl and others
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc
