"""Atomic file writes: a reader (another asset, the UI, an agent) never sees half a file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import polars as pl

from rag_core.fileio import temp_beside, write_text_atomic

__all__ = ["copy_atomic", "write_parquet_atomic", "write_text_atomic"]


def write_parquet_atomic(frame: pl.DataFrame, target: Path) -> Path:
    """Write ``frame`` as Parquet (polars' own writer) to ``target``; returns ``target``."""
    with temp_beside(target) as tmp:
        frame.write_parquet(tmp)
    return target


def copy_atomic(source: Path, target: Path, copy: Callable[[str, str], object] = shutil.copyfile) -> Path:
    """Copy ``source`` to ``target`` (OSError when ``source`` is unreadable); returns ``target``."""
    with temp_beside(target) as tmp:
        copy(str(source), tmp)
    return target
