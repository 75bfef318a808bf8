"""Writing files so that a failure never leaves half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path, data: bytes) -> None:
    """Write beside the target and rename, so a failure leaves any earlier file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # a temporary file is private; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
