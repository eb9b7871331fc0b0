"""The rerank cross-validation (rag_core.evaluation.cv, ``rag eval cv``) on fake records: the
offline ranking, the pairwise fit learning the feature that finds the answer, grouped folds,
per-script weights through the ranker file and the post-processor, the report, the adoption rule,
the command's refusals. No model, no corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from rag_core.cli import app
from rag_core.evaluation import cv
from rag_core.evaluation.known_items import KnownItem
from rag_core.l0 import L0Hints
from rag_core.lookup.postprocessor import KnowledgeEvidencePostProcessor, RerankWeights
from rag_core.lookup.ranker import FEATURES, INDEX, LinearRanker, RankerFileError, load_ranker
from rag_core.lookup.retriever import Candidate
from rag_core.models import StoreHit

HAND = RerankWeights().ranker()


def record(item_id: str, docs: list[str], columns: dict[str, list[float]], script: str = "latin") -> cv.Record:
    matrix = np.zeros((len(docs), len(FEATURES)))
    for name, values in columns.items():
        matrix[:, INDEX[name]] = values
    return cv.Record(
        item_id=item_id,
        docs=docs,
        rrf=np.linspace(1.0, 0.5, len(docs)),
        matrix=matrix,
        crosslingual=False,
        with_ensemble=False,
        named=set(),
        tail=list(dict.fromkeys(docs)),
        pipeline=[],
        script=script,
    )


def lexical_world(n: int = 40) -> tuple[list[cv.Record], list[KnownItem]]:
    """Queries whose answer BM25 finds (lexical 1) while the dense cosine prefers another doc by
    more than the hand weights' lexical share: the hand ranking misses, a fit can learn it."""
    records, items = [], []
    for q in range(n):
        answer, other, third = f"d{q}.md", f"d{(q + 1) % n}.md", f"d{(q + 2) % n}.md"
        records.append(record(f"q{q}", [other, answer, third], {"dense": [1.0, 0.4, 0.0], "lexical": [0.0, 1.0, 0.1]}))
        items.append(KnownItem(f"q{q}", "text", answer, "en", "en", "en", "section"))
    return records, items


def test_offline_rank_is_the_postprocessors_order_with_the_fused_tail():
    rec = record("q", ["a.md", "b.md", "a.md", "c.md"], {"dense": [0.2, 1.0, 0.9, 0.0]})
    rec.tail = ["a.md", "b.md", "c.md", "z.md"]
    assert cv.rank(rec, HAND) == ["b.md", "a.md", "c.md", "z.md"]  # a doc scores by its best chunk
    empty = cv.Record("e", [], np.zeros(0), np.zeros((0, len(FEATURES))), False, False, set(), [], ["p.md"])
    assert cv.rank(empty, HAND) == ["p.md"]  # nothing kept: the pipeline's own ranking


def test_the_pairwise_fit_learns_the_feature_that_finds_the_answer_and_cv_shows_it():
    records, items = lexical_world()
    learned = cv.fit_ranker(records, [i.doc_id for i in items], HAND)
    w = learned.weights(False, False)
    assert w[INDEX["lexical"]] > HAND.same_script[INDEX["lexical"]]
    assert np.abs(learned.same_script).sum() == pytest.approx(np.abs(HAND.same_script).sum())  # L1-scaled
    folds = cv.cross_validate(records, items, HAND, folds=4)
    assert folds.hand[:, 1].mean() == pytest.approx(0.5)  # answer always second
    assert folds.learned[:, 1].mean() == pytest.approx(1.0)  # fitted on other documents' queries
    assert sorted(set(folds.fold_of)) == [0, 1, 2, 3]
    by_doc = {}
    for item, fold in zip(items, folds.fold_of, strict=True):
        assert by_doc.setdefault(item.doc_id, fold) == fold  # grouped by document
    half = cv.fit_ranker(records, [i.doc_id for i in items], HAND, cv.CvConfig(shrink=0.5))
    assert half.same_script == pytest.approx((HAND.same_script + learned.same_script) / 2)


def test_per_script_weights_are_fitted_apart_and_used_by_the_postprocessor(tmp_path):
    latin, items = lexical_world(20)
    cjk = [record(f"z{q}", r.docs, {"dense": [1.0, 0.4, 0.0]}, "cjk") for q, r in enumerate(latin)]
    expected = [i.doc_id for i in items] * 2
    ranker = cv.fit_ranker(latin + cjk, expected, HAND, cv.CvConfig(split="script"))
    assert set(ranker.by_script) == {"latin", "cjk"}
    lex = INDEX["lexical"]
    assert ranker.weights(False, False, "latin")[lex] > ranker.weights(False, False, "cjk")[lex]
    assert ranker.weights(True, True, "latin") == pytest.approx(ranker.crosslingual)  # cross-lingual side apart

    path = tmp_path / "r.json"
    data = cv.ranker_file(cv.run_cv(items, latin, folds=2, config=cv.CvConfig(split="script")), {"main": "fp"}, {}, 20)
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = load_ranker(path, {"main": "fp"})
    assert set(loaded.by_script) == {"latin", "cjk"}
    path.write_text(json.dumps({**data, "by_script": {"greek": {}}}), encoding="utf-8")
    with pytest.raises(RankerFileError, match="by_script"):
        load_ranker(path, {"main": "fp"})

    lexical_only = np.eye(len(FEATURES))[lex]
    dense_only = np.eye(len(FEATURES))[INDEX["dense"]]
    split = LinearRanker("s", dense_only, dense_only, by_script={"cjk": lexical_only})

    def cand(doc: str, similarity: float, lexical: float) -> Candidate:
        hit = StoreHit(f"{doc}#0", doc, doc, doc, "k8s", "english text", similarity, "cosine", similarity)
        return Candidate(hit=hit, rrf=0.01, channels={"dense", "lexical"}, lexical_score=lexical, lexical_rank=1)

    cands = [cand("a.md", 0.9, 1.0), cand("b.md", 0.5, 5.0)]
    post = KnowledgeEvidencePostProcessor(None, 0.0, 10, ranker=split)
    assert [b.doc_id for b in post.process(cands, L0Hints(), "pods keep restarting")[0]] == ["a.md", "b.md"]
    _, entries = post.process(cands, L0Hints(), "节点 上 的 容器 一直 重启")
    assert [e.doc_id for e in entries] == ["b.md", "a.md"]
    assert entries[0].contributions["lexical"] == pytest.approx(1.0)  # the trace shows the feature


def test_report_puts_the_tables_first_and_the_rule_reads_suites(tmp_path):
    records, items = lexical_world()
    suite = cv.SuiteRecords("s", [r.item_id for r in records[:5]], records[:5], [[i.doc_id] for i in items[:5]])
    result = cv.run_cv(items, records, folds=4, suites=[suite])
    assert result.verdict.startswith("adopt")
    json_path, md_path = cv.write_report(result, tmp_path)
    text = md_path.read_text(encoding="utf-8")
    assert text.splitlines()[4].startswith("| query -> corpus (n)")  # title, verdict, then the CV table
    assert "| en->en (40) | 1.000 / 1.000 | 0.500 / 1.000 |" in text and "| s (5) |" in text
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["groups"][-1]["group"] == "all" and data["groups"][-1]["wilcoxon_p"] < 0.05
    assert data["suites"][0]["top5_gained"] == 0 and data["suites"][0]["rr_change"] == pytest.approx(2.5)

    groups = data["groups"]
    losing = [{"suite": "x", "top5_lost": 2, "rr_change": -0.5}]
    assert cv.verdict(groups, losing).startswith("keep hand weights: CV MRR gain, but visible suite(s) x")
    assert cv.verdict(groups, [{"suite": "x", "top5_lost": 1, "rr_change": -1.5}]).startswith("keep")
    tie = [{**groups[-1], "learned": groups[-1]["hand"], "wilcoxon_p": None}]
    assert cv.verdict(tie, []).startswith("keep hand weights: CV MRR")


def test_rag_eval_cv_refuses_unusable_corpora(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "cv", "--corpus", f"en={tmp_path / 'missing'}"])
    assert res.exit_code == 2 and "--corpus must be LANG=DIR" in res.output
    (tmp_path / "kb").mkdir()
    res = runner.invoke(app, ["eval", "cv", "--corpus", f"fr={tmp_path / 'kb'}", "--cache", str(tmp_path / "c")])
    assert res.exit_code == 2 and "no section headings" in res.output
    res = runner.invoke(app, ["eval", "cv", "--pairs", "some"])
    assert res.exit_code == 2 and "--pairs" in res.output
