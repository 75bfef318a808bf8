"""How this process's C allocator treats large freed blocks.

glibc's malloc serves a block of more than 32 MiB (its largest dynamic mmap threshold) with a
fresh ``mmap`` and unmaps it again on free. An activation of a batch of images is such a block:
EfficientNet-Lite0's first feature maps hold 50 x 32 x 112 x 112 floats (80 MB). So each batch
maps new zero pages and faults every one of them in, and the next batch does the same: on a
2-core machine, about a million minor page faults per batch of 50, 3 of the 5 seconds spent in
the kernel, and torch's float executor at 19 images/s (docs/benchmarks.md). With the mmap and
trim thresholds raised to 1 GiB, freed blocks stay in the heap and the next batch reuses them:
no page faults and 62-70 images/s for the same run.

The cost is that memory freed below the process's peak is not given back to the system until
the process ends, which for npuforge's commands (one model, one batch size) is the peak they
reached anyway. The command line turns it on for its own process; a program that uses npuforge
as a library can call :func:`keep_freed_memory` itself. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_THRESHOLD = 1 << 30


@functools.cache  # once per process: the command line's main() runs it on every call, the tests many times
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB (see the module docstring); True where
    the allocator took both, False where there is no glibc ``mallopt`` or it refused."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: libc's, without a library search
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim, mmap = mallopt(_M_TRIM_THRESHOLD, _THRESHOLD), mallopt(_M_MMAP_THRESHOLD, _THRESHOLD)  # both, always
    return bool(trim) and bool(mmap)
