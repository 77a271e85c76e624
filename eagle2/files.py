"""Files this project writes for later runs or for a visitor: whole or not at all.

`write_atomic` writes a temporary file in the same folder, flushes it to disk and renames it over the target
(`os.replace` is atomic on one filesystem), so a process killed mid-write (SIGKILL, the OOM killer, a container
stop) leaves the previous file or none, never half of one; the next run reads a whole file or makes it again.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
