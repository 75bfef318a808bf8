"""npuforge/memory.py: with glibc's thresholds raised, a batch-sized block comes from the heap,
where a freed one is kept and reused, not from a mapping of its own that free() gives back to the
system and the next batch faults in again page by page (what made torch's float executor spend 3
of every 5 seconds in the kernel on EfficientNet-Lite0)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

import npuforge.memory

_PROBE = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("memory", sys.argv[2])  # the module alone, not all of npuforge
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
took = memory.keep_freed_memory() if sys.argv[1] == "on" else None
block = torch.empty(20_000_000)  # 80 MB: beyond glibc's largest dynamic mmap threshold (32 MiB)
address = block.data_ptr()
for line in open("/proc/self/maps"):
    span, *rest = line.split()
    lo, hi = (int(v, 16) for v in span.split("-"))
    if lo <= address < hi:
        print(took, rest[4] if len(rest) > 4 else "anonymous")
"""


def _region(mode: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, npuforge.memory.__file__], capture_output=True,
                         text=True, check=True)
    took, region = out.stdout.split()
    return took, region


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_batch_sized_block_comes_from_the_heap():
    took, region = _region("on")
    assert took == "True"
    assert region == "[heap]", f"an 80 MB block lies in a {region} mapping with the thresholds raised"
    _, default = _region("off")
    assert default == "anonymous", f"glibc's default no longer maps such a block on its own ({default})"
