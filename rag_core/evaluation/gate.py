"""Regression gate: compare a current evaluation against the stored baseline.

The gate fails when, over the answerable cases run in both reports, recall@5, MRR or the share
of strong hits drops by more than its (absolute) tolerance (the strong share uses recall's: a night
that loses answer sections while the documents still rank is a regression), when any case goes
from strong to miss, when an unanswerable case that abstained in the baseline now claims support
(``newly_claimed``), when the share of answerable cases labelled PRECISE/RELEVANT drops by more
than ``claimed_tolerance``, when a case that ran in the baseline is not run now, or when no case
ran in both. A paired randomization test on the
per-case reciprocal ranks says how likely the MRR change is under "no difference"; it is
reported, not gated on (16 cases rarely reach significance, and a blocking check should not
depend on a p-value threshold).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from rag_core.evaluation.abstention import CLAIMS
from rag_core.evaluation.evaluator import CaseResult, EvaluationReport, HitLevel
from rag_core.markdown import md_table_lines

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "GATE_K",
    "PERMUTATIONS",
    "SEED",
    "CaseChange",
    "GateResult",
    "PairedTest",
    "compare",
    "paired_randomization_test",
]

GATE_K = 5
PERMUTATIONS = 10_000
SEED = 20_021_129
_BATCH = 1_000
# Float noise in means over identical inputs must not count as a drop.
_EPS = 1e-9
NOTHING_COMPARED = "no case ran in both the baseline and the current evaluation"

ChangeKind = Literal[
    "newly_missed", "newly_found", "level_changed", "rank_changed", "newly_not_run", "newly_run", "newly_claimed"
]


class CaseChange(BaseModel):
    """One case whose hit level or first expected-doc rank differs between the reports."""

    case_id: str
    scenario: str
    baseline_level: HitLevel
    current_level: HitLevel
    baseline_first_hit_rank: int | None
    current_first_hit_rank: int | None
    kinds: list[ChangeKind]


class PairedTest(BaseModel):
    """Paired randomization (permutation) test on per-case reciprocal rank.

    Statistic: mean of (current RR − baseline RR) over ``n_cases`` paired cases. Null: the two
    reports are exchangeable per case (sign flips of the differences). Two-sided p-value from
    all 2^n sign assignments when that is at most ``n_permutations`` (exact test, n <= 13),
    else from ``n_permutations`` random ones (``seed`` fixed, so the result is reproducible;
    p = (extreme + 1) / (n_permutations + 1)). Same test as
    ``scipy.stats.permutation_test(..., permutation_type="samples")``, with memory bounded
    for large case sets. See Smucker, Allan & Carterette, CIKM 2007, for its use in IR.
    """

    n_cases: int
    baseline_mrr: float
    current_mrr: float
    mean_difference: float
    p_value: float
    n_permutations: int = PERMUTATIONS
    seed: int = SEED


class GateResult(BaseModel):
    """Outcome of ``compare``: pass/fail with reasons, metric deltas, per-case changes.

    Metrics are over the ``compared_cases`` answerable cases run in both reports (so adding or
    dropping golden cases does not move them); ``*_claimed_share``: the share of them labelled
    PRECISE/RELEVANT. ``str(result)`` / ``to_markdown()`` renders it.
    """

    passed: bool
    reasons: list[str]
    recall_tolerance: float
    mrr_tolerance: float
    compared_cases: int
    baseline_recall_at_5: float | None
    current_recall_at_5: float | None
    baseline_mrr: float | None
    current_mrr: float | None
    baseline_strong_share: float | None = None
    current_strong_share: float | None = None
    newly_missed: list[str] = Field(default_factory=list)
    newly_found: list[str] = Field(default_factory=list)
    strong_to_miss: list[str] = Field(default_factory=list)
    newly_not_run: list[str] = Field(default_factory=list)
    newly_claimed: list[str] = Field(default_factory=list)
    claimed_tolerance: float = 0.05
    baseline_claimed_share: float | None = None
    current_claimed_share: float | None = None
    changes: list[CaseChange] = Field(default_factory=list)
    significance: PairedTest | None = None

    def to_markdown(self) -> str:
        """Markdown summary: verdict, metric deltas, p-value, reasons, changed cases."""
        return _render(self)

    def __str__(self) -> str:
        return self.to_markdown()


def _ran(case: CaseResult | None) -> bool:
    return case is not None and case.hit_level != "not_run"


def _found(case: CaseResult) -> bool:
    return case.hit_level in ("strong", "medium")


def _recall(cases: Sequence[CaseResult], k: int) -> float | None:
    # From the first-hit rank, so reports evaluated with any set of K compare at K=5.
    if not cases:
        return None
    return sum(c.first_hit_rank is not None and c.first_hit_rank <= k for c in cases) / len(cases)


def _strong_share(cases: Sequence[CaseResult]) -> float | None:
    return sum(c.hit_level == "strong" for c in cases) / len(cases) if cases else None


def _mrr(cases: Sequence[CaseResult]) -> float | None:
    return sum(c.reciprocal_rank or 0.0 for c in cases) / len(cases) if cases else None


def _claimed_share(cases: Sequence[CaseResult]) -> float | None:
    labelled = [c for c in cases if c.relevance_level is not None]
    return sum(c.relevance_level in CLAIMS for c in labelled) / len(labelled) if labelled else None


def _change(base: CaseResult, cur: CaseResult) -> CaseChange | None:
    kinds: list[ChangeKind] = []
    if _ran(base) and not _ran(cur):
        kinds.append("newly_not_run")
    elif not _ran(base) and _ran(cur):
        kinds.append("newly_run")
    elif _ran(base):
        if base.hit_level == "abstained" and cur.hit_level == "claimed":
            kinds.append("newly_claimed")
        elif _found(base) and cur.hit_level == "miss":
            kinds.append("newly_missed")
        elif base.hit_level == "miss" and _found(cur):
            kinds.append("newly_found")
        elif base.hit_level != cur.hit_level:
            kinds.append("level_changed")
        if base.first_hit_rank != cur.first_hit_rank:
            kinds.append("rank_changed")
    if not kinds:
        return None
    return CaseChange(
        case_id=cur.case_id,
        scenario=cur.scenario,
        baseline_level=base.hit_level,
        current_level=cur.hit_level,
        baseline_first_hit_rank=base.first_hit_rank,
        current_first_hit_rank=cur.first_hit_rank,
        kinds=kinds,
    )


def _sign_flip_p_value(diffs: npt.NDArray[np.float64], seed: int) -> float:
    """Two-sided p-value of |mean(diffs)| under random sign flips (see ``PairedTest``)."""
    import numpy as np

    n = len(diffs)
    observed = abs(diffs.mean())
    # Equal statistics must count as "as extreme" despite float rounding.
    threshold = observed - 1e-12 * max(1.0, observed)
    if 2**n <= PERMUTATIONS:  # exact: every sign assignment once
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2.0 - 1.0
        return float(np.mean(np.abs(signs @ diffs) / n >= threshold))
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, PERMUTATIONS, _BATCH):  # batches bound memory to _BATCH x n
        signs = rng.choice((-1.0, 1.0), size=(min(_BATCH, PERMUTATIONS - start), n))
        extreme += int(np.count_nonzero(np.abs(signs @ diffs) / n >= threshold))
    # Counting the observed assignment itself keeps p > 0 (Phipson & Smyth 2010).
    return (extreme + 1) / (PERMUTATIONS + 1)


def paired_randomization_test(
    baseline_rr: Sequence[float], current_rr: Sequence[float], seed: int = SEED
) -> PairedTest:
    """Two-sided paired randomization test of mean(current − baseline); see ``PairedTest``.

    Raises ``ValueError`` when the sequences are empty or differ in length.
    """
    import numpy as np

    base = np.asarray(baseline_rr, dtype=float)
    cur = np.asarray(current_rr, dtype=float)
    if base.shape != cur.shape or base.size == 0:
        raise ValueError("need two non-empty sequences of equal length")
    diffs = cur - base
    return PairedTest(
        n_cases=len(base),
        baseline_mrr=float(base.mean()),
        current_mrr=float(cur.mean()),
        mean_difference=float(diffs.mean()),
        p_value=_sign_flip_p_value(diffs, seed),
        seed=seed,
    )


def compare(
    baseline: EvaluationReport,
    current: EvaluationReport,
    recall_tolerance: float = 0.02,
    mrr_tolerance: float = 0.02,
    *,
    fail_on_not_run: bool = True,
    claimed_tolerance: float = 0.05,
) -> GateResult:
    """Gate ``current`` against ``baseline`` (see module docstring for the rules).

    Tolerances are absolute drops in recall@5 / MRR (0.02 = two points) and in the share of
    answerable cases labelled PRECISE/RELEVANT (``claimed_tolerance``, 0.05 = the five points
    issue 43 allows the calibrated levels to cost). Cases are matched
    by id; cases in only one report are ignored. ``fail_on_not_run=False`` lets a case that
    ran in the baseline be not run now without failing (it is still listed).
    """
    base_by_id = {c.case_id: c for c in baseline.cases}
    pairs = [(base_by_id[c.case_id], c) for c in current.cases if c.case_id in base_by_id]
    ran_both = [(b, c) for b, c in pairs if _ran(b) and _ran(c)]
    both = [(b, c) for b, c in ran_both if not c.unanswerable]
    changes = [ch for b, c in pairs if (ch := _change(b, c)) is not None]

    def ids(kind: ChangeKind) -> list[str]:
        return [ch.case_id for ch in changes if kind in ch.kinds]

    base_cases = [b for b, _ in both]
    cur_cases = [c for _, c in both]
    result = GateResult(
        passed=True,
        reasons=[],
        recall_tolerance=recall_tolerance,
        mrr_tolerance=mrr_tolerance,
        compared_cases=len(both),
        baseline_recall_at_5=_recall(base_cases, GATE_K),
        current_recall_at_5=_recall(cur_cases, GATE_K),
        baseline_mrr=_mrr(base_cases),
        current_mrr=_mrr(cur_cases),
        baseline_strong_share=_strong_share(base_cases),
        current_strong_share=_strong_share(cur_cases),
        newly_missed=ids("newly_missed"),
        newly_found=ids("newly_found"),
        strong_to_miss=[ch.case_id for ch in changes if ch.baseline_level == "strong" and ch.current_level == "miss"],
        newly_not_run=ids("newly_not_run"),
        newly_claimed=ids("newly_claimed"),
        claimed_tolerance=claimed_tolerance,
        baseline_claimed_share=_claimed_share(base_cases),
        current_claimed_share=_claimed_share(cur_cases),
        changes=changes,
    )
    if both:
        result.significance = paired_randomization_test(
            [b.reciprocal_rank or 0.0 for b in base_cases],
            [c.reciprocal_rank or 0.0 for c in cur_cases],
        )
    result.reasons = _reasons(result, fail_on_not_run) if ran_both else [NOTHING_COMPARED]
    result.passed = not result.reasons
    return result


def _drop(name: str, before: float | None, after: float | None, tolerance: float) -> list[str]:
    if before is None or after is None or before - after <= tolerance + _EPS:
        return []
    return [(f"{name} dropped {before:.3f} -> {after:.3f} ({after - before:+.3f}, tolerance {tolerance:.3f})")]


def _reasons(result: GateResult, fail_on_not_run: bool) -> list[str]:
    reasons = _drop(
        f"recall@{GATE_K}",
        result.baseline_recall_at_5,
        result.current_recall_at_5,
        result.recall_tolerance,
    )
    reasons += _drop("MRR", result.baseline_mrr, result.current_mrr, result.mrr_tolerance)
    reasons += _drop("strong hits", result.baseline_strong_share, result.current_strong_share, result.recall_tolerance)
    reasons += _drop(
        "share of answerable cases labelled PRECISE/RELEVANT",
        result.baseline_claimed_share,
        result.current_claimed_share,
        result.claimed_tolerance,
    )
    if result.newly_claimed:
        reasons.append(f"unanswerable, now labelled PRECISE/RELEVANT: {', '.join(result.newly_claimed)}")
    if result.strong_to_miss:
        reasons.append(f"strong -> miss: {', '.join(result.strong_to_miss)}")
    if fail_on_not_run and result.newly_not_run:
        reasons.append(f"ran in the baseline, not run now: {', '.join(result.newly_not_run)}")
    return reasons


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _rank(value: int | None) -> str:
    return "—" if value is None else str(value)


def _render(result: GateResult) -> str:
    verdict = "PASS" if result.passed else "FAIL"
    lines = [
        f"## Retrieval regression gate: {verdict}",
        "",
        f"- Cases run in both reports: {result.compared_cases}",
        (
            f"- recall@{GATE_K}: {_fmt(result.baseline_recall_at_5)} -> "
            f"{_fmt(result.current_recall_at_5)} (allowed drop {result.recall_tolerance:.3f})"
        ),
        (f"- MRR: {_fmt(result.baseline_mrr)} -> {_fmt(result.current_mrr)} (allowed drop {result.mrr_tolerance:.3f})"),
        (
            f"- strong hits (share): {_fmt(result.baseline_strong_share)} -> "
            f"{_fmt(result.current_strong_share)} (allowed drop {result.recall_tolerance:.3f})"
        ),
        (
            f"- answerable labelled PRECISE/RELEVANT: {_fmt(result.baseline_claimed_share)} -> "
            f"{_fmt(result.current_claimed_share)} (allowed drop {result.claimed_tolerance:.3f})"
        ),
    ]
    sig = result.significance
    if sig is not None:
        lines.append(
            f"- Is the MRR change noise? Paired randomization test on per-case reciprocal rank: mean "
            f"difference {sig.mean_difference:+.3f}, two-sided p = {sig.p_value:.4f} "
            f"({sig.n_cases} cases, {sig.n_permutations:,} permutations, seed {sig.seed}); "
            "for information only, the verdict does not use it"
        )
    if result.reasons:
        lines += ["", "Failed because:", *(f"- {r}" for r in result.reasons)]
    lines += [
        "",
        f"Newly missed: {', '.join(result.newly_missed) or 'none'}",
        f"Newly found: {', '.join(result.newly_found) or 'none'}",
    ]
    if result.changes:
        rows = [
            (
                f"`{c.case_id}`",
                c.scenario,
                f"{c.baseline_level} -> {c.current_level}",
                f"{_rank(c.baseline_first_hit_rank)} -> {_rank(c.current_first_hit_rank)}",
                ", ".join(k.replace("_", " ") for k in c.kinds),
            )
            for c in result.changes
        ]
        lines += ["", *md_table_lines(["case", "scenario", "hit level", "first-hit rank", "change"], rows)]
    else:
        lines += ["", "No case changed hit level or first-hit rank."]
    return "\n".join(lines) + "\n"
