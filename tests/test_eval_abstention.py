"""Unanswerable cases and abstention figures: evaluator, gate, reports, case files (issue 43)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_core.evaluation.abstention import (
    abstention_figures,
    expected_calibration_error,
    honest,
    reliability_bins,
)
from rag_core.evaluation.cases import GoldenCase, load_cases
from rag_core.evaluation.evaluator import EvaluationReport, evaluate
from rag_core.evaluation.fixtures import CaseFixture, load_fixtures
from rag_core.evaluation.gate import compare
from rag_core.evaluation.reports import render_baseline_markdown
from rag_core.evaluation.suites import load_suites
from rag_core.evaluation.testing import make_fixture, write_fixture_dir

ANSWERABLE = [GoldenCase(id=f"a{i}", scenario="chat", query=f"q{i}", expected_docs=[f"k/{i}.md"]) for i in range(4)]
UNANSWERABLE = [GoldenCase(id=f"u{i}", scenario="chat", query=f"nothing {i}", unanswerable=True) for i in range(3)]
CASES = ANSWERABLE + UNANSWERABLE


def _fixture(case_id: str, docs: list[str], level: str, confidence: float | None = None) -> CaseFixture:
    found = level != "NONE"
    return make_fixture(case_id, docs).model_copy(
        update={"relevance_level": level, "confidence": confidence, "found": found}
    )


def _report(directory: Path, levels: dict[str, str], confidence: dict[str, float] | None = None) -> EvaluationReport:
    """a0/a1 have the right top-1, a2 the right doc second, a3 misses; u* get wrong docs."""
    confidence = confidence or {}
    docs = {"a0": ["k/0.md"], "a1": ["k/1.md", "o/1.md"], "a2": ["o/2.md", "k/2.md"], "a3": ["o/3.md"]}
    fixtures = [
        _fixture(c.id, docs.get(c.id, ["o/x.md"]), levels.get(c.id, "WEAK"), confidence.get(c.id)) for c in CASES
    ]
    write_fixture_dir(directory, fixtures)
    return evaluate(CASES, load_fixtures(directory, [c.id for c in CASES]))


def test_unanswerable_cases_are_scored_on_the_claim_not_on_rank(tmp_path: Path):
    report = _report(tmp_path, {"a0": "PRECISE", "a1": "RELEVANT", "u0": "RELEVANT", "u1": "WEAK", "u2": "NONE"})
    levels = {c.case_id: c.hit_level for c in report.cases}
    assert (levels["u0"], levels["u1"], levels["u2"]) == ("claimed", "abstained", "abstained")
    # Rank metrics are over the four answerable cases only (a0, a1 at 1, a2 at 2, a3 missed).
    assert report.summary.run_count == 4 and report.summary.not_run == 0
    assert report.summary.recall_at_k[1] == pytest.approx(2 / 4)
    assert report.summary.mrr == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    fig = report.abstention
    assert (fig.unanswerable, fig.unanswerable_claimed, fig.unanswerable_honest) == (3, 1, 2)
    assert fig.unanswerable_found == 2  # NONE is the only level with found false here
    assert (fig.answerable, fig.answerable_claimed) == (4, 2)
    bands = {b.level: (b.n, b.top1_correct) for b in fig.bands}
    assert bands["PRECISE"] == (1, 1) and bands["RELEVANT"] == (1, 1) and bands["WEAK"] == (2, 0)


def test_honest_is_one_pass_fail_per_case():
    right = _fixture("a0", ["k/0.md"], "RELEVANT")
    wrong_top = _fixture("a0", ["o/0.md", "k/0.md"], "RELEVANT")
    assert honest(ANSWERABLE[0], right) and not honest(ANSWERABLE[0], wrong_top)
    assert not honest(ANSWERABLE[0], right.model_copy(update={"relevance_level": "WEAK"}))
    assert honest(UNANSWERABLE[0], _fixture("u0", ["o/x.md"], "WEAK"))
    assert not honest(UNANSWERABLE[0], _fixture("u0", ["o/x.md"], "PRECISE"))


def test_expected_calibration_error_by_hand():
    # One bin at 0.9 with half right: |0.5 - 0.9| = 0.4; a second, perfectly calibrated bin
    # (0.0, all wrong) of the same size halves it.
    assert expected_calibration_error([0.9] * 4, [True, False, True, False]) == pytest.approx(0.4)
    assert expected_calibration_error([0.9] * 4 + [0.0] * 4, [True, False] * 2 + [False] * 4) == pytest.approx(0.2)
    bins = reliability_bins([0.05, 0.95, 1.0], [False, True, True])
    assert [(b.low, b.n, b.accuracy) for b in bins] == [(0.0, 1, 0.0), (pytest.approx(0.9), 2, 1.0)]
    with pytest.raises(ValueError):
        expected_calibration_error([], [])


def test_figures_take_ece_from_recorded_confidence(tmp_path: Path):
    conf = {"a0": 0.9, "a1": 0.9, "a2": 0.9, "a3": 0.9}
    report = _report(tmp_path, {}, conf)
    fig = report.abstention
    assert fig.calibrated_n == 4 and fig.ece == pytest.approx(abs(0.5 - 0.9))
    assert abstention_figures(CASES, {}).calibrated_n == 0


def test_gate_fails_when_an_unanswerable_case_starts_claiming(tmp_path: Path):
    base = _report(tmp_path / "b", {"a0": "PRECISE", "a1": "RELEVANT"})
    now = _report(tmp_path / "c", {"a0": "PRECISE", "a1": "RELEVANT", "u1": "RELEVANT"})
    result = compare(base, now)
    assert not result.passed and result.newly_claimed == ["u1"]
    assert any("u1" in r for r in result.reasons)
    assert compare(base, base).passed


def test_gate_fails_when_answerable_claims_drop_more_than_tolerance(tmp_path: Path):
    base = _report(tmp_path / "b", {"a0": "PRECISE", "a1": "RELEVANT"})
    now = _report(tmp_path / "c", {"a0": "PRECISE", "a1": "WEAK"})
    result = compare(base, now)
    assert (result.baseline_claimed_share, result.current_claimed_share) == (0.5, 0.25)
    assert not result.passed and any("PRECISE/RELEVANT" in r for r in result.reasons)
    assert compare(base, now, claimed_tolerance=0.3).passed


def test_gate_on_an_all_unanswerable_suite_compares(tmp_path: Path):
    only = UNANSWERABLE
    ids = [c.id for c in only]
    write_fixture_dir(tmp_path, [_fixture(c.id, ["o/x.md"], "WEAK") for c in only])
    report = evaluate(only, load_fixtures(tmp_path, ids))
    assert report.summary.run_count == 0
    assert compare(report, report).passed


def test_report_has_an_abstention_section(tmp_path: Path):
    report = _report(tmp_path, {"u0": "RELEVANT"}, {"a0": 0.5})
    text = render_baseline_markdown(report)
    assert "## Abstention" in text and "2/3" in text and "**CLAIMED**" in text


def test_written_unanswerable_suites_load_and_are_unanswerable():
    suites = {s.name: s for s in load_suites()}
    ids: set[str] = set()
    for name in ("sample-unanswerable", "runbooks-en-unanswerable", "runbooks-zh-unanswerable"):
        cases = load_cases(suites[name].cases)
        assert cases and all(c.unanswerable for c in cases)
        assert not ids & {c.id for c in cases}
        ids |= {c.id for c in cases}
        answerable_dirs = {s.knowledge_dir for s in suites.values() if not s.name.endswith("-unanswerable")}
        assert suites[name].knowledge_dir in answerable_dirs
