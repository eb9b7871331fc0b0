"""SidecarSearch: the pgvector sidecar's search beside the main store's (never affects the result).

The sidecar is searched in a small pool of its own while the main path runs; its outcome only goes
into the trace (:class:`rag_core.lookup.contracts.SidecarStatus`). It must never hold up the agent:
after the main path is done it gets ``SIDECAR_GRACE_SECONDS`` more; one that fails or hangs is
skipped until a probe succeeds (a :class:`rag_core.breaker.CircuitBreaker`, like the trace
recorder's), and at most ``settings.sidecar_queue_max`` searches wait on it at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from rag_core.breaker import CircuitBreaker
from rag_core.lookup.contracts import SidecarStatus
from rag_core.lookup.query_transformer import TransformedQuery
from rag_core.lookup.retriever import KnowledgeDocumentRetriever, RetrievalOutcome
from rag_core.settings import RagSettings

if TYPE_CHECKING:
    import numpy as np

    from rag_core.stores.base import VectorStore

SIDECAR_GRACE_SECONDS = 2.0

#: A started search (its future), the status saying why none was started, or None (sidecar off).
Pending = Future[tuple[RetrievalOutcome, float]] | SidecarStatus | None


class SidecarSearch:
    """``start(tq, vector) -> Pending`` then ``status(pending) -> SidecarStatus``.

    ``sidecar``: returns the sidecar store (None when switched off); ``model_error``: the index
    model check (:meth:`rag_core.lookup.index_guard.IndexGuard.model_error` bound to the
    embedder). Thread-safe."""

    def __init__(
        self,
        settings: RagSettings,
        sidecar: Callable[[], VectorStore | None],
        model_error: Callable[[VectorStore], str | None],
    ) -> None:
        self.settings = settings
        self._sidecar = sidecar
        self._model_error = model_error
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sidecar")
        self.breaker = CircuitBreaker(retry_after=2.0, max_retry_after=60.0)
        self._slots = threading.BoundedSemaphore(settings.sidecar_queue_max)

    def start(self, tq: TransformedQuery, vector: np.ndarray) -> Pending:
        """The sidecar search as a future, or the status saying why it was skipped (breaker
        open after a failure, or ``sidecar_queue_max`` searches already in flight); None when
        the sidecar is off."""
        if not self.settings.sidecar_enabled:
            return None
        breaker = self.breaker
        if not breaker.allow():
            return SidecarStatus(
                status="unavailable",
                reason=(
                    f"skipped: sidecar failed ({breaker.last_error or 'error'}); next try in {breaker.retry_in():.1f} s"
                )[:300],
            )
        if not self._slots.acquire(blocking=False):
            return SidecarStatus(
                status="unavailable",
                reason=(
                    f"skipped: {self.settings.sidecar_queue_max} sidecar searches already in flight "
                    "(RAG_SIDECAR_QUEUE_MAX)"
                ),
            )
        try:
            future = self._pool.submit(self._run, tq, vector)
        except RuntimeError as exc:  # pool shut down (tool closed)
            self._slots.release()
            return SidecarStatus(status="unavailable", reason=str(exc)[:300])
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def _run(self, tq: TransformedQuery, vector: np.ndarray) -> tuple[RetrievalOutcome, float]:
        t0 = time.perf_counter()
        try:
            sidecar = self._sidecar()
            if sidecar is None:  # RAG_SIDECAR_ENABLED switched off since the check in start()
                raise RuntimeError("the sidecar is disabled")
            mismatch = self._model_error(sidecar)
            if mismatch:
                self.breaker.success()  # reachable: a model mismatch is reported, not retried
                return RetrievalOutcome([], [], None, mismatch), (time.perf_counter() - t0) * 1000
            outcome = KnowledgeDocumentRetriever(sidecar, self.settings).retrieve(tq, vector)
        except Exception as exc:
            self.breaker.failure(f"{type(exc).__name__}: {exc}"[:200])
            raise
        if outcome.error:
            self.breaker.failure(outcome.error[:200])
        else:
            self.breaker.success()
        return outcome, (time.perf_counter() - t0) * 1000

    def status(self, pending: Pending) -> SidecarStatus:
        """What became of ``pending``, waiting at most ``SIDECAR_GRACE_SECONDS``."""
        if pending is None:
            return SidecarStatus(status="disabled")
        if isinstance(pending, SidecarStatus):
            return pending
        try:
            outcome, ms = pending.result(timeout=SIDECAR_GRACE_SECONDS)
        except TimeoutError:
            reason = f"no answer within {SIDECAR_GRACE_SECONDS} s"
            self.breaker.failure(reason)  # a hung sidecar is skipped from now on
            return SidecarStatus(status="unavailable", reason=reason)
        except Exception as exc:
            return SidecarStatus(status="unavailable", reason=f"{type(exc).__name__}: {exc}"[:300])
        if outcome.error:
            return SidecarStatus(status="error", reason=outcome.error[:300], duration_ms=round(ms, 2))
        doc_ids = list(dict.fromkeys(c.hit.doc_id for c in outcome.candidates))[:5]
        partial = outcome.partial_error
        return SidecarStatus(
            status="degraded" if partial else "available",
            reason=partial[:300] if partial else None,
            top_doc_ids=doc_ids,
            duration_ms=round(ms, 2),
        )

    def close(self) -> None:
        """Abandon searches still running (not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
