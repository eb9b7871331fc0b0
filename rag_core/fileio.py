"""Atomic file writes: a reader (another process, an asset, the UI, an agent) never sees half a
file. Write to a temp file beside the target, then ``os.replace`` it over the target (atomic on
POSIX within one file system). No fsync: after a power loss a torn file is possible, and every
reader here treats an unreadable file as absent or corrupt, which is cheaper than an fsync per write.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["portable_path", "temp_beside", "write_text_atomic"]


@contextmanager
def temp_beside(target: Path) -> Iterator[str]:
    """A temp path in ``target``'s directory (created), renamed over ``target`` when the body
    succeeds and removed when it raises."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(target: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``target`` atomically; returns ``target``. OSError as ``open`` raises it."""
    with temp_beside(target) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return target


def portable_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a report should name it: relative to the working directory (the checkout) when
    it lies in it or beside it (``../shared/golden/x.yaml``), so committed reports read the same
    on every machine; absolute otherwise (a temp dir)."""
    absolute = Path(path).resolve()
    here = Path.cwd().resolve()
    if absolute.is_relative_to(here) or (here.parent != here and absolute.is_relative_to(here.parent)):
        return os.path.relpath(absolute, here)
    return str(absolute)
