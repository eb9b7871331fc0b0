"""The lookup view stays readable in an 80-column terminal and keeps its table when wide."""

from __future__ import annotations

from rich.console import Console

from rag_core.cli.views import print_lookup
from rag_core.lookup.contracts import (
    ContextPack,
    EvidenceBlock,
    LookupResult,
    RelevanceLevel,
    RerankEntry,
    RetrievalTrace,
)

DOC = "kubernetes/kube-controller-manager/KubeControllerManagerDown.md"
CRUMB = "Kube Controller Manager Down > Diagnosis > Check the leader election lease and the pod logs"


def _result(blocks: int = 5) -> LookupResult:
    evidence = [
        EvidenceBlock(
            rank=i + 1,
            doc_id=DOC.replace("Down", f"Down{i}"),
            title="Kube Controller Manager Down",
            breadcrumb=CRUMB,
            category="kubernetes",
            retrieval_layer="L1",
            content="text",
            similarity=0.8,
            final_score=0.9,
            hit_reasons=["dense similarity 0.812", "bm25 rank 2", "title match", "L0 keyword kube-controller-manager"],
        )
        for i in range(blocks)
    ]
    rerank = [
        RerankEntry(
            doc_id=b.doc_id,
            base_score=0.8,
            contributions={"title_match": 0.05, "lexical": 0.03},
            final_score=0.9,
            rank_before=2,
            rank_after=b.rank,
        )
        for b in evidence
    ]
    return LookupResult(
        query="controller manager down",
        found=True,
        evidence_blocks=evidence,
        context_pack=ContextPack(
            packed_text="packed", strategy="s", char_budget=100, used_chars=6, included_doc_ids=[], omitted_doc_ids=[]
        ),
        retrieval_trace=RetrievalTrace(store="milvus", layer="L1", attempts=[]),
        rerank_trace=rerank,
        relevance_level=RelevanceLevel.RELEVANT,
        semantic_support=True,
        completeness_hint="complete",
        retrieved_domains_this_session=[],
        message="ok",
    )


def _render(width: int, wide: bool | None = None) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    print_lookup(console, _result(), wide)
    return console.export_text().splitlines()


def test_eighty_columns_give_a_few_whole_lines_per_block():
    lines = _render(80)
    assert len(lines) < 5 * 8 + 5  # five blocks of at most eight lines, plus header and pack
    assert "1. " + DOC.replace("Down", "Down0") in lines  # the doc id whole, on its own line
    assert CRUMB in " ".join(line.strip() for line in lines)  # wrapped at words, not one per line
    assert any("rerank: title_match+0.050, lexical+0.030 (rank 2->1)" in line for line in lines)


def test_a_wide_terminal_or_wide_flag_keeps_the_table():
    for lines in (_render(200), _render(80, wide=True)):
        assert any("┃ #" in line or "│ 1" in line for line in lines)
    narrow_table = _render(80, wide=True)
    assert len(narrow_table) > len(_render(80))  # what --stacked avoids
