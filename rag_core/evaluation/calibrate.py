"""``rag eval calibrate``: similarity thresholds for one embedding model, from recorded fixtures.

Each model spreads cosines differently (all-MiniLM-L6-v2: unrelated text near 0.1, relevant
0.45-0.75; e5: everything between 0.7 and 0.9), so the thresholds of ``RagSettings`` are
calibrated per model and written into its profile (``rag_core/embedding/profiles.json``, read by
``rag_core.model_profiles``).

Per case, ``x`` = the top evidence block's normalised similarity (the number
``assess_relevance`` and the retry trigger compare) and ``y`` = whether an expected document is
among the evidence blocks. Then:

* ``relevant_threshold``: the cut that maximises Youden's J = TPR - FPR over the cases
  (Youden 1950, "Index for rating diagnostic tests"), midway between the two neighbouring
  scores. With no negative case (every expected doc found) J is undefined; the cut is then the
  ``REFERENCE_QUANTILE`` quantile of the positives' scores (nothing to separate from).
* ``high_relevance_threshold``: the lowest cut >= relevant at which the cases above it are
  ``HIGH_PRECISION`` positives and which keeps at least ``HIGH_MIN_SHARE`` of the positives
  above it (else the positives' median). For a model whose cosines cannot separate the two
  levels this equals relevant, and PRECISE rests on L0 agreeing with the top block.
* ``reference_threshold`` (below it attempt 1 counts as low quality and the unfiltered retry
  runs): the ``REFERENCE_QUANTILE`` quantile of the positives' scores, at most relevant, so a
  retry is rare when the answer is there.
* ``min_block_similarity`` (evidence under it is dropped): below the lowest similarity of any
  expected-doc candidate seen, by ``BLOCK_MARGIN`` (room for unseen phrasings), and at most the
  reference threshold, so no answer seen in the golden sets would have been dropped.

It also reports how often ``relevanceLevel`` agrees with the hit level (PRECISE/RELEVANT for a
strong or medium hit, WEAK/NONE for a miss): as recorded, and as the new thresholds would set
it from the top score (PRECISE needs L0 agreement, which fixtures do not keep, so the
simulation counts PRECISE and RELEVANT together).

Reads cases and fixtures only (no pymilvus, psycopg or torch). The command is in
``rag_core.cli.evaluation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.evaluator import evaluate
from rag_core.evaluation.fixtures import FixtureSet

HIGH_PRECISION = 0.95
HIGH_MIN_SHARE = 0.25
REFERENCE_QUANTILE = 0.05
BLOCK_MARGIN = 0.05
_SUPPORTED = {"PRECISE", "RELEVANT"}


@dataclass
class CaseScore:
    """One case's calibration input: top evidence similarity and whether the answer was in it."""

    case_id: str
    top_similarity: float
    answer_in_evidence: bool
    hit_level: str
    recorded_level: str | None
    expected_similarities: list[float] = field(default_factory=list)


@dataclass
class Calibration:
    """Chosen thresholds, the figures they came from and the relevance agreement."""

    thresholds: dict[str, float]
    cases: int
    positives: int
    negatives: int
    youden_j: float | None
    agreement_recorded: float | None
    agreement_calibrated: float | None
    method: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def case_scores(cases: Sequence[GoldenCase], fixtures: FixtureSet) -> list[CaseScore]:
    """The per-case inputs of every case that has a fixture (not_run cases are left out)."""
    hit_levels = {r.case_id: r.hit_level for r in evaluate(cases, fixtures).cases}
    out = []
    for case in cases:
        fx = fixtures.fixtures.get(case.id)
        if fx is None:
            continue
        expected = set(case.expected_docs)
        scores = [b.similarity for b in fx.evidence_blocks if b.similarity is not None]
        if not scores:
            scores = [c.similarity for c in fx.candidates[:1] if c.similarity is not None]
        out.append(
            CaseScore(
                case_id=case.id,
                top_similarity=max(scores, default=0.0),
                answer_in_evidence=any(b.doc_id in expected for b in fx.evidence_blocks),
                hit_level=hit_levels.get(case.id, "not_run"),
                recorded_level=fx.relevance_level,
                expected_similarities=[
                    c.similarity for c in fx.candidates if c.doc_id in expected and c.similarity is not None
                ],
            )
        )
    return out


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def youden_cut(pos: Sequence[float], neg: Sequence[float]) -> tuple[float, float]:
    """``(cut, J)``: the threshold maximising TPR - FPR for "score >= cut means positive".

    Candidate cuts lie midway between consecutive distinct scores; ties go to the lower cut.
    """
    values = sorted(set(pos) | set(neg))
    cuts = [values[0] - 1e-6] + [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    best = (cuts[0], -1.0)
    for cut in cuts:
        j = youden_j(pos, neg, cut)
        if j > best[1] + 1e-12:
            best = (cut, j)
    return best


def youden_j(pos: Sequence[float], neg: Sequence[float], cut: float) -> float:
    return sum(p >= cut for p in pos) / len(pos) - sum(n >= cut for n in neg) / len(neg)


def _high_cut(scores: Sequence[CaseScore], relevant: float, pos: Sequence[float]) -> float:
    # The lowest cut >= relevant whose cases above are HIGH_PRECISION answered. When the model's
    # cosines cannot tell PRECISE from RELEVANT (e5's narrow range), this is relevant itself and
    # PRECISE rests on L0 agreeing with the top block (see assess_relevance).
    for cut in sorted({s.top_similarity for s in scores if s.top_similarity >= relevant}):
        above = [s for s in scores if s.top_similarity >= cut]
        answered = sum(s.answer_in_evidence for s in above)
        if answered / len(above) >= HIGH_PRECISION and answered / len(pos) >= HIGH_MIN_SHARE:
            return max(cut, relevant)
    return max(relevant, _quantile(pos, 0.5))


def _agreement(scores: Sequence[CaseScore], level_of: Any) -> float | None:
    judged = [(level_of(s), s.hit_level in ("strong", "medium")) for s in scores if s.hit_level != "not_run"]
    judged = [(lvl, hit) for lvl, hit in judged if lvl is not None]
    if not judged:
        return None
    return round(sum((lvl in _SUPPORTED) == hit for lvl, hit in judged) / len(judged), 4)


def agreement_cut(pos: Sequence[float], neg: Sequence[float]) -> tuple[float, float]:
    """``(cut, accuracy)``: the threshold with the most cases on the right side (positives at or
    above it, negatives below). With few negatives this favours calling nearly everything relevant."""
    values = sorted(set(pos) | set(neg))
    cuts = [values[0] - 1e-6] + [(a + b) / 2 for a, b in zip(values, values[1:], strict=False)]
    total = len(pos) + len(neg)
    best = (cuts[0], -1.0)
    for cut in cuts:
        acc = (sum(p >= cut for p in pos) + sum(n < cut for n in neg)) / total
        if acc > best[1] + 1e-12:
            best = (cut, acc)
    return best


def calibrate(scores: Sequence[CaseScore], objective: str = "youden") -> Calibration:
    """Thresholds from the case scores (see the module docstring). ``objective`` is ``youden``
    (balanced: TPR - FPR) or ``agreement`` (accuracy). ValueError without positives."""
    pos = [s.top_similarity for s in scores if s.answer_in_evidence]
    neg = [s.top_similarity for s in scores if not s.answer_in_evidence]
    if not pos:
        raise ValueError("no case has its expected document in the evidence: nothing to calibrate on")
    reference_q = _quantile(pos, REFERENCE_QUANTILE)
    if neg and objective == "agreement":
        relevant, _ = agreement_cut(pos, neg)
        j, method = youden_j(pos, neg, relevant), "agreement"
    elif neg:
        relevant, j = youden_cut(pos, neg)
        method = "youden"
    else:
        relevant, j, method = reference_q, None, "positives-only quantile"
    relevant = max(0.0, min(1.0, relevant))
    high = _high_cut(scores, relevant, pos)
    reference = min(reference_q, relevant)
    seen = [v for s in scores for v in s.expected_similarities]
    min_block = max(0.0, min(min(seen, default=reference) - BLOCK_MARGIN, reference))
    thresholds = {
        "reference_threshold": round(reference, 3),
        "relevant_threshold": round(relevant, 3),
        "high_relevance_threshold": round(max(high, relevant), 3),
        "min_block_similarity": round(min_block, 3),
    }

    def simulated(s: CaseScore) -> str:
        if s.top_similarity <= 0:
            return "NONE"
        return "RELEVANT" if s.top_similarity >= thresholds["relevant_threshold"] else "WEAK"

    return Calibration(
        thresholds=thresholds,
        cases=len(scores),
        positives=len(pos),
        negatives=len(neg),
        youden_j=None if j is None else round(j, 4),
        agreement_recorded=_agreement(scores, lambda s: s.recorded_level),
        agreement_calibrated=_agreement(scores, simulated),
        method=method,
    )


def model_of_fixtures(fixture_sets: Sequence[FixtureSet]) -> tuple[str, str]:
    """``(backend, model_id)`` the fixture manifests were recorded with; ValueError when they name
    none or several."""
    models = set()
    for fs in fixture_sets:
        extra = fs.manifest.model_extra if fs.manifest and fs.manifest.model_extra else {}
        model = extra.get("model") or {}
        if model:
            models.add((str(model.get("backend")), str(model.get("model_id"))))
    if len(models) != 1:
        raise ValueError(
            "the fixture manifests name "
            + (f"several models {sorted(models)}" if models else "no model (recorded before models were recorded)")
            + ": pass --backend and --model"
        )
    return next(iter(models))
