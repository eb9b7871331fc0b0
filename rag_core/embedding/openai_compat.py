"""An OpenAI-compatible ``POST {base_url}/embeddings`` endpoint (OpenAI, vLLM, TEI, Ollama, ...).

The key is a SecretStr and never appears in messages or logs. Transport errors, 429 and 5xx are
retried (tenacity); anything else raises EmbeddingEndpointError at once. A rate-limit answer's
``Retry-After`` (seconds or an HTTP date, RFC 9110 section 10.2.3) or ``retry-after-ms`` (OpenAI's
header) sets the wait, capped at ``max_retry_after_s``; without one the wait is exponential with
jitter. A 429 also holds back every other request of this client until the wait is over, so
concurrent requests do not keep hitting a server that asked for a pause.

Passages go out in batches of ``batch_size`` texts, ``concurrency`` requests in flight at once
(one thread pool per client, shared by concurrent callers; httpx's connection pool sized to
match), so a GPU embedding server (TEI, vLLM, ...) is the scale-out of the embed step.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import numpy as np
from pydantic import SecretStr
from tenacity import RetryCallState, retry, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import EmbedderLoadError, Matrix, check_vectors, default_labels

SETTING = "RAG_EMBEDDING_BACKEND=openai"
#: Statuses whose ``Retry-After`` is honoured (RFC 9110: 503 and 3xx; RFC 6585: 429).
RATE_LIMITED = (429, 503)


class EmbeddingEndpointError(RuntimeError):
    """The endpoint answered with an error or an unusable body (status and reason, never the key)."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and (
        exc.response.status_code == 429 or exc.response.status_code >= 500
    )


def retry_after_seconds(response: httpx.Response, now: datetime | None = None) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, else ``Retry-After`` as delta
    seconds or an HTTP date), never negative; None when absent or unreadable."""
    ms = response.headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, float((when - (now or datetime.now(UTC))).total_seconds()))


class _RateLimitAwareWait:
    """tenacity wait: the server's ``Retry-After`` on 429/503 (capped), else exponential
    back-off with jitter (``initial * 2**n`` up to ``maximum``, plus up to ``jitter`` s)."""

    def __init__(self, cap_s: float, initial: float = 0.2, maximum: float = 4.0, jitter: float = 0.2) -> None:
        self.cap_s = cap_s
        self._fallback = wait_exponential(multiplier=initial, max=maximum) + wait_random(0, jitter)

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in RATE_LIMITED:
            asked = retry_after_seconds(exc.response)
            if asked is not None:
                return min(asked, self.cap_s)
        return float(self._fallback(state))


class OpenAIEmbedder(BaseEmbedder):
    """Embeddings from an OpenAI-compatible endpoint.

    ``dimension`` is the configured one, else learnt from one probe request. Tokens are
    estimated as UTF-8 bytes / 3 (an over-estimate for English, about one per CJK character),
    since the server's tokenizer is not known here; ``window`` is the model's context.
    ``concurrency``: passage requests in flight at once (1: one after the other); ``attempts``:
    tries per request; ``max_retry_after_s``: the longest wait a ``Retry-After`` can ask for.
    Raises EmbedderLoadError at construction when ``base_url`` or ``model`` is missing or
    ``concurrency`` is below 1.
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
        concurrency: int = 4,
        max_retry_after_s: float = 30.0,
    ) -> None:
        super().__init__(batch_size)
        if not base_url:
            raise EmbedderLoadError(f"{SETTING}: RAG_EMBEDDING_BASE_URL is empty")
        if not model:
            raise EmbedderLoadError(f"{SETTING}: RAG_EMBEDDING_MODEL is empty (the endpoint's model name)")
        if concurrency < 1:
            raise EmbedderLoadError(f"{SETTING}: RAG_EMBEDDING_CONCURRENCY={concurrency} must be at least 1")
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
        # One connection per request in flight, plus one for queries sent meanwhile.
        limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout_s, transport=transport, limits=limits
        )
        self.concurrency = concurrency
        self._max_retry_after_s = max_retry_after_s
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._pause_lock = threading.Lock()
        self._resume_at = 0.0  # time.monotonic() before which no request is sent (after a 429)
        self._base_url = base_url
        self._name = model
        self._dim = dimension
        self._window = window
        self._prefixes = (query_prefix, passage_prefix)
        self._post = retry(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(attempts),
            wait=_RateLimitAwareWait(max_retry_after_s),
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
        with self._pause_lock:
            pause = self._resume_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        response = self._client.post("embeddings", json=body)
        if response.status_code == 429:
            self._pause_all(response)
        response.raise_for_status()
        return response

    def _pause_all(self, response: httpx.Response) -> None:
        """Hold back this client's other requests for the wait a 429 asks for (or 1 s)."""
        asked = retry_after_seconds(response)
        wait = min(asked if asked is not None else 1.0, self._max_retry_after_s)
        with self._pause_lock:
            self._resume_at = max(self._resume_at, time.monotonic() + wait)

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

    def _requests_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="embedding-requests")
            return self._pool

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> Matrix:
        """``(len(texts), dimension)`` float32 unit rows, in the order of ``texts``.

        Batches of ``batch_size`` texts, up to ``concurrency`` requests in flight. The first
        failing batch's EmbeddingEndpointError is raised (batches not yet sent are cancelled);
        BadVectorError names the first bad row's id.
        """
        labels = list(ids) if ids is not None else default_labels(len(texts))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        batches = [list(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        if len(batches) == 1 or self.concurrency == 1:
            parts = [self._encode(b, False) for b in batches]
        else:
            futures = [self._requests_pool().submit(self._encode, b, False) for b in batches]
            try:
                parts = [f.result() for f in futures]
            finally:
                for f in futures:
                    f.cancel()
        out = np.concatenate(
            [np.asarray(p, dtype=np.float32).reshape(len(b), -1) for p, b in zip(parts, batches, strict=True)]
        )
        if self._dim is None:
            self._dim = int(out.shape[1])
        return check_vectors(out, labels, self._dim)

    def close(self) -> None:
        """Stop the request threads and close the HTTP connections."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()
