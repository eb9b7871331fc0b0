"""Filter cost accounting: did the L0 category filter help, hurt, or change nothing?

For every case whose lookup used an L0 category filter, the recorder also runs the same
lookup with the filter disabled (``FilterProbe``). Comparing the first-hit rank of an
expected doc in the two doc rankings classifies the filter's effect:

- **hurt**: the expected doc ranks worse with the filter (or is lost);
- **rescued**: the filtered attempt itself did not return the expected doc, yet the final
  answer has it at least as high as without the filter (the unfiltered attempt that runs
  beside or after it brought it back);
- **helped**: the expected doc ranks better with the filter;
- **no_difference**: the same first-hit rank, and the filtered attempt found it;
- **no_filter**: no filter was used (nothing to account);
- **unknown**: a filter was used but no unfiltered run was recorded (old fixture).

Ranks are compared within ``depth`` (a doc below it counts as not retrieved), so movements
far down the ranking that no agent sees do not count as help or harm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from rag_core.evaluation.fixtures import CaseFixture
from rag_core.evaluation.metrics import doc_ranking, first_hit_rank, normalize_doc_id

__all__ = ["FILTER_EFFECTS", "FilterEffect", "FilterOutcome", "FilterCostSummary", "classify", "summarize"]

FilterEffect = Literal["hurt", "rescued", "helped", "no_difference", "no_filter", "unknown"]
# Report order: the cases the filter hurt come first.
FILTER_EFFECTS: tuple[FilterEffect, ...] = ("hurt", "rescued", "helped", "no_difference", "no_filter", "unknown")


class FilterOutcome(BaseModel):
    """The filter's effect on one case.

    ``rank_with_filter`` / ``rank_without_filter`` are 1-based first-hit ranks within the
    depth (``None``: not retrieved within it).
    """

    effect: FilterEffect
    category_filter: str | None = None
    rank_with_filter: int | None = None
    rank_without_filter: int | None = None


class FilterCostSummary(BaseModel):
    """Counts of filter effects over the run cases (keys: every ``FilterEffect``)."""

    counts: dict[str, int]
    filtered_cases: int


def _rank(ranking: Sequence[str | None], expected: set[str], depth: int) -> int | None:
    rank = first_hit_rank(ranking, expected)
    return rank if rank is not None and rank <= depth else None


def _better(a: int | None, b: int | None) -> bool:
    """True when rank ``a`` is better (smaller) than ``b``; None is worst."""
    return a is not None and (b is None or a < b)


def classify(fixture: CaseFixture, expected_docs: Sequence[str], depth: int = 10) -> FilterOutcome:
    """The filter effect of one recorded case (see the module docstring)."""
    probe = fixture.filter_probe
    if probe is None or probe.category_filter is None:
        return FilterOutcome(effect="no_filter")
    expected = {d for d in (normalize_doc_id(e) for e in expected_docs) if d}
    with_filter = _rank(doc_ranking(fixture.evidence_blocks, fixture.candidates), expected, depth)
    if not probe.unfiltered_candidates and not probe.unfiltered_evidence_blocks:
        return FilterOutcome(effect="unknown", category_filter=probe.category_filter, rank_with_filter=with_filter)
    without = _rank(doc_ranking(probe.unfiltered_evidence_blocks, probe.unfiltered_candidates), expected, depth)
    filtered_found = bool(expected & {normalize_doc_id(d) for d in probe.filtered_docs})
    if _better(without, with_filter):
        effect: FilterEffect = "hurt"
    elif not filtered_found and with_filter is not None:
        effect = "rescued"
    elif _better(with_filter, without):
        effect = "helped"
    else:
        effect = "no_difference"
    return FilterOutcome(
        effect=effect, category_filter=probe.category_filter, rank_with_filter=with_filter, rank_without_filter=without
    )


def summarize(outcomes: Sequence[FilterOutcome]) -> FilterCostSummary:
    """Counts per effect, every effect present (0 when none)."""
    counts = {effect: 0 for effect in FILTER_EFFECTS}
    for outcome in outcomes:
        counts[outcome.effect] += 1
    return FilterCostSummary(counts=counts, filtered_cases=sum(o.effect != "no_filter" for o in outcomes))
