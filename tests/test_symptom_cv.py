"""bench.symptom_cv's offline re-ranking: a zero weight gives the hand ranking, a feature or a
late-fused channel moves documents, weights are chosen on training records only, view rows."""

from __future__ import annotations

import numpy as np

from bench import symptom_cv as sc
from bench.rerank_cv import IndexDump, Record, rank
from rag_core.lookup.postprocessor import RerankWeights
from rag_core.lookup.ranker import FEATURES, INDEX


def record(docs: list[str], dense: list[float]) -> Record:
    matrix = np.zeros((len(docs), len(FEATURES)))
    matrix[:, INDEX["dense"]] = dense
    return Record(
        item_id="q",
        docs=docs,
        rrf=np.linspace(1.0, 0.5, len(docs)),
        matrix=matrix,
        crosslingual=False,
        with_ensemble=False,
        named=set(),
        tail=list(dict.fromkeys(docs)),
        pipeline=[],
    )


HAND = RerankWeights().ranker()


def test_zero_weight_is_the_hand_ranking_and_a_feature_moves_documents():
    rec = record(["a.md", "b.md", "c.md"], [1.0, 0.4, 0.0])
    column = np.array([0.0, 0.0, 1.0])
    assert sc.rank_with(rec, HAND, sc.Extra(chunk=column), 0.0) == rank(rec, HAND) == ["a.md", "b.md", "c.md"]
    assert sc.rank_with(rec, HAND, sc.Extra(chunk=column), 0.5)[:2] == ["a.md", "c.md"]


def test_late_fusion_adds_channel_documents_and_weighs_them():
    rec = record(["a.md", "b.md"], [1.0, 0.0])
    channel = sc.Extra(channel=["x.md", "b.md"])
    assert sc.rank_with(rec, HAND, channel, 0.0) == ["a.md", "b.md"]
    fused = sc.rank_with(rec, HAND, channel, 1.0)
    assert fused[0] == "b.md" and "x.md" in fused


def test_weight_is_chosen_on_the_records_given_ties_to_the_smaller():
    rec = record(["a.md", "b.md"], [1.0, 0.9])
    extra = sc.Extra(chunk=np.array([0.0, 1.0]))
    assert sc.choose_weight([rec], [extra], [["b.md"]], HAND, sc.FEATURE_GRID) > 0
    assert sc.choose_weight([rec], [extra], [["a.md"]], HAND, sc.FEATURE_GRID) == 0.0


def test_view_rows_are_the_symptom_sections():
    dump = IndexDump(
        chunk_ids=["1", "2", "3"],
        doc_ids=["a.md"] * 3,
        texts=["t"] * 3,
        breadcrumbs=["A > Meaning", "A > Mitigation", "A > 诊断"],
        vectors=np.eye(3, dtype=np.float32),
    )
    assert sc.section_rows(dump, [0, 1, 2]) == [0, 2]
