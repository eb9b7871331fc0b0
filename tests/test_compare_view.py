"""``rag compare`` output from the typed StoreComparison (no store needed)."""

import io
import json

from rich.console import Console

from rag_core.cli.views import print_compare
from rag_core.compare import CandidateRow, ComparisonRow, StoreComparison


def _row(rank: int, doc_id: str, store: str, similarity: float) -> CandidateRow:
    return CandidateRow(
        rank=rank,
        doc_id=doc_id,
        chunk_id=f"{doc_id}#0",
        title=doc_id,
        breadcrumb=f"{doc_id} > Meaning",
        category="k",
        content_preview="text",
        raw_score=similarity if store == "milvus" else round(1 - similarity, 4),
        score_label="milvus_cosine_similarity[-1,1]" if store == "milvus" else "pgvector_cosine_distance[0,2]",
        similarity=similarity,
        channels=["dense"],
        attempts=[1],
    )


COMPARISON = StoreComparison(
    query="kafka lag",
    sidecar_status="available",
    sidecar_reason=None,
    rows=[
        ComparisonRow(
            rank=1, main=_row(1, "q/A.md", "milvus", 0.9), sidecar=_row(1, "q/A.md", "pgvector", 0.9), same_doc=True
        ),
        ComparisonRow(rank=2, main=_row(2, "q/B.md", "milvus", 0.8), sidecar=None, same_doc=False),
    ],
    overlap_at_5=0.5,
    score_labels=["milvus_cosine_similarity[-1,1]", "pgvector_cosine_distance[0,2]"],
    main_error=None,
)


def test_print_compare_renders_both_stores_from_the_model():
    out = io.StringIO()
    print_compare(Console(file=out, width=200), COMPARISON)
    text = out.getvalue()
    assert "kafka lag" in text and "sidecar: available" in text
    assert "q/A.md" in text and "q/B.md" in text and "≠" in text
    assert "0.900 (0.100 pgvector_cosine_distance)" in text and "top-5 doc overlap" in text


def test_the_json_keeps_its_keys():
    data = json.loads(COMPARISON.model_dump_json())
    assert list(data) == [
        "query",
        "sidecar_status",
        "sidecar_reason",
        "rows",
        "overlap_at_5",
        "score_labels",
        "main_error",
    ]
    assert data["rows"][1]["sidecar"] is None and data["rows"][0]["main"]["similarity"] == 0.9
