"""Atomic file writes: a reader (another asset, the UI, an agent) never sees half a file."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl


@contextmanager
def _temp_beside(target: Path) -> Iterator[str]:
    """A temp path in ``target``'s directory, renamed over ``target`` when the body succeeds."""
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
    """Write UTF-8 ``text`` to ``target``; returns ``target``."""
    with _temp_beside(target) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return target


def write_parquet_atomic(frame: pl.DataFrame, target: Path) -> Path:
    """Write ``frame`` as Parquet (polars' own writer) to ``target``; returns ``target``."""
    with _temp_beside(target) as tmp:
        frame.write_parquet(tmp)
    return target


def copy_atomic(source: Path, target: Path, copy: Callable[[str, str], object] = shutil.copyfile) -> Path:
    """Copy ``source`` to ``target`` (OSError when ``source`` is unreadable); returns ``target``."""
    with _temp_beside(target) as tmp:
        copy(str(source), tmp)
    return target
