"""Writing files so that a failure never leaves half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import NpuforgeError


def write_atomic(path, data: bytes) -> None:
    """Write beside the target and rename, so a failure leaves any earlier file intact."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():  # a folder, a device node, a pipe: never replaced
        raise NpuforgeError(f"{path}: exists and is not a regular file; npuforge replaces only regular files")
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
