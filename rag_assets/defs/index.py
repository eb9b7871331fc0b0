"""Index group: the L0 hint index, the Milvus collection (main path), the pgvector table (sidecar).

The store assets run rag_core's incremental ingest (content hashes: unchanged chunks are not
re-embedded) under the store's inter-process lock. The sidecar never fails the run: when
PostgreSQL is unreachable ``pgvector_table`` records ``status: unavailable`` and the reason.
"""

import dagster as dg
import psycopg

from rag_assets.defs.resources import (
    EmbedderResource,
    MilvusStoreResource,
    PgVectorStoreResource,
    RagSettingsResource,
)
from rag_assets.metadata import md_table
from rag_core.models import KnowledgeDocument
from rag_core.settings import redact_dsn
from rag_core.stores.base import StoreError

# What an unreachable or misconfigured PostgreSQL raises on the way to the sidecar.
SIDECAR_UNAVAILABLE = (StoreError, psycopg.Error, OSError)
#: Main-path steps run first, back to back: results exist even if the sidecar is slow, and an
#: in-process Milvus Lite connection left idle for ~30 s is dropped by its gRPC server.
MAIN_PATH_FIRST = {"dagster/priority": "10"}


@dg.asset(group_name="index", kinds={"json"})
def l0_index(rag: RagSettingsResource, knowledge_documents: list[KnowledgeDocument]) -> dg.MaterializeResult:
    """The L0 keyword/frontmatter hint index, saved as JSON in the data dir (``l0_index.json``)."""
    from rag_core.l0 import L0Index

    settings = rag.get_settings()
    index = L0Index.build(knowledge_documents)
    index.save(settings.l0_index_path)
    domains = sorted(index.domains)
    return dg.MaterializeResult(metadata={
        "entries": len(index),
        "keywords": len(index.keywords),
        "domains": len(domains),
        "domain_names": dg.MetadataValue.md(md_table(["domain"], [[d] for d in domains])),
        "path": dg.MetadataValue.path(str(settings.l0_index_path.resolve())),
    })


def ingest_metadata(report, store_name: str, stored: int) -> dict:
    """Metadata of one store's ingest: chunk changes, totals, skipped documents, stage seconds."""
    changes = report.stores[store_name]
    return {
        "status": "available",
        "added": changes.added,
        "updated": changes.updated,
        "removed": changes.removed,
        "unchanged": changes.unchanged,
        "chunks_embedded": report.chunks_embedded,
        "documents_ingested": report.documents_ingested,
        "skipped_documents": len(report.skipped),
        "dagster/row_count": stored,
        "stage_seconds": dg.MetadataValue.json(report.stage_seconds),
    }


@dg.asset(group_name="index", deps=["chunks", "l0_index"], kinds={"milvus"}, op_tags=MAIN_PATH_FIRST)
def milvus_collection(context: dg.AssetExecutionContext, rag: RagSettingsResource,
                      embedder: EmbedderResource, milvus: MilvusStoreResource) -> dg.MaterializeResult:
    """The main-path Milvus collection, brought in step with the knowledge directory.

    Incremental: only added or changed chunks are embedded; deleted documents are removed.
    Fails with StoreError when Milvus cannot be opened (the main path must not be skipped).
    """
    from rag_core.ingest.pipeline import ingest

    settings = rag.get_settings()
    with milvus.open(context.log) as store:
        report = ingest(settings, embedder.get(), [store], progress=False)
        stored = store.count()
    return dg.MaterializeResult(metadata={
        **ingest_metadata(report, store.name, stored),
        "collection": settings.collection,
        "target": redact_dsn(settings.milvus_target),
    })


@dg.asset(group_name="index", deps=["chunks"], kinds={"postgres"})
def pgvector_table(context: dg.AssetExecutionContext, rag: RagSettingsResource,
                   embedder: EmbedderResource, pgvector: PgVectorStoreResource) -> dg.MaterializeResult:
    """The sidecar pgvector table, ingested like the Milvus collection.

    When the sidecar is disabled or PostgreSQL is unreachable the asset still materializes,
    with ``status`` (``disabled`` / ``unavailable``) and ``reason`` in its metadata.
    """
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.pgserver import scrub_secrets

    settings = rag.get_settings()
    if not settings.sidecar_enabled:
        return dg.MaterializeResult(metadata={"status": "disabled",
                                              "reason": "sidecar disabled (RAG_SIDECAR_ENABLED=false)"})
    try:
        with pgvector.open(context.log) as store:
            report = ingest(settings, embedder.get(), [store], progress=False)
            stored = store.count()
    except SIDECAR_UNAVAILABLE as exc:
        reason = scrub_secrets(f"{type(exc).__name__}: {exc}")[:500]
        context.log.warning("pgvector sidecar unavailable: %s", reason)
        return dg.MaterializeResult(metadata={"status": "unavailable", "reason": reason})
    return dg.MaterializeResult(metadata={**ingest_metadata(report, store.name, stored),
                                          "table": settings.pg_table})
