"""An OpenAI-compatible ``POST {base_url}/embeddings`` endpoint (OpenAI, vLLM, TEI, Ollama, ...).

The key is a SecretStr and never appears in messages or logs. Transport errors, 429 and 5xx are
retried (tenacity, exponential back-off); anything else raises EmbeddingEndpointError at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
from pydantic import SecretStr
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import EmbedderLoadError

SETTING = "RAG_EMBEDDING_BACKEND=openai"


class EmbeddingEndpointError(RuntimeError):
    """The endpoint answered with an error or an unusable body (status and reason, never the key)."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and (
        exc.response.status_code == 429 or exc.response.status_code >= 500
    )


class OpenAIEmbedder(BaseEmbedder):
    """Embeddings from an OpenAI-compatible endpoint.

    ``dimension`` is the configured one, else learnt from one probe request. Tokens are
    estimated as UTF-8 bytes / 3 (an over-estimate for English, about one per CJK character),
    since the server's tokenizer is not known here; ``window`` is the model's context.
    Raises EmbedderLoadError at construction when ``base_url`` or ``model`` is missing.
    """

    backend = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: SecretStr | None = None,
        *,
        dimension: int | None = None,
        window: int = 512,
        batch_size: int = 64,
        timeout_s: float = 30.0,
        attempts: int = 3,
        query_prefix: str = "",
        passage_prefix: str = "",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(batch_size)
        if not base_url:
            raise EmbedderLoadError(f"{SETTING}: RAG_EMBEDDING_BASE_URL is empty")
        if not model:
            raise EmbedderLoadError(f"{SETTING}: RAG_EMBEDDING_MODEL is empty (the endpoint's model name)")
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout_s, transport=transport
        )
        self._base_url = base_url
        self._name = model
        self._dim = dimension
        self._window = window
        self._prefixes = (query_prefix, passage_prefix)
        self._post = retry(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=0.2, max=4),
            reraise=True,
        )(self._post_once)

    @property
    def model_id(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        if self._dim is None:
            self._dim = int(np.asarray(self._request(["dimension probe"])).shape[1])
        return self._dim

    @property
    def max_tokens(self) -> int:
        return self._window

    def count_tokens(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / 3) + 2

    def _settings(self) -> dict[str, Any]:
        return {"base_url": self._base_url, "query_prefix": self._prefixes[0], "passage_prefix": self._prefixes[1]}

    def _post_once(self, body: dict[str, Any]) -> httpx.Response:
        response = self._client.post("embeddings", json=body)
        response.raise_for_status()
        return response

    def _request(self, texts: Sequence[str]) -> list[list[float]]:
        try:
            response = self._post({"model": self._name, "input": list(texts), "encoding_format": "float"})
        except httpx.HTTPStatusError as exc:
            raise EmbeddingEndpointError(
                f"embedding endpoint answered HTTP {exc.response.status_code}: {exc.response.text[:200]}"
            ) from None
        except httpx.HTTPError as exc:
            raise EmbeddingEndpointError(f"embedding endpoint unreachable: {type(exc).__name__}: {exc}") from None
        try:
            data = sorted(response.json()["data"], key=lambda d: int(d["index"]))
            rows = [list(map(float, d["embedding"])) for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingEndpointError(f"embedding endpoint gave an unusable body: {exc!r}") from None
        if len(rows) != len(texts):
            raise EmbeddingEndpointError(f"embedding endpoint returned {len(rows)} vectors for {len(texts)} inputs")
        return rows

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        prefix = self._prefixes[0] if is_query else self._prefixes[1]
        return np.asarray(self._request([prefix + t for t in texts]), dtype=np.float32)

    def close(self) -> None:
        self._client.close()
