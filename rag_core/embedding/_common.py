"""Shared plumbing of the in-process backends: batching, the encode gate and the vector check."""

from __future__ import annotations

import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np

from rag_core.embedding.base import Matrix, ModelIdentity, Vector, check_vectors, default_labels, fingerprint

#: How much later than its arrival an encode queues per token it embeds (seconds): the cheapest
#: waiting encode goes first, and a long one is not starved for ever (a 512-token query yields to
#: the short ones arriving within 1 s of it, then runs).
AGING_S_PER_TOKEN = 2e-3
#: Passage batches (ingest, title vectors) queue behind every query waiting.
PASSAGE_DELAY_S = 3600.0


class EmbedDeadlineError(TimeoutError):
    """A query waited longer than its deadline for the model (other encodes held it)."""


class EncodeGate:
    """Admits at most ``slots`` encodes at once, of which at most ``heavy_slots`` heavy ones,
    the waiting encode with the earliest key first: ``arrival + delay``, where the caller's
    ``delay`` grows with the encode's size. A FIFO lock made one heavy query (or a passage
    batch) hold every short query behind it; here a short query waits for at most the encodes
    under way, and with more than one slot a heavy query never takes the last one."""

    def __init__(self, slots: int = 1, heavy_slots: int | None = None) -> None:
        self.slots, self.heavy_slots = slots, heavy_slots if heavy_slots is not None else slots
        self._cond = threading.Condition()
        self._waiting: list[tuple[float, int, bool]] = []
        self._running = self._heavy_running = 0
        self._seq = itertools.count()

    def _may_start(self, entry: tuple[float, int, bool]) -> bool:
        """True when ``entry`` gets a slot once every waiting encode before it that fits has one."""
        free, heavy_free = self.slots - self._running, self.heavy_slots - self._heavy_running
        for other in sorted(self._waiting):
            if free <= 0:
                return False
            fits = not other[2] or heavy_free > 0
            if other == entry:
                return fits
            if fits:
                free, heavy_free = free - 1, heavy_free - other[2]
        return False

    @property
    def running(self) -> int:
        """Encodes holding a slot now."""
        return self._running

    @contextmanager
    def turn(self, delay_s: float, timeout_s: float | None = None, heavy: bool = False) -> Iterator[None]:
        """Hold a slot inside the ``with`` block. Raises EmbedDeadlineError when the turn has
        not come within ``timeout_s`` seconds (None: wait as long as it takes)."""
        entry = (time.monotonic() + delay_s, next(self._seq), heavy)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._waiting.append(entry)
            while not self._may_start(entry):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._waiting.remove(entry)
                    self._cond.notify_all()
                    raise EmbedDeadlineError(f"the embedding model stayed busy for {timeout_s:g} s")
                self._cond.wait(left)
            self._waiting.remove(entry)
            self._running, self._heavy_running = self._running + 1, self._heavy_running + heavy
            self._cond.notify_all()  # a further slot may be free for the next one
        try:
            yield
        finally:
            with self._cond:
                self._running, self._heavy_running = self._running - 1, self._heavy_running - heavy
                self._cond.notify_all()


class BaseEmbedder(ABC):
    """Implements the ``Embedder`` protocol around two raw encoders (query side, passage side).

    Subclasses give ``backend``, ``model_id``, ``dimension``, ``max_tokens``, ``count_tokens``,
    ``_settings()`` (what goes into the fingerprint) and ``_encode(texts, is_query)``. Calls go
    through one :class:`EncodeGate` (one slot unless a backend runs encodes side by side):
    short queries first, passage batches last; a query that
    waits longer than ``query_wait_s`` (None: no limit; ``RAG_QUERY_EMBED_WAIT_S`` through the
    factory) raises EmbedDeadlineError, which the lookup answers as a failed L1 search.
    """

    backend: str = ""

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size
        self.query_wait_s: float | None = None
        self._gate = EncodeGate()

    def _query_turn(self, texts: Sequence[str]) -> AbstractContextManager[None]:
        """The gate's turn for a query encode of ``texts``: its cost is their tokens, heavy past
        a quarter of the model's window."""
        tokens = sum(map(self.count_tokens, texts))
        return self._gate.turn(AGING_S_PER_TOKEN * tokens, self.query_wait_s, tokens > self.max_tokens // 4)

    @property
    @abstractmethod
    def model_id(self) -> str: ...

    @property
    @abstractmethod
    def dimension(self) -> int: ...

    @property
    @abstractmethod
    def max_tokens(self) -> int: ...

    @abstractmethod
    def count_tokens(self, text: str) -> int: ...

    @abstractmethod
    def _settings(self) -> dict[str, Any]:
        """Everything that changes the vectors (goes into the fingerprint)."""

    @abstractmethod
    def _encode(self, texts: list[str], is_query: bool) -> Any:
        """Raw ``(n, dim)`` array-like for ``texts``."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(
            {"backend": self.backend, "model_id": self.model_id, "dimension": self.dimension, **self._settings()}
        )

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.backend, self.model_id, self.dimension, self.fingerprint)

    def embed_query(self, text: str) -> Vector:
        """``(dimension,)`` float32, unit norm. BadVectorError when the model gives no direction."""
        with self._query_turn([text]):
            raw = self._encode([text], True)
        vector: Vector = check_vectors(np.asarray(raw).reshape(1, -1), ["query"], self.dimension)[0]
        return vector

    def embed_queries(self, texts: Sequence[str]) -> Matrix:
        """``(len(texts), dimension)`` float32 unit rows, query side, in one call to the model."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._query_turn(texts):
            raw = self._encode(list(texts), True)
        labels = [f"query view {i}" for i in range(len(texts))]
        return check_vectors(np.asarray(raw, dtype=np.float32).reshape(len(texts), -1), labels, self.dimension)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> Matrix:
        """``(len(texts), dimension)`` float32, unit rows; BadVectorError names the bad row's id."""
        labels = list(ids) if ids is not None else default_labels(len(texts))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = []
        for i in range(0, len(texts), self.batch_size):
            with self._gate.turn(PASSAGE_DELAY_S):
                parts.append(
                    np.asarray(self._encode(list(texts[i : i + self.batch_size]), False), dtype=np.float32).reshape(
                        -1, self.dimension
                    )
                )
        return check_vectors(np.concatenate(parts), labels, self.dimension)
