"""Writing files so that nothing already written is lost or left half-written (DESIGN rule 8)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temp file in the target's folder, fsync, then rename over ``path``.

    A reader sees the old file or the new one, never a mix; on any failure the temp file is
    removed and an existing ``path`` is untouched. The file gets the mode an existing one had
    (else the umask's default), not mkstemp's 0600.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a folder; give a file name inside it")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.chmod(tmp, _file_mode(p))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """``write_bytes_atomic`` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def _file_mode(p: Path) -> int:
    """The mode an existing ``p`` has, else what a new file gets under the process umask."""
    try:
        return p.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
