"""Regression gate: passes on identical runs, fails on degraded fixtures, paired test."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.evaluator import EvaluationReport, evaluate
from rag_core.evaluation.fixtures import load_fixtures
from rag_core.evaluation.gate import compare, paired_randomization_test
from rag_core.evaluation.testing import make_fixture, write_fixture_dir

N = 12
CASES = [
    GoldenCase(
        id=f"c{i:02d}",
        scenario="chat" if i % 3 else "aiops_alert",
        query=f"q{i}",
        expected_docs=[f"k/{i}.md"],
        expected_keywords=["needle"],
    )
    for i in range(N)
]
IDS = [c.id for c in CASES]


def _evaluate(directory: Path, ranks: dict[str, int | None], lost: set[str] = frozenset()) -> EvaluationReport:
    """Fixtures where case i's expected doc sits at ``ranks[id]`` (None: not retrieved); the
    cases in ``lost`` lack the expected keyword (an answer section removed: medium, not strong)."""
    fixtures = []
    for i, cid in enumerate(IDS):
        rank = ranks.get(cid, 1)
        docs = [f"o/{j}.md" for j in range(6)]
        if rank is not None:
            docs.insert(rank - 1, f"k/{i}.md")
        fixtures.append(make_fixture(cid, docs, content="the haystack" if cid in lost else "the needle"))
    write_fixture_dir(directory, fixtures)
    return evaluate(CASES, load_fixtures(directory, IDS))


@pytest.fixture()
def baseline(tmp_path: Path) -> EvaluationReport:
    return _evaluate(tmp_path / "base", {"c01": 2, "c02": 3})


def test_identical_reports_pass(tmp_path: Path, baseline: EvaluationReport):
    again = _evaluate(tmp_path / "again", {"c01": 2, "c02": 3})
    result = compare(baseline, again)
    assert result.passed and result.reasons == []
    assert result.changes == [] and result.newly_missed == []
    assert result.significance.p_value == 1.0
    assert result.significance.n_cases == N
    assert "PASS" in str(result)


def test_degraded_fixtures_fail(tmp_path: Path, baseline: EvaluationReport):
    # Expected docs shifted down for three cases, dropped for two.
    degraded = _evaluate(
        tmp_path / "worse",
        {"c01": 2, "c02": 3, "c03": 4, "c04": 6, "c05": 7, "c06": None, "c07": None},
    )
    result = compare(baseline, degraded)
    assert not result.passed
    assert any(r.startswith("recall@5 dropped") for r in result.reasons)
    assert any(r.startswith("MRR dropped") for r in result.reasons)
    assert any(r.startswith("strong -> miss") for r in result.reasons)
    assert result.newly_missed == ["c04", "c05", "c06", "c07"]
    assert result.strong_to_miss == ["c04", "c05", "c06", "c07"]
    assert result.current_recall_at_5 == pytest.approx(8 / 12)
    change = next(c for c in result.changes if c.case_id == "c03")
    assert (change.baseline_first_hit_rank, change.current_first_hit_rank) == (1, 4)
    assert change.kinds == ["rank_changed"]
    assert result.significance.mean_difference < 0
    # Five cases got worse, none better: exact two-sided p = 2 / 2**5.
    assert result.significance.p_value == pytest.approx(0.0625)
    text = result.to_markdown()
    assert "FAIL" in text and "p = " in text and "| `c06` |" in text

    # The reverse direction is an improvement: newly found, and the gate passes.
    better = compare(degraded, baseline)
    assert better.passed and better.newly_found == ["c04", "c05", "c06", "c07"]


def test_strong_to_medium_at_the_same_rank_is_gated_like_recall(tmp_path: Path, baseline: EvaluationReport):
    # The documents still rank first, but two lost their answer section: recall and MRR unchanged.
    lost = _evaluate(tmp_path / "lost", {"c01": 2, "c02": 3}, lost={"c08", "c09"})
    result = compare(baseline, lost)
    assert result.current_recall_at_5 == result.baseline_recall_at_5 and result.current_mrr == result.baseline_mrr
    assert not result.passed
    assert result.reasons == ["strong hits dropped 1.000 -> 0.833 (-0.167, tolerance 0.020)"]
    text = result.to_markdown()
    assert "strong hits (share): 1.000 -> 0.833" in text and "the verdict does not use it" in text


def test_small_drop_within_tolerance_passes(tmp_path: Path, baseline: EvaluationReport):
    # One case from rank 2 to rank 3: MRR falls by (1/2 - 1/3) / 12 = 0.014 < 0.02.
    slightly = _evaluate(tmp_path / "slightly", {"c01": 3, "c02": 3})
    result = compare(baseline, slightly)
    assert result.passed, result.reasons
    assert [c.case_id for c in result.changes] == ["c01"]
    assert not compare(baseline, slightly, mrr_tolerance=0.01).passed


def test_case_no_longer_run_fails_unless_allowed(tmp_path: Path, baseline: EvaluationReport):
    current = _evaluate(tmp_path / "cur", {"c01": 2, "c02": 3})
    (tmp_path / "cur" / "c05.json").unlink()
    current = evaluate(CASES, load_fixtures(tmp_path / "cur", IDS))
    result = compare(baseline, current)
    assert not result.passed and result.newly_not_run == ["c05"]
    assert result.compared_cases == N - 1
    assert compare(baseline, current, fail_on_not_run=False).passed


def test_nothing_comparable_fails(tmp_path: Path, baseline: EvaluationReport):
    nothing = evaluate(CASES, load_fixtures(tmp_path / "missing", IDS))
    result = compare(baseline, nothing)
    assert not result.passed
    assert result.reasons[0] == "no case ran in both the baseline and the current evaluation"
    assert result.significance is None


def test_paired_test_matches_exact_sign_flip_enumeration():
    base = [1.0, 0.5, 1.0, 0.0, 1.0, 0.33, 1.0, 0.25]
    cur = [1.0, 0.25, 0.5, 0.0, 0.2, 0.33, 1.0, 1.0]
    diffs = [c - b for b, c in zip(base, cur, strict=True)]
    observed = abs(sum(diffs) / len(diffs))
    flips = list(itertools.product((1, -1), repeat=len(diffs)))
    extreme = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True)) / len(diffs)) >= observed - 1e-12 for signs in flips
    )
    result = paired_randomization_test(base, cur)
    assert result.p_value == pytest.approx(extreme / len(flips))
    assert result.mean_difference == pytest.approx(sum(diffs) / len(diffs))
    # Fixed seed: the same input gives the same p-value when sampling is needed too.
    many_b = [(i % 5) / 5 for i in range(40)]
    many_c = [((i + 1) % 5) / 5 for i in range(40)]
    first = paired_randomization_test(many_b, many_c).p_value
    assert paired_randomization_test(many_b, many_c).p_value == first


def test_paired_test_agrees_with_scipy_exact_permutation_test():
    np = pytest.importorskip("numpy")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    base = rng.random(10)
    cur = np.clip(base + rng.normal(0.1, 0.2, 10), 0, 1)
    expected = stats.permutation_test(
        (cur, base),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=10_000,  # 2**10 < 10_000, so scipy enumerates exactly too
    ).pvalue
    assert paired_randomization_test(base, cur).p_value == pytest.approx(expected)
