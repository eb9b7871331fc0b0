"""The lookup_knowledge result contract (pydantic; JSON keys are camelCase).

``LookupResult.model_dump(by_alias=True)`` is what the agent receives. ``primary`` and
``supplement`` are derived compatibility views (top evidence block / the rest).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import Field, computed_field, field_serializer
from pydantic.alias_generators import to_camel

from rag_core.l0 import L0Hints
from rag_core.models import CamelModel

Layer = Literal["L1", "L0+L1", "L0", "none"]
#: ok; degraded: the knowledge store failed (L0 matches only) or part of the search failed (the
#: evidence of the searches that answered); error: nothing could be looked up.
Status = Literal["ok", "degraded", "error"]


class RelevanceLevel(str, Enum):
    """How well the evidence answers the query (thresholds: see ``assess_relevance``)."""

    PRECISE = "PRECISE"
    RELEVANT = "RELEVANT"
    WEAK = "WEAK"
    NONE = "NONE"


class EvidenceBlock(CamelModel):
    """One source document's best evidence. ``docId`` is the document id (path relative to the
    knowledge root); ``similarity`` is the normalised cosine similarity in [0, 1]; ``rawScore``
    is the store's own number, meaning given by ``scoreLabel``; ``finalScore`` is the rerank
    score the blocks are ordered by."""

    rank: int
    doc_id: str
    chunk_id: str | None = None
    title: str
    breadcrumb: str
    category: str
    retrieval_layer: Layer
    content: str
    similarity: float
    raw_score: float | None = None
    score_label: str | None = None
    final_score: float
    hit_reasons: list[str] = Field(default_factory=list)


class ContextPack(CamelModel):
    """Evidence packed into one text under a character budget (``charBudget`` / ``usedChars``
    in characters); ``includedDocIds`` / ``omittedDocIds`` are the blocks' doc ids it kept /
    left out."""

    packed_text: str
    strategy: str
    char_budget: int
    used_chars: int
    included_doc_ids: list[str]
    omitted_doc_ids: list[str]


class RetrievalAttempt(CamelModel):
    """One L1 attempt. ``filter`` is the category filter (None = unfiltered); ``topSimilarity``
    is the best normalised similarity in [0, 1]; ``durationMs`` in milliseconds."""

    attempt: int
    query: str
    filter: str | None
    top_k: int
    candidate_count: int
    top_similarity: float | None
    duration_ms: float
    error: str | None = None
    low_quality_reason: str | None = None


class SidecarStatus(CamelModel):
    """Outcome of the pgvector sidecar query beside the main store (never affects the result);
    ``topDocIds`` are the sidecar's first doc ids. ``degraded``: it answered, but part of its
    search (a channel or an attempt) failed; ``reason`` names what."""

    status: Literal["disabled", "available", "degraded", "unavailable", "error"]
    reason: str | None = None
    top_doc_ids: list[str] = Field(default_factory=list)
    duration_ms: float | None = None


class RetrievalTrace(CamelModel):
    """How L1 ran: ``store`` is the store that answered (``milvus``, ``pgvector``, ``none``)."""

    store: str
    layer: Layer
    attempts: list[RetrievalAttempt]
    candidate_count: int = 0  # distinct chunks after fusing every attempt and channel
    fallback_reason: str | None = None
    error: str | None = None
    query_truncated: bool = False
    l0_hints: L0Hints = Field(default_factory=L0Hints)
    sidecar: SidecarStatus = Field(default_factory=lambda: SidecarStatus(status="disabled"))


class RerankEntry(CamelModel):
    """Why a block got its rank: ``finalScore = baseScore + sum(contributions)``. Contribution
    names are snake_case in Python (``title_match``) and camelCase in JSON (``titleMatch``),
    like every other key of the result."""

    doc_id: str
    base_score: float
    contributions: dict[str, float]
    final_score: float
    rank_before: int
    rank_after: int
    #: Top block only, when the result has a ``confidence``: each signal's logit contribution to
    #: it (rag_core.lookup.confidence; positive raised it), largest first.
    confidence_signals: dict[str, float] | None = None

    @field_serializer("contributions", "confidence_signals")
    def _camel_contributions(self, contributions: dict[str, float] | None) -> dict[str, float] | None:
        return None if contributions is None else {to_camel(name): value for name, value in contributions.items()}


class LookupResult(CamelModel):
    """What ``lookup_knowledge`` returns to the agent."""

    query: str
    session_id: str | None = None
    found: bool
    evidence_blocks: list[EvidenceBlock]
    context_pack: ContextPack
    retrieval_trace: RetrievalTrace
    rerank_trace: list[RerankEntry]
    relevance_level: RelevanceLevel
    #: Estimated probability in [0, 1] that the top evidence block answers the query, calibrated
    #: per embedding model and language pair (rag_core.lookup.confidence, which also gives the
    #: relevance bands); None when no calibration fits the models in use or the evidence is L0-only.
    confidence: float | None = None
    semantic_support: bool
    completeness_hint: str
    retrieved_domains_this_session: list[str]
    message: str
    status: Status = "ok"
    #: Part of the query was left out: past RAG_MAX_QUERY_CHARS, or past the embedding model's
    #: query window in tokens (rag_core.lookup.admission); ``retrievalTrace.queryTruncated`` too.
    query_truncated: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def primary(self) -> EvidenceBlock | None:
        return self.evidence_blocks[0] if self.evidence_blocks else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def supplement(self) -> list[EvidenceBlock]:
        return self.evidence_blocks[1:]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
