"""LookupComponents: the lookup's settings and lazily built components (models, stores, L0
index, rerank model, recorder), shared by every stage of :class:`rag_core.lookup.tool.LookupKnowledgeTool`.

Each component is built on first use from ``settings`` (``rag_core.components``) unless given;
tests pass fakes or shared instances. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from rag_core import components, text
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.l0 import L0Index
from rag_core.lookup.document_similarity import DocumentSimilarity
from rag_core.lookup.ensemble import EnsembleSimilarity
from rag_core.lookup.postprocessor import RerankWeights
from rag_core.lookup.ranker import LinearRanker, resolve_ranker
from rag_core.lookup.rerankers import Reranker, make_reranker
from rag_core.settings import RagSettings

if TYPE_CHECKING:
    from rag_core.embedding.base import Embedder
    from rag_core.stores.base import VectorStore
    from rag_core.traces.recorder import ToolInvocationRecorder

log = logging.getLogger(__name__)


class LookupComponents:
    """The components a lookup uses: ``embedder`` (``rag_core.embedding.make_embedder``),
    ``store`` (MilvusStore), ``sidecar`` (PgVectorStore, only when ``settings.sidecar_enabled``),
    ``l0`` (loaded from the data dir; None when missing), ``recorder`` (ToolInvocationRecorder
    on PostgreSQL with a local spool), ``ensemble`` (the rerank's second model,
    ``components.make_ensemble_embedder``; one that cannot load is logged once and the rerank
    goes without it), ``ranker`` (the rerank model: the ``weights`` given, unless
    ``settings.rerank_model`` names a learned ranker that fits the models), ``documents`` (document similarity),
    ``reranker`` (the optional second stage, ``rag_core.lookup.rerankers.make_reranker``)."""

    def __init__(
        self,
        settings: RagSettings | None = None,
        *,
        embedder: Embedder | None = None,
        store: VectorStore | None = None,
        sidecar: VectorStore | None = None,
        l0: L0Index | None = None,
        recorder: ToolInvocationRecorder | None = None,
        weights: RerankWeights = RerankWeights(),
        ensemble_embedder: Embedder | None = None,
        reranker: Reranker | None = None,
    ) -> None:
        self.settings = settings or RagSettings()
        text.keep_dictionary_in(self.settings.model_cache_dir)
        # Title vectors, written by ingest; read so a fresh process need not embed them.
        self.vector_cache = EmbeddingCache.under(self.settings.data_dir)
        self._embedder = embedder
        self._store = store
        self._sidecar = sidecar
        self._l0 = l0
        self._l0_given = l0 is not None
        self._l0_mtime: int | None = None
        self._recorder = recorder
        self._weights = weights
        self._ranker: LinearRanker | None = None
        self._documents: DocumentSimilarity | None = None
        self._ensemble: EnsembleSimilarity | None = (
            EnsembleSimilarity(ensemble_embedder) if ensemble_embedder is not None else None
        )
        self._ensemble_loaded = ensemble_embedder is not None
        self._init_lock = threading.Lock()
        # The second-stage reranker (RAG_RERANKER; None: off); nothing loads before its first call.
        self.reranker = reranker if reranker is not None else make_reranker(self.settings)

    @property
    def l0(self) -> L0Index | None:
        """The L0 index: the one given, else the data dir's, reloaded when ingestion rewrote it."""
        if self._l0_given:
            return self._l0
        path = self.settings.l0_index_path
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            if self._l0 is None:
                log.warning("no L0 index at %s: run `rag ingest`", path)
            return self._l0
        if mtime != self._l0_mtime:
            try:
                self._l0, self._l0_mtime = L0Index.load(path), mtime
            except Exception as exc:
                log.warning("L0 index unreadable (%s): keeping the previous one", exc)
        return self._l0

    @property
    def data_dir_vanished(self) -> bool:
        """True when the L0 index was loaded from the data dir and that dir is gone since."""
        return not self._l0_given and self._l0_mtime is not None and not self.settings.data_dir.exists()

    @property
    def embedder(self) -> Embedder:
        with self._init_lock:
            if self._embedder is None:
                self._embedder = components.make_embedder(self.settings)
            return self._embedder

    @property
    def ensemble(self) -> EnsembleSimilarity | None:
        """The rerank's second-model similarity (None when off or when its model cannot load)."""
        with self._init_lock:
            if not self._ensemble_loaded:
                self._ensemble_loaded = True
                try:
                    second = components.make_ensemble_embedder(self.settings)
                    self._ensemble = EnsembleSimilarity(second) if second is not None else None
                except Exception as exc:  # the rerank goes on with the main model alone
                    log.warning("ensemble similarity off: %s", exc)
            return self._ensemble

    @property
    def documents(self) -> DocumentSimilarity:
        """The document (title + centroid) similarity under the main model."""
        embedder = self.embedder
        with self._init_lock:
            if self._documents is None:
                self._documents = DocumentSimilarity(embedder, self.vector_cache)
            return self._documents

    @property
    def ranker(self) -> LinearRanker:
        """The rerank model ``settings.rerank_model`` names (:func:`resolve_ranker`), resolved
        once against the embedding models in use (the second one loaded when the setting is
        not 'hand'); the hand-set weights when it cannot be used."""
        if self._ranker is None:
            hand = self._weights.ranker()
            setting = self.settings.rerank_model
            if setting in ("", "hand"):
                self._ranker = hand
            else:
                main = self.embedder
                second = self.ensemble.embedder if self.ensemble is not None else None
                keys = {"main": _model_key(main), "second": _model_key(second)}

                def models() -> dict[str, str]:  # only when a ranker file is read: may probe the model
                    return {"main": getattr(main, "fingerprint", ""), "second": getattr(second, "fingerprint", "")}

                self._ranker = resolve_ranker(setting, hand, models, keys)
        return self._ranker

    @property
    def store(self) -> VectorStore:
        with self._init_lock:
            if self._store is None:
                self._store = components.make_main_store(self.settings)
            return self._store

    @property
    def store_name(self) -> str:
        """The main store's name (``milvus`` unless it says otherwise)."""
        return getattr(self.store, "name", "milvus")

    @property
    def sidecar(self) -> VectorStore | None:
        if not self.settings.sidecar_enabled:
            return None
        with self._init_lock:
            if self._sidecar is None:
                self._sidecar = components.make_sidecar_store(self.settings, lookup=True)
            return self._sidecar

    @property
    def recorder(self) -> ToolInvocationRecorder | None:
        if not self.settings.trace_enabled:
            return None
        with self._init_lock:
            if self._recorder is None:
                self._recorder = components.make_recorder(self.settings)
            return self._recorder

    def load(self) -> None:
        """Load the models and the L0 index and open the main store now, so the first lookup
        does not pay for them. Never raises: a failure is logged (the lookup reports it)."""
        try:
            self.embedder.embed_query("warm up")
            if self.ensemble is not None:  # USE's first query also pays its set-up (about 2 s)
                self.ensemble.embedder.embed_query("warm up")
            _ = self.l0
            text.warm_up()  # an English-only index would leave the first Chinese query to load jieba
            self.store.count()
        except Exception as exc:
            log.warning("warm-up incomplete: %s", exc)


def _model_key(embedder: object | None) -> str:
    """``backend:model`` of ``embedder`` ('' when None or it does not say: no shipped ranker is for it)."""
    backend, model = getattr(embedder, "backend", ""), getattr(embedder, "model_id", "")
    return f"{backend}:{model}" if backend and model else ""
