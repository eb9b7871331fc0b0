"""Format versions of fixtures, manifests, reports and history lines (rag_core.evaluation.formats).

Version-1 files (written before ``format_version``, with the old key names) load with their keys
mapped; a version this code does not know fails with one line naming the file and the version.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_assets.history import HISTORY_FILE, HistoryError, load_history
from rag_core.cli.evaluation import eval_app
from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.evaluator import evaluate
from rag_core.evaluation.fixtures import CaseFixture, FixtureManifest, load_fixtures
from rag_core.evaluation.formats import FORMAT_VERSION, FormatVersionError, parse_json_model, read_json_model
from rag_core.evaluation.reports import ComparisonReport, load_report, write_baseline_report
from rag_core.evaluation.testing import make_fixture, write_fixture_dir
from rag_core.settings import PROJECT_ROOT

REPORTS = PROJECT_ROOT / "golden" / "reports"
CASE = GoldenCase(id="a", scenario="chat", query="q", expected_docs=["k/A.md"])

V1_MANIFEST = {
    "path": "pgvector",
    "corpus_hash": "sha256:ab",
    "index_params": {"metric": "COSINE"},
    "path_status": {"status": "available", "reason": None},
}
V1_ROW = {"rank": 1, "doc_id": "k/A.md", "raw_score": 0.2, "score_label": "pgvector_cosine_distance[0,2]"}
V1_FIXTURE = {
    "case_id": "a",
    "path": "pgvector",
    "candidates": [{**V1_ROW, "normalized_score": 0.8}],
    "evidence_blocks": [{**V1_ROW, "normalized_score": 0.8, "content": "text"}],
    "context_pack_sources": ["k/A.md"],
    "filter_probe": {"category_filter": "k", "unfiltered_candidates": [{**V1_ROW, "normalized_score": 0.7}]},
}


def _write_json(file: Path, data: dict) -> Path:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(data), encoding="utf-8")
    return file


def test_a_version_1_fixture_directory_loads_with_its_keys_mapped(tmp_path: Path):
    _write_json(tmp_path / "manifest.json", V1_MANIFEST)
    _write_json(tmp_path / "a.json", V1_FIXTURE)
    fixtures = load_fixtures(tmp_path, ["a"])

    assert fixtures.store == "pgvector" and fixtures.store_status.available and not fixtures.not_run
    fixture = fixtures.fixtures["a"]
    assert fixture.format_version == FORMAT_VERSION and fixture.store == "pgvector"
    assert fixture.candidates[0].similarity == 0.8 and fixture.evidence_blocks[0].similarity == 0.8
    assert fixture.context_pack_doc_ids == ["k/A.md"]
    assert fixture.filter_probe is not None and fixture.filter_probe.unfiltered_candidates[0].similarity == 0.7
    assert fixtures.manifest is not None and fixtures.manifest.index_params == {"metric": "COSINE"}  # verbatim
    report = evaluate([CASE], fixtures)
    assert report.store == "pgvector" and report.cases[0].hit_level == "strong"


def test_files_written_now_carry_format_version_2_and_the_new_names(tmp_path: Path):
    directory = write_fixture_dir(tmp_path / "fx", [make_fixture("a", ["k/A.md"], store="pgvector")])
    fixture = json.loads((directory / "a.json").read_text())
    manifest = json.loads((directory / "manifest.json").read_text())
    assert fixture["format_version"] == manifest["format_version"] == 2
    assert fixture["store"] == manifest["store"] == "pgvector" and "store_status" in manifest
    assert "similarity" in fixture["candidates"][0] and "context_pack_doc_ids" in fixture
    old = {"path", "path_status", "normalized_score", "context_pack_sources"}
    assert not old & {*fixture, *manifest, *fixture["candidates"][0]}

    written = write_baseline_report(evaluate([CASE], load_fixtures(directory, ["a"])), tmp_path / "out")
    report = json.loads(written.files.json_path.read_text())
    assert report["format_version"] == 2 and report["store"] == "pgvector" and "schema_version" not in report


@pytest.mark.parametrize("name", ["manifest.json", "a.json"])
def test_an_unknown_future_version_fails_with_one_line_naming_file_and_version(tmp_path: Path, name: str):
    write_fixture_dir(tmp_path, [make_fixture("a", ["k/A.md"])])
    file = tmp_path / name
    _write_json(file, {**json.loads(file.read_text()), "format_version": 3})
    with pytest.raises(FormatVersionError) as info:
        load_fixtures(tmp_path, ["a"])
    message = str(info.value)
    assert "\n" not in message and str(file) in message and "format_version 3" in message


def test_the_cli_reports_a_future_version_in_one_line_and_exits_2(tmp_path: Path):
    fixtures = write_fixture_dir(tmp_path / "fx", [make_fixture("a", ["k/A.md"])])
    _write_json(fixtures / "a.json", {**json.loads((fixtures / "a.json").read_text()), "format_version": 9})
    cases = tmp_path / "cases.yaml"
    cases.write_text("cases:\n- {id: a, scenario: chat, query: q, expected_docs: [k/A.md]}\n")
    result = CliRunner().invoke(
        eval_app, ["run", "--cases", str(cases), "--fixtures", str(fixtures), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2
    assert "a.json: format_version 9" in result.output and "Traceback" not in result.output


def test_version_1_data_built_in_code_must_go_through_the_reader():
    assert parse_json_model(json.dumps(V1_FIXTURE), CaseFixture, "f.json").store == "pgvector"
    with pytest.raises(ValueError, match="format_version 1 data must be read with parse_json_model"):
        CaseFixture.model_validate({**V1_FIXTURE, "format_version": 1})
    # Without a version, data built in code is current: old names are not guessed.
    assert FixtureManifest.model_validate({"store": "milvus"}).store_status.available


@pytest.mark.parametrize(
    "file", sorted(REPORTS.glob("*baseline*.json")) + sorted(REPORTS.glob("suites/*/baseline.json")), ids=str
)
def test_the_stored_baselines_load(file: Path):
    raw = json.loads(file.read_text())
    report = load_report(file)
    assert report.store == raw.get("store", raw.get("path")) and report.cases
    status = raw.get("store_status", raw.get("path_status"))
    assert report.store_status.status == status["status"]
    if report.manifest is not None:
        assert report.manifest.store == report.store


def test_the_stored_comparison_loads():
    file = REPORTS / "comparison.json"
    raw = json.loads(file.read_text())
    comparison = read_json_model(file, ComparisonReport)
    assert comparison.main_store == raw.get("main_store", raw.get("main_path")) == comparison.main.store
    first = raw["cases"][0]["main_top"][0]
    assert comparison.cases[0].main_top[0].similarity == first.get("similarity", first.get("normalized_score"))


def test_a_future_report_version_fails_clearly(tmp_path: Path):
    raw = json.loads((REPORTS / "baseline.json").read_text())
    raw.pop("schema_version", None)
    file = _write_json(tmp_path / "baseline.json", {**raw, "format_version": 3})
    with pytest.raises(FormatVersionError, match=r"baseline.json: format_version 3 is not one this rag_core reads"):
        load_report(file)


def test_a_version_1_history_line_loads(tmp_path: Path):
    night = {
        "night": "2026-11-30",
        "recorded_at": "2026-11-30T02:10:00+00:00",
        "paths": {
            "milvus": {
                "status": "available",
                "case_count": 1,
                "run_count": 1,
                "recall_at_5": 1.0,
                "mrr": 1.0,
                "strong": 1,
                "medium": 0,
                "miss": 0,
                "not_run": 0,
                "cases": {"path": {"hit_level": "strong", "first_hit_rank": 1}},  # a case id, not a key
            }
        },
    }
    history = tmp_path / HISTORY_FILE
    history.write_text(json.dumps(night) + "\n" + json.dumps({**night, "night": "2026-12-01", "format_version": 7}))
    with pytest.raises(HistoryError, match=r"history.jsonl:2: format_version 7"):
        load_history(history)
    history.write_text(json.dumps(night) + "\n")
    (loaded,) = load_history(history)
    assert list(loaded.stores) == ["milvus"] and list(loaded.stores["milvus"].cases) == ["path"]
