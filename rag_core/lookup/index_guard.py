"""IndexGuard: whether the index a lookup searches can be trusted.

Two checks: before searching, that the store was built with the embedding model in use
(:meth:`IndexGuard.model_error`; vectors of two models are not comparable and scores collapse
silently, so such an index is not searched); after searching, that an L1 answer is not a damaged
or vanished index passing for "found nothing" (:meth:`IndexGuard.problem`). The last health
check (``rag_core.health``, :meth:`IndexGuard.check`) feeds the second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rag_core.lookup.retriever import RetrievalOutcome
from rag_core.settings import RagSettings

if TYPE_CHECKING:
    from rag_core.embedding.base import Embedder
    from rag_core.health import HealthReport
    from rag_core.stores.base import VectorStore

log = logging.getLogger(__name__)

# How often a long-lived tool re-reads which model the index was built with (ingest may change it).
MODEL_CHECK_S = 30.0


class IndexGuard:
    """Index checks for one tool. ``health``: the last :meth:`check` verdict (None before any).
    Thread-safe enough for its use: a race re-reads a model record, never a wrong verdict."""

    def __init__(self, settings: RagSettings) -> None:
        self.settings = settings
        self.health: HealthReport | None = None
        self._model_checks: dict[int, tuple[float, str | None]] = {}

    def model_error(self, store: VectorStore, embedder: Embedder) -> str | None:
        """The message when ``store`` was built with another embedding model than ``embedder``,
        else None. Checked at most every ``MODEL_CHECK_S`` seconds per store; an unreachable
        store or one that records nothing is left to the retriever (None)."""
        now = time.monotonic()
        checked_at, cached = self._model_checks.get(id(store), (float("-inf"), None))
        if now - checked_at < MODEL_CHECK_S:
            return cached
        recorded_model = getattr(store, "recorded_model", None)
        error = None
        try:
            recorded = recorded_model() if recorded_model else None
            active = embedder.identity()
            if recorded is not None and recorded != active:
                from rag_core.stores.base import IndexModelMismatchError

                error = str(IndexModelMismatchError(f"the {store.name} index", recorded, active))
        except Exception:  # unreachable store: the retriever reports it
            log.debug("could not read the index's model record", exc_info=True)
            return None
        self._model_checks[id(store)] = (now, error)
        return error

    def check(self, stores: Callable[[], list[VectorStore]], embedder: Callable[[], Embedder]) -> HealthReport:
        """Verify the ``stores()`` (main first) against the index state; kept as ``health``.
        Never raises: a failing check (opening a store or the model included) is a report
        naming it."""
        from rag_core.health import HealthReport, check_health

        extra: list[VectorStore] = []
        try:
            given = stores()
            extra = self._unqueried_sidecar(given)
            report = check_health(self.settings, [*given, *extra], embedder().identity())
        except Exception as exc:
            report = HealthReport(stores=[], state_problem=f"health check failed: {type(exc).__name__}: {exc}")
        finally:
            for store in extra:
                store.close()
        self.health = report
        if not report.ok:
            log.error("knowledge index check failed: %s (run `rag doctor`)", report.summary())
        return report

    def _unqueried_sidecar(self, given: list[VectorStore]) -> list[VectorStore]:
        """The pgvector store, opened for the check alone, when the last ingest wrote it but
        lookups do not query it (sidecar disabled): every store written is verified (issue 46).
        ``[]`` when not needed or when it cannot be opened (logged)."""
        from rag_core.health import written_stores

        if any(s.name == "pgvector" for s in given) or "pgvector" not in written_stores(self.settings):
            return []
        try:
            from rag_core.components import make_sidecar_store

            return [make_sidecar_store(self.settings, lookup=True)]
        except Exception as exc:
            log.warning("the pgvector sidecar written by the last ingest cannot be opened to check it: %s", exc)
            return []

    def problem(self, outcome: RetrievalOutcome, store: VectorStore, data_dir_vanished: bool) -> str | None:
        """Why the L1 answer of ``store`` (the main store) cannot be trusted, or None: the last
        health check failed for it, the data dir vanished under this process, or a non-empty
        index returned nothing at all (one ``count()`` and an index-state read, only then)."""
        store_name = getattr(store, "name", "milvus")
        if self.health is not None and self.health.problems_of(store_name):
            return ("index check failed: " + "; ".join(self.health.problems_of(store_name)) + " (run `rag doctor`)")[
                :500
            ]
        if data_dir_vanished:
            return (
                f"the data dir {self.settings.data_dir} is gone (deleted under this process?): the "
                "index may be stale or empty; run `rag ingest`"
            )
        if outcome.candidates:
            return None
        try:
            rows = store.count()
        except Exception as exc:
            return f"L1 returned nothing and the {store_name} index cannot be counted: {exc}"[:500]
        if rows > 0:
            return (
                f"L1 returned nothing from a {store_name} index of {rows} rows: the index is damaged (run `rag doctor`)"
            )
        from rag_core.ingest.index_state import read_index_state

        state, _ = read_index_state(self.settings)
        expected = state.get(store_name) if state else None
        if expected is not None and expected.rows > 0:
            return (
                f"the {store_name} index is empty but the last ingest left {expected.rows} rows: "
                "run `rag doctor` / `rag ingest`"
            )
        return None
