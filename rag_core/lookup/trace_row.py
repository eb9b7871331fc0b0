"""Builds the compact ``tool_invocation`` row of one lookup (no secrets, content truncated)."""

from __future__ import annotations

from rag_core.lookup.contracts import LookupResult
from rag_core.lookup.query_transformer import TransformedQuery
from rag_core.traces.rows import TraceRow

OUTPUT_PREVIEW_CHARS = 500
EVIDENCE_PREVIEW_CHARS = 200
INPUT_CHARS = 4000


def build_trace_row(
    result: LookupResult,
    tq: TransformedQuery | None,
    timings: dict[str, float],
    latency_ms: float,
    tool_name: str,
    transport: str = "python",
) -> TraceRow:
    """The trace row of one lookup, cleaned (``TraceRow``: secrets scrubbed, details JSON-safe),
    with a fresh ``id`` and ``created_at`` = now (UTC). ``timings`` are stage durations in
    milliseconds (``retrieval_details["stage_ms"]``), ``latency_ms`` the whole call's;
    ``transport`` the channel the call came by (``retrieval_details["transport"]``)."""
    rt = result.retrieval_trace
    details = {
        "l0_hints": rt.l0_hints.model_dump(mode="json", by_alias=False),  # the trace is snake_case throughout
        "query_transform": tq.summary() if tq else None,
        "attempts": [a.model_dump(mode="json") for a in rt.attempts],
        "fallback_reason": rt.fallback_reason,
        "sidecar": rt.sidecar.model_dump(mode="json"),
        "rerank": [r.model_dump(mode="json") for r in result.rerank_trace],
        "context_pack": {k: v for k, v in result.context_pack.model_dump(mode="json").items() if k != "packed_text"},
        "evidence": [
            {
                "rank": b.rank,
                "doc_id": b.doc_id,
                "breadcrumb": b.breadcrumb,
                "layer": b.retrieval_layer,
                "similarity": b.similarity,
                "final_score": b.final_score,
                "hit_reasons": b.hit_reasons,
                "content": b.content[:EVIDENCE_PREVIEW_CHARS],
            }
            for b in result.evidence_blocks
        ],
        "candidate_count": rt.candidate_count,
        "final_block_count": len(result.evidence_blocks),
        "relevance_level": result.relevance_level.value,
        "stage_ms": timings,
        "query_truncated": rt.query_truncated,
        "transport": transport,
    }
    return TraceRow(
        session_id=result.session_id,
        tool_name=tool_name,
        input=result.query[:INPUT_CHARS],
        output_preview=result.context_pack.packed_text[:OUTPUT_PREVIEW_CHARS],
        retrieval_layer=rt.layer,
        retrieval_details=details,
        status=result.status,
        error=rt.error,
        latency_ms=round(latency_ms, 3),
    )
