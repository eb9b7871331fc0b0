"""LookupResultAssembler: which evidence layer answers, the retrieval trace, relevance
assessment, message, status, completeness hint and the LookupResult.

Layer rules (:meth:`LookupResultAssembler.evidence`): L1 blocks when the post-processor kept
any (``L0+L1`` when L0 also matched the query, else ``L1``); otherwise the L0 title/keyword
matches (``L0``) when there are any, whether L1 failed, was disabled or found only candidates
below the minimum block similarity; otherwise ``none``. Status: ``ok`` unless retrieval failed
(``outcome.error``): then ``degraded`` with L0 evidence, ``error`` without any; ``degraded`` too
when part of it failed (``outcome.partial_error``: a channel or attempt errored while the others
answered, e.g. a lookup in flight across a store restart), with a message naming what failed.

Relevance (:meth:`LookupResultAssembler.relevance`): with a calibrated confidence model for the
embedding models in use (:mod:`rag_core.lookup.confidence`), L1 evidence gets a ``confidence``
and the level is its band; ``found`` is false when that band is NONE (the knowledge base
probably has no answer; the evidence is still listed). Without one, and for L0-only evidence,
the similarity thresholds of :func:`assess_relevance` set the level and ``found`` says whether
there is any evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from rag_core.l0 import L0Hints, L0Index
from rag_core.lookup.confidence import band, language_pair, load_confidence_model, signals
from rag_core.lookup.contracts import (
    ContextPack,
    EvidenceBlock,
    Layer,
    LookupResult,
    RelevanceLevel,
    RerankEntry,
    RetrievalTrace,
    SidecarStatus,
    Status,
)
from rag_core.lookup.postprocessor import l0_fallback_blocks
from rag_core.lookup.query_transformer import TransformedQuery
from rag_core.lookup.retriever import RetrievalOutcome
from rag_core.settings import RagSettings

SEEN_REASON = "seen_earlier_in_session"


@dataclass(frozen=True)
class Evidence:
    """The evidence a lookup answers with: ``blocks`` best first, their ``rerank`` entries (L1
    only; [] for L0 fallback blocks) and the ``layer`` they come from."""

    blocks: list[EvidenceBlock]
    rerank: list[RerankEntry]
    layer: Layer


def assess_relevance(blocks: list[EvidenceBlock], hints: L0Hints, layer: str, settings: RagSettings) -> RelevanceLevel:
    """PRECISE: the top L1 block's similarity >= ``high_relevance_threshold`` and L0 matched
    that same document. RELEVANT: top similarity >= ``relevant_threshold`` (or >= high without
    L0 agreement). WEAK: evidence below that, and every L0-only answer (title/keyword matches
    without semantic retrieval claim no relevance beyond "verify first"). NONE: no evidence.
    """
    if not blocks:
        return RelevanceLevel.NONE
    top = blocks[0]
    if layer == "L0":
        return RelevanceLevel.WEAK
    agrees = top.doc_id in hints.matched_doc_ids
    if top.similarity >= settings.high_relevance_threshold and agrees:
        return RelevanceLevel.PRECISE
    if top.similarity >= settings.relevant_threshold:
        return RelevanceLevel.RELEVANT
    return RelevanceLevel.WEAK


def _default_message(count: int, rel: Relevance) -> str:
    if not count:
        return "no evidence found in the knowledge base for this query"
    if not rel.found:
        return (
            f"the knowledge base probably has no answer (confidence {rel.confidence:.2f}); {count} "
            "evidence block(s) listed for reference only: do not rely on them"
        )
    shown = "" if rel.confidence is None else f", confidence {rel.confidence:.2f}"
    return (
        f"{count} evidence block(s), relevance {rel.level.value}{shown}; use contextPack "
        "for the answer and cite evidenceBlocks[].docId"
    )


def completeness_hint(blocks: list[EvidenceBlock], pack: ContextPack, layer: str) -> str:
    if not blocks:
        return "no evidence found"
    if layer == "L0":
        return (
            "only L0 (title/keyword) evidence, no semantic support: content is a document "
            "summary; verify before relying on it"
        )
    if pack.omitted_doc_ids:
        return (
            f"{len(pack.omitted_doc_ids)} source document(s) omitted by the {pack.char_budget}-character "
            f"budget: {', '.join(pack.omitted_doc_ids)}"
        )
    return "all evidence blocks included in the context pack"


def no_l1_evidence(outcome: RetrievalOutcome, settings: RagSettings) -> str:
    """Why L1 gave no usable evidence (retrieval itself did not fail)."""
    if not settings.l1_enabled:
        return "L1 disabled"
    if not outcome.candidates:
        return "L1 returned nothing"
    return f"no L1 candidate reached the minimum block similarity {settings.min_block_similarity}"


@dataclass(frozen=True)
class Relevance:
    """The relevance assessment: ``level``, ``confidence`` (None: not calibrated), ``found``
    and the rerank entries with the top one's ``confidence_signals`` set."""

    level: RelevanceLevel
    confidence: float | None
    found: bool
    rerank: list[RerankEntry]


class LookupResultAssembler:
    """Layer, trace, message, status and relevance rules (module docstring) and the ``LookupResult``."""

    def __init__(self, settings: RagSettings, embedding_profile: tuple[str, str] | None = None):
        """``embedding_profile``: ``(backend, model)`` of the embedder in use when it is not the
        settings' own; the confidence model is that profile's (None when it has none)."""
        self.settings = settings
        backend, model = embedding_profile or (settings.embedding_backend, settings.embedding_model)
        self.confidence_model = load_confidence_model(backend, model, settings.ensemble_backend)

    def relevance(
        self, query: str, blocks: list[EvidenceBlock], rerank: list[RerankEntry], hints: L0Hints, layer: str
    ) -> Relevance:
        """The calibrated band of the top block's confidence when a confidence model applies
        (L1 evidence), else :func:`assess_relevance` (module docstring)."""
        model = self.confidence_model
        if model is None or layer == "L0":
            return Relevance(assess_relevance(blocks, hints, layer, self.settings), None, bool(blocks), rerank)
        if not blocks:
            return Relevance(RelevanceLevel.NONE, 0.0, False, rerank)
        confidence, explained = model.explain(language_pair(query, blocks[0]), signals(blocks, rerank, hints))
        level = band(confidence)
        if rerank:
            rerank = [rerank[0].model_copy(update={"confidence_signals": explained}), *rerank[1:]]
        return Relevance(level, confidence, level is not RelevanceLevel.NONE, rerank)

    def evidence(
        self,
        blocks: list[EvidenceBlock],
        rerank: list[RerankEntry],
        hints: L0Hints,
        l0: L0Index | None,
        seen: set[str],
    ) -> Evidence:
        """The answering evidence from the post-processor's ``blocks`` / ``rerank`` (module
        docstring); blocks of a document in ``seen`` (shown earlier in the session) get the hit
        reason ``seen_earlier_in_session`` (new blocks, the inputs are not changed)."""
        if blocks:
            layer: Layer = "L0+L1" if hints.matched else "L1"
        elif hints.matched:
            blocks, rerank, layer = l0_fallback_blocks(hints, l0, self.settings.max_evidence_blocks), [], "L0"
        else:
            layer = "none"
        marked = [
            b.model_copy(update={"hit_reasons": [*b.hit_reasons, SEEN_REASON]}) if b.doc_id in seen else b
            for b in blocks
        ]
        return Evidence(marked, rerank, layer)

    def trace(
        self, outcome: RetrievalOutcome, evidence: Evidence, tq: TransformedQuery, sidecar: SidecarStatus, store: str
    ) -> RetrievalTrace:
        """How L1 ran; ``store``: the main store's name (``none`` when L1 is disabled)."""
        fallback = outcome.fallback_reason
        if evidence.layer == "L0":
            fallback = "l0_fallback: " + (outcome.error or no_l1_evidence(outcome, self.settings))
        return RetrievalTrace(
            store=store if self.settings.l1_enabled else "none",
            layer=evidence.layer,
            attempts=outcome.attempts,
            candidate_count=len(outcome.candidates),
            fallback_reason=fallback,
            error=outcome.error,
            query_truncated=tq.truncated,
            l0_hints=tq.hints,
            sidecar=sidecar,
        )

    def message(self, outcome: RetrievalOutcome, evidence: Evidence) -> str | None:
        """The warning an L0-only or failed answer carries; None: the default message."""
        if evidence.layer == "L0" and (outcome.error or not self.settings.l1_enabled):
            return (
                "semantic retrieval unavailable; returning title/keyword (L0) matches only: "
                "verify before relying on them"
            )
        if outcome.partial_error:
            return (
                f"part of the knowledge search failed ({outcome.partial_error}); the evidence is from the "
                "searches that answered and may be ranked differently: verify before relying on it"
            )
        if evidence.layer == "L0":
            return (
                "semantic retrieval found no evidence above the minimum similarity; returning "
                "title/keyword (L0) matches only: verify before relying on them"
            )
        if outcome.error and not evidence.blocks:
            return f"knowledge retrieval failed and nothing matched by title: {outcome.error}"
        return None

    @staticmethod
    def status(outcome: RetrievalOutcome, evidence: Evidence) -> Status:
        """``ok``; ``degraded`` / ``error`` when retrieval failed, with / without evidence;
        ``degraded`` when part of it failed (``outcome.partial_error``)."""
        if outcome.error:
            return "degraded" if evidence.blocks else "error"
        return "degraded" if outcome.partial_error else "ok"

    def lookup_result(
        self,
        query: str,
        session_id: str | None,
        tq: TransformedQuery,
        outcome: RetrievalOutcome,
        evidence: Evidence,
        pack: ContextPack,
        sidecar: SidecarStatus,
        store: str,
        session_domains: list[str],
    ) -> LookupResult:
        """The result of a lookup that ran (trace, message and status by the rules above)."""
        trace = self.trace(outcome, evidence, tq, sidecar, store)
        return self.assemble(
            query,
            session_id,
            evidence.blocks,
            pack,
            trace,
            evidence.rerank,
            tq.hints,
            session_domains,
            self.message(outcome, evidence),
            self.status(outcome, evidence),
        )

    def empty(
        self,
        query: str,
        session_id: str | None,
        pack: ContextPack,
        session_domains: list[str],
        message: str,
        status: Status = "ok",
        error: str | None = None,
    ) -> LookupResult:
        """The result of a call that looked nothing up (refused or empty input, or a failure):
        no evidence, store ``none``, ``error`` as the trace error."""
        trace = RetrievalTrace(store="none", layer="none", attempts=[], error=error)
        return self.assemble(query, session_id, [], pack, trace, [], L0Hints(), session_domains, message, status)

    def assemble(
        self,
        query: str,
        session_id: str | None,
        blocks: list[EvidenceBlock],
        pack: ContextPack,
        trace: RetrievalTrace,
        rerank: list[RerankEntry],
        hints: L0Hints,
        session_domains: list[str],
        message: str | None = None,
        status: Status = "ok",
    ) -> LookupResult:
        """The ``LookupResult`` of these parts; ``message`` None: the default one (count and
        relevance, or "no evidence found")."""
        rel = self.relevance(query, blocks, rerank, hints, trace.layer)
        if message is None:
            message = _default_message(len(blocks), rel)
        return LookupResult(
            query=query,
            session_id=session_id,
            found=rel.found,
            evidence_blocks=blocks,
            context_pack=pack,
            retrieval_trace=trace,
            rerank_trace=rel.rerank,
            relevance_level=rel.level,
            confidence=rel.confidence,
            semantic_support=any(b.retrieval_layer != "L0" for b in blocks),
            completeness_hint=completeness_hint(blocks, pack, trace.layer),
            retrieved_domains_this_session=session_domains,
            message=message,
            status=status,
            query_truncated=trace.query_truncated,
        )
