"""Abstention: does the tool claim support only when the knowledge base answers?

A result *claims support* when its ``relevanceLevel`` is PRECISE or RELEVANT (:data:`CLAIMS`).
``found`` is reported beside it but is not the criterion: WEAK still returns evidence with
``found`` true ("some support, verify"), and an honest "no answer" is WEAK or NONE.

- An **unanswerable** case (``GoldenCase.unanswerable``) passes when the result does not claim
  support (:func:`honest`).
- An **answerable** case is *claimed* when it is labelled PRECISE/RELEVANT; its top-1 is right
  when the first evidence block is an expected document.

:class:`AbstentionFigures` aggregates both per store and suite, with the expected calibration
error (ECE: Naeini, Cooper & Hauskrecht 2015, equal-width bins, weighted by bin size) of the
recorded ``confidence`` against "the top block answers" (1 for a right top-1 of an answerable
case, 0 otherwise), and the reliability bins behind it. Reads fixtures only (no store, no model).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.fixtures import CaseFixture
from rag_core.evaluation.metrics import normalize_doc_id

__all__ = [
    "CLAIMS",
    "ECE_BINS",
    "AbstentionFigures",
    "BandFigures",
    "ReliabilityBin",
    "abstention_figures",
    "claims_support",
    "expected_calibration_error",
    "honest",
    "reliability_bins",
    "top1_correct",
]

CLAIMS = ("PRECISE", "RELEVANT")
LEVELS = ("PRECISE", "RELEVANT", "WEAK", "NONE")
ECE_BINS = 10


def claims_support(fixture: CaseFixture) -> bool:
    """True when the recorded result is labelled PRECISE or RELEVANT."""
    return fixture.relevance_level in CLAIMS


def top1_correct(case: GoldenCase, fixture: CaseFixture) -> bool:
    """True when the first evidence block is one of the case's expected docs (never for an
    unanswerable case)."""
    if case.unanswerable or not fixture.evidence_blocks:
        return False
    expected = {normalize_doc_id(d) for d in case.expected_docs}
    return normalize_doc_id(fixture.evidence_blocks[0].doc_id) in expected


def honest(case: GoldenCase, fixture: CaseFixture) -> bool:
    """The pass/fail of one case on the abstention question: an unanswerable case passes when
    the result does not claim support; an answerable one when it claims support with the right
    top-1 block."""
    if case.unanswerable:
        return not claims_support(fixture)
    return claims_support(fixture) and top1_correct(case, fixture)


class BandFigures(BaseModel):
    """Answerable cases labelled ``level``: ``n`` and how many had the right top-1 block."""

    level: str
    n: int
    top1_correct: int

    @property
    def precision(self) -> float | None:
        """Top-1 precision of the band (None when empty)."""
        return self.top1_correct / self.n if self.n else None


class ReliabilityBin(BaseModel):
    """One confidence bin [``low``, ``high``): ``n`` results, their mean confidence and the
    share whose top block answered (``accuracy``)."""

    low: float
    high: float
    n: int
    mean_confidence: float
    accuracy: float


class AbstentionFigures(BaseModel):
    """Abstention figures of one store over run cases (module docstring).

    ``answerable_claimed``: answerable cases labelled PRECISE/RELEVANT; ``bands``: per level,
    answerable cases and right top-1s; ``unanswerable_claimed`` / ``unanswerable_found``:
    unanswerable cases labelled PRECISE/RELEVANT / returned with ``found`` true (None when the
    fixtures did not record ``found``); ``ece`` and ``reliability`` over the cases whose
    fixture recorded a confidence (``calibrated_n``; None / [] when none did).
    """

    answerable: int = 0
    answerable_claimed: int = 0
    bands: list[BandFigures] = Field(default_factory=list)
    unanswerable: int = 0
    unanswerable_claimed: int = 0
    unanswerable_found: int | None = None
    calibrated_n: int = 0
    ece: float | None = None
    reliability: list[ReliabilityBin] = Field(default_factory=list)

    @property
    def answerable_claimed_share(self) -> float | None:
        """Share of answerable cases labelled PRECISE/RELEVANT (None without any)."""
        return self.answerable_claimed / self.answerable if self.answerable else None

    @property
    def unanswerable_honest(self) -> int:
        """Unanswerable cases that did not claim support."""
        return self.unanswerable - self.unanswerable_claimed


def reliability_bins(
    confidence: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS
) -> list[ReliabilityBin]:
    """Non-empty equal-width bins of [0, 1] (the last one closed) with their counts, mean
    confidence and accuracy."""
    conf = np.clip(np.asarray(confidence, dtype=float), 0.0, 1.0)
    hit = np.asarray(correct, dtype=float)
    index = np.minimum((conf * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        m = index == b
        if m.any():
            out.append(
                ReliabilityBin(
                    low=b / bins,
                    high=(b + 1) / bins,
                    n=int(m.sum()),
                    mean_confidence=float(conf[m].mean()),
                    accuracy=float(hit[m].mean()),
                )
            )
    return out


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS) -> float:
    """ECE: sum over bins of (bin share) x |accuracy - mean confidence|; ValueError when empty."""
    if len(confidence) == 0:
        raise ValueError("expected calibration error of no results")
    return sum(b.n * abs(b.accuracy - b.mean_confidence) for b in reliability_bins(confidence, correct, bins)) / len(
        confidence
    )


def abstention_figures(cases: Sequence[GoldenCase], fixtures: dict[str, CaseFixture]) -> AbstentionFigures:
    """The figures of ``cases`` that have a fixture in ``fixtures`` (case id -> fixture)."""
    fig = AbstentionFigures()
    bands = {level: [0, 0] for level in LEVELS}
    confidence: list[float] = []
    correct: list[bool] = []
    found: list[bool | None] = []
    for case in cases:
        fixture = fixtures.get(case.id)
        if fixture is None:
            continue
        right = top1_correct(case, fixture)
        if case.unanswerable:
            fig.unanswerable += 1
            fig.unanswerable_claimed += claims_support(fixture)
            found.append(fixture.found)
        else:
            fig.answerable += 1
            fig.answerable_claimed += claims_support(fixture)
            band = bands.setdefault(fixture.relevance_level or "NONE", [0, 0])
            band[0] += 1
            band[1] += right
        if fixture.confidence is not None:
            confidence.append(fixture.confidence)
            correct.append(right)
    fig.bands = [BandFigures(level=k, n=n, top1_correct=c) for k, (n, c) in bands.items()]
    if found and all(f is not None for f in found):
        fig.unanswerable_found = sum(bool(f) for f in found)
    if confidence:
        fig.calibrated_n = len(confidence)
        fig.ece = expected_calibration_error(confidence, correct)
        fig.reliability = reliability_bins(confidence, correct)
    return fig
