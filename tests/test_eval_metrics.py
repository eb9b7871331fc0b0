"""Rank metrics: the doc ranking, hand-computed values, and parity with ranx."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from rag_core.evaluation.metrics import (
    doc_ranking,
    first_hit_rank,
    ndcg_at_k,
    rank_overlap_at_k,
    recall_at_k,
    reciprocal_rank,
)


@dataclass
class Item:
    rank: int
    doc_id: str | None


def items(*doc_ids: str | None) -> list[Item]:
    return [Item(rank, d) for rank, d in enumerate(doc_ids, start=1)]


def test_doc_ranking_blocks_first_then_new_candidates():
    blocks = items("a.md", "b.md", "a.md")
    candidates = items("b.md", "c.md", "a.md", "d.md", "c.md")
    assert doc_ranking(blocks, candidates) == ["a.md", "b.md", "c.md", "d.md"]


def test_doc_ranking_is_deterministic_on_rank_ties_and_input_order():
    blocks = [Item(2, "z.md"), Item(1, "y.md"), Item(1, "x.md")]
    assert doc_ranking(blocks, []) == ["x.md", "y.md", "z.md"]


def test_missing_doc_ids_keep_their_position_but_never_hit():
    ranking = doc_ranking(items(None, "", "./a.md "), items(None))
    assert ranking == [None, None, "a.md", None]
    assert first_hit_rank(ranking, ["a.md"]) == 3
    assert first_hit_rank(ranking, [""]) is None
    assert recall_at_k(ranking, ["a.md"], 2) == 0.0


def test_hand_computed_values():
    ranking = ["x", "a", "y", "b"]
    relevant = ["a", "b", "c"]
    assert first_hit_rank(ranking, relevant) == 2
    assert recall_at_k(ranking, relevant, 1) == 0.0
    assert recall_at_k(ranking, relevant, 2) == 1.0
    assert reciprocal_rank(ranking, relevant) == 0.5
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(ranking, relevant, 10) == pytest.approx(dcg / ideal)
    # The ideal is capped at K relevant docs.
    assert ndcg_at_k(["a"], relevant, 1) == 1.0
    assert reciprocal_rank(ranking, ["zzz"]) == 0.0
    assert ndcg_at_k(ranking, [], 10) == 0.0


def test_rank_overlap():
    assert rank_overlap_at_k(["a", "b", "c"], ["c", "a", "x"], 3) == pytest.approx(2 / 3)
    assert rank_overlap_at_k(["a", None], ["b", None], 2) == 0.0
    assert rank_overlap_at_k(["a"], ["a"], 5) == 0.2


def test_k_must_be_positive():
    with pytest.raises(ValueError):
        recall_at_k(["a"], ["a"], 0)


def _random_queries(seed: int, count: int) -> dict[str, tuple[list[str], set[str]]]:
    rng = random.Random(seed)
    pool = [f"doc{i}.md" for i in range(40)]
    queries = {}
    for q in range(count):
        ranking = rng.sample(pool, rng.randint(1, 15))
        relevant = set(rng.sample(pool, rng.randint(1, 4)))
        queries[f"q{q}"] = (ranking, relevant)
    return queries


@pytest.mark.filterwarnings("ignore:unsafe cast")  # ranx's numba kernels, not our code
def test_parity_with_ranx_on_random_rankings():
    ranx = pytest.importorskip("ranx")
    queries = _random_queries(seed=7, count=300)
    qrels = ranx.Qrels({q: {d: 1 for d in rel} for q, (_, rel) in queries.items()})
    # Strictly decreasing scores so that ranx ranks exactly in our order.
    run = ranx.Run({q: {d: 100.0 - i for i, d in enumerate(r)} for q, (r, _) in queries.items()})
    ks = (1, 3, 5, 10)
    metrics = [f"hits@{k}" for k in ks] + ["mrr", "ndcg@10"]
    expected = ranx.evaluate(qrels, run, metrics, return_mean=False)
    order = list(run.keys())  # ranx's per-query arrays follow the run's query order

    for k in ks:
        ours = [recall_at_k(queries[q][0], queries[q][1], k) for q in order]
        theirs = [float(h > 0) for h in expected[f"hits@{k}"]]
        assert ours == theirs, f"hit rate @{k}"
        assert sum(ours) / len(ours) == pytest.approx(sum(theirs) / len(theirs))
    ours_rr = [reciprocal_rank(*queries[q]) for q in order]
    assert ours_rr == pytest.approx(list(expected["mrr"]))
    ours_ndcg = [ndcg_at_k(*queries[q], 10) for q in order]
    assert ours_ndcg == pytest.approx(list(expected["ndcg@10"]))
