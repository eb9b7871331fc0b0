"""PassageVectors: passage-side embeddings of short texts (titles, chunks), computed on first use
and kept in a bounded LRU cache keyed by the model fingerprint and a digest of the text, so a
model change never mixes vectors and a text is embedded once per process. With a disk cache
(the data dir's ``EmbeddingCache``, which ingest fills with the title vectors) a fresh process
reads what the ingest embedded instead of embedding it again; lookups only read it (a write
could wait on an ingest's lock)."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence

from rag_core.embedding.base import Embedder, Vector
from rag_core.ingest.embed_cache import EmbeddingCache

log = logging.getLogger(__name__)


class PassageVectors:
    """``vectors(texts) -> {text: (dimension,) unit vector}``. Thread-safe.

    Texts not cached in memory are read from ``disk`` (when given), the rest embedded in one
    ``embed_passages`` batch, their rows labelled ``label + text[:60]`` (so a BadVectorError
    names what was embedded) and, with ``store_new``, written to ``disk``. Raises what the
    embedder raises; a disk cache that cannot be read or written is logged and skipped. The memory cache keeps at
    most ``max_entries`` vectors (least recently used out).
    """

    def __init__(self, embedder: Embedder, max_entries: int, label: str, disk: EmbeddingCache | None = None) -> None:
        self.embedder = embedder
        self._max = max_entries
        self._label = label
        self._disk = disk
        self._cache: OrderedDict[tuple[str, bytes], Vector] = OrderedDict()
        self._lock = threading.Lock()
        self.embedded = 0  # texts this instance had to embed (not found in memory or on disk)

    def disk_key(self, text: str) -> str:
        """The disk cache key of ``text``: the label and a digest (chunk keys are bare sha256)."""
        return self._label + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def vectors(self, texts: Sequence[str], store_new: bool = False) -> dict[str, Vector]:
        model = self.embedder.fingerprint
        keys = {t: (model, hashlib.blake2b(t.encode(), digest_size=16).digest()) for t in set(texts)}
        with self._lock:
            found = {t: self._cache[k] for t, k in keys.items() if k in self._cache}
            for t in found:
                self._cache.move_to_end(keys[t])
        missing = sorted(t for t in keys if t not in found)
        stored = self._read_disk(missing)
        fresh = [t for t in missing if t not in stored]
        embedded: dict[str, Vector] = {}
        if fresh:
            rows = self.embedder.embed_passages(fresh, [f"{self._label}{t[:60]}" for t in fresh])
            embedded = dict(zip(fresh, rows, strict=True))
        self.embedded += len(embedded)
        if embedded and store_new:
            self._write_disk(embedded)
        with self._lock:
            for text, row in {**stored, **embedded}.items():
                self._cache[keys[text]] = found[text] = row
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return found

    def _read_disk(self, texts: list[str]) -> dict[str, Vector]:
        if self._disk is None or not texts:
            return {}
        by_key = {self.disk_key(t): t for t in texts}
        try:
            rows = self._disk.get_many(self.embedder.identity(), by_key)
        except sqlite3.Error as exc:
            log.info("passage vector cache %s not read: %s", self._disk.path, exc)
            return {}
        return {by_key[k]: v for k, v in rows.items()}

    def _write_disk(self, vectors: dict[str, Vector]) -> None:
        if self._disk is None:
            return
        try:
            self._disk.put_many(self.embedder.identity(), {self.disk_key(t): v for t, v in vectors.items()})
        except sqlite3.Error as exc:
            log.info("passage vector cache %s not written: %s", self._disk.path, exc)
