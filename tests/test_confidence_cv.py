"""Fitting and cross-validating the calibrated confidence (rag_core.evaluation.confidence_cv)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_core.evaluation.confidence_cv import (
    Sample,
    cross_validate,
    figures,
    fit,
    held_out_docs,
    level_after,
    subsample,
    suite_rows,
)
from rag_core.evaluation.known_items import KnownItem
from rag_core.lookup.confidence import SIGNALS, ConfidenceModel

pytest.importorskip("sklearn")


def _samples(n: int, seed: int = 0) -> list[Sample]:
    """Answerable: labels drawn with P(answer) = sigmoid(12 * (similarity - 0.6)), a known truth;
    unanswerable (every fourth): similarity at most 0.7, label 0."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = np.zeros(len(SIGNALS))
        answerable = i % 4 != 0
        x[0] = rng.uniform(0.2, 1.0 if answerable else 0.7)
        x[1] = rng.normal()  # noise signal
        p = 1 / (1 + np.exp(-12 * (x[0] - 0.6)))
        label = int(answerable and rng.random() < p)
        out.append(
            Sample(
                item_id=f"q{i}",
                group=f"doc{i // 3}",
                language="en" if i % 2 else "zh",
                source="answerable" if answerable else "held-out",
                label=label,
                pair="latin->latin",
                x=x,
                level_before="RELEVANT",
                found_before=True,
            )
        )
    return out


def test_cross_validated_confidence_is_calibrated_on_a_known_truth():
    samples = _samples(2000)
    conf = cross_validate(samples, folds=5)
    assert not np.isnan(conf).any()
    rows = {r["language"]: r for r in figures(samples, conf)}
    assert rows["all"]["ece"] < 0.05 and rows["en"]["calibrated_n"] + rows["zh"]["calibrated_n"] == 2000
    # Each band's top-1 precision reaches its floor (PRECISE >= 0.95 is rare here; RELEVANT >= 0.8).
    for level, floor in (("PRECISE", 0.95), ("RELEVANT", 0.8)):
        right, n = rows["all"]["after"]["bands"][level]
        assert n > 50 and right / n >= floor - 0.03, (level, right, n)
    # Before: everything RELEVANT, so every unanswerable query claimed support; after: few.
    assert rows["all"]["before"]["unanswerable_claimed"] == rows["all"]["unanswerable"]
    assert rows["all"]["after"]["unanswerable_claimed"] < rows["all"]["unanswerable"] / 5


def test_fitted_model_round_trips_through_json():
    samples = _samples(800, seed=1)
    model = fit(samples, {"ensemble_backend": "use"})
    again = ConfidenceModel.from_json(json.loads(json.dumps(model.to_json())))
    for s in samples[:50]:
        assert again.model_for(s.pair).probability(s.x) == pytest.approx(
            model.model_for(s.pair).probability(s.x), abs=1e-4
        )
    assert level_after(model, samples[0]) in ("PRECISE", "RELEVANT", "WEAK", "NONE")


def test_samples_without_signals_keep_their_uncalibrated_level():
    samples = _samples(400, seed=2)
    samples[0].x = None
    samples[0].level_before = "WEAK"
    model = fit(samples[1:], {})
    assert level_after(model, samples[0]) == "WEAK"
    assert np.isnan(cross_validate(samples, folds=4)[0])


def test_suite_rows_score_rank_and_claims():
    model = fit(_samples(400, seed=3), {})
    strong = np.zeros(len(SIGNALS))
    strong[0] = 1.0
    weak = np.zeros(len(SIGNALS))
    weak[0] = 0.0
    base = {"group": "g", "language": "en", "pair": "latin->latin", "level_before": "RELEVANT", "found_before": True}
    rows = suite_rows(
        {
            "s": [
                Sample("a", source="answerable", label=1, x=strong, ranking=("d1", "d2"), expected=("d1",), **base),
                Sample("b", source="answerable", label=0, x=strong, ranking=("d3", "d4"), expected=("d4",), **base),
                Sample("u", source="written", label=0, x=weak, ranking=("d5",), **base),
            ]
        },
        model,
    )
    (row,) = rows
    assert row["recall@5"] == 1.0 and row["mrr"] == pytest.approx((1 + 0.5) / 2)
    assert row["before"]["unanswerable_claimed"] == 1 and row["after"]["unanswerable_claimed"] == 0
    assert row["before"]["answerable_claimed"] == 2 and row["before"]["claimed_top1_right"] == 1


def test_subsample_keeps_one_variant_per_section_and_caps_each_index(tmp_path):
    items = [
        KnownItem(f"en:a.md:{h}:{k}", f"{h} {k}", "a.md", "en", "en", "en", k, h)
        for h in ("Meaning", "Impact")
        for k in ("section", "typo")
    ] + [KnownItem("en:a.md:title", "a", "a.md", "en", "en", "en", "title")]
    picked = subsample(items)
    assert sorted(i.heading for i in picked) == ["", "Impact", "Meaning"] and subsample(items) == picked
    assert len(subsample(items, per_index=2)) == 2
    for name in ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j"):
        (tmp_path / f"{name}.md").write_text("x", encoding="utf-8")
    held = held_out_docs(tmp_path, share=0.5)
    assert held == held_out_docs(tmp_path, share=0.5) and held <= {f"{n}.md" for n in "abcdefghij"}
    assert held_out_docs(tmp_path, share=0.0) == set() and len(held_out_docs(tmp_path, share=1.0)) == 10
