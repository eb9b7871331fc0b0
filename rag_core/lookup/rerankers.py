"""Second-stage rerankers: ``Reranker.rerank(query, texts) -> scores`` (one float per text, higher
is better), behind a protocol so the stage (:mod:`rag_core.lookup.second_stage`) does not care
what scores.

Two implementations: :class:`CrossEncoderReranker`, a sentence-transformers ``CrossEncoder``
from a local model path (query and passage read together, the retrieve-then-rerank pattern of
Nogueira & Cho 2019, "Passage Re-ranking with BERT"), and :class:`HttpReranker`, a client of a
``/rerank`` endpoint (Hugging Face TEI, Jina, Cohere and the servers copying them). Both raise
:class:`RerankerError` on any failure; the stage turns that into the first-stage order.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from rag_core.secrets import scrub_secrets
from rag_core.settings import RagSettings

if TYPE_CHECKING:
    import httpx


class RerankerError(RuntimeError):
    """A reranker could not score (load, connection, HTTP status, malformed answer)."""


@runtime_checkable
class Reranker(Protocol):
    """Scores ``texts`` (the candidates' passages, best first-stage first) for ``query``:
    ``rerank(query, texts) -> list[float]`` of ``len(texts)``, higher is better, same order as
    ``texts``. Raises :class:`RerankerError`. ``name`` goes into the trace."""

    name: str

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]: ...


class CrossEncoderReranker:
    """sentence-transformers ``CrossEncoder(model)`` (a local path or hub id), loaded on first
    use (import included: the ``sentence-transformers`` extra). Thread-safe."""

    def __init__(self, model: str, max_length: int = 512) -> None:
        self.model = model
        self.max_length = max_length
        self.name = f"cross-encoder:{model}"
        self._encoder: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._encoder is None:
                try:
                    from sentence_transformers import CrossEncoder
                except ImportError as exc:
                    raise RerankerError(
                        "RAG_RERANKER=cross-encoder needs the sentence-transformers extra "
                        "(pip install 'rag-retrieval[sentence-transformers]')"
                    ) from exc
                try:
                    self._encoder = CrossEncoder(self.model, max_length=self.max_length, device="cpu")
                except Exception as exc:
                    raise RerankerError(
                        f"cannot load the cross-encoder RAG_RERANKER_MODEL={self.model}: {exc}"
                    ) from exc
            return self._encoder

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        encoder = self._load()
        try:
            scores = encoder.predict([(query, t) for t in texts], show_progress_bar=False)
        except Exception as exc:
            raise RerankerError(f"cross-encoder failed: {type(exc).__name__}: {exc}") from exc
        return _finite([float(s) for s in scores], len(texts))


class _Ranked(BaseModel):
    """One entry of a rerank answer: the text's ``index`` and its score (TEI ``score``,
    Jina/Cohere ``relevance_score``)."""

    model_config = ConfigDict(extra="ignore")

    index: int
    score: float | None = None
    relevance_score: float | None = None


class _Results(BaseModel):
    model_config = ConfigDict(extra="ignore")

    results: list[_Ranked]


class HttpReranker:
    """Client of a ``/rerank`` endpoint. Request (JSON POST to ``url``): ``query``, the texts as
    ``documents`` (Jina, Cohere) and as ``texts`` (TEI), ``top_n`` = their count,
    ``return_documents`` false, ``model`` when given. Answer: TEI's list of ``{index, score}`` or
    Jina/Cohere's ``{"results": [{index, relevance_score}]}``; every text must get one finite
    score. ``api_key``: sent as ``Authorization: Bearer``, never logged or put in an error.
    ``timeout_s``: httpx timeout of each phase (the stage bounds the whole call)."""

    def __init__(self, url: str, model: str = "", api_key: SecretStr | None = None, timeout_s: float = 2.0) -> None:
        self.url = url
        self.model = model
        self.name = f"http:{scrub_secrets(url)}"
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                try:
                    import httpx
                except ImportError as exc:
                    raise RerankerError("RAG_RERANKER=http needs httpx (the rerank-http extra)") from exc
                headers = {"Accept": "application/json"}
                if self._api_key is not None and self._api_key.get_secret_value():
                    headers["Authorization"] = f"Bearer {self._api_key.get_secret_value()}"
                self._client = httpx.Client(timeout=self._timeout_s, headers=headers)
            return self._client

    def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        body: dict[str, Any] = {
            "query": query,
            "documents": list(texts),
            "texts": list(texts),
            "top_n": len(texts),
            "return_documents": False,
        }
        if self.model:
            body["model"] = self.model
        try:
            response = self._http().post(self.url, json=body)
        except RerankerError:
            raise
        except Exception as exc:  # httpx.TimeoutException, ConnectError, ...
            raise RerankerError(self._scrub(f"rerank endpoint unreachable: {type(exc).__name__}: {exc}")) from exc
        if response.status_code != 200:
            raise RerankerError(
                self._scrub(f"rerank endpoint answered HTTP {response.status_code}: {response.text[:200]}")
            )
        try:
            return parse_scores(response.json(), len(texts))
        except (ValueError, ValidationError) as exc:
            raise RerankerError(self._scrub(f"rerank endpoint gave a malformed answer: {exc}"[:300])) from exc

    def _scrub(self, text: str) -> str:
        key = self._api_key.get_secret_value() if self._api_key is not None else ""
        return scrub_secrets(text.replace(key, "***") if key else text)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def parse_scores(answer: Any, n: int) -> list[float]:
    """Scores in text order from a TEI (list of ``{index, score}``) or Jina/Cohere
    (``{"results": [{index, relevance_score}]}``) answer for ``n`` texts. Raises ValueError
    (or pydantic's ValidationError) when an index is out of range, repeated or missing, or a
    score is missing or not finite."""
    entries = _Results.model_validate(answer).results if isinstance(answer, dict) else None
    if entries is None:
        if not isinstance(answer, list):
            raise ValueError(f"expected a list or an object with 'results', got {type(answer).__name__}")
        entries = [_Ranked.model_validate(e) for e in answer]
    scores: list[float | None] = [None] * n
    for e in entries:
        value = e.relevance_score if e.relevance_score is not None else e.score
        if not 0 <= e.index < n or scores[e.index] is not None or value is None:
            raise ValueError(f"bad entry (index {e.index}, score {value}) for {n} texts")
        scores[e.index] = value
    if any(s is None for s in scores):
        raise ValueError(f"scores for {sum(s is not None for s in scores)} of {n} texts")
    return _finite([float(s) for s in scores if s is not None], n)


def _finite(scores: list[float], n: int) -> list[float]:
    if len(scores) != n or not all(math.isfinite(s) for s in scores):
        raise RerankerError(f"the reranker gave {len(scores)} scores for {n} texts, or a non-finite one")
    return scores


def make_reranker(settings: RagSettings) -> Reranker | None:
    """The reranker ``settings.reranker`` names (None for 'none'); nothing is loaded yet."""
    if settings.reranker == "cross-encoder":
        return CrossEncoderReranker(settings.reranker_model)
    if settings.reranker == "http":
        assert settings.reranker_url  # the settings validator requires it
        return HttpReranker(
            settings.reranker_url, settings.reranker_model, settings.reranker_api_key, settings.reranker_timeout_s
        )
    return None
