"""Linear rerank models: one weight per rerank feature, a candidate's score is ``w . x``.

The post-processor (:mod:`rag_core.lookup.postprocessor`) computes one feature vector per
candidate chunk (``FEATURES``, each in a bounded range: min-max normalised cosines, BM25 score
over the best one, reciprocal channel ranks, L0 match indicators/counts, document support), and
a document's score is the score of its best chunk. Two weight vectors per model: one for a query
written in the script of its candidates, one for a query in another script (a Chinese question
on English runbooks; :func:`rag_core.lookup.postprocessor.languages_differ`), because the
channels' reliability flips across languages; optionally, same-script weights per query script
(``by_script``: ``latin``, ``cjk``), which override ``same_script`` for that script. Without the second embedding model
(``ensemble_dense`` absent) its weight goes to the main model's cosine, so a missing feature
never crashes the ranker or leaves the dense weight short.

The hand-set weights (``RerankWeights.ranker()``) are one such model; a learned one is read from
a small JSON file (``RANKER_FORMAT``) written by ``rag eval cv --fit`` and tied to the embedding
models it was fitted on (their fingerprints): features of another model mean other things.
Inference is a NumPy dot product: no training library is imported here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Feature names, also the rerank trace's contribution names (``base_score`` is ``dense``).
FEATURES = (
    "dense",  # main model cosine, min-max over the candidates
    "ensemble_dense",  # second model cosine, min-max over the candidates (0: model off)
    "lexical",  # BM25 score / best BM25 score of the candidates (0: dense channel only)
    "bm25_rank",  # 1 / rank in the BM25 channel (0: not found by it)
    "dense_rank",  # 1 / rank in the dense channel (0: not found by it)
    "rrf",  # reciprocal rank fusion score, min-max over the candidates
    "doc_support",  # share of the document's other chunks among the candidates
    "title_match",  # L0 name match: 1 exact/fuzzy, coverage s for a partial one
    "keyword_match",  # L0 keyword matches of the document, at most MAX_TERM_MATCHES
    "entity_match",  # L0 entity matches of the document, at most MAX_TERM_MATCHES
    "domain_match",  # 1 when the block's category is an L0 domain hint
    "priority",  # frontmatter priority clamped to [-5, 5]
    "document_similarity",  # title + centroid cosine, min-max over the documents
    "filtered_attempt",  # 1 when found by the category-filtered attempt
)
INDEX = {name: i for i, name in enumerate(FEATURES)}
MAX_TERM_MATCHES = 2
RANKER_FORMAT = "rag_core.linear_ranker/1"
SCRIPTS = ("latin", "cjk")  # rag_core.text.script


class RankerFileError(ValueError):
    """A ranker file that cannot be used: unreadable, malformed, or fitted for other models."""


@dataclass(frozen=True)
class LinearRanker:
    """``same_script`` and ``crosslingual``: (len(FEATURES),) weights. ``name``: shown in logs
    and reports; ``source``: how they were chosen (file path and fit summary for a learned one);
    ``by_script``: script (``SCRIPTS``) -> (len(FEATURES),) same-script weights for a query in
    that script (others use ``same_script``)."""

    name: str
    same_script: np.ndarray
    crosslingual: np.ndarray
    source: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    by_script: Mapping[str, np.ndarray] = field(default_factory=dict)

    def weights(self, crosslingual: bool, with_ensemble: bool, script: str | None = None) -> np.ndarray:
        """The (len(FEATURES),) weights for one result set (``script``: the query's, for
        ``by_script``); without the second model its weight is added to ``dense`` (the main
        model then carries the whole dense evidence)."""
        chosen = self.crosslingual if crosslingual else self.by_script.get(script or "", self.same_script)
        w = chosen.astype(np.float64, copy=True)
        if not with_ensemble:
            w[INDEX["dense"]] += w[INDEX["ensemble_dense"]]
            w[INDEX["ensemble_dense"]] = 0.0
        return w

    def to_json(self) -> dict[str, Any]:
        """The file form (``RANKER_FORMAT``): weights by feature name plus ``meta``."""
        return {
            "format": RANKER_FORMAT,
            "name": self.name,
            "features": list(FEATURES),
            "same_script": {f: round(float(v), 6) for f, v in zip(FEATURES, self.same_script, strict=True)},
            "crosslingual": {f: round(float(v), 6) for f, v in zip(FEATURES, self.crosslingual, strict=True)},
            **(
                {
                    "by_script": {
                        s: {f: round(float(v), 6) for f, v in zip(FEATURES, w, strict=True)}
                        for s, w in sorted(self.by_script.items())
                    }
                }
                if self.by_script
                else {}
            ),
            **dict(self.meta),
        }


def weight_vector(weights: Mapping[str, float], where: str) -> np.ndarray:
    """(len(FEATURES),) from ``{feature: weight}``; a feature left out weighs 0. RankerFileError
    naming ``where`` for an unknown feature or a non-finite weight."""
    unknown = sorted(set(weights) - set(FEATURES))
    if unknown:
        raise RankerFileError(f"{where}: unknown rerank features {unknown}; known: {', '.join(FEATURES)}")
    out = np.zeros(len(FEATURES))
    for name, value in weights.items():
        if not isinstance(value, (int, float)) or not np.isfinite(value):
            raise RankerFileError(f"{where}: weight of {name!r} must be a finite number, got {value!r}")
        out[INDEX[name]] = float(value)
    return out


def load_ranker(path: Path, models: Mapping[str, str]) -> LinearRanker:
    """The ranker in ``path`` (``RANKER_FORMAT``). ``models``: role (``main``, ``second``) ->
    fingerprint of the embedding model now in use ('' when that role is off). A file fitted for
    another main model, or with a second model that is now a different one, is refused; a second
    model that is now off is fine (its weight goes to ``dense``). RankerFileError (naming the file)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RankerFileError(f"{path}: ranker file unreadable: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != RANKER_FORMAT:
        raise RankerFileError(f"{path}: not a ranker file (expected format {RANKER_FORMAT!r})")
    fitted = data.get("models")
    if not isinstance(fitted, dict):
        raise RankerFileError(f"{path}: field 'models' (role -> model fingerprint) missing")
    for role, fingerprint in fitted.items():
        now = models.get(role, "")
        if fingerprint and now and now != fingerprint:
            raise RankerFileError(
                f"{path}: ranker fitted for {role} model fingerprint {fingerprint}, but {now} is in use; "
                "refit it (rag eval cv --fit) or set RAG_RERANK_MODEL=hand"
            )
    if fitted.get("main") and not models.get("main"):
        raise RankerFileError(f"{path}: ranker needs its main model fingerprint {fitted['main']}")
    for key in ("same_script", "crosslingual"):
        if not isinstance(data.get(key), dict):
            raise RankerFileError(f"{path}: field {key!r} (feature -> weight) missing")
    by_script = data.get("by_script", {})
    if not isinstance(by_script, dict) or not set(by_script) <= set(SCRIPTS):
        raise RankerFileError(f"{path}: field 'by_script' must map {' / '.join(SCRIPTS)} to feature weights")
    for key, weights in by_script.items():
        if not isinstance(weights, dict):
            raise RankerFileError(f"{path}: by_script.{key} (feature -> weight) must be a mapping")
    skip = ("format", "name", "features", "same_script", "crosslingual", "by_script")
    return LinearRanker(
        name=str(data.get("name") or path.stem),
        same_script=weight_vector(data["same_script"], f"{path}: same_script"),
        crosslingual=weight_vector(data["crosslingual"], f"{path}: crosslingual"),
        source=str(path),
        meta={k: v for k, v in data.items() if k not in skip},
        by_script={k: weight_vector(w, f"{path}: by_script.{k}") for k, w in by_script.items()},
    )


RANKERS_DIR = Path(__file__).with_name("rankers")


def shipped_ranker_path(main: str, second: str) -> Path:
    """Where the learned ranker for main model key ``main`` and second model key ``second``
    (``backend:model``, '' when off) ships: ``rankers/<main>+<second>.json``."""
    slug = "+".join(k.replace(":", "-").replace("/", "-") for k in (main, second) if k)
    return RANKERS_DIR / f"{slug}.json"


def resolve_ranker(
    setting: str,
    hand: LinearRanker,
    models: Mapping[str, str] | Callable[[], Mapping[str, str]],
    keys: Mapping[str, str],
) -> LinearRanker:
    """The ranker ``setting`` (``RagSettings.rerank_model``) asks for: 'hand' -> ``hand``;
    'auto' -> the shipped file for the model ``keys`` (role -> ``backend:model``) if there is
    one, else ``hand``; anything else is a file path. A missing, corrupt or mismatched file
    (``models``: role -> fingerprint, see :func:`load_ranker`; a callable is called only when a
    file is read, as a fingerprint may need the model) logs one warning naming the file and
    gives ``hand``; never raises."""
    if setting in ("", "hand"):
        return hand
    if setting == "auto":
        path = shipped_ranker_path(keys.get("main", ""), keys.get("second", ""))
        if not path.is_file():
            return hand
    else:
        path = Path(setting).expanduser()
    try:
        return load_ranker(path, models() if callable(models) else models)
    except RankerFileError as exc:
        log.warning("rerank: %s; using the hand-set weights", exc)
        return hand
