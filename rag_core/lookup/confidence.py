"""The calibrated ``confidence`` of a lookup and the relevance bands it sets (issue 43).

``confidence`` is the estimated probability that the top evidence block answers the query: a
logistic model (Platt scaling over several signals) of the top block's rerank signals
(:data:`SIGNALS`, :func:`signals`), one per embedding-model profile and language pair (query
script -> top block script, e.g. ``cjk->latin``), fitted and cross-validated by ``rag eval confidence``
(:mod:`rag_core.evaluation.confidence_cv`, scikit-learn) and stored as JSON under
``rag_core/lookup/calibration/``; inference here is NumPy only. Where no file fits the models in
use, there is no confidence (None) and the similarity thresholds of ``assess_relevance`` set
the level.

Bands (:func:`band`; the stated meaning of each level is a floor on its top-1 precision, which
the cross-validation checks):

- PRECISE: confidence >= 0.95, the top block answers with probability at least 0.95;
- RELEVANT: >= 0.80;
- WEAK: >= 0.30, some support: verify before relying on it;
- NONE: below 0.30, the knowledge base probably has no answer (``found`` false; the evidence
  is still listed).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from rag_core.l0 import L0Hints
from rag_core.lookup.contracts import EvidenceBlock, RelevanceLevel, RerankEntry
from rag_core.model_profiles import profile_key
from rag_core.text import script

__all__ = [
    "BANDS",
    "CALIBRATION_DIR",
    "CONFIDENCE_FORMAT",
    "SIGNALS",
    "ConfidenceModel",
    "PairModel",
    "band",
    "calibration_path",
    "language_pair",
    "load_confidence_model",
    "signals",
]

log = logging.getLogger(__name__)

CONFIDENCE_FORMAT = "rag_core.confidence/1"
CALIBRATION_DIR = Path(__file__).with_name("calibration")
#: Lower bounds of the levels on the confidence (module docstring), best first.
BANDS: tuple[tuple[RelevanceLevel, float], ...] = (
    (RelevanceLevel.PRECISE, 0.95),
    (RelevanceLevel.RELEVANT, 0.80),
    (RelevanceLevel.WEAK, 0.30),
)
SIGNALS = (
    "similarity",  # top block's normalised cosine, [0, 1]
    "similarity_gap",  # top minus second block's similarity (0 with one block)
    "score_gap",  # top minus second block's rerank finalScore (0 with one block)
    "l0_agrees",  # 1 when L0 matched the top block's document
    "title_match",  # the top block's titleMatch rerank contribution
    "lexical",  # the top block's lexical (BM25) rerank contribution
    "doc_support",  # the top block's docSupport rerank contribution
    "document_similarity",  # the top block's documentSimilarity rerank contribution
    "crosslingual",  # 1 when the query is in another script than its candidates
    "blocks",  # number of evidence blocks
)


def signals(blocks: Sequence[EvidenceBlock], rerank: Sequence[RerankEntry], hints: L0Hints) -> np.ndarray:
    """(len(SIGNALS),) signals of the top block of ``blocks`` (best first) and its ``rerank``
    entry (same order; [] gives zeros for the rerank parts). ValueError without blocks."""
    if not blocks:
        raise ValueError("confidence signals need at least one evidence block")
    top = blocks[0]
    contrib = rerank[0].contributions if rerank else {}
    second_sim = blocks[1].similarity if len(blocks) > 1 else top.similarity
    second_score = rerank[1].final_score if len(rerank) > 1 else (rerank[0].final_score if rerank else 0.0)
    values = {
        "similarity": top.similarity,
        "similarity_gap": top.similarity - second_sim,
        "score_gap": (rerank[0].final_score - second_score) if rerank else 0.0,
        "l0_agrees": float(top.doc_id in hints.matched_doc_ids),
        "title_match": contrib.get("title_match", 0.0),
        "lexical": contrib.get("lexical", 0.0),
        "doc_support": contrib.get("doc_support", 0.0),
        "document_similarity": contrib.get("document_similarity", 0.0),
        "crosslingual": float("crosslingual_weights" in top.hit_reasons),
        "blocks": float(len(blocks)),
    }
    return np.array([values[name] for name in SIGNALS], dtype=np.float64)


def language_pair(query: str, top: EvidenceBlock) -> str:
    """``<query script>-><top block script>`` (``latin``/``cjk``; ``none`` without letters)."""
    return f"{script(query) or 'none'}->{script(top.content) or 'none'}"


def band(confidence: float) -> RelevanceLevel:
    """The level of ``confidence`` (:data:`BANDS`; NONE below the WEAK floor)."""
    return next((level for level, floor in BANDS if confidence >= floor), RelevanceLevel.NONE)


@dataclass(frozen=True)
class PairModel:
    """One language pair's model (Platt-style logistic): standardise by ``mean`` / ``scale``,
    logit = ``weights`` . z + ``bias``, probability = sigmoid(logit)."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float

    def contributions(self, x: np.ndarray) -> np.ndarray:
        """Per-signal logit contributions of ``x`` (positive: raised the confidence)."""
        return np.asarray(self.weights * (x - self.mean) / self.scale, dtype=np.float64)

    def probability(self, x: np.ndarray) -> float:
        """The calibrated probability of signals ``x``, in [0, 1]."""
        logit = float(self.contributions(x).sum()) + self.bias
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, logit))))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairModel:
        mean, scale, weights = (np.array(data[k], dtype=np.float64) for k in ("mean", "scale", "weights"))
        return cls(mean, scale, weights, float(data["bias"]))

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: [round(float(v), 6) for v in getattr(self, k)] for k in ("mean", "scale", "weights")},
            "bias": round(self.bias, 6),
        }


@dataclass(frozen=True)
class ConfidenceModel:
    """Pair models by language pair, ``pooled`` for a pair without its own; ``meta``: how it
    was fitted (models, data, cross-validated figures)."""

    pairs: dict[str, PairModel]
    pooled: PairModel
    meta: dict[str, Any]

    def model_for(self, pair: str) -> PairModel:
        return self.pairs.get(pair, self.pooled)

    def explain(self, pair: str, x: np.ndarray) -> tuple[float, dict[str, float]]:
        """(confidence, signal -> logit contribution, largest first; zeros left out)."""
        model = self.model_for(pair)
        parts = model.contributions(x)
        explained = {
            SIGNALS[i]: round(float(parts[i]), 3) for i in np.argsort(-np.abs(parts)) if round(float(parts[i]), 3)
        }
        return round(model.probability(x), 4), explained

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CONFIDENCE_FORMAT,
            "signals": list(SIGNALS),
            "pairs": {k: m.to_json() for k, m in sorted(self.pairs.items())},
            "pooled": self.pooled.to_json(),
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConfidenceModel:
        if data.get("format") != CONFIDENCE_FORMAT or list(data.get("signals", [])) != list(SIGNALS):
            raise ValueError(f"not a {CONFIDENCE_FORMAT} file with signals {list(SIGNALS)}")
        return cls(
            pairs={k: PairModel.from_json(v) for k, v in data["pairs"].items()},
            pooled=PairModel.from_json(data["pooled"]),
            meta=dict(data.get("meta", {})),
        )


def calibration_path(backend: str, model: str) -> Path:
    """Where the confidence model of embedding profile ``backend:model`` ships."""
    return CALIBRATION_DIR / (profile_key(backend, model).replace(":", "-").replace("/", "-") + ".json")


@cache
def _load(path: Path) -> ConfidenceModel | None:
    if not path.is_file():
        return None
    try:
        return ConfidenceModel.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("confidence: %s unusable (%s); relevance falls back to the similarity thresholds", path, exc)
        return None


def load_confidence_model(backend: str, model: str, ensemble: str) -> ConfidenceModel | None:
    """The shipped confidence model of profile ``backend:model`` fitted with second model
    ``ensemble`` (``RagSettings.ensemble_backend``); None when there is none or it was fitted
    with another second model (its rerank signals differ). Never raises (a bad file is logged)."""
    found = _load(calibration_path(backend, model))
    if found is None or found.meta.get("ensemble_backend", ensemble) != ensemble:
        return None
    return found
