"""LookupKnowledgeTool: the ``lookup_knowledge`` tool the agent service calls.

Stages (one module each): KnowledgeQueryTransformer -> KnowledgeDocumentRetriever (beside it
SidecarSearch; before it and after it IndexGuard) -> DocumentSimilarity / EnsembleSimilarity
(on the candidates) -> KnowledgeEvidencePostProcessor -> SecondStageRerank (optional) ->
LookupResultAssembler.evidence -> KnowledgeContextPacker -> LookupResultAssembler ->
ToolInvocationRecorder. The components
come from :class:`rag_core.lookup.wiring.LookupComponents`. ``lookup`` never raises: every
failure becomes a structured result (``status="error"`` or an L0 fallback) and a trace row.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rag_core.breaker import CircuitBreaker
from rag_core.lookup.admission import QueryWindow
from rag_core.lookup.assembler import LookupResultAssembler
from rag_core.lookup.contracts import LookupResult, SidecarStatus, Status
from rag_core.lookup.definition import TOOL_DESCRIPTION, TOOL_NAME, tool_definition
from rag_core.lookup.index_guard import IndexGuard
from rag_core.lookup.packer import KnowledgeContextPacker
from rag_core.lookup.postprocessor import KnowledgeEvidencePostProcessor
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer, TransformedQuery
from rag_core.lookup.query_vector import query_vector
from rag_core.lookup.retriever import Candidate, KnowledgeDocumentRetriever, RetrievalOutcome
from rag_core.lookup.second_stage import SecondStageOutcome, SecondStageRerank
from rag_core.lookup.session import SessionState
from rag_core.lookup.sidecar_search import SidecarSearch
from rag_core.lookup.timing import StageTimings, timed
from rag_core.lookup.trace_row import build_trace_row
from rag_core.lookup.wiring import LookupComponents

if TYPE_CHECKING:
    from rag_core.health import HealthReport

log = logging.getLogger(__name__)

__all__ = ["TOOL_DESCRIPTION", "TOOL_NAME", "LookupKnowledgeTool", "tool_definition"]


class LookupKnowledgeTool(LookupComponents):
    """``LookupKnowledgeTool(settings).lookup(query, session_id=None) -> LookupResult``.

    Constructor arguments: see :class:`LookupComponents` (components built lazily from
    ``settings`` unless given). ``health``: the last ``check_health()`` / ``warm_up()`` verdict.
    Safe to call from several threads.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sessions = SessionState(self.settings.session_max, self.settings.session_ttl_seconds)
        self.packer = KnowledgeContextPacker(self.settings.context_char_budget)
        # The confidence model belongs to the embedding model that answers: a given embedder's,
        # else the settings' (the one make_embedder will build, or a stand-in that names none).
        given = self._embedder
        backend, model = getattr(given, "backend", None), getattr(given, "model_id", None)
        profile = (backend, model) if isinstance(backend, str) and isinstance(model, str) else None
        self.assembler = LookupResultAssembler(self.settings, profile)
        self.guard = IndexGuard(self.settings)
        self.second_stage = SecondStageRerank(self.reranker, self.settings)
        self.sidecar_search = SidecarSearch(
            self.settings, lambda: self.sidecar, lambda store: self.guard.model_error(store, self.embedder)
        )

    @property
    def health(self) -> HealthReport | None:
        return self.guard.health

    @property
    def sidecar_breaker(self) -> CircuitBreaker:
        """The sidecar's breaker (open: searches skipped until a probe succeeds)."""
        return self.sidecar_search.breaker

    def lookup(self, query: str, session_id: str | None = None, *, transport: str = "python") -> LookupResult:
        """Evidence for ``query``. Never raises; see the module docstring. ``transport`` names
        the caller's channel in the trace row (``RetrievalDetails.transport``: ``python``,
        ``cli``, ``evaluation``, or ``mcp-stdio`` / ``mcp-http`` / ``http`` from
        ``rag_core.serve``); it sets the row's ``origin``."""
        return self.lookup_with_candidates(query, session_id, transport=transport)[0]

    def lookup_with_candidates(
        self, query: str, session_id: str | None = None, use_l0_filter: bool = True, *, transport: str = "python"
    ) -> tuple[LookupResult, list[Candidate]]:
        """``lookup`` plus the fused L1 candidates before post-processing (best first), for
        evaluation fixtures and comparisons. ``use_l0_filter=False`` runs the unfiltered
        search only (the evaluation's filter cost accounting). Never raises."""
        t0 = time.perf_counter()
        timings = StageTimings()
        try:
            result, tq, candidates, second = self._lookup(query, session_id, timings, use_l0_filter)
        except Exception as exc:  # last line of defence: the agent always gets a result
            log.exception("lookup_knowledge failed")
            result, tq, candidates, second = self._error_result(query, session_id, exc), None, [], None
        self._record(result, tq, timings, (time.perf_counter() - t0) * 1000, transport, second)
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
        self._record(result, None, StageTimings(), (time.perf_counter() - t0) * 1000, transport)
        return result

    def _lookup(
        self, query: str, session_id: str | None, timings: StageTimings, use_l0_filter: bool = True
    ) -> tuple[LookupResult, TransformedQuery | None, list[Candidate], SecondStageOutcome | None]:
        """The pipeline: every stage's output is the next one's input, none is changed after."""
        if not isinstance(query, str):
            error = f"query must be a string (got {type(query).__name__})"
            return self._empty_result(f"<{type(query).__name__}>", session_id, error, "error", error), None, [], None
        if not query.strip():
            empty = self._empty_result(query, session_id, "the query is empty: ask with a question or alert text")
            return empty, None, [], None
        with timed(timings, "l0_ms"):
            tq = KnowledgeQueryTransformer(self.l0, self.settings.max_query_chars, self._query_window()).transform(
                query, use_l0_filter=use_l0_filter
            )
        outcome, sidecar_status = self._retrieve(tq, timings)
        with timed(timings, "documents_ms"):
            # A store that failed a channel of this lookup is not asked again (it may be hanging).
            store = None if any(a.error for a in outcome.attempts) else self.store
            candidates, documents_error = self.documents.annotate(outcome, store)
            outcome = replace(outcome, stage_error=documents_error)
        with timed(timings, "ensemble_ms"):
            if self.ensemble is not None and candidates:
                candidates = self.ensemble.annotate(tq, candidates)
        with timed(timings, "postprocess_ms"):
            blocks, rerank = KnowledgeEvidencePostProcessor(
                self.l0,
                self.settings.min_block_similarity,
                self.second_stage.first_stage_blocks,
                self._weights,
                ranker=self.ranker,
            ).process(candidates, tq.hints, query)
        blocks, rerank, second = self.second_stage.apply(query, blocks, rerank, tq.hints)
        if second is not None:
            timings.second_stage_ms = second.duration_ms
        with timed(timings, "postprocess_ms"):
            seen = self.sessions.seen_doc_ids(session_id)
            evidence = self.assembler.evidence(blocks, rerank, tq.hints, self.l0, seen)
        with timed(timings, "pack_ms"):
            pack = self.packer.pack(evidence.blocks)
        domains = self.sessions.update(
            session_id,
            tq.hints.domains + [b.category for b in evidence.blocks if b.category],
            [b.doc_id for b in evidence.blocks],
        )
        result = self.assembler.lookup_result(
            query, session_id, tq, outcome, evidence, pack, sidecar_status, self.store_name, domains
        )
        return result, tq, outcome.candidates, second

    def _query_window(self) -> QueryWindow | None:
        """The embedding model's query window (admission by its tokens); None when L1 is off, or
        the model does not load or tells no window (L0 still answers; the retrieval records a
        load error)."""
        if not self.settings.l1_enabled:
            return None
        try:
            embedder = self.embedder
            return QueryWindow(embedder.max_tokens, embedder.count_tokens)
        except Exception:
            return None

    def _retrieve(self, tq: TransformedQuery, timings: StageTimings) -> tuple[RetrievalOutcome, SidecarStatus]:
        """L1 on the main store (the sidecar beside it), guarded by :class:`IndexGuard`."""
        if not self.settings.l1_enabled:
            return RetrievalOutcome([], [], "l1_disabled"), SidecarStatus(status="disabled")
        try:
            with timed(timings, "embed_ms"):
                vector = query_vector(self.embedder, tq)
        except Exception as exc:
            return RetrievalOutcome([], [], None, f"embedding failed: {exc}"), SidecarStatus(status="disabled")
        mismatch = self.guard.model_error(self.store, self.embedder)
        if mismatch:
            return RetrievalOutcome([], [], None, mismatch), SidecarStatus(status="disabled")
        pending = self.sidecar_search.start(tq, vector)
        with timed(timings, "search_ms"):
            outcome = KnowledgeDocumentRetriever(self.store, self.settings).retrieve(tq, vector)
        if not outcome.error:  # a damaged or vanished index is an error in the trace, never "found nothing"
            outcome = replace(outcome, error=self.guard.problem(outcome, self.store, self.data_dir_vanished))
        return outcome, self.sidecar_search.status(pending)

    def _empty_result(
        self, query: str, session_id: str | None, message: str, status: Status = "ok", error: str | None = None
    ) -> LookupResult:
        domains = self.sessions.update(session_id, [], [])
        return self.assembler.empty(query, session_id, self.packer.pack([]), domains, message, status, error)

    def _error_result(self, query: object, session_id: str | None, exc: Exception) -> LookupResult:
        err = f"{type(exc).__name__}: {exc}"[:500]
        return self._empty_result(str(query), session_id, f"knowledge lookup failed: {err}", "error", err)

    def _record(
        self,
        result: LookupResult,
        tq: TransformedQuery | None,
        timings: StageTimings,
        ms: float,
        transport: str,
        second: SecondStageOutcome | None = None,
    ) -> None:
        try:
            recorder = self.recorder
            if recorder is not None:
                recorder.record(build_trace_row(result, tq, timings, ms, TOOL_NAME, transport, second))
        except Exception:  # tracing must never fail a lookup
            log.warning("could not hand the trace to the recorder", exc_info=True)

    def warm_up(self) -> HealthReport:
        """Load the model, the L0 index and open the store now, so the first ``lookup`` does
        not pay for them, then verify the stores against the last ingest (``rag_core.health``).

        Returns the health report (``.ok``, ``.summary()``); while it names a problem of the main
        store, every lookup carries that problem as its trace error (status degraded or error).
        Never raises.
        """
        self.load()
        return self.check_health()

    def check_health(self) -> HealthReport:
        """Verify the main store (and the sidecar when enabled) against the index state; the
        result is kept for later lookups. Never raises."""
        return self.guard.check(lambda: [s for s in (self.store, self.sidecar) if s is not None], lambda: self.embedder)

    def close(self) -> None:
        """Flush traces (no reconnect to a trace store known to be down) and release stores;
        sidecar searches still running are abandoned, not waited for."""
        self.sidecar_search.close()
        self.second_stage.close()
        if self._recorder is not None:
            self._recorder.close()
        for s in (self._store, self._sidecar):
            if s is not None:
                s.close()
