"""Golden retrieval evaluation over recorded fixtures (offline: no store, no model).

Each case is classified (DESIGN.md "Evaluation"), with ``strong_k`` = 5 by default:

- **strong**: an expected doc is in the top ``strong_k`` docs of the doc ranking and
  coverage is met: every expected keyword appears (case-insensitive, NFKC, whitespace
  folded) in the content of the evidence blocks in the top ``strong_k``, and, when expected
  breadcrumbs are given, one of them is a case-insensitive substring of a breadcrumb of
  those top items or of the top ``strong_k`` chunk-level candidates;
- **medium**: an expected doc is in the top ``strong_k``, coverage not met;
- **miss**: no expected doc in the top ``strong_k`` (it may still be further down);
- **not_run**: no usable fixture (missing, corrupt, store unavailable), with the reason.

An unanswerable case (``GoldenCase.unanswerable``) is **abstained** when the result does not
claim support (relevanceLevel WEAK or NONE) and **claimed** when it does
(:mod:`rag_core.evaluation.abstention`); it has no rank metrics.

Rates (recall@K, MRR, nDCG@10, ...) are over run answerable cases; not_run cases are counted
apart; ``EvaluationReport.abstention`` holds the abstention figures beside them.
The doc ranking is defined in ``rag_core.evaluation.metrics``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from rag_core.evaluation.abstention import AbstentionFigures, abstention_figures, claims_support
from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.filter_cost import FilterCostSummary, FilterOutcome, classify
from rag_core.evaluation.filter_cost import summarize as summarize_filter_cost
from rag_core.evaluation.fixtures import (
    CaseFixture,
    FixtureCandidate,
    FixtureEvidenceBlock,
    FixtureManifest,
    FixtureSet,
    StoreStatus,
)
from rag_core.evaluation.formats import VersionedFile
from rag_core.evaluation.metrics import (
    first_hit_rank,
    ndcg_at_k,
    normalize_doc_id,
    ranked_docs,
    recall_at_k,
    reciprocal_rank,
)
from rag_core.fileio import portable_path

__all__ = [
    "DEFAULT_KS",
    "LABEL_COUNT",
    "NDCG_K",
    "CaseResult",
    "EvaluationReport",
    "HitLevel",
    "MetricSummary",
    "candidate_label",
    "evaluate",
]

HitLevel = Literal["strong", "medium", "miss", "not_run", "abstained", "claimed"]
DEFAULT_KS: tuple[int, ...] = (1, 3, 5, 10)
NDCG_K = 10
LABEL_COUNT = 5


class CaseResult(BaseModel):
    """Outcome of one golden case on one store.

    ``first_hit_rank`` is the 1-based position of the first expected doc in the doc ranking
    (``None``: not retrieved at all); ``reciprocal_rank`` is 1/that (0.0 when not retrieved);
    ``recall_at_k`` maps K -> 1.0/0.0; ``top_docs`` are the first max(K, 10) doc ids of the
    ranking (``None`` = block without doc id); ``top_candidates`` are human-readable labels
    of the first five positions; ``context_pack_survived`` is ``None`` when no expected doc
    was among the evidence blocks (nothing to pack). Metric fields are ``None`` for not_run and
    unanswerable cases. ``relevance_level`` / ``confidence``: the recorded result's.
    """

    case_id: str
    scenario: str
    query: str
    expected_docs: list[str]
    hit_level: HitLevel
    not_run_reason: str | None = None
    retrieval_layer: str | None = None
    first_hit_rank: int | None = None
    reciprocal_rank: float | None = None
    recall_at_k: dict[int, float] = Field(default_factory=dict)
    ndcg_at_10: float | None = None
    context_pack_survived: bool | None = None
    top_docs: list[str | None] = Field(default_factory=list)
    top_candidates: list[str] = Field(default_factory=list)
    failed_checks: list[str] = Field(default_factory=list)
    filter_outcome: FilterOutcome | None = None
    unanswerable: bool = False
    relevance_level: str | None = None
    confidence: float | None = None


class MetricSummary(BaseModel):
    """Aggregate metrics over a set of case results.

    ``case_count`` = all cases, ``run_count`` = answerable cases not not_run (unanswerable
    ones are in ``EvaluationReport.abstention``). Rates are over run cases
    and ``None`` when nothing ran: ``recall_at_k`` (K -> hit rate in [0, 1]), ``mrr`` (mean
    reciprocal rank, [0, 1]), ``ndcg_at_10`` ([0, 1]). ``avg_first_hit_rank`` (1 = top) is
    over the ``hit_count`` cases whose expected doc is anywhere in the ranking.
    ``context_pack_survival_rate`` is the share of the ``context_pack_eligible`` cases (an
    expected doc among the evidence blocks) whose context pack kept an expected doc.
    """

    case_count: int
    run_count: int
    strong: int
    medium: int
    miss: int
    not_run: int
    recall_at_k: dict[int, float | None]
    mrr: float | None
    ndcg_at_10: float | None
    hit_count: int
    avg_first_hit_rank: float | None
    context_pack_eligible: int
    context_pack_survival_rate: float | None


class EvaluationReport(VersionedFile):
    """Evaluation of one store: manifest info, summary, per-scenario summaries, per-case results.

    JSON-serialisable with ``model_dump_json()``; read back with
    ``rag_core.evaluation.reports.load_report`` (which also reads format version 1).
    """

    V1_NAMES = {"path": "store", "path_status": "store_status"}
    store: str | None
    store_status: StoreStatus
    manifest: FixtureManifest | None
    fixtures_dir: str | None
    ks: list[int]
    strong_k: int
    summary: MetricSummary
    by_scenario: dict[str, MetricSummary]
    cases: list[CaseResult]
    filter_cost: FilterCostSummary | None = None
    abstention: AbstentionFigures | None = None
    warnings: list[str] = Field(default_factory=list)

    def case(self, case_id: str) -> CaseResult | None:
        """The result of ``case_id``, or ``None``."""
        return next((c for c in self.cases if c.case_id == case_id), None)


_CRUMB_SEP = re.compile(r"\s*>\s*")


def _fold(text: str) -> str:
    """NFKC, case-folded, whitespace runs collapsed: the form keywords are matched in."""
    # str.split() is much faster than a regex on long evidence text.
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _fold_crumb(text: str) -> str:
    return _CRUMB_SEP.sub(" > ", _fold(text))


def candidate_label(position: int, item: FixtureCandidate) -> str:
    """``"1. kubernetes/KubeSchedulerDown.md — Kube Scheduler Down > Meaning (0.61 label)"``.

    The number in parentheses is the raw score with its label (the store's own unit), or the
    similarity when no raw score was recorded.
    """
    text = f"{position}. {normalize_doc_id(item.doc_id) or '(no doc id)'}"
    heading = item.breadcrumb or item.title
    if heading:
        text += f" — {heading}"
    if item.raw_score is not None:
        text += f" ({f'{item.raw_score:.2f} {item.score_label}'.strip()})"
    elif item.similarity is not None:
        text += f" ({item.similarity:.2f} similarity)"
    return text


def _coverage_failures(
    case: GoldenCase,
    top_items: Sequence[FixtureCandidate],
    top_candidates: Sequence[FixtureCandidate],
    strong_k: int,
) -> list[str]:
    failures: list[str] = []
    if case.expected_keywords:
        evidence = " ".join(_fold(i.content) for i in top_items if isinstance(i, FixtureEvidenceBlock))
        failures.extend(
            f"keyword {kw!r} not in top-{strong_k} evidence"
            for kw in case.expected_keywords
            if _fold(kw) not in evidence
        )
    if case.expected_breadcrumbs:
        crumbs = [_fold_crumb(i.breadcrumb) for i in (*top_items, *top_candidates) if i.breadcrumb]
        wanted = [_fold_crumb(b) for b in case.expected_breadcrumbs]
        if not any(w in c for w in wanted for c in crumbs):
            names = ", ".join(repr(b) for b in case.expected_breadcrumbs)
            failures.append(f"no breadcrumb in top {strong_k} matches any of {names}")
    return failures


def _context_pack_survived(fixture: CaseFixture, expected: set[str]) -> bool | None:
    in_evidence = {normalize_doc_id(b.doc_id) for b in fixture.evidence_blocks} & expected
    if not in_evidence:
        return None
    packed = {normalize_doc_id(d) for d in fixture.context_pack_doc_ids}
    return bool(packed & expected)


def _not_run(case: GoldenCase, reason: str) -> CaseResult:
    return CaseResult(
        case_id=case.id,
        scenario=case.scenario,
        query=case.query,
        expected_docs=list(case.expected_docs),
        hit_level="not_run",
        not_run_reason=reason,
        unanswerable=case.unanswerable,
    )


def _evaluate_unanswerable(case: GoldenCase, fixture: CaseFixture) -> CaseResult:
    claimed = claims_support(fixture)
    items = ranked_docs(fixture.evidence_blocks, fixture.candidates)
    return CaseResult(
        case_id=case.id,
        scenario=case.scenario,
        query=case.query,
        expected_docs=[],
        hit_level="claimed" if claimed else "abstained",
        retrieval_layer=fixture.retrieval_layer,
        top_candidates=[candidate_label(n, i) for n, i in enumerate(items[:LABEL_COUNT], 1)],
        failed_checks=[f"unanswerable, but labelled {fixture.relevance_level}"] if claimed else [],
        unanswerable=True,
        relevance_level=fixture.relevance_level,
        confidence=fixture.confidence,
    )


def _evaluate_case(case: GoldenCase, fixture: CaseFixture, ks: Sequence[int], strong_k: int) -> CaseResult:
    if case.unanswerable:
        return _evaluate_unanswerable(case, fixture)
    items = ranked_docs(fixture.evidence_blocks, fixture.candidates)
    ranking = [normalize_doc_id(i.doc_id) for i in items]
    expected = {d for d in (normalize_doc_id(e) for e in case.expected_docs) if d}
    rank = first_hit_rank(ranking, expected)
    found = rank is not None and rank <= strong_k

    failed: list[str] = []
    if fixture.status == "error":
        failed.append(f"retrieval error: {fixture.error or 'no detail recorded'}")
    if rank is None:
        failed.append(f"expected doc not retrieved ({len(ranking)} docs ranked)")
    elif not found:
        failed.append(f"expected doc not in top {strong_k} (first at {rank})")
    coverage = _coverage_failures(case, items[:strong_k], fixture.candidates[:strong_k], strong_k)
    failed.extend(coverage)

    level: HitLevel = "miss" if not found else ("medium" if coverage else "strong")
    return CaseResult(
        case_id=case.id,
        scenario=case.scenario,
        query=case.query,
        expected_docs=list(case.expected_docs),
        hit_level=level,
        retrieval_layer=fixture.retrieval_layer,
        first_hit_rank=rank,
        # The same functions the ranx parity test checks.
        reciprocal_rank=reciprocal_rank(ranking, expected),
        recall_at_k={k: recall_at_k(ranking, expected, k) for k in ks},
        ndcg_at_10=ndcg_at_k(ranking, expected, NDCG_K),
        context_pack_survived=_context_pack_survived(fixture, expected),
        top_docs=ranking[: max(*ks, NDCG_K)],
        top_candidates=[candidate_label(n, i) for n, i in enumerate(items[:LABEL_COUNT], 1)],
        failed_checks=failed,
        filter_outcome=classify(fixture, case.expected_docs, depth=max(*ks, NDCG_K)),
        relevance_level=fixture.relevance_level,
        confidence=fixture.confidence,
    )


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _summarize(results: Sequence[CaseResult], ks: Sequence[int]) -> MetricSummary:
    """Aggregate case results evaluated at ``ks`` (see ``MetricSummary``)."""
    run = [r for r in results if r.hit_level != "not_run" and not r.unanswerable]
    hits = [r.first_hit_rank for r in run if r.first_hit_rank is not None]
    eligible = [r.context_pack_survived for r in run if r.context_pack_survived is not None]
    return MetricSummary(
        case_count=len(results),
        run_count=len(run),
        strong=sum(r.hit_level == "strong" for r in results),
        medium=sum(r.hit_level == "medium" for r in results),
        miss=sum(r.hit_level == "miss" for r in results),
        not_run=sum(r.hit_level == "not_run" for r in results),
        recall_at_k={k: _mean(r.recall_at_k[k] for r in run) for k in ks},
        mrr=_mean(r.reciprocal_rank or 0.0 for r in run),
        ndcg_at_10=_mean(r.ndcg_at_10 or 0.0 for r in run),
        hit_count=len(hits),
        avg_first_hit_rank=_mean(hits),
        context_pack_eligible=len(eligible),
        context_pack_survival_rate=_mean(float(s) for s in eligible),
    )


def _check_ks(ks: Iterable[int], strong_k: int) -> list[int]:
    clean = sorted({int(k) for k in ks})
    if not clean or clean[0] < 1:
        raise ValueError(f"ks must be positive integers, got {list(ks)!r}")
    if strong_k < 1:
        raise ValueError(f"strong_k must be >= 1, got {strong_k}")
    return clean


def evaluate(
    cases: Sequence[GoldenCase],
    fixtures: FixtureSet,
    ks: Iterable[int] = DEFAULT_KS,
    strong_k: int = 5,
) -> EvaluationReport:
    """Evaluate ``cases`` against one store's ``fixtures``.

    ``ks`` are the cut-offs for recall@K (sorted, deduplicated); ``strong_k`` is the depth
    within which an expected doc and the coverage must be found for a strong / medium hit.
    A case without a usable fixture is not_run with the loader's reason.
    """
    ks = _check_ks(ks, strong_k)
    results: list[CaseResult] = []
    for case in cases:
        fixture = fixtures.fixtures.get(case.id)
        if fixture is not None:
            results.append(_evaluate_case(case, fixture, ks, strong_k))
        else:
            reason = fixtures.not_run.get(case.id, f"no fixture loaded from {fixtures.directory}")
            results.append(_not_run(case, reason))

    scenarios = sorted({r.scenario for r in results})
    return EvaluationReport(
        store=fixtures.store,
        store_status=fixtures.store_status,
        manifest=fixtures.manifest,
        fixtures_dir=portable_path(fixtures.directory),
        ks=ks,
        strong_k=strong_k,
        summary=_summarize(results, ks),
        by_scenario={s: _summarize([r for r in results if r.scenario == s], ks) for s in scenarios},
        cases=results,
        filter_cost=summarize_filter_cost([r.filter_outcome for r in results if r.filter_outcome]),
        abstention=abstention_figures(cases, fixtures.fixtures),
        warnings=list(fixtures.warnings),
    )
