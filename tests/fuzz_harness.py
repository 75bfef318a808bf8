"""Shared by the fuzz tests: run one mutated input through the command line in this process and
check that it ends cleanly.

A clean end is exit 0 (the mutation left a valid input), 1 (``check`` found problems) or 2 with one
``npuforge: error:`` line; never 3 (the CLI's boundary caught an unexpected exception: a bug), never
a traceback, and no file the case was told to protect changed. ``NPUFORGE_FUZZ_CASES`` raises the
number of cases each fuzz test runs (a few hundred in ``make test``; thousands by hand).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
from pathlib import Path

from npuforge.cli import main


def fuzz_cases(default: int) -> int:
    """How many cases a fuzz test runs: ``default``, or NPUFORGE_FUZZ_CASES when set."""
    return int(os.environ.get("NPUFORGE_FUZZ_CASES", default))


def _digest(path: Path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def run_case(argv, protect=()) -> tuple[int, str]:
    """Run ``npuforge ARGV`` in this process; return (exit code, stderr). Fails the test when the run
    ended unclean (see the module's docstring); the message names the case so it can be replayed."""
    argv = [str(a) for a in argv]
    before = {Path(p): _digest(Path(p)) for p in protect}
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    text = err.getvalue()
    where = f"npuforge {' '.join(argv)}"
    assert code in (0, 1, 2), f"{where}: exit {code}: {text.strip()[-600:]}"
    assert "Traceback" not in text, f"{where}: {text[-600:]}"
    if code == 2:
        lines = [line for line in text.strip().splitlines() if line.startswith("npuforge: error:")]
        assert len(lines) == 1, f"{where}: {text.strip()[-600:]}"
    for p, digest in before.items():
        assert _digest(p) == digest, f"{where}: changed {p}"
    return code, text


def mutations(data: bytes, rng: random.Random, count: int):
    """``count`` seeded mutations of ``data``: byte flips, overwritten runs, 32-bit fields set to
    extremes, truncations, duplicated and deleted spans."""
    n = len(data)
    extremes = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFF, 0x10000]
    for _ in range(count):
        b = bytearray(data)
        kind = rng.randrange(6)
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif kind == 1:
            i = rng.randrange(n)
            b[i:i + 4] = rng.choice(extremes).to_bytes(4, "little")[:len(b[i:i + 4])]
        elif kind == 2:
            b = b[:rng.randrange(n)]
        elif kind == 3:
            i = rng.randrange(n)
            b[i:i + rng.randint(1, 64)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif kind == 4:
            i, j = sorted(rng.randrange(n) for _ in range(2))
            b = b[:i] + b[j:]
        else:
            i, j = sorted(rng.randrange(n) for _ in range(2))
            b = b[:j] + b[i:j] + b[j:]
        yield bytes(b)
