"""Baseline and comparison reports, and the ``rag eval`` commands that write them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_core.cli.evaluation import eval_app
from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.evaluator import evaluate
from rag_core.evaluation.fixtures import load_fixtures, write_manifest
from rag_core.evaluation.reports import (
    load_comparison,
    load_report,
    write_baseline_report,
    write_comparison_report,
)
from rag_core.evaluation.testing import make_fixture, make_manifest, write_fixture_dir
from rag_core.markdown import md_table_lines

CASES = [
    GoldenCase(
        id="c1",
        scenario="aiops_alert",
        query="q1",
        expected_docs=["k/A.md"],
        expected_keywords=["alpha"],
    ),
    GoldenCase(id="c2", scenario="chat", query="q2 | pipes", expected_docs=["k/B.md"]),
    GoldenCase(id="c3", scenario="chat", query="q3", expected_docs=["k/C.md"]),
]
IDS = [c.id for c in CASES]
CASES_YAML = "cases:\n" + "".join(
    f"- {{id: {c.id}, scenario: {c.scenario}, query: '{c.query}', "
    f"expected_docs: {c.expected_docs}, expected_keywords: {c.expected_keywords}}}\n"
    for c in CASES
)


def main_fixtures(directory: Path) -> Path:
    return write_fixture_dir(
        directory,
        [
            make_fixture("c1", ["k/A.md", "o/1.md"], content="alpha", extra_candidates=["o/2.md"]),
            make_fixture("c2", ["o/1.md", "k/B.md"], breadcrumbs={"o/1.md": "A | B > Meaning"}),
            make_fixture("c3", ["o/1.md"]),
        ],
    )


def sidecar_fixtures(directory: Path) -> Path:
    return write_fixture_dir(
        directory,
        [
            make_fixture("c1", ["o/1.md", "k/A.md"], store="pgvector", content="alpha"),
            make_fixture("c2", ["o/1.md", "k/B.md"], store="pgvector"),
            make_fixture("c3", ["k/C.md"], store="pgvector"),
        ],
    )


@pytest.fixture()
def main_set(tmp_path: Path):
    fixtures = load_fixtures(main_fixtures(tmp_path / "main"), IDS)
    return evaluate(CASES, fixtures), fixtures


def test_baseline_report_files_and_sections(tmp_path: Path, main_set):
    report, _ = main_set
    written = write_baseline_report(report, tmp_path / "out")
    json_path, md_path = written.files.json_path, written.files.markdown_path

    assert written.report is report and load_report(json_path) == report
    assert written.files.chart_path == tmp_path / "out" / "baseline-recall.png"
    assert json.loads(json_path.read_text())["summary"]["recall_at_k"]["1"] == pytest.approx(1 / 3)
    assert (tmp_path / "out" / "baseline-recall.png").read_bytes()[:4] == b"\x89PNG"

    md = md_path.read_text()
    order = ["# Retrieval evaluation baseline", "## Summary", "## By scenario", "## Per case"]
    positions = [md.index(heading) for heading in order]
    assert positions == sorted(positions)
    for needle in (
        "recall@10",
        "MRR",
        "nDCG@10",
        "avg first-hit rank",
        "abc1234",
        "all-MiniLM-L6-v2",
        "sha256:abababababab",
        "![recall@K per store]",
        "baseline-recall.png",
        "rag eval run",
    ):
        assert needle in md
    assert "A \\| B > Meaning" in md  # pipes escaped inside table cells
    assert "**MISS**" in md
    assert all(ord(ch) < 0x1F300 for ch in md)  # no emoji


def test_baseline_with_several_stores_and_not_run(tmp_path: Path, main_set):
    report, _ = main_set
    (tmp_path / "side").mkdir()
    write_manifest(tmp_path / "side", make_manifest("pgvector", available=False, reason="pg down"))
    side = evaluate(CASES, load_fixtures(tmp_path / "side", IDS))
    md = write_baseline_report(report, tmp_path / "out", "nightly", other_stores=[side]).files.markdown_path.read_text()
    assert "| metric | `milvus` | `pgvector` |" in md
    assert (tmp_path / "out" / "nightly-recall.png").exists()
    assert not (tmp_path / "out" / "nightly.json").read_text().count("pgvector")

    md = write_baseline_report(side, tmp_path / "out", "side").files.markdown_path.read_text()
    assert "## Not run" in md and "pg down" in md and "**unavailable**" in md


def test_comparison_with_sidecar_unavailable_keeps_main_results(tmp_path: Path, main_set):
    report, fixtures = main_set
    side_fx = load_fixtures(tmp_path / "missing-sidecar", IDS)
    side = evaluate(CASES, side_fx)
    written = write_comparison_report(
        report, side, fixtures, side_fx, side_fx.store_status.model_dump(), tmp_path / "out"
    )
    md = written.files.markdown_path.read_text()
    assert "Sidecar status: unavailable" in md and "not found" in md
    assert "main `milvus`" in md and "recall@5" in md and "k/A.md" in md
    data = load_comparison(written.files.json_path)
    assert data == written.report
    assert data.sidecar_status.status == "unavailable"
    assert data.main == report
    assert data.cases[0].main_top[0].doc_id == "k/A.md"
    assert data.mean_rank_overlap == {5: None, 10: None}

    # No sidecar report at all is the same story.
    written = write_comparison_report(report, None, fixtures, None, None, tmp_path / "none")
    assert written.report.sidecar is None and not written.report.sidecar_status.available
    assert "Sidecar status: unavailable" in written.files.markdown_path.read_text()


def test_comparison_side_by_side(tmp_path: Path, main_set):
    report, fixtures = main_set
    side_fx = load_fixtures(sidecar_fixtures(tmp_path / "side"), IDS)
    side = evaluate(CASES, side_fx)
    written = write_comparison_report(
        report, side, fixtures, side_fx, {"status": "available", "reason": None}, tmp_path / "out"
    )
    md_path = written.files.markdown_path
    data = written.report
    assert load_comparison(written.files.json_path) == data
    c1, c2, c3 = data.cases
    assert c1.differing_ranks == [1, 2, 3]  # main has a third doc (a candidate), sidecar none
    assert c2.differing_ranks == []
    assert c1.rank_overlap == {5: pytest.approx(2 / 5), 10: pytest.approx(2 / 10)}
    assert c3.main_hit_level == "miss" and c3.sidecar_hit_level == "strong"
    assert data.mean_rank_overlap[5] == pytest.approx((2 / 5 + 2 / 5 + 0) / 3)
    entry = c1.sidecar_top[0]
    assert (entry.score_label, entry.similarity) == ("pgvector_cosine_distance[0,2]", 0.9)

    md = md_path.read_text()
    assert "Sidecar status: available" in md
    assert "≠" in md and "**k/A.md**" in md
    assert "pgvector_cosine_distance[0,2]" in md and "milvus_cosine_similarity[-1,1]" in md
    assert "Δ (sidecar − main)" in md and "Mean rank overlap@5" in md
    assert "comparison-recall.png" in md


def _cli(*args: str):
    return CliRunner().invoke(eval_app, [*args], catch_exceptions=False)


def test_cli_run_compare_and_gate(tmp_path: Path):
    cases_file = tmp_path / "cases.yaml"
    cases_file.write_text(CASES_YAML, encoding="utf-8")
    main_dir = main_fixtures(tmp_path / "main")
    out = tmp_path / "out"

    done = _cli(
        "run",
        "--cases",
        str(cases_file),
        "--fixtures",
        str(main_dir),
        "--k",
        "1,5",
        "--out",
        str(out),
    )
    assert done.exit_code == 0, done.output
    assert "recall@5" in done.output and (out / "baseline.md").exists()
    assert load_report(out / "baseline.json").ks == [1, 5]

    done = _cli(
        "compare",
        "--cases",
        str(cases_file),
        "--main",
        str(main_dir),
        "--sidecar",
        str(tmp_path / "no-sidecar"),
        "--out",
        str(out),
    )
    assert done.exit_code == 0, done.output
    assert "Sidecar status: unavailable" in (out / "comparison.md").read_text()

    baseline = out / "baseline.json"
    done = _cli("gate", "--baseline", str(baseline), "--current", str(baseline))
    assert done.exit_code == 0, done.output
    assert "PASS" in done.output and "p = 1.0000" in done.output

    # Degrade: the expected doc of c1 drops out of the ranking.
    write_fixture_dir(main_dir, [make_fixture("c1", ["o/1.md"], content="alpha")])
    _cli(
        "run",
        "--cases",
        str(cases_file),
        "--fixtures",
        str(main_dir),
        "--out",
        str(out),
        "--name",
        "current",
    )
    done = _cli("gate", "--baseline", str(baseline), "--current", str(out / "current.json"))
    assert done.exit_code == 1
    assert "FAIL" in done.output and "c1" in done.output


def test_cli_bad_inputs_exit_2(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases:\n- {id: a, scenario: chat\n", encoding="utf-8")
    done = CliRunner().invoke(
        eval_app,
        ["run", "--cases", str(bad), "--fixtures", str(tmp_path), "--out", str(tmp_path / "o")],
    )
    assert done.exit_code == 2
    assert "malformed YAML" in done.output

    good = tmp_path / "good.yaml"
    good.write_text(CASES_YAML, encoding="utf-8")
    done = CliRunner().invoke(
        eval_app,
        [
            "run",
            "--cases",
            str(good),
            "--fixtures",
            str(tmp_path / "nope"),
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert done.exit_code == 2 and "not found" in done.output

    done = CliRunner().invoke(eval_app, ["gate", "--baseline", str(good), "--current", str(good)])
    assert done.exit_code == 2 and "cannot read report" in done.output


def test_cli_json_output_is_the_report_data(tmp_path: Path):
    import json

    cases_file = tmp_path / "cases.yaml"
    cases_file.write_text(CASES_YAML, encoding="utf-8")
    main_dir = main_fixtures(tmp_path / "main")
    out = tmp_path / "out"
    done = _cli("run", "--cases", str(cases_file), "--fixtures", str(main_dir), "--out", str(out), "--json")
    assert done.exit_code == 0, done.output
    printed = json.loads(done.output)
    stored = load_report(out / "baseline.json")
    assert printed["report"]["summary"]["mrr"] == pytest.approx(stored.summary.mrr)
    assert [c["case_id"] for c in printed["report"]["cases"]] == [c.case_id for c in stored.cases]
    assert printed["files"] == [str(out / "baseline.json"), str(out / "baseline.md")]

    done = _cli(
        "compare",
        "--cases",
        str(cases_file),
        "--main",
        str(main_dir),
        "--sidecar",
        str(tmp_path / "none"),
        "--out",
        str(out),
        "--json",
    )
    assert done.exit_code == 0, done.output
    comparison = json.loads(done.output)
    assert comparison["sidecar"] is None and comparison["sidecar_status"]["status"] == "unavailable"

    done = _cli("gate", "--baseline", str(out / "baseline.json"), "--current", str(out / "baseline.json"), "--json")
    assert done.exit_code == 0 and json.loads(done.output)["passed"] is True


def test_a_doc_id_or_query_with_control_characters_cannot_break_a_report_line():
    lines = md_table_lines(["doc_id", "query"], [["a.md\n| forged | row |", "clear \x1b[2J\r\nscreen"]])
    assert len(lines) == 3
    assert lines[2] == "| a.md\\n\\| forged \\| row \\| | clear \\x1b[2J\\r\\nscreen |"
