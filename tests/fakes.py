"""Fakes shared by the tests: an embedder without a model (deterministic hash vectors) and a wrapper
that counts the chunk passages a real embedder embeds. Rows labelled ``title: `` (the document titles
ingest embeds for the rerank) are counted apart from chunk passages."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag_core.embedding.base import ModelIdentity, check_vectors
from rag_core.lookup.title_similarity import TITLE_LABEL

POISON = "POISON"  # a text holding it gets a NaN vector from HashEmbedder


def title_rows(ids: Sequence[str] | None) -> int:
    """How many of a batch's row labels are document titles (``title: ...``)."""
    return sum(1 for label in ids or () if label.startswith(TITLE_LABEL))


class HashEmbedder:
    """The Embedder protocol without a model: a ``dimension``-d float32 unit vector per text, drawn from a
    generator seeded with the text's sha256, so a text always gets the same vector.

    A text holding ``POISON`` gets a NaN row: ``checked=True`` behaves like the real backends (the shared
    check raises ``BadVectorError`` for the batch), ``checked=False`` returns the row as is. ``calls``
    counts ``embed_passages`` calls, ``texts`` the chunk passages embedded, ``titles`` the title rows.
    """

    backend, model_id, max_tokens = "fake", "fake-hash", 512

    def __init__(self, dimension: int, fingerprint: str = "f" * 16, checked: bool = True) -> None:
        self.dimension, self.fingerprint, self.checked = dimension, fingerprint, checked
        self.texts, self.calls, self.titles = 0, 0, 0

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.backend, self.model_id, self.dimension, self.fingerprint)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_passages(texts)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        self.calls += 1
        titles = title_rows(ids)
        self.texts, self.titles = self.texts + len(texts) - titles, self.titles + titles
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).normal(size=self.dimension).astype(np.float32)
            rows.append(np.full(self.dimension, np.nan, np.float32) if POISON in text else v / np.linalg.norm(v))
        out = np.stack(rows)
        labels = list(ids) if ids is not None else [f"text #{i}" for i in range(len(texts))]
        return check_vectors(out, labels, self.dimension) if self.checked else out


class CountingEmbedder:
    """Wraps an embedder (the real model) and counts in ``count`` the chunk passages it embeds."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.count = inner, 0

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        self.count += len(texts) - title_rows(ids)
        return self.inner.embed_passages(texts, ids)
