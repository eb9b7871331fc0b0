"""The knowledge-gap report (rag_core.evaluation.gaps) on the sample knowledge base."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.gaps import missed_cases, render_gaps_markdown, unanswerable_clusters

KNOWLEDGE = Path(__file__).resolve().parent.parent / "golden" / "knowledge"


def unanswerable(case_id: str, query: str) -> GoldenCase:
    return GoldenCase(id=case_id, scenario="chat", query=query, unanswerable=True)


def report(*results):
    return SimpleNamespace(cases=[SimpleNamespace(case_id=c, hit_level=h, first_hit_rank=r) for c, h, r in results])


def test_unanswerable_queries_cluster_by_topic_most_asked_first():
    cases = [
        unanswerable("u1", "how do I set up the office printer"),
        unanswerable("u2", "office printer setup on the third floor"),
        unanswerable("u3", "when is the company summer party"),
        unanswerable("u4", "summer party location"),
        unanswerable("u5", "staff canteen menu"),
    ]
    clusters = unanswerable_clusters(cases, {"u1": 4, "u2": 1, "u3": 1})
    assert [sorted(c.case_ids) for c in clusters] == [["u1", "u2"], ["u3", "u4"], ["u5"]]
    assert clusters[0].count == 5 and {"office", "printer"} <= set(clusters[0].words)


def test_missed_and_low_ranked_cases_name_the_document_and_the_words_it_lacks():
    cases = [
        GoldenCase(
            id="a", scenario="chat", query="redis blizzard of writes", expected_docs=["cache/RedisMemoryHigh.md"]
        ),
        GoldenCase(id="b", scenario="chat", query="refund", expected_docs=["policy/RefundPolicy.md"]),
        GoldenCase(id="c", scenario="chat", query="lag", expected_docs=["queues/KafkaConsumerLagHigh.md"]),
    ]
    reports = {
        "milvus": report(("a", "miss", None), ("b", "strong", 1), ("c", "medium", 5)),
        "pgvector": report(("a", "medium", 4), ("b", "strong", 2), ("c", "strong", 1)),
    }
    missed = missed_cases(cases, reports, KNOWLEDGE)
    assert [(m.case_id, m.stores, m.rank) for m in missed] == [
        ("a", ("milvus", "pgvector"), None),
        ("c", ("milvus",), 5),
    ]
    # "redis" is the document's keyword; the others are words agents use that it does not have.
    assert "redis" not in missed[0].lacking and "blizzard" in missed[0].lacking and "writes" not in missed[0].lacking
    text = render_gaps_markdown([], missed)
    assert "cache/RedisMemoryHigh.md" in text and "milvus, pgvector" in text
