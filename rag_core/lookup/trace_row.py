"""The compact ``tool_invocation`` row of one lookup (no secrets, content truncated) and its
``retrieval_details`` model.

``RetrievalDetails`` is what the trace table's ``retrieval_details`` jsonb column holds
(``model_dump(mode="json")``; keys snake_case, the nested result models keep their camelCase
JSON as in the result). Readers of stored rows use :meth:`RetrievalDetails.read`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from rag_core.l0 import L0Hints
from rag_core.lookup.contracts import (
    ContextPack,
    LookupResult,
    RelevanceLevel,
    RerankEntry,
    RetrievalAttempt,
    SidecarStatus,
)
from rag_core.lookup.query_transformer import QueryTransformSummary
from rag_core.lookup.second_stage import SecondStageOutcome
from rag_core.lookup.timing import StageTimings
from rag_core.traces.rows import TraceRow, origin_of

if TYPE_CHECKING:
    from rag_core.lookup.query_transformer import TransformedQuery

OUTPUT_PREVIEW_CHARS = 500
EVIDENCE_PREVIEW_CHARS = 200
INPUT_CHARS = 4000


class EvidenceTrace(BaseModel):
    """One evidence block as the trace keeps it (``content``: the first
    ``EVIDENCE_PREVIEW_CHARS`` characters)."""

    rank: int
    doc_id: str
    breadcrumb: str
    layer: str
    similarity: float
    final_score: float
    hit_reasons: list[str]
    content: str


class RetrievalDetails(BaseModel):
    """The ``retrieval_details`` of one trace row. ``query_transform``: the transformed query's
    summary (``TransformedQuery.summary()``; None when no lookup ran); ``stage_ms``: the stages'
    durations in milliseconds (:class:`~rag_core.lookup.timing.StageTimings`; JSON: stage name ->
    ms, of the stages that ran); ``transport``: the
    caller's channel (``python``, ``cli``, ``evaluation``, ``mcp-stdio``, ``mcp-http``, ``http``); ``second_stage``: the
    optional second-stage reranker's outcome (:mod:`rag_core.lookup.second_stage`; None when
    off, and then not in the JSON). Every field has a default so rows of older versions read back (:meth:`read`)."""

    model_config = ConfigDict(extra="ignore")

    l0_hints: L0Hints = Field(default_factory=L0Hints)
    query_transform: QueryTransformSummary | None = None
    attempts: list[RetrievalAttempt] = Field(default_factory=list)
    fallback_reason: str | None = None
    sidecar: SidecarStatus = Field(default_factory=lambda: SidecarStatus(status="disabled"))
    rerank: list[RerankEntry] = Field(default_factory=list)
    context_pack: ContextPack | None = None
    evidence: list[EvidenceTrace] = Field(default_factory=list)
    candidate_count: int | None = None
    final_block_count: int | None = None
    relevance_level: RelevanceLevel | None = None
    confidence: float | None = None  # LookupResult.confidence (why: rerank[0].confidence_signals)
    stage_ms: StageTimings = Field(default_factory=StageTimings)
    query_truncated: bool = False
    transport: str = "python"
    second_stage: SecondStageOutcome | None = None  # left out of the JSON when None

    @field_serializer("l0_hints")
    def _snake_hints(self, hints: L0Hints) -> dict[str, Any]:
        return hints.model_dump(mode="json", by_alias=False)  # the trace is snake_case throughout

    @classmethod
    def read(cls, details: Mapping[str, Any] | None) -> RetrievalDetails:
        """The details of a stored row; a row whose nested parts do not validate (a foreign or
        damaged row) keeps its flat fields, anything unreadable its defaults. Never raises."""
        try:
            return cls.model_validate(details or {})
        except ValidationError:
            flat = {
                "fallback_reason",
                "candidate_count",
                "final_block_count",
                "relevance_level",
                "confidence",
                "transport",
            }
            try:
                return cls.model_validate({k: v for k, v in (details or {}).items() if k in flat})
            except ValidationError:
                return cls()


def build_details(
    result: LookupResult,
    tq: TransformedQuery | None,
    timings: StageTimings,
    transport: str = "python",
    second_stage: SecondStageOutcome | None = None,
) -> RetrievalDetails:
    """The ``RetrievalDetails`` of ``result``; ``timings`` stage durations in milliseconds;
    ``second_stage`` what the optional second-stage reranker did (None: off)."""
    rt = result.retrieval_trace
    return RetrievalDetails(
        l0_hints=rt.l0_hints,
        query_transform=tq.summary() if tq else None,
        attempts=rt.attempts,
        fallback_reason=rt.fallback_reason,
        sidecar=rt.sidecar,
        rerank=result.rerank_trace,
        context_pack=result.context_pack,
        evidence=[
            EvidenceTrace(
                rank=b.rank,
                doc_id=b.doc_id,
                breadcrumb=b.breadcrumb,
                layer=b.retrieval_layer,
                similarity=b.similarity,
                final_score=b.final_score,
                hit_reasons=b.hit_reasons,
                content=b.content[:EVIDENCE_PREVIEW_CHARS],
            )
            for b in result.evidence_blocks
        ],
        candidate_count=rt.candidate_count,
        final_block_count=len(result.evidence_blocks),
        relevance_level=result.relevance_level,
        confidence=result.confidence,
        stage_ms=timings,
        query_truncated=rt.query_truncated,
        transport=transport,
        second_stage=second_stage,
    )


def build_trace_row(
    result: LookupResult,
    tq: TransformedQuery | None,
    timings: StageTimings,
    latency_ms: float,
    tool_name: str,
    transport: str = "python",
    second_stage: SecondStageOutcome | None = None,
) -> TraceRow:
    """The trace row of one lookup, cleaned (``TraceRow``: secrets scrubbed, details JSON-safe),
    with a fresh ``id`` and ``created_at`` = now (UTC). ``timings`` are stage durations in
    milliseconds (``RetrievalDetails.stage_ms``), ``latency_ms`` the whole call's;
    ``transport`` the channel the call came by (``RetrievalDetails.transport``), which also
    gives the row's ``origin`` (``rag_core.traces.rows.origin_of``)."""
    rt = result.retrieval_trace
    details = build_details(result, tq, timings, transport, second_stage)
    return TraceRow(
        session_id=result.session_id,
        tool_name=tool_name,
        input=result.query[:INPUT_CHARS],
        output_preview=result.context_pack.packed_text[:OUTPUT_PREVIEW_CHARS],
        retrieval_layer=rt.layer,
        retrieval_details=details.model_dump(mode="json", exclude={"second_stage"} if second_stage is None else None),
        status=result.status,
        error=rt.error,
        latency_ms=round(latency_ms, 3),
        origin=origin_of(transport),
    )
