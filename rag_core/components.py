"""Builds the real components from settings (one place, used by the CLI and Dagster)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_core.settings import RagSettings

if TYPE_CHECKING:  # the components' modules load heavy dependencies: imported on first use
    from rag_core.embedding.base import Embedder
    from rag_core.stores.base import VectorStore
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.pgvector import PgVectorStore


def make_embedder(settings: RagSettings) -> Embedder:
    """The process-wide embedder the settings name (``RAG_EMBEDDING_BACKEND`` / ``_MODEL``).

    Raises EmbedderLoadError (one line naming the setting and the reason) when it cannot load.
    """
    from rag_core.embedding import make_embedder as make

    return make(settings)


def make_main_store(settings: RagSettings) -> MilvusStore:
    """The Milvus store: ``RAG_MILVUS_URI``, else the embedded server of the data dir (or the
    in-process file with ``RAG_MILVUS_MODE=file``)."""
    from rag_core.stores.milvus import MilvusStore

    return MilvusStore.from_settings(settings)


def make_sidecar_store(settings: RagSettings) -> PgVectorStore:
    """The pgvector store on ``RAG_PG_DSN`` or the embedded PostgreSQL under the data dir."""
    from rag_core.stores.pgserver import resolve_dsn
    from rag_core.stores.pgvector import PgVectorStore

    return PgVectorStore(resolve_dsn(settings), settings.pg_table, ef_search=settings.pg_ef_search)


def make_stores(settings: RagSettings, with_sidecar: bool | None = None) -> list[VectorStore]:
    """``[main]`` or ``[main, sidecar]`` (sidecar when enabled in settings or asked for)."""
    stores: list[VectorStore] = [make_main_store(settings)]
    if settings.sidecar_enabled if with_sidecar is None else with_sidecar:
        stores.append(make_sidecar_store(settings))
    return stores
