"""LookupResultAssembler: relevance assessment, completeness hint and the LookupResult."""

from __future__ import annotations

from rag_core.l0 import L0Hints
from rag_core.lookup.contracts import (
    ContextPack,
    EvidenceBlock,
    LookupResult,
    RelevanceLevel,
    RerankEntry,
    RetrievalTrace,
)
from rag_core.settings import RagSettings


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


class LookupResultAssembler:
    def __init__(self, settings: RagSettings):
        self.settings = settings

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
        status: str = "ok",
    ) -> LookupResult:
        level = assess_relevance(blocks, hints, trace.layer, self.settings)
        if message is None:
            message = (
                (
                    f"{len(blocks)} evidence block(s), relevance {level.value}; use contextPack "
                    "for the answer and cite evidenceBlocks[].docId"
                )
                if blocks
                else "no evidence found in the knowledge base for this query"
            )
        return LookupResult(
            query=query,
            session_id=session_id,
            found=bool(blocks),
            evidence_blocks=blocks,
            context_pack=pack,
            retrieval_trace=trace,
            rerank_trace=rerank,
            relevance_level=level,
            semantic_support=any(b.retrieval_layer != "L0" for b in blocks),
            completeness_hint=completeness_hint(blocks, pack, trace.layer),
            retrieved_domains_this_session=session_domains,
            message=message,
            status=status,
        )
