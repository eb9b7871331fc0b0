"""Evaluator: hit levels, fixture problems turned into not_run, aggregates, no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.evaluator import EvaluationReport, candidate_label, evaluate
from rag_core.evaluation.fixtures import load_fixtures, write_fixture, write_manifest
from rag_core.evaluation.testing import make_fixture, make_manifest, write_fixture_dir

PROJECT = Path(__file__).resolve().parents[1]


def case(cid: str, docs: list[str], scenario: str = "chat", **extra) -> GoldenCase:
    return GoldenCase(id=cid, scenario=scenario, query=f"query {cid}", expected_docs=docs, **extra)


def run(tmp_path: Path, cases: list[GoldenCase], fixtures, **kw) -> EvaluationReport:
    directory = write_fixture_dir(tmp_path / "fx", fixtures)
    return evaluate(cases, load_fixtures(directory, [c.id for c in cases]), **kw)


def test_strong_medium_miss(tmp_path: Path):
    cases = [
        case("s", ["k/A.md"], expected_keywords=["gRPC", "file descriptor"]),
        case("m", ["k/A.md"], expected_keywords=["gRPC", "absent"]),
        case("x", ["k/A.md"]),
    ]
    text = "Too many ＧＲＰＣ requests.\nThe FILE\n  descriptor limit."
    fixtures = [
        make_fixture("s", ["o/1.md", "k/A.md"], content={"k/A.md": text}),
        make_fixture("m", ["k/A.md"], content=text),
        make_fixture(
            "x",
            ["o/1.md", "o/2.md", "o/3.md", "o/4.md", "o/5.md"],
            extra_candidates=["o/6.md", "k/A.md"],
        ),
    ]
    report = run(tmp_path, cases, fixtures)
    s, m, x = report.cases
    assert (s.hit_level, s.first_hit_rank, s.failed_checks) == ("strong", 2, [])
    assert s.reciprocal_rank == 0.5
    assert m.hit_level == "medium"
    assert m.failed_checks == ["keyword 'absent' not in top-5 evidence"]
    assert x.hit_level == "miss" and x.first_hit_rank == 7
    assert x.failed_checks == ["expected doc not in top 5 (first at 7)"]
    assert x.recall_at_k == {1: 0.0, 3: 0.0, 5: 0.0, 10: 1.0}
    assert report.summary.model_dump(include={"strong", "medium", "miss", "not_run"}) == {
        "strong": 1,
        "medium": 1,
        "miss": 1,
        "not_run": 0,
    }


def test_keywords_only_count_inside_top_strong_k_evidence(tmp_path: Path):
    docs = [f"o/{i}.md" for i in range(6)] + ["k/A.md"]
    fixture = make_fixture("c", docs, content={"o/5.md": "the scheduler", "o/0.md": "intro"})
    report = run(tmp_path, [case("c", ["o/0.md"], expected_keywords=["scheduler"])], [fixture])
    assert report.cases[0].hit_level == "medium"
    # With a deeper strong_k the block at rank 6 counts.
    deeper = evaluate(
        [case("c", ["o/0.md"], expected_keywords=["scheduler"])],
        load_fixtures(tmp_path / "fx", ["c"]),
        strong_k=6,
    )
    assert deeper.cases[0].hit_level == "strong"


def test_breadcrumb_coverage(tmp_path: Path):
    crumbs = {"k/A.md": "Kube Scheduler Down>Diagnosis"}
    cases = [
        case("b1", ["k/A.md"], expected_breadcrumbs=["kube scheduler down > diagnosis"]),
        case("b2", ["k/A.md"], expected_breadcrumbs=["Mitigation", "Runbook > Steps"]),
    ]
    fixtures = [make_fixture(c.id, ["k/A.md"], breadcrumbs=crumbs) for c in cases]
    b1, b2 = run(tmp_path, cases, fixtures).cases
    assert b1.hit_level == "strong"
    assert b2.hit_level == "medium"
    assert b2.failed_checks == ["no breadcrumb in top 5 matches any of 'Mitigation', 'Runbook > Steps'"]


def test_top_candidate_labels(tmp_path: Path):
    fixture = make_fixture(
        "c",
        ["kubernetes/KubeSchedulerDown.md"] + [f"o/{i}.md" for i in range(6)],
        breadcrumbs={"kubernetes/KubeSchedulerDown.md": "Kube Scheduler Down > Meaning"},
    )
    result = run(tmp_path, [case("c", ["o/0.md"])], [fixture]).cases[0]
    assert len(result.top_candidates) == 5
    assert result.top_candidates[0] == (
        "1. kubernetes/KubeSchedulerDown.md — Kube Scheduler Down > Meaning (0.90 milvus_cosine_similarity[-1,1])"
    )
    assert len(result.top_docs) == 7


def test_label_without_scores():
    from rag_core.evaluation.fixtures import FixtureCandidate

    assert candidate_label(3, FixtureCandidate(rank=3)) == "3. (no doc id)"


def test_deleting_one_fixture_makes_only_that_case_not_run(tmp_path: Path):
    cases = [case(f"c{i}", [f"k/{i}.md"], expected_keywords=["x"]) for i in range(4)]
    fixtures = [make_fixture(c.id, ["o/a.md", f"k/{i}.md"], content="x" if i % 2 else "") for i, c in enumerate(cases)]
    before = run(tmp_path, cases, fixtures)
    (tmp_path / "fx" / "c2.json").unlink()
    after = evaluate(cases, load_fixtures(tmp_path / "fx", [c.id for c in cases]))

    gone = after.case("c2")
    assert gone.hit_level == "not_run"
    assert "c2.json" in gone.not_run_reason
    assert gone.reciprocal_rank is None
    for cid in ("c0", "c1", "c3"):
        assert after.case(cid) == before.case(cid)
    assert (after.summary.case_count, after.summary.run_count) == (4, 3)
    assert after.summary.not_run == 1
    assert after.summary.mrr == pytest.approx(0.5)  # over run cases only


def test_corrupt_fixture_is_reported_and_the_rest_evaluated(tmp_path: Path):
    cases = [case("good", ["k/A.md"]), case("bad", ["k/A.md"]), case("invalid", ["k/A.md"])]
    directory = write_fixture_dir(tmp_path / "fx", [make_fixture("good", ["k/A.md"])])
    (directory / "bad.json").write_text('{"case_id": "bad", "candidates": [', encoding="utf-8")
    (directory / "invalid.json").write_text(
        json.dumps({"format_version": 2, "case_id": "invalid", "store": "milvus", "candidates": [{"rank": 0}]}),
        encoding="utf-8",
    )
    fixtures = load_fixtures(directory, [c.id for c in cases])
    report = evaluate(cases, fixtures)

    assert report.case("good").hit_level == "strong"
    bad, invalid = report.case("bad"), report.case("invalid")
    assert bad.hit_level == invalid.hit_level == "not_run"
    assert "bad.json" in bad.not_run_reason and "not valid JSON" in bad.not_run_reason
    assert "invalid.json" in invalid.not_run_reason and "candidates.0.rank" in invalid.not_run_reason
    assert any("bad.json" in w for w in report.warnings)


def test_fixture_for_unknown_case_is_a_warning(tmp_path: Path):
    directory = write_fixture_dir(
        tmp_path / "fx", [make_fixture("known", ["k/A.md"]), make_fixture("stray", ["k/A.md"])]
    )
    report = evaluate([case("known", ["k/A.md"])], load_fixtures(directory, ["known"]))
    assert report.case("known").hit_level == "strong"
    assert any("unknown case 'stray'" in w for w in report.warnings)


def test_fixture_of_another_case_or_store_is_rejected(tmp_path: Path):
    directory = write_fixture_dir(tmp_path / "fx", [make_fixture("a", ["k/A.md"])])
    write_fixture(directory, make_fixture("b", ["k/A.md"], store="pgvector"))
    (directory / "c.json").write_text((directory / "a.json").read_text(), encoding="utf-8")
    fixtures = load_fixtures(directory, ["a", "b", "c"])
    assert set(fixtures.fixtures) == {"a"}
    assert "recorded on store 'pgvector'" in fixtures.not_run["b"]
    assert "is for case 'a'" in fixtures.not_run["c"]


def test_unavailable_store_makes_every_case_not_run(tmp_path: Path):
    directory = tmp_path / "fx"
    write_manifest(directory, make_manifest("pgvector", available=False, reason="pg down"))
    report = evaluate([case("a", ["k/A.md"])], load_fixtures(directory, ["a"]))
    assert report.store == "pgvector"
    assert report.store_status.status == "unavailable"
    assert report.cases[0].not_run_reason == "store 'pgvector' unavailable: pg down"
    assert report.summary.recall_at_k[5] is None and report.summary.mrr is None


def test_missing_directory_and_missing_manifest(tmp_path: Path):
    report = evaluate([case("a", ["k/A.md"])], load_fixtures(tmp_path / "nope", ["a"]))
    assert "not found" in report.cases[0].not_run_reason

    write_fixture(tmp_path / "bare", make_fixture("a", ["k/A.md"]))
    bare = load_fixtures(tmp_path / "bare", ["a"])
    assert bare.store == "milvus" and "a" in bare.fixtures
    assert any("manifest.json missing" in w for w in bare.warnings)


def test_retrieval_error_fixture_is_a_miss_with_the_error(tmp_path: Path):
    fixture = make_fixture("e", [], status="error", error="MilvusException: timeout")
    result = run(tmp_path, [case("e", ["k/A.md"])], [fixture]).cases[0]
    assert result.hit_level == "miss"
    assert result.failed_checks[0] == "retrieval error: MilvusException: timeout"
    assert result.reciprocal_rank == 0.0


def test_context_pack_survival(tmp_path: Path):
    cases = [case("kept", ["k/A.md"]), case("dropped", ["k/A.md"]), case("absent", ["k/A.md"])]
    fixtures = [
        make_fixture("kept", ["k/A.md"]),
        make_fixture("dropped", ["o/1.md", "k/A.md"], packed=["o/1.md"]),
        make_fixture("absent", ["o/1.md"], extra_candidates=["k/A.md"]),
    ]
    report = run(tmp_path, cases, fixtures)
    assert [c.context_pack_survived for c in report.cases] == [True, False, None]
    assert report.summary.context_pack_eligible == 2
    assert report.summary.context_pack_survival_rate == 0.5


def test_aggregates_by_scenario_and_json_round_trip(tmp_path: Path):
    cases = [
        case("a1", ["k/A.md"], scenario="aiops_alert"),
        case("a2", ["k/B.md"], scenario="aiops_alert"),
        case("c1", ["k/C.md"], scenario="chat"),
    ]
    fixtures = [
        make_fixture("a1", ["k/A.md"]),
        make_fixture("a2", ["o/1.md", "o/2.md", "k/B.md"]),
        make_fixture("c1", ["o/1.md"]),
    ]
    report = run(tmp_path, cases, fixtures, ks=(5, 1, 3, 3))
    assert report.ks == [1, 3, 5]
    alert = report.by_scenario["aiops_alert"]
    assert alert.recall_at_k == {1: 0.5, 3: 1.0, 5: 1.0}
    assert alert.mrr == pytest.approx((1 + 1 / 3) / 2)
    assert alert.avg_first_hit_rank == 2.0
    assert report.by_scenario["chat"].miss == 1
    assert report.summary.hit_count == 2
    assert report.manifest.model_id == "all-MiniLM-L6-v2"

    again = EvaluationReport.model_validate_json(report.model_dump_json())
    assert again == report


def test_invalid_ks(tmp_path: Path):
    with pytest.raises(ValueError):
        run(tmp_path, [case("a", ["k/A.md"])], [make_fixture("a", ["k/A.md"])], ks=(0, 5))


def test_writer_is_atomic_and_validates(tmp_path: Path):
    write_fixture(tmp_path, make_fixture("a", ["k/A.md"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    with pytest.raises(ValidationError):
        write_fixture(tmp_path, {"case_id": "b", "store": "milvus", "candidates": [{"rank": -1}]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_recorder_shaped_blocks_load(tmp_path: Path):
    # What the recorder writes: extra keys, None score labels (L0 fallback blocks).
    write_fixture(
        tmp_path,
        {
            "case_id": "a",
            "store": "milvus",
            "query": "q",
            "status": "ok",
            "error": None,
            "retrieval_layer": None,
            "candidates": [
                {
                    "rank": 1,
                    "doc_id": "k/A.md",
                    "channels": ["dense"],
                    "raw_score": 0.5,
                    "score_label": "milvus_cosine_similarity[-1,1]",
                }
            ],
            "evidence_blocks": [
                {
                    "rank": 1,
                    "doc_id": "k/A.md",
                    "title": "A",
                    "breadcrumb": "A",
                    "category": "k",
                    "content": "text",
                    "similarity": 0.0,
                    "score_label": None,
                    "final_score": 0.4,
                    "retrieval_layer": "L0",
                    "hit_reasons": ["l0_fallback"],
                }
            ],
            "context_pack_doc_ids": ["k/A.md"],
        },
    )
    fixtures = load_fixtures(tmp_path, ["a"])
    assert fixtures.fixtures["a"].evidence_blocks[0].score_label == ""


def test_evaluator_imports_no_store_or_model_libraries(tmp_path: Path):
    directory = write_fixture_dir(tmp_path / "fx", [make_fixture("a", ["k/A.md"])])
    script = textwrap.dedent(f"""
        import sys
        from rag_core.evaluation.cases import GoldenCase
        from rag_core.evaluation.evaluator import evaluate
        from rag_core.evaluation.fixtures import load_fixtures
        from rag_core.evaluation.gate import compare
        from rag_core.evaluation.reports import write_baseline_report
        import rag_core.cli.evaluation
        case = GoldenCase(id="a", scenario="chat", query="q", expected_docs=["k/A.md"])
        report = evaluate([case], load_fixtures({str(directory)!r}, ["a"]))
        assert report.cases[0].hit_level == "strong"
        compare(report, report)
        write_baseline_report(report, {str(tmp_path / "out")!r})
        heavy = ("pymilvus", "psycopg", "torch", "sentence_transformers")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
        print(",".join(loaded))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
