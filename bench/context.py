"""State the benchmarks share within one run: scratch space, the time budget, the embedding
model, the runbook corpus (chunks and their embeddings), its ingested data dir (Milvus Lite and
pgvector) and the benchmark queries with their embeddings. Everything is built lazily, so each
benchmark can also run alone (``--only``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RUNBOOKS, Budget, Scratch, chunk_dir, log, make_settings, warm_embedder
from bench.queries import benchmark_queries
from rag_core.settings import RagSettings

PG_TABLE = "knowledge_chunks"


@dataclass
class Corpus:
    """The runbook chunks as ingestion sees them, with their embeddings (one row per chunk)."""

    chunks: list[Any]
    vectors: np.ndarray

    @property
    def texts(self) -> list[str]:
        return [c.embed_text for c in self.chunks]


@dataclass
class BenchContext:
    scratch: Scratch
    budget: Budget
    quick: bool = False
    show_progress: bool = True
    knowledge_dir: Path = RUNBOOKS
    query_limit: int | None = None
    corpus: Corpus | None = None
    kb_settings: RagSettings | None = None  # data dir holding the ingested corpus (Milvus + L0)
    pg_ready: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def embedder(self) -> Any:
        """The configured backend (RAG_EMBEDDING_BACKEND, else the default), loaded up front."""
        embedder, self.notes["model_load_s"] = warm_embedder(
            make_settings(self.scratch.dir("model"), self.knowledge_dir)
        )
        log(f"embedding model loaded in {self.notes['model_load_s']} s")
        return embedder

    def chunk_corpus(self) -> list[Any]:
        """The knowledge dir's chunks, exactly as ``ingest`` makes them."""
        return chunk_dir(self.knowledge_dir, make_settings(self.scratch.dir("chunking"), self.knowledge_dir))

    def get_corpus(self) -> Corpus:
        """The knowledge dir's chunks with the vectors the kb ingest embedded (read back from its
        embedding cache: the corpus is embedded once per run)."""
        if self.corpus is None:
            from rag_core.ingest.embed_cache import EmbeddingCache

            cache = EmbeddingCache.under(self.get_kb_settings().data_dir)
            chunks = self.chunk_corpus()
            vectors = cache.get_many(self.embedder.identity(), [c.content_hash for c in chunks])
            self.corpus = Corpus(chunks, np.stack([vectors[c.content_hash] for c in chunks]))
        return self.corpus

    def get_kb_settings(self) -> RagSettings:
        """Settings of a data dir holding the ingested corpus (Milvus Lite + L0 index)."""
        if self.kb_settings is None:
            from rag_core.ingest.pipeline import ingest
            from rag_core.stores.milvus import MilvusStore

            settings = make_settings(self.scratch.dir("kb"), self.knowledge_dir)
            ingest(settings, self.embedder, [MilvusStore.from_settings(settings)], progress=False)
            self.kb_settings = settings
        return self.kb_settings

    def pg_store(self):
        """A PgVectorStore on the suite's embedded PostgreSQL holding the ingested corpus (its
        vectors from the kb data dir's embedding cache: no second embedding)."""
        from rag_core.stores.pgvector import PgVectorStore

        store = PgVectorStore(self.scratch.pg_dsn(), PG_TABLE)
        if not self.pg_ready:
            from rag_core.ingest.pipeline import ingest

            ingest(self.get_kb_settings(), self.embedder, [store], progress=False)
            self.pg_ready = True
        return store

    @cached_property
    def queries(self) -> list[str]:
        return benchmark_queries(self.query_limit)

    @cached_property
    def query_vectors(self) -> np.ndarray:
        return np.stack([self.embedder.embed_query(q) for q in self.queries])
