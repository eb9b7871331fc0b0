"""Clause views of a query, the query vector built from them, and length-normalised document
support in the rerank (issue 10). Unit tests with small fakes; the golden suites measure the
effect on retrieval."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rag_core.embedding.base import ModelIdentity
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.title_similarity import TitleSimilarity
from rag_core.l0 import L0Entry, L0Hints, L0Index
from rag_core.lookup.postprocessor import DEFAULT_OTHER_CHUNKS, KnowledgeEvidencePostProcessor, RerankWeights
from rag_core.lookup.query_transformer import MAX_VIEWS, KnowledgeQueryTransformer, clause_views
from rag_core.lookup.query_vector import VIEW_WEIGHT, query_vector
from rag_core.lookup.retriever import Candidate
from rag_core.models import StoreHit


def test_a_query_of_several_observations_gets_one_view_per_clause():
    views = clause_views("scaled a deployment to 6 replicas, no new pods showed up, yet kubectl responds instantly")
    assert views == ["scaled a deployment to 6 replicas", "no new pods showed up", "kubectl responds instantly"]


def test_a_single_clause_or_short_pieces_give_no_views():
    assert clause_views("KubePodCrashLooping in namespace shop") == []
    assert clause_views("disk full, help") == []  # "help" is too short to stand alone: one clause left
    assert clause_views("a, b, c; d") == []


def test_a_chinese_comma_does_not_split_but_a_full_stop_does():
    assert clause_views("节点上的容器组个数已经逼近单机允许的上限，想把上限调高") == []
    assert len(clause_views("节点上的容器组个数已经逼近单机允许的上限。想把这个上限调高该改哪项配置？")) == 2


def test_views_are_capped():
    text = "; ".join(f"observation number {i}" for i in range(10))
    assert clause_views(text) == [f"observation number {i}" for i in range(MAX_VIEWS)]


def test_the_transformer_puts_the_views_of_the_rewritten_text_in_the_query():
    tq = KnowledgeQueryTransformer(None).transform("the disk is nearly full. pods get evicted from the node")
    assert tq.views == ["the disk is nearly full", "pods get evicted from the node"]
    assert tq.summary().views == tq.views


class _AxisEmbedder:
    """Maps each known text to a fixed unit vector; counts calls."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table
        self.calls: list[list[str]] = []

    def embed_query(self, text: str) -> np.ndarray:
        self.calls.append([text])
        return self.table[text]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.stack([self.table[t] for t in texts])


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_query_vector_mixes_the_whole_query_with_the_mean_of_its_clauses_in_one_batch():
    text = "the disk is nearly full. pods get evicted from the node"
    tq = KnowledgeQueryTransformer(None).transform(text)
    emb = _AxisEmbedder({text: _unit(1, 0, 0), tq.views[0]: _unit(0, 1, 0), tq.views[1]: _unit(0, 0, 1)})
    vec = query_vector(emb, tq)  # type: ignore[arg-type]
    expected = _unit(1 - VIEW_WEIGHT, VIEW_WEIGHT / 2, VIEW_WEIGHT / 2)
    assert np.allclose(vec, expected, atol=1e-6)
    assert vec.dtype == np.float32 and np.linalg.norm(vec) == pytest.approx(1.0)
    assert emb.calls == [[text, *tq.views]]


def test_query_vector_of_a_one_clause_query_is_its_embedding():
    tq = KnowledgeQueryTransformer(None).transform("KubePodCrashLooping")
    emb = _AxisEmbedder({tq.rewritten: _unit(0, 1, 0)})
    assert np.array_equal(query_vector(emb, tq), _unit(0, 1, 0))  # type: ignore[arg-type]
    assert emb.calls == [[tq.rewritten]]


def _cand(doc: str, n: int, similarity: float = 0.8) -> Candidate:
    hit = StoreHit(f"{doc}#{n}", doc, doc, doc, "k8s", "text", similarity, "cosine", similarity)
    return Candidate(hit=hit, rrf=0.01, channels={"dense"})


def _support(l0: L0Index | None, candidates: list[Candidate]) -> dict[str, float]:
    pp = KnowledgeEvidencePostProcessor(l0, 0.0, 10)
    _, entries = pp.process(candidates, L0Hints())
    return {e.doc_id: e.contributions.get("doc_support", 0.0) for e in entries}


def test_document_support_is_the_share_of_the_documents_other_chunks_found():
    l0 = L0Index(
        [
            L0Entry("short.md", "Short", "k8s", ["Short"], chunk_count=2),
            L0Entry("long.md", "Long", "k8s", ["Long"], chunk_count=9),
        ]
    )
    cands = [_cand("short.md", 0), _cand("short.md", 1), _cand("long.md", 0), _cand("long.md", 1), _cand("long.md", 2)]
    support = _support(l0, cands)
    w = RerankWeights().doc_support
    assert support["short.md"] == pytest.approx(w)  # its one other chunk was found
    assert support["long.md"] == pytest.approx(round(w * 2 / 8, 4))  # two of its eight others


def test_without_chunk_counts_support_assumes_the_default_document_length():
    cands = [_cand("a.md", i) for i in range(3)]
    w = RerankWeights().doc_support
    assert _support(None, cands)["a.md"] == pytest.approx(round(w * 2 / DEFAULT_OTHER_CHUNKS, 4))


def test_chunk_counts_survive_save_and_an_older_index_loads_without_them(tmp_path):
    path = tmp_path / "l0.json"
    L0Index([L0Entry("a.md", "A", "k8s", ["A"], chunk_count=4)]).save(path)
    assert L0Index.load(path).entries["a.md"].chunk_count == 4
    path.write_text('[{"doc_id": "b.md", "title": "B", "category": "", "names": ["B"]}]')
    assert L0Index.load(path).entries["b.md"].chunk_count is None


class _TitleEmbedder:
    """Passage side for titles: one fixed vector per known title text; counts the texts embedded."""

    fingerprint = "fake-model"

    def identity(self) -> ModelIdentity:
        return ModelIdentity(backend="fake", model_id="fake-model", dimension=3, fingerprint=self.fingerprint)

    def __init__(self, table: dict[str, np.ndarray], fail: bool = False) -> None:
        self.table, self.fail = table, fail
        self.embedded: list[str] = []

    def embed_passages(self, texts: list[str], ids: list[str] | None = None) -> np.ndarray:
        if self.fail:
            raise RuntimeError("endpoint down")
        self.embedded += texts
        return np.stack([self.table[t] for t in texts])


def test_title_similarity_embeds_each_title_once_with_camel_case_written_out():
    emb = _TitleEmbedder({"Kube Controller Manager Down": _unit(1, 0, 0), "Kubelet Too Many Pods": _unit(0, 1, 0)})
    titles = TitleSimilarity(emb)  # type: ignore[arg-type]
    docs = {"a.md": "KubeControllerManagerDown", "b.md": "Kubelet Too Many Pods"}
    first = titles.similarities(_unit(1, 1, 0), docs)
    assert first == pytest.approx({"a.md": 0.7071, "b.md": 0.7071}, abs=1e-4)
    assert titles.similarities(_unit(0, 1, 0), docs) == pytest.approx({"a.md": 0.0, "b.md": 1.0}, abs=1e-6)
    assert sorted(emb.embedded) == ["Kube Controller Manager Down", "Kubelet Too Many Pods"]  # cached


def test_titles_embedded_at_ingest_are_read_from_disk_by_a_fresh_process(tmp_path):
    table = {"Kube Controller Manager Down": _unit(1, 0, 0), "Kubelet Too Many Pods": _unit(0, 1, 0)}
    disk = EmbeddingCache(tmp_path / "cache.sqlite3")
    ingest = _TitleEmbedder(table)
    assert TitleSimilarity(ingest, disk=disk).embed_titles(["KubeControllerManagerDown", "Kubelet Too Many Pods"]) == 2  # type: ignore[arg-type]
    assert TitleSimilarity(_TitleEmbedder(table), disk=disk).embed_titles(["Kubelet Too Many Pods"]) == 0  # type: ignore[arg-type]
    lookup = _TitleEmbedder({}, fail=True)  # would fail if it had to embed anything
    got = TitleSimilarity(lookup, disk=disk).similarities(_unit(1, 0, 0), {"a.md": "KubeControllerManagerDown"})  # type: ignore[arg-type]
    assert got == pytest.approx({"a.md": 1.0}) and lookup.embedded == []


def test_an_unusable_disk_cache_costs_the_cache_not_the_signal(tmp_path):
    (tmp_path / "dir").mkdir()
    disk = EmbeddingCache(tmp_path / "dir")  # a directory: sqlite cannot open it
    titles = TitleSimilarity(_TitleEmbedder({"A": _unit(1, 0, 0)}), disk=disk)  # type: ignore[arg-type]
    assert titles.similarities(_unit(1, 0, 0), {"a.md": "A"}) == pytest.approx({"a.md": 1.0})


def test_title_similarity_gives_nothing_rather_than_failing_the_lookup():
    titles = TitleSimilarity(_TitleEmbedder({}, fail=True))  # type: ignore[arg-type]
    assert titles.similarities(_unit(1, 0, 0), {"a.md": "A"}) == {}


def test_the_closest_document_gets_the_whole_document_similarity_weight():
    cands = [_cand("near.md", 0), _cand("far.md", 0), _cand("middle.md", 0)]
    documents = {"near.md": 1.8, "far.md": 1.0, "middle.md": 1.4}
    cands = [replace(c, document_similarity=documents[c.hit.doc_id]) for c in cands]
    pp = KnowledgeEvidencePostProcessor(None, 0.0, 10)
    _, entries = pp.process(cands, L0Hints())
    got = {e.doc_id: e.contributions.get("document_similarity", 0.0) for e in entries}
    w = RerankWeights().document_similarity
    assert got == pytest.approx({"near.md": w, "middle.md": w / 2, "far.md": 0.0})
    assert entries[0].doc_id == "near.md"  # equal otherwise: the document similarity decides
