"""PassageVectors: passage-side embeddings of short texts (titles, chunks), computed on first use
and kept in a bounded LRU cache keyed by the model fingerprint and a digest of the text, so a
model change never mixes vectors and a text is embedded once per process."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

from rag_core.embedding.base import Embedder, Vector


class PassageVectors:
    """``vectors(texts) -> {text: (dimension,) unit vector}``. Thread-safe.

    Texts not cached are embedded in one ``embed_passages`` batch, their rows labelled
    ``label + text[:60]`` (so a BadVectorError names what was embedded). Raises what the embedder
    raises; the cache keeps at most ``max_entries`` vectors (least recently used out).
    """

    def __init__(self, embedder: Embedder, max_entries: int, label: str) -> None:
        self.embedder = embedder
        self._max = max_entries
        self._label = label
        self._cache: OrderedDict[tuple[str, bytes], Vector] = OrderedDict()
        self._lock = threading.Lock()

    def vectors(self, texts: Sequence[str]) -> dict[str, Vector]:
        model = self.embedder.fingerprint
        keys = {t: (model, hashlib.blake2b(t.encode(), digest_size=16).digest()) for t in set(texts)}
        with self._lock:
            found = {t: self._cache[k] for t, k in keys.items() if k in self._cache}
            for t in found:
                self._cache.move_to_end(keys[t])
        missing = sorted(t for t in keys if t not in found)
        if missing:
            rows = self.embedder.embed_passages(missing, [f"{self._label}{t[:60]}" for t in missing])
            with self._lock:
                for text, row in zip(missing, rows, strict=True):
                    self._cache[keys[text]] = found[text] = row
                while len(self._cache) > self._max:
                    self._cache.popitem(last=False)
        return found
