"""Index group: the ingest plan, the L0 hint index, the chunk embeddings and the two stores.

The lineage is the data flow (rag_core's ingest stages, one asset each)::

    knowledge_documents -> chunks (Parquet) -> ingest_plan -> l0_index
                                                         -> chunk_embeddings -> milvus_collection
                                                                            -> pgvector_table

One refresh scans the documents once, chunks once, embeds what changed once (through the
embedding cache) and writes each store once. ``rag ingest`` runs the same functions
(``rag_core.ingest.pipeline.ingest``). The store assets are in the ``rag_milvus`` /
``rag_pgvector`` concurrency pools (one writer per store across runs; see dagster.local.yaml).
The sidecar never fails the run: when PostgreSQL is unreachable ``pgvector_table`` records
``status: unavailable`` and the reason.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import psycopg

from rag_assets.defs.ingest import ChunkTable, read_chunks
from rag_assets.defs.resources import (
    LOCK_TIMEOUT_S,
    EmbedderResource,
    MilvusStoreResource,
    PgVectorStoreResource,
    RagSettingsResource,
)
from rag_assets.metadata import issues_table, md_table
from rag_core.ingest.embed import ChunkEmbeddings
from rag_core.ingest.plan import DocumentScan, IngestPlan, StoreChanges
from rag_core.settings import RagSettings, redact_dsn
from rag_core.stores.base import StoreError

# What an unreachable or misconfigured PostgreSQL raises on the way to the sidecar.
SIDECAR_UNAVAILABLE = (StoreError, psycopg.Error, OSError)
#: Main-store steps run first, back to back: results exist even if the sidecar is slow, and an
#: in-process Milvus Lite connection left idle for ~30 s is dropped by its gRPC server.
MAIN_STORE_FIRST = {"dagster/priority": "10"}
#: Concurrency pools of the store writers (limits: ``concurrency.pools`` in dagster.local.yaml).
MILVUS_POOL = "rag_milvus"
PGVECTOR_POOL = "rag_pgvector"


def _sidecar_reason(exc: BaseException) -> str:
    from rag_core.secrets import scrub_secrets

    return scrub_secrets(f"{type(exc).__name__}: {exc}")[:500]


@dg.asset(group_name="index", kinds={"python"}, op_tags=MAIN_STORE_FIRST)
def ingest_plan(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    embedder: EmbedderResource,
    milvus: MilvusStoreResource,
    pgvector: PgVectorStoreResource,
    knowledge_documents: DocumentScan,
    chunks: ChunkTable,
) -> dg.Output[IngestPlan]:
    """What this refresh will change in each store (``IngestPlan``), decided before any write.

    Reads the chunks back from ``chunks.parquet`` and each store's chunk content hashes once,
    and diffs them: added, changed and removed chunks per store. Fails (dg.Failure, nothing
    written) when the wipe guard refuses: no document found, or more than
    RAG_INGEST_MAX_REMOVE_SHARE of a store's documents would go. An unreachable sidecar is
    recorded in the plan (``unavailable``), not an error.
    """
    from rag_core.ingest.index_state import pending_applies
    from rag_core.ingest.plan import ChunkedDocuments, IngestRefusedError, plan_ingest, read_store_state

    settings = rag.get_settings()
    keep = set(chunks.doc_ids)
    chunked = ChunkedDocuments(
        tuple(d for d in knowledge_documents.documents if d.doc_id in keep), tuple(read_chunks(chunks)), chunks.issues
    )
    unavailable: dict[str, str] = {}
    with _index_lock(context, settings, "ingest_plan"):
        with milvus.open(context.log) as store:
            states = [read_store_state(store)]
        if settings.sidecar_enabled:
            try:
                with pgvector.open(context.log) as store:
                    states.append(read_store_state(store))
            except SIDECAR_UNAVAILABLE as exc:
                unavailable["pgvector"] = _sidecar_reason(exc)
                context.log.warning("pgvector sidecar unavailable: %s", unavailable["pgvector"])
        rewrite = set(pending_applies(settings))
    for name in sorted(rewrite & {s.name for s in states}):
        context.log.warning("%s was left part-written by a faulted ingest: planned whole", name)
    try:
        plan = plan_ingest(
            knowledge_documents,
            chunked,
            states,
            embedder.get().identity(),
            max_remove_share=settings.ingest_max_remove_share,
            unavailable=unavailable,
            rewrite=rewrite,
        )
    except IngestRefusedError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    rows = [
        [
            name,
            p.changes.added,
            p.changes.updated,
            p.changes.removed,
            p.changes.unchanged,
            "yes" if p.model_changed else "",
        ]
        for name, p in plan.stores.items()
    ]
    rows += [[name, "", "", "", "", f"unavailable: {reason}"] for name, reason in unavailable.items()]
    return dg.Output(
        plan,
        metadata={
            "chunks": len(plan.chunks),
            "to_embed": len(plan.to_embed()),
            "documents": len(plan.documents),
            "skipped_documents": issues_table(list(plan.skipped)),
            "stores": dg.MetadataValue.md(
                md_table(["store", "added", "updated", "removed", "unchanged", "model changed / status"], rows)
            ),
            "model": plan.identity.describe(),
        },
    )


@dg.asset(group_name="index", kinds={"json"})
def l0_index(
    context: dg.AssetExecutionContext, rag: RagSettingsResource, ingest_plan: IngestPlan
) -> dg.MaterializeResult:
    """The L0 keyword/frontmatter hint index of the plan's documents, saved as JSON in the data
    dir (``l0_index.json``). Written after the wipe guard passed, once per refresh."""
    from rag_core.ingest.pipeline import save_l0_index

    settings = rag.get_settings()
    with _index_lock(context, settings, "l0_index"):
        index = save_l0_index(ingest_plan, settings.l0_index_path)
    domains = sorted(index.domains)
    return dg.MaterializeResult(
        metadata={
            "entries": len(index),
            "keywords": len(index.keywords),
            "domains": len(domains),
            "domain_names": dg.MetadataValue.md(md_table(["domain"], [[d] for d in domains])),
            "path": dg.MetadataValue.path(str(settings.l0_index_path.resolve())),
        }
    )


@dg.op(out=dg.DynamicOut(int), tags=MAIN_STORE_FIRST)
def embedding_shards(context: dg.OpExecutionContext, rag: RagSettingsResource, ingest_plan: IngestPlan):
    """One dynamic output per shard of the plan's chunks to embed (``rag.embed_shards``; at
    least one, so the merge always runs): the multiprocess executor embeds them in parallel."""
    shards = max(1, min(rag.embed_shards, len(ingest_plan.to_embed())))
    context.log.info("embedding %d chunk(s) in %d shard(s)", len(ingest_plan.to_embed()), shards)
    for shard in range(shards):
        yield dg.DynamicOutput(shard, mapping_key=f"shard_{shard}_of_{shards}")


def _shard_count(context: dg.OpExecutionContext) -> int:
    # the mapping key says "shard_<i>_of_<n>": every shard step knows n without another input
    return int(context.get_mapping_key().rsplit("_", 1)[1])


@dg.op(tags=MAIN_STORE_FIRST)
def embed_shard(
    context: dg.OpExecutionContext,
    rag: RagSettingsResource,
    embedder: EmbedderResource,
    ingest_plan: IngestPlan,
    shard: int,
) -> ChunkEmbeddings:
    """The vectors of one shard of the plan (``rag_core.ingest.shards.shard_plan``), embedded
    into the shared embedding cache (SQLite; safe across the step processes)."""
    from rag_core.ingest.embed import embed_plan
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.shards import shard_plan

    settings = rag.get_settings()
    part = shard_plan(ingest_plan, shard, _shard_count(context))
    return embed_plan(
        part, embedder.get(), EmbeddingCache.under(settings.data_dir), batch_size=settings.embedding_batch_size
    )


@dg.op(tags=MAIN_STORE_FIRST)
def merge_embedding_shards(
    context: dg.OpExecutionContext,
    rag: RagSettingsResource,
    embedder: EmbedderResource,
    ingest_plan: IngestPlan,
    parts: list[ChunkEmbeddings],
) -> dg.Output[ChunkEmbeddings]:
    """The shards' embeddings as one (``merge_embeddings``), the document titles embedded once,
    and the metadata of the whole embed stage."""
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.shards import merge_embeddings
    from rag_core.ingest.title_vectors import embed_titles

    settings = rag.get_settings()
    embeddings = merge_embeddings(parts)
    titles_embedded = embed_titles(ingest_plan, embedder.get(), EmbeddingCache.under(settings.data_dir))
    for issue in embeddings.skipped:
        context.log.warning("skipped: %s", issue)
    return dg.Output(
        embeddings,
        metadata={
            "needed": len(ingest_plan.to_embed()),
            "passages_embedded": embeddings.embedded,
            "cache_hits": embeddings.cache_hits,
            "titles_embedded": titles_embedded,
            "shards": len(parts),
            "skipped_documents": dg.MetadataValue.md(
                md_table(
                    ["document", "heading", "reason"], [[i.path, i.heading or "", i.reason] for i in embeddings.skipped]
                )
            ),
            "skipped_count": len(embeddings.skipped),
            "cache": dg.MetadataValue.path(str(embeddings.cache.path)),
        },
    )


@dg.graph_asset(group_name="index", kinds={"sqlite"})
def chunk_embeddings(ingest_plan: IngestPlan) -> ChunkEmbeddings:
    """One vector per chunk some store needs, embedded once for every store and kept in
    ``<data_dir>/embedding_cache.sqlite3`` (by model and content hash: unchanged chunks and
    other stores reuse them), and the document titles the rerank compares with (so a fresh lookup
    process reads them). A chunk whose vector is NaN/infinite/not unit length takes its
    document out of this refresh (listed with path, heading and reason); the rest go on.

    The chunks are split into ``RAG_EMBED_SHARDS`` shards by content hash (``embedding_shards``
    -> ``embed_shard`` per shard -> ``merge_embedding_shards``): on the multiprocess executor
    (or a Kubernetes/Celery one) the shards embed in parallel, and the stores are still applied
    once, from the merged result. The vectors are those of one process (same model, same cache).
    """
    parts = embedding_shards(ingest_plan).map(lambda shard: embed_shard(ingest_plan, shard))
    return merge_embedding_shards(ingest_plan, parts.collect())


def store_metadata(changes: StoreChanges, embeddings: ChunkEmbeddings, stored: int) -> dict[str, Any]:
    """Metadata of one store's apply: chunk changes, rows, documents skipped for bad vectors."""
    return {
        "status": "available",
        "added": changes.added,
        "updated": changes.updated,
        "removed": changes.removed,
        "unchanged": changes.unchanged,
        "skipped_documents": len(embeddings.skipped),
        "dagster/row_count": stored,
    }


@contextmanager
def _index_lock(context: Any, settings: RagSettings, step: str) -> Iterator[str]:
    """The index lock of the data dir (``rag_core.ingest.index_lock``), as ``rag ingest`` holds
    it; yields this step's writer description. Steps of one run wait for each other (at least
    ``LOCK_TIMEOUT_S``); a writer holding it past that fails the step, naming the holder."""
    from rag_core.ingest.index_lock import IndexBusyError, index_lock

    command = f"dagster run {context.run_id} step {step}"
    try:
        with index_lock(settings, command, wait_s=max(settings.ingest_lock_wait, LOCK_TIMEOUT_S)):
            yield command
    except IndexBusyError as exc:
        raise dg.Failure(description=str(exc)) from None


def _apply(
    command: str, settings: RagSettings, store: Any, plan: IngestPlan, embeddings: ChunkEmbeddings
) -> tuple[StoreChanges, int]:
    """Apply ``plan`` to ``store`` and record its index state, as ``rag ingest`` does. Called
    under the index lock (the stale-plan check and the writes see no other writer); the apply
    is recorded as pending until the state is written (a fault leaves it listed: the next plan
    rewrites the store whole)."""
    from rag_core.ingest.apply import StalePlanError, apply_plan
    from rag_core.ingest.index_state import mark_apply_done, mark_apply_started
    from rag_core.ingest.pipeline import record_index_state

    mark_apply_started(settings, store.name, command)
    try:
        changes = apply_plan(store, plan, embeddings)
    except StalePlanError as exc:
        mark_apply_done(settings, [store.name])  # refused before any write
        raise dg.Failure(description=str(exc)) from None
    record_index_state(settings, [store], plan, embeddings)
    mark_apply_done(settings, [store.name])
    return changes, store.count()


@dg.asset(group_name="index", deps=["l0_index"], kinds={"milvus"}, op_tags=MAIN_STORE_FIRST, pool=MILVUS_POOL)
def milvus_collection(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    milvus: MilvusStoreResource,
    ingest_plan: IngestPlan,
    chunk_embeddings: ChunkEmbeddings,
) -> dg.MaterializeResult:
    """The main-store Milvus collection with the plan applied (upserts, deletes, model record).

    ``l0_index`` is upstream so the main store is served with the L0 index of the same plan.
    Fails with StoreError when Milvus cannot be opened (the main store must not be skipped),
    and with a stale-plan failure when another writer changed the collection since planning.
    """
    settings = rag.get_settings()
    # The index lock before the store lock, in every asset (ingest_plan too): no lock-order deadlock.
    with _index_lock(context, settings, "milvus_collection") as command, milvus.open(context.log) as store:
        changes, stored = _apply(command, settings, store, ingest_plan, chunk_embeddings)
    return dg.MaterializeResult(
        metadata={
            **store_metadata(changes, chunk_embeddings, stored),
            "collection": settings.collection,
            "target": redact_dsn(settings.milvus_target),
        }
    )


@dg.asset(group_name="index", kinds={"postgres"}, pool=PGVECTOR_POOL)
def pgvector_table(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    pgvector: PgVectorStoreResource,
    ingest_plan: IngestPlan,
    chunk_embeddings: ChunkEmbeddings,
) -> dg.MaterializeResult:
    """The sidecar pgvector table with the plan applied, like the Milvus collection.

    When the sidecar is disabled or PostgreSQL is unreachable (at planning or now) the asset
    still materializes, with ``status`` (``disabled`` / ``unavailable``) and ``reason``.
    """
    settings = rag.get_settings()
    if not settings.sidecar_enabled:
        return dg.MaterializeResult(
            metadata={"status": "disabled", "reason": "sidecar disabled (RAG_SIDECAR_ENABLED=false)"}
        )
    if "pgvector" not in ingest_plan.stores:
        reason = ingest_plan.unavailable.get("pgvector", "not read when the ingest was planned")
        context.log.warning("pgvector sidecar unavailable: %s", reason)
        return dg.MaterializeResult(metadata={"status": "unavailable", "reason": reason})
    try:
        with _index_lock(context, settings, "pgvector_table") as command, pgvector.open(context.log) as store:
            changes, stored = _apply(command, settings, store, ingest_plan, chunk_embeddings)
    except SIDECAR_UNAVAILABLE as exc:
        reason = _sidecar_reason(exc)
        context.log.warning("pgvector sidecar unavailable: %s", reason)
        return dg.MaterializeResult(metadata={"status": "unavailable", "reason": reason})
    return dg.MaterializeResult(
        metadata={**store_metadata(changes, chunk_embeddings, stored), "table": settings.pg_table}
    )
