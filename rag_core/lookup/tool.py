"""LookupKnowledgeTool: the ``lookup_knowledge`` tool the agent service calls.

Stages (one module each): KnowledgeQueryTransformer -> KnowledgeDocumentRetriever ->
KnowledgeEvidencePostProcessor -> KnowledgeContextPacker -> LookupResultAssembler ->
ToolInvocationRecorder. ``lookup`` never raises: every failure becomes a structured result
(``status="error"`` or an L0 fallback) and a trace row.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from rag_core import components
from rag_core.breaker import CircuitBreaker
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.l0 import L0Hints, L0Index
from rag_core.lookup.assembler import LookupResultAssembler
from rag_core.lookup.contracts import (
    LookupResult,
    RetrievalTrace,
    SidecarStatus,
)
from rag_core.lookup.document_similarity import DocumentSimilarity
from rag_core.lookup.ensemble import EnsembleSimilarity
from rag_core.lookup.packer import KnowledgeContextPacker
from rag_core.lookup.postprocessor import (
    KnowledgeEvidencePostProcessor,
    RerankWeights,
    l0_fallback_blocks,
)
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer, TransformedQuery
from rag_core.lookup.query_vector import query_vector
from rag_core.lookup.ranker import LinearRanker, resolve_ranker
from rag_core.lookup.retriever import Candidate, KnowledgeDocumentRetriever, RetrievalOutcome
from rag_core.lookup.session import SessionState
from rag_core.lookup.trace_row import build_trace_row
from rag_core.settings import RagSettings

if TYPE_CHECKING:
    import numpy as np

    from rag_core.embedding.base import Embedder
    from rag_core.health import HealthReport
    from rag_core.stores.base import VectorStore
    from rag_core.traces.recorder import ToolInvocationRecorder

log = logging.getLogger(__name__)

TOOL_NAME = "lookup_knowledge"
SIDECAR_GRACE_SECONDS = 2.0
TOOL_DESCRIPTION = (
    "Look up evidence in the team's knowledge base (runbooks, how-tos, FAQs, policies). "
    "Call it with the user's question or the alert text. Answer from `contextPack.packedText`, "
    "cite `evidenceBlocks[].docId` (and breadcrumb), and check `relevanceLevel`: PRECISE or "
    "RELEVANT evidence can be relied on, WEAK means the knowledge base may not cover the "
    "question, NONE means nothing was found; `semanticSupport=false` means only title/keyword "
    "matches were available. `status`: ok, degraded (the knowledge store failed; title/keyword "
    "matches only) or error (nothing could be looked up; `message` says why)."
)


def tool_definition() -> dict[str, Any]:
    """The JSON-schema function definition (OpenAI ``tools`` format; the inner ``function``
    object is the shape most other agent frameworks take)."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The question or alert text to find evidence for."}
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


# How often a long-lived tool re-reads which model the index was built with (ingest may change it).
_MODEL_CHECK_S = 30.0


class LookupKnowledgeTool:
    """``LookupKnowledgeTool(settings).lookup(query, session_id=None) -> LookupResult``.

    Components are created lazily from ``settings`` unless given (tests pass fakes or shared
    instances): ``embedder`` (``rag_core.embedding.make_embedder``), ``store`` (MilvusStore),
    ``sidecar`` (PgVectorStore, only when ``settings.sidecar_enabled``), ``l0`` (loaded from
    the data dir; None when missing), ``recorder`` (ToolInvocationRecorder on PostgreSQL with
    a local spool), ``ensemble_embedder`` (the rerank's second model,
    ``components.make_ensemble_embedder``; one that cannot load is logged once and the rerank
    goes without it). Safe to call from several threads.
    """

    def __init__(
        self,
        settings: RagSettings | None = None,
        *,
        embedder: Embedder | None = None,
        store: VectorStore | None = None,
        sidecar: VectorStore | None = None,
        l0: L0Index | None = None,
        recorder: ToolInvocationRecorder | None = None,
        weights: RerankWeights = RerankWeights(),
        ensemble_embedder: Embedder | None = None,
    ) -> None:
        self.settings = settings or RagSettings()
        # Title vectors, written by ingest; read so a fresh process need not embed them.
        self.vector_cache = EmbeddingCache.under(self.settings.data_dir)
        self._embedder = embedder
        self._store = store
        self._sidecar = sidecar
        self._l0 = l0
        self._l0_given = l0 is not None
        self._l0_mtime: int | None = None
        self._recorder = recorder
        self._weights = weights
        self._ranker: LinearRanker | None = None
        self._documents: DocumentSimilarity | None = None
        self._ensemble: EnsembleSimilarity | None = (
            EnsembleSimilarity(ensemble_embedder) if ensemble_embedder is not None else None
        )
        self._ensemble_loaded = ensemble_embedder is not None
        self._init_lock = threading.Lock()
        self._model_checks: dict[int, tuple[float, str | None]] = {}
        self.health: HealthReport | None = None  # the last check_health() / warm_up() verdict
        self.sessions = SessionState(self.settings.session_max, self.settings.session_ttl_seconds)
        self.packer = KnowledgeContextPacker(self.settings.context_char_budget)
        self.assembler = LookupResultAssembler(self.settings)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sidecar")
        # A sidecar that fails or hangs is skipped until a probe succeeds (the trace recorder's
        # breaker), and at most sidecar_queue_max searches wait on it: lookups never queue behind it.
        self.sidecar_breaker = CircuitBreaker(retry_after=2.0, max_retry_after=60.0)
        self._sidecar_slots = threading.BoundedSemaphore(self.settings.sidecar_queue_max)

    # --- lazily built components ------------------------------------------------------------

    @property
    def l0(self) -> L0Index | None:
        """The L0 index: the one given, else the data dir's, reloaded when ingestion rewrote it."""
        if self._l0_given:
            return self._l0
        path = self.settings.l0_index_path
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            if self._l0 is None:
                log.warning("no L0 index at %s: run `rag ingest`", path)
            return self._l0
        if mtime != self._l0_mtime:
            try:
                self._l0, self._l0_mtime = L0Index.load(path), mtime
            except Exception as exc:
                log.warning("L0 index unreadable (%s): keeping the previous one", exc)
        return self._l0

    @property
    def embedder(self) -> Embedder:
        with self._init_lock:
            if self._embedder is None:
                self._embedder = components.make_embedder(self.settings)
            return self._embedder

    @property
    def ensemble(self) -> EnsembleSimilarity | None:
        """The rerank's second-model similarity (None when off or when its model cannot load)."""
        with self._init_lock:
            if not self._ensemble_loaded:
                self._ensemble_loaded = True
                try:
                    second = components.make_ensemble_embedder(self.settings)
                    self._ensemble = EnsembleSimilarity(second) if second is not None else None
                except Exception as exc:  # the rerank goes on with the main model alone
                    log.warning("ensemble similarity off: %s", exc)
            return self._ensemble

    @property
    def ranker(self) -> LinearRanker:
        """The rerank model ``settings.rerank_model`` names (:func:`resolve_ranker`), resolved
        once against the embedding models in use (the second one loaded when the setting is
        not 'hand'); the hand-set weights when it cannot be used."""
        if self._ranker is None:
            hand = self._weights.ranker()
            setting = self.settings.rerank_model
            if setting in ("", "hand"):
                self._ranker = hand
            else:
                main = self.embedder
                second = self.ensemble.embedder if self.ensemble is not None else None
                models = {"main": main.fingerprint, "second": second.fingerprint if second else ""}
                keys = {
                    "main": f"{main.backend}:{main.model_id}",
                    "second": f"{second.backend}:{second.model_id}" if second else "",
                }
                self._ranker = resolve_ranker(setting, hand, models, keys)
        return self._ranker

    @property
    def store(self) -> VectorStore:
        with self._init_lock:
            if self._store is None:
                self._store = components.make_main_store(self.settings)
            return self._store

    @property
    def sidecar(self) -> VectorStore | None:
        if not self.settings.sidecar_enabled:
            return None
        with self._init_lock:
            if self._sidecar is None:
                self._sidecar = components.make_sidecar_store(self.settings, lookup=True)
            return self._sidecar

    @property
    def recorder(self) -> ToolInvocationRecorder | None:
        if not self.settings.trace_enabled:
            return None
        with self._init_lock:
            if self._recorder is None:
                self._recorder = components.make_recorder(self.settings)
            return self._recorder

    # --- the tool -----------------------------------------------------------------------------

    def lookup(self, query: str, session_id: str | None = None, *, transport: str = "python") -> LookupResult:
        """Evidence for ``query``. Never raises; see the module docstring. ``transport`` names
        the caller's channel in the trace row (``retrieval_details["transport"]``: ``python``,
        or ``mcp-stdio`` / ``mcp-http`` / ``http`` from ``rag_core.serve``)."""
        return self.lookup_with_candidates(query, session_id, transport=transport)[0]

    def lookup_with_candidates(
        self, query: str, session_id: str | None = None, use_l0_filter: bool = True, *, transport: str = "python"
    ) -> tuple[LookupResult, list[Candidate]]:
        """``lookup`` plus the fused L1 candidates before post-processing (best first), for
        evaluation fixtures and comparisons. ``use_l0_filter=False`` runs the unfiltered
        search only (the evaluation's filter cost accounting). Never raises."""
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        try:
            result, tq, candidates = self._lookup(query, session_id, timings, use_l0_filter)
        except Exception as exc:  # last line of defence: the agent always gets a result
            log.exception("lookup_knowledge failed")
            result, tq, candidates = self._error_result(query, session_id, exc), None, []
        latency_ms = (time.perf_counter() - t0) * 1000
        self._record(result, tq, timings, latency_ms, transport)
        return result, candidates

    async def alookup(self, query: str, session_id: str | None = None, *, transport: str = "python") -> LookupResult:
        """Async variant of ``lookup`` (runs it in a worker thread)."""
        return await asyncio.to_thread(functools.partial(self.lookup, query, session_id, transport=transport))

    def rejected(self, query: str, session_id: str | None, error: str, *, transport: str = "python") -> LookupResult:
        """The structured error result for input a transport refused before any lookup (a
        missing or oversized argument: ``error`` is its one-line reason, naming the argument),
        recorded as a trace row with ``status="error"`` like any other call. Never raises."""
        t0 = time.perf_counter()
        try:
            result = self._empty_result(query, session_id, error, "error", error)
        except Exception as exc:
            result = self._error_result(query, session_id, exc)
        self._record(result, None, {}, (time.perf_counter() - t0) * 1000, transport)
        return result

    def _lookup(
        self, query: str, session_id: str | None, timings: dict[str, float], use_l0_filter: bool = True
    ) -> tuple[LookupResult, TransformedQuery | None, list[Candidate]]:
        if not isinstance(query, str):
            error = f"query must be a string (got {type(query).__name__})"
            return self._empty_result(f"<{type(query).__name__}>", session_id, error, "error", error), None, []
        if not query.strip():
            return (
                self._empty_result(query, session_id, "the query is empty: ask with a question or alert text"),
                None,
                [],
            )
        with _timed(timings, "l0_ms"):
            tq = KnowledgeQueryTransformer(self.l0, self.settings.max_query_chars).transform(
                query, use_l0_filter=use_l0_filter
            )
        outcome, sidecar_status = self._retrieve(tq, timings)
        if self.settings.l1_enabled and not outcome.error:
            # A damaged or vanished index is an error in the trace, never "found nothing".
            outcome.error = self._index_problem(outcome)
        with _timed(timings, "documents_ms"):
            documents = self._document_similarities(outcome)
        with _timed(timings, "ensemble_ms"):
            ensemble = self._ensemble_similarities(tq, outcome)
        with _timed(timings, "postprocess_ms"):
            post = KnowledgeEvidencePostProcessor(
                self.l0,
                self.settings.min_block_similarity,
                self.settings.max_evidence_blocks,
                self._weights,
                ranker=self.ranker,
            )
            blocks, rerank = post.process(outcome.candidates, tq.hints, documents, ensemble, query)
            layer = ("L0+L1" if tq.hints.matched else "L1") if blocks else "none"
            # L0 matches are offered whenever L1 gave no usable evidence: when it failed, was
            # disabled, or found only candidates below the minimum block similarity.
            if not blocks and tq.hints.matched:
                blocks = l0_fallback_blocks(tq.hints, self.l0, self.settings.max_evidence_blocks)
                rerank, layer = [], "L0"
            seen = self.sessions.seen_doc_ids(session_id)
            for b in blocks:
                if b.doc_id in seen:
                    b.hit_reasons.append("seen_earlier_in_session")
        with _timed(timings, "pack_ms"):
            pack = self.packer.pack(blocks)
        domains = self.sessions.update(
            session_id, tq.hints.domains + [b.category for b in blocks if b.category], [b.doc_id for b in blocks]
        )
        trace = RetrievalTrace(
            store=getattr(self.store, "name", "milvus") if self.settings.l1_enabled else "none",
            layer=layer,
            attempts=outcome.attempts,
            candidate_count=len(outcome.candidates),
            fallback_reason=("l0_fallback: " + (outcome.error or _no_l1_evidence(outcome, self.settings)))
            if layer == "L0"
            else outcome.fallback_reason,
            error=outcome.error,
            query_truncated=tq.truncated,
            l0_hints=tq.hints,
            sidecar=sidecar_status,
        )
        message = None
        if layer == "L0" and (outcome.error or not self.settings.l1_enabled):
            message = (
                "semantic retrieval unavailable; returning title/keyword (L0) matches only: "
                "verify before relying on them"
            )
        elif layer == "L0":
            message = (
                "semantic retrieval found no evidence above the minimum similarity; returning "
                "title/keyword (L0) matches only: verify before relying on them"
            )
        elif outcome.error and not blocks:
            message = f"knowledge retrieval failed and nothing matched by title: {outcome.error}"
        status = ("error" if not blocks else "degraded") if outcome.error else "ok"
        result = self.assembler.assemble(
            query, session_id, blocks, pack, trace, rerank, tq.hints, domains, message, status
        )
        return result, tq, outcome.candidates

    def _document_similarities(self, outcome: RetrievalOutcome) -> dict[str, float]:
        """Doc id -> cosine of the query vector and the candidate document's title plus its
        cosine with the document's centroid ({} when L1 found nothing)."""
        if outcome.query_vector is None or not outcome.candidates:
            return {}
        embedder = self.embedder
        # A store that failed a channel of this lookup is not asked again (it may be hanging).
        store = None if any(a.error for a in outcome.attempts) else self.store
        with self._init_lock:
            if self._documents is None:
                self._documents = DocumentSimilarity(embedder, self.vector_cache)
            similarity = self._documents
        titles = {c.hit.doc_id: c.hit.title for c in outcome.candidates}
        return similarity.similarities(store, outcome.query_vector, titles)

    def _ensemble_similarities(self, tq: TransformedQuery, outcome: RetrievalOutcome) -> dict[str, float]:
        """Chunk id -> the second model's cosine of query and chunk ({} when L1 found nothing or
        the second model is off)."""
        if not outcome.candidates:
            return {}
        ensemble = self.ensemble
        return ensemble.similarities(tq, outcome.candidates) if ensemble is not None else {}

    def _retrieve(self, tq: TransformedQuery, timings: dict[str, float]) -> tuple[RetrievalOutcome, SidecarStatus]:
        if not self.settings.l1_enabled:
            return RetrievalOutcome([], [], "l1_disabled"), SidecarStatus(status="disabled")
        try:
            with _timed(timings, "embed_ms"):
                vector = query_vector(self.embedder, tq)
        except Exception as exc:
            return RetrievalOutcome([], [], None, f"embedding failed: {exc}"), SidecarStatus(status="disabled")
        mismatch = self._index_model_error()
        if mismatch:
            return RetrievalOutcome([], [], None, mismatch), SidecarStatus(status="disabled")
        sidecar_future = self._start_sidecar(tq, vector)
        with _timed(timings, "search_ms"):
            outcome = KnowledgeDocumentRetriever(self.store, self.settings).retrieve(tq, vector)
        return outcome, self._sidecar_status(sidecar_future)

    def _index_model_error(self, store: VectorStore | None = None) -> str | None:
        """The message when ``store`` (default: the main one) was built with another embedding
        model, else None.

        Vectors of two models are not comparable (scores collapse silently), so such an index
        is not searched. Checked at most every ``_MODEL_CHECK_S`` seconds per store; an
        unreachable store or one that records nothing is left to the retriever.
        """
        store = self.store if store is None else store
        now = time.monotonic()
        checked_at, cached = self._model_checks.get(id(store), (float("-inf"), None))
        if now - checked_at < _MODEL_CHECK_S:
            return cached
        recorded_model = getattr(store, "recorded_model", None)
        error = None
        try:
            recorded = recorded_model() if recorded_model else None
            active = self.embedder.identity()
            if recorded is not None and recorded != active:
                from rag_core.stores.base import IndexModelMismatchError

                error = str(IndexModelMismatchError(f"the {store.name} index", recorded, active))
        except Exception:  # unreachable store: the retriever reports it
            log.debug("could not read the index's model record", exc_info=True)
            return None
        self._model_checks[id(store)] = (now, error)
        return error

    def _start_sidecar(
        self, tq: TransformedQuery, vector: np.ndarray
    ) -> Future[tuple[RetrievalOutcome, float]] | SidecarStatus | None:
        """The sidecar search as a future, or the status saying why it was skipped (breaker
        open after a failure, or ``sidecar_queue_max`` searches already in flight)."""
        if not self.settings.sidecar_enabled:
            return None
        breaker = self.sidecar_breaker
        if not breaker.allow():
            return SidecarStatus(
                status="unavailable",
                reason=(
                    f"skipped: sidecar failed ({breaker.last_error or 'error'}); next try in {breaker.retry_in():.1f} s"
                )[:300],
            )
        if not self._sidecar_slots.acquire(blocking=False):
            return SidecarStatus(
                status="unavailable",
                reason=(
                    f"skipped: {self.settings.sidecar_queue_max} sidecar searches already in flight "
                    "(RAG_SIDECAR_QUEUE_MAX)"
                ),
            )

        def run() -> tuple[RetrievalOutcome, float]:
            t0 = time.perf_counter()
            try:
                sidecar = self.sidecar
                if sidecar is None:  # RAG_SIDECAR_ENABLED switched off since the check above
                    raise RuntimeError("the sidecar is disabled")
                mismatch = self._index_model_error(sidecar)
                if mismatch:
                    breaker.success()  # reachable: a model mismatch is reported, not retried
                    return RetrievalOutcome([], [], None, mismatch), (time.perf_counter() - t0) * 1000
                outcome = KnowledgeDocumentRetriever(sidecar, self.settings).retrieve(tq, vector)
            except Exception as exc:
                breaker.failure(f"{type(exc).__name__}: {exc}"[:200])
                raise
            if outcome.error:
                breaker.failure(outcome.error[:200])
            else:
                breaker.success()
            return outcome, (time.perf_counter() - t0) * 1000

        try:
            future = self._pool.submit(run)
        except RuntimeError as exc:  # pool shut down (tool closed)
            self._sidecar_slots.release()
            return SidecarStatus(status="unavailable", reason=str(exc)[:300])
        future.add_done_callback(lambda _f: self._sidecar_slots.release())
        return future

    def _sidecar_status(self, future: Future[tuple[RetrievalOutcome, float]] | SidecarStatus | None) -> SidecarStatus:
        if future is None:
            return SidecarStatus(status="disabled")
        if isinstance(future, SidecarStatus):
            return future
        try:
            # The sidecar must not hold up the agent: a short grace after the main path is done.
            outcome, ms = future.result(timeout=SIDECAR_GRACE_SECONDS)
        except TimeoutError:
            reason = f"no answer within {SIDECAR_GRACE_SECONDS} s"
            self.sidecar_breaker.failure(reason)  # a hung sidecar is skipped from now on
            return SidecarStatus(status="unavailable", reason=reason)
        except Exception as exc:
            return SidecarStatus(status="unavailable", reason=f"{type(exc).__name__}: {exc}"[:300])
        if outcome.error:
            return SidecarStatus(status="error", reason=outcome.error[:300], duration_ms=round(ms, 2))
        doc_ids = list(dict.fromkeys(c.hit.doc_id for c in outcome.candidates))[:5]
        return SidecarStatus(status="available", top_doc_ids=doc_ids, duration_ms=round(ms, 2))

    # --- results without retrieval ----------------------------------------------------------

    def _empty_result(
        self, query: str, session_id: str | None, message: str, status: str = "ok", error: str | None = None
    ) -> LookupResult:
        pack = self.packer.pack([])
        trace = RetrievalTrace(store="none", layer="none", attempts=[], error=error)
        return self.assembler.assemble(
            query, session_id, [], pack, trace, [], L0Hints(), self.sessions.update(session_id, [], []), message, status
        )

    def _error_result(self, query: object, session_id: str | None, exc: Exception) -> LookupResult:
        err = f"{type(exc).__name__}: {exc}"[:500]
        return self._empty_result(str(query), session_id, f"knowledge lookup failed: {err}", "error", err)

    def _record(
        self,
        result: LookupResult,
        tq: TransformedQuery | None,
        timings: dict[str, float],
        latency_ms: float,
        transport: str = "python",
    ) -> None:
        try:
            recorder = self.recorder
            if recorder is None:
                return
            recorder.record(build_trace_row(result, tq, timings, latency_ms, TOOL_NAME, transport))
        except Exception:  # tracing must never fail a lookup
            log.warning("could not hand the trace to the recorder", exc_info=True)

    def warm_up(self) -> HealthReport:
        """Load the model, the L0 index and open the store now, so the first ``lookup`` does
        not pay for them, then verify the stores against the last ingest (``rag_core.health``).

        Returns the health report (``.ok``, ``.summary()``); while it names a problem of the main
        store, every lookup carries that problem as its trace error (status degraded or error).
        Never raises.
        """
        try:
            self.embedder.embed_query("warm up")
            if self.ensemble is not None:  # USE's first query also pays its set-up (about 2 s)
                self.ensemble.embedder.embed_query("warm up")
            _ = self.l0
            self.store.count()
        except Exception as exc:
            log.warning("warm-up incomplete: %s", exc)
        return self.check_health()

    def check_health(self) -> HealthReport:
        """Verify the main store (and the sidecar when enabled) against the index state; the
        result is kept for later lookups. Never raises."""
        from rag_core.health import HealthReport, check_health

        try:
            store, sidecar = self.store, self.sidecar  # sidecar: None unless sidecar_enabled
            stores = [store] + ([sidecar] if sidecar is not None else [])
            report = check_health(self.settings, stores, self.embedder.identity())
        except Exception as exc:
            report = HealthReport(stores=[], state_problem=f"health check failed: {type(exc).__name__}: {exc}")
        self.health = report
        if not report.ok:
            log.error("knowledge index check failed: %s (run `rag doctor`)", report.summary())
        return report

    def _index_problem(self, outcome: RetrievalOutcome) -> str | None:
        """Why the L1 answer cannot be trusted, or None: the last health check failed for the
        main store, the data dir vanished under this process, or a non-empty index returned
        nothing at all."""
        store_name = getattr(self.store, "name", "milvus")
        if self.health is not None and self.health.problems_of(store_name):
            return ("index check failed: " + "; ".join(self.health.problems_of(store_name)) + " (run `rag doctor`)")[
                :500
            ]
        if not self._l0_given and self._l0_mtime is not None and not self.settings.data_dir.exists():
            return (
                f"the data dir {self.settings.data_dir} is gone (deleted under this process?): the "
                "index may be stale or empty; run `rag ingest`"
            )
        if outcome.candidates:
            return None
        try:
            rows = self.store.count()
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

    def close(self) -> None:
        """Flush traces (no reconnect to a trace store known to be down) and release stores;
        sidecar searches still running are abandoned, not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._recorder is not None:
            self._recorder.close()
        for s in (self._store, self._sidecar):
            if s is not None:
                s.close()


def _no_l1_evidence(outcome: RetrievalOutcome, settings: RagSettings) -> str:
    if not settings.l1_enabled:
        return "L1 disabled"
    if not outcome.candidates:
        return "L1 returned nothing"
    return f"no L1 candidate reached the minimum block similarity {settings.min_block_similarity}"


class _timed:
    def __init__(self, timings: dict[str, float], key: str) -> None:
        self.timings, self.key = timings, key

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> Literal[False]:
        self.timings[self.key] = round(self.timings.get(self.key, 0.0) + (time.perf_counter() - self.t0) * 1000, 3)
        return False
