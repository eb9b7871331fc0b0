"""Production signals and mined candidate cases from trace rows (rag_core.evaluation.signals,
rag_core.evaluation.mining). Rows are built by hand with the fields the lookup writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rag_core.evaluation.mining import mine_candidates
from rag_core.evaluation.signals import day_signals, drift, flag_lookups
from rag_core.traces.rows import TraceRow

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def row(query, *, at=0, session="s1", level="RELEVANT", origin="library", latency=100.0, **details):
    evidence = details.pop("evidence", ["runbooks/A.md"])
    return TraceRow(
        session_id=session,
        input=query,
        retrieval_layer=details.pop("layer", "L1"),
        status=details.pop("status", "ok"),
        latency_ms=latency,
        created_at=T0 + timedelta(seconds=at),
        origin=origin,
        retrieval_details={
            "relevance_level": level,
            "attempts": [
                {
                    "attempt": a,
                    "query": query,
                    "filter": None,
                    "top_k": 10,
                    "candidate_count": 3,
                    "top_similarity": 0.4,
                    "duration_ms": 5.0,
                }
                for a in details.pop("attempts", [1])
            ],
            "evidence": [
                {
                    "rank": i + 1,
                    "doc_id": d,
                    "breadcrumb": d,
                    "layer": "L1",
                    "similarity": 0.4,
                    "final_score": 0.4,
                    "hit_reasons": [],
                    "content": "",
                }
                for i, d in enumerate(evidence)
            ],
            **details,
        },
    )


def test_each_signal_is_raised_by_the_lookup_that_shows_it_and_evaluation_is_left_out():
    rows = [
        row("fine question", at=0),
        row("weak one", at=10, level="WEAK", session="s2"),
        row("nothing found", at=20, level="NONE", session="s3", layer="L0", status="degraded", evidence=[]),
        row("retried", at=30, attempts=[1, 2], session="s4"),
        row("Same Question ", at=40, session="s5"),
        row("same question", at=100, session="s5"),  # re-asked 60 s later: the first one is flagged
        row("same question", at=5000, session="s5"),  # too late to be a re-ask of the second
        row("disagree", at=50, session="s6", sidecar={"status": "available", "top_doc_ids": ["runbooks/B.md"]}),
        row("slow", at=60, session="s7", latency=5000.0),
        row("eval case", at=70, session="eval-milvus-20261201", origin="evaluation", level="NONE"),
    ]
    flagged = flag_lookups(rows, slow_ms=2000.0, reask_window_s=600.0)
    by_query = {}
    for f in flagged:
        by_query.setdefault(f.row.input, []).append(f.flags)
    assert by_query["fine question"] == [frozenset()]
    assert by_query["weak one"] == [{"weak"}]
    assert by_query["nothing found"] == [{"weak", "l0_fallback", "degraded"}]
    assert by_query["retried"] == [{"retried"}]
    assert by_query["Same Question "] == [{"reasked"}]
    assert by_query["same question"] == [frozenset(), frozenset()]
    assert by_query["disagree"] == [{"disagreement"}]
    assert "slow_slo" in by_query["slow"][0] and "slow_p95" in by_query["slow"][0]

    figures = day_signals(flagged)
    assert set(figures) == {"library", "production"}  # the evaluation's lookup is not production
    production = figures["production"]
    assert production["lookups"] == 9
    assert production["weak"] == 2 / 9 and production["reasked"] == 1 / 9
    assert production["sidecar_compared"] == 1 and production["disagreement"] == 1.0


def test_drift_needs_a_week_of_history_and_flags_a_jump_not_noise():
    steady = [{"weak": 0.10 + 0.01 * (i % 3)} for i in range(10)]
    assert drift({"weak": 0.40}, steady[:6]) == {}
    assert drift({"weak": 0.40}, steady)["weak"] == "up"
    assert "weak" not in drift({"weak": 0.12}, steady)


def test_mined_candidates_are_deduplicated_ranked_and_scrubbed():
    secret = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
    rows = [
        row("OrdersDB replication lag?", at=0, level="NONE", session="a"),
        row("ordersdb replication lag", at=30, level="NONE", session="a"),
        row("ordersdb replication lag", at=4000, level="WEAK", session="b"),
        row(f"git push fails token={secret}", at=10, level="WEAK", session="c"),
        row("answered well", at=20, session="d"),
        row("rescued by the retry", at=25, session="e", attempts=[1, 2]),
    ]
    candidates = mine_candidates(flag_lookups(rows, 2000.0, 600.0))
    assert [c.provenance.count for c in candidates] == [3, 1]
    top = candidates[0]
    assert top.query == "ordersdb replication lag" and top.provenance.sessions == 2
    assert top.score == 3 + 2 + 3 + 3  # NONE and re-asked, NONE, WEAK
    assert set(top.provenance.signals) == {"weak", "reasked"} and top.provenance.dates == ["2026-12-01"]
    assert sorted(top.provenance.trace_ids) == sorted(r.id for r in rows[:3])
    assert top.tool_answer.top_doc_ids == ["runbooks/A.md"] and top.tool_answer.relevance == "WEAK"
    assert secret not in candidates[1].query and "git push fails" in candidates[1].query
