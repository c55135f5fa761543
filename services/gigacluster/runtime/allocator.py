"""glibc's malloc set for a process that makes and drops large NumPy arrays all the time.

glibc serves an allocation above its mmap threshold (128 KiB at start, raised dynamically up to 32 MiB
as such blocks are freed) with a fresh ``mmap``, and returns free memory at the top of the heap to the
kernel once it exceeds the trim threshold. Every page of a fresh mapping is then a minor fault, which
the kernel answers by zeroing the page. The fabric plans and routes collectives as array work: a
first step of a 102,400-chip job makes and drops a few hundred arrays of 50 KB to 5 MB, and took
about 9,000 minor faults to plan, a third of its CPU time (``docs/performance.md``, "The allocator's
page faults"), and a simulated training step of that job 70,000-93,000 faults at 3-7 us each on this
machine's virtualised memory. With the thresholds below, those arrays reuse the heap's pages and the faults go.

The price is memory held: a process keeps up to ``TRIM_THRESHOLD`` of free heap it could have given
back, and blocks up to ``MMAP_THRESHOLD`` come from the heap, where a long-lived one can pin free
pages below it. The whole 2 GW site's resident memory is measured with it (same document).

A deployment that sets glibc's own tunables (``GLIBC_TUNABLES`` with ``glibc.malloc.mmap_threshold``
or ``trim_threshold``, or the older ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``) keeps its
own values: :func:`tune` then does nothing. Other C libraries (musl) and other systems: nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# Arrays of a 2M-entry incidence (a 100k-chip step's flows) are 16-48 MB: above glibc's own dynamic ceiling (32 MiB),
# so each would still be a fresh mapping. Some glibc builds refuse a threshold above half their heap size (32 MiB):
# the tuning then falls back to that.
MMAP_THRESHOLD = 128 * 1024 * 1024
MMAP_THRESHOLD_FALLBACK = 32 * 1024 * 1024
TRIM_THRESHOLD = 512 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _user_chose() -> bool:
    if any(name in os.environ for name in _USER_SETTINGS):
        return True
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "malloc.mmap_threshold" in tunables or "malloc.trim_threshold" in tunables


def tune() -> dict[str, int]:
    """Set glibc's mmap and trim thresholds for this process -> what was set ({} when nothing was)."""
    if not sys.platform.startswith("linux") or _user_chose():
        return {}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl has no such symbol)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    for mmap_threshold in (MMAP_THRESHOLD, MMAP_THRESHOLD_FALLBACK):
        if mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1:
            break
    else:
        return {}
    if mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return {"mmap_threshold": mmap_threshold}
    return {"mmap_threshold": mmap_threshold, "trim_threshold": TRIM_THRESHOLD}


__all__ = ["MMAP_THRESHOLD", "MMAP_THRESHOLD_FALLBACK", "TRIM_THRESHOLD", "tune"]
