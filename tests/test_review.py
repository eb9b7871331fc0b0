"""Review decisions on mined candidates (rag_core.evaluation.review): the production suite file
and the decision log."""

from __future__ import annotations

import json

import pytest

from rag_core.evaluation.cases import load_cases
from rag_core.evaluation.mining import CandidateCase, Provenance, ToolAnswer
from rag_core.evaluation.review import ReviewError, decide, pending, record_decision

KNOWN = {"cache/RedisMemoryHigh.md", "policy/RefundPolicy.md"}


def candidate(case_id: str, query: str) -> CandidateCase:
    return CandidateCase(
        id=case_id,
        scenario="chat",
        query=query,
        score=5.0,
        provenance=Provenance(
            trace_ids=[f"{case_id}-t1"], dates=["2026-12-01"], count=1, sessions=1, origins=["http"], signals=["weak"]
        ),
        tool_answer=ToolAnswer(top_doc_ids=["cache/RedisMemoryHigh.md"], relevance="WEAK"),
    )


def test_accepted_and_unanswerable_cases_become_loadable_golden_cases_with_provenance(tmp_path):
    suite, log = tmp_path / "production.yaml", tmp_path / "decisions.jsonl"
    redis, printer, noise = (
        candidate("prod-a", "redis memory high"),
        candidate("prod-b", "office printer"),
        candidate("prod-c", "asdf"),
    )
    for c, verdict, docs in [
        (redis, "accept", ["cache/RedisMemoryHigh.md"]),
        (printer, "unanswerable", []),
        (noise, "reject", []),
    ]:
        record_decision(
            decide(c, verdict, doc_ids=docs, known_doc_ids=KNOWN, reviewer="ana", reason="why"), c, suite, log
        )
    cases = {c.id: c for c in load_cases(suite)}
    assert set(cases) == {"prod-a", "prod-b"}  # the rejected one is only in the log
    assert cases["prod-a"].expected_docs == ["cache/RedisMemoryHigh.md"] and not cases["prod-a"].unanswerable
    assert cases["prod-b"].unanswerable and cases["prod-b"].expected_docs == []
    assert (
        "trace_ids: [prod-a-t1]" in suite.read_text().replace("\n  ", " ").replace("- ", "")
        or "prod-a-t1" in suite.read_text()
    )
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(d["case_id"], d["decision"], d["reviewer"]) for d in logged] == [
        ("prod-a", "accept", "ana"),
        ("prod-b", "unanswerable", "ana"),
        ("prod-c", "reject", "ana"),
    ]
    assert pending([redis, printer, noise, candidate("prod-d", "new")], log) == [candidate("prod-d", "new")]


def test_a_decision_that_cannot_be_taken_names_the_case_and_the_doc():
    c = candidate("prod-a", "redis memory high")
    with pytest.raises(ReviewError, match="prod-a: --doc cache/Nope.md is not in the index"):
        decide(c, "accept", doc_ids=["cache/Nope.md"], known_doc_ids=KNOWN, reviewer="ana")
    with pytest.raises(ReviewError, match="prod-a: accept needs --doc"):
        decide(c, "accept", known_doc_ids=KNOWN, reviewer="ana")
    with pytest.raises(ReviewError, match="only for accept"):
        decide(c, "unanswerable", doc_ids=["policy/RefundPolicy.md"], known_doc_ids=KNOWN, reviewer="ana")


def test_interactive_review_takes_a_doc_from_the_tool_s_answer_and_an_unanswerable(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rag_core.cli import app
    from rag_core.cli import review as review_cli
    from rag_core.evaluation.mining import write_candidates

    candidates = write_candidates(
        tmp_path / "2026-12-01.yaml", [candidate("prod-a", "redis memory high"), candidate("prod-b", "office printer")]
    )
    monkeypatch.setattr(review_cli, "_is_terminal", lambda: True)
    monkeypatch.setattr(review_cli, "_known_doc_ids", lambda settings: KNOWN)
    suite, log = tmp_path / "production.yaml", tmp_path / "decisions.jsonl"
    args = ["eval", "review", "--candidates", str(candidates), "--suite-file", str(suite), "--log", str(log)]
    # Shown best first (equal scores: by query): "u" for the printer, then "1", the first of the
    # tool's top docs, for redis; each followed by its reason.
    result = CliRunner().invoke(app, [*args, "--reviewer", "ana"], input="u\nno IT docs\n1\nthe runbook\n")
    assert result.exit_code == 0, result.output
    cases = {c.id: c for c in load_cases(suite)}
    assert cases["prod-a"].expected_docs == ["cache/RedisMemoryHigh.md"] and cases["prod-b"].unanswerable
    assert [json.loads(line)["reason"] for line in log.read_text().splitlines()] == ["no IT docs", "the runbook"]
