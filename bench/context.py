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

from bench.common import RUNBOOKS, Scratch, chunk_dir, log, make_settings, warm_embedder
from bench.queries import benchmark_queries
from bench.scale import BaseData
from rag_core.settings import RagSettings


@dataclass
class BenchContext:
    scratch: Scratch
    deadline: float | None = None  # time.perf_counter() by which the run's time budget ends
    quick: bool = False
    show_progress: bool = True
    knowledge_dir: Path = RUNBOOKS
    query_limit: int | None = None
    pg_ready: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    memory_collection: dict[str, Any] | None = None  # the Milvus collection scale keeps for memory

    @cached_property
    def embedder(self) -> Any:
        """The configured backend (RAG_EMBEDDING_BACKEND, else the default), loaded up front."""
        settings = make_settings(self.scratch.dir("model"), self.knowledge_dir)
        embedder, self.notes["model_load_s"] = warm_embedder(settings)
        log(f"embedding model loaded in {self.notes['model_load_s']} s")
        return embedder

    def chunk_corpus(self) -> list[Any]:
        """The knowledge dir's chunks, exactly as ``ingest`` makes them."""
        return chunk_dir(self.knowledge_dir, make_settings(self.scratch.dir("chunking"), self.knowledge_dir))

    @cached_property
    def corpus(self) -> BaseData:
        """The knowledge dir's chunks with the vectors the kb ingest embedded (read back from its
        embedding cache: the corpus is embedded once per run; the ingestion benchmark sets its own)."""
        from rag_core.ingest.embed_cache import EmbeddingCache

        cache = EmbeddingCache.under(self.kb_settings.data_dir)
        chunks = self.chunk_corpus()
        vectors = cache.get_many(self.embedder.identity(), [c.content_hash for c in chunks])
        return BaseData(np.stack([vectors[c.content_hash] for c in chunks]), chunks)

    @cached_property
    def kb_settings(self) -> RagSettings:
        """Settings of a data dir holding the ingested corpus (Milvus Lite + L0 index; the ingestion
        benchmark sets the one it ingested)."""
        from rag_core.ingest.pipeline import ingest
        from rag_core.stores.milvus import MilvusStore

        settings = make_settings(self.scratch.dir("kb"), self.knowledge_dir)
        ingest(settings, self.embedder, [MilvusStore.from_settings(settings)], progress=False)
        return settings

    def store(self, path: str) -> Any:
        """A store holding the ingested corpus, for a lookup path: ``milvus`` (the kb data dir's) or
        ``pgvector`` (the suite's embedded PostgreSQL, filled from the kb data dir's embedding cache
        on first use: no second embedding)."""
        if path == "milvus":
            from rag_core.stores.milvus import MilvusStore

            return MilvusStore.from_settings(self.kb_settings)
        from rag_core.stores.pgvector import PgVectorStore

        store = PgVectorStore(self.scratch.pg_dsn())  # the product's default table
        if not self.pg_ready:
            from rag_core.ingest.pipeline import ingest

            ingest(self.kb_settings, self.embedder, [store], progress=False)
            self.pg_ready = True
        return store

    @cached_property
    def queries(self) -> list[str]:
        return benchmark_queries(self.query_limit)

    @cached_property
    def query_vectors(self) -> np.ndarray:
        return np.stack([self.embedder.embed_query(q) for q in self.queries])
