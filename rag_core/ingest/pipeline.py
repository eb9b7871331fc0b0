"""Incremental ingestion, composed of its stages: scan -> chunk -> plan -> L0 index -> embed
once -> apply per store. ``rag ingest`` runs ``ingest``; the Dagster assets run the same stage
functions one asset each (``rag_assets/defs/ingest.py``, ``index.py``).

Content hashes decide what is embedded: a chunk whose id and hash are already in a store is
left alone, so re-ingesting an unchanged knowledge base embeds nothing. Every store (Milvus,
and pgvector when the sidecar is enabled) is diffed on its own, so a store that missed a run
catches up on the next one; a vector needed by several stores is embedded once, and kept in the
embedding cache (model + content hash) for later runs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag_core.components import chunk_checks
from rag_core.embedding import Embedder, make_embedder
from rag_core.ingest.apply import StalePlanError, apply_plan
from rag_core.ingest.embed import ChunkEmbeddings, embed_plan
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.index_state import write_index_state
from rag_core.ingest.plan import (
    IngestPlan,
    IngestRefusedError,
    StoreChanges,
    chunk_scan,
    is_failure,
    plan_ingest,
    read_store_state,
    refuse_wipe,
    scan_knowledge,
)
from rag_core.ingest.title_vectors import embed_titles
from rag_core.l0 import L0Index
from rag_core.models import Chunk, DocumentIssue, KnowledgeDocument
from rag_core.settings import RagSettings
from rag_core.stores.base import VectorStore

__all__ = [
    "IngestRefusedError",
    "IngestReport",
    "StalePlanError",
    "StoreChanges",
    "chunk_documents",
    "chunk_token_limit",
    "ingest",
    "refuse_wipe",
    "save_l0_index",
]

log = logging.getLogger(__name__)


@dataclass
class IngestReport:
    """What one ``ingest`` run did. ``stage_seconds`` maps stage name -> wall seconds.

    ``chunks_embedded``: chunks that needed a vector this run (added, changed, or every chunk of
    a store built with another model), counted once across stores; ``passages_embedded`` of them
    went to the model, ``embedding_cache_hits`` came from the embedding cache.
    """

    knowledge_dir: str
    documents_seen: int = 0
    documents_ingested: int = 0
    skipped: list[DocumentIssue] = field(default_factory=list)
    warnings: list[DocumentIssue] = field(default_factory=list)
    chunks_total: int = 0
    chunks_embedded: int = 0
    passages_embedded: int = 0
    embedding_cache_hits: int = 0
    stores: dict[str, StoreChanges] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    model_changed: dict[str, str] = field(default_factory=dict)

    @property
    def main(self) -> StoreChanges:
        return next(iter(self.stores.values()), StoreChanges())

    @property
    def partial(self) -> bool:
        """True when a document that should have been ingested was skipped (load, chunking or
        embedding failure); section pages and empty files skipped on purpose do not count."""
        return any(is_failure(i) for i in self.skipped)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["partial"] = self.partial
        d["skipped"] = [asdict(s) for s in self.skipped]
        d["warnings"] = [asdict(w) for w in self.warnings]
        return d


@contextmanager
def _stage(report: IngestReport, name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        report.stage_seconds[name] = round(report.stage_seconds.get(name, 0.0) + time.perf_counter() - t0, 4)


def chunk_token_limit(settings: RagSettings, embedder: Embedder) -> int:
    """Tokens per chunk: the profile's/setting's ``chunk_max_tokens``, capped by the model window."""
    return min(settings.chunk_max_tokens, embedder.max_tokens)


def chunk_documents(
    docs: Sequence[KnowledgeDocument],
    settings: RagSettings,
    report: IngestReport,
    embedder: Embedder | None = None,
) -> tuple[list[KnowledgeDocument], list[Chunk]]:
    """Chunk every document with the active model's tokenizer and window (``embedder``, else the
    one the settings name); a document whose chunking fails is added to ``report.skipped``."""
    embedder = embedder or make_embedder(settings)
    chunked = chunk_scan(docs, embedder.count_tokens, chunk_token_limit(settings, embedder), chunk_checks(settings))
    report.skipped.extend(chunked.issues)
    return list(chunked.documents), list(chunked.chunks)


def save_l0_index(plan: IngestPlan, path: Path) -> L0Index:
    """Build the L0 hint index from the plan's documents (and their chunk counts) and save it
    (atomic replace) at ``path``."""
    index = L0Index.build(plan.documents, Counter(c.doc_id for c in plan.chunks))
    index.save(path)
    return index


def ingest(
    settings: RagSettings,
    embedder: Embedder,
    stores: Sequence[VectorStore],
    knowledge_dir: Path | None = None,
    rebuild: bool = False,
    progress: bool = True,
    prune: bool = False,
) -> IngestReport:
    """Bring ``stores`` and the L0 index in step with the Markdown files under ``knowledge_dir``.

    ``stores[0]`` is the main store. ``rebuild`` drops and recreates every store first.
    Raises FileNotFoundError / NotADirectoryError for a missing root, StoreError when a
    store is unreachable, IngestRefusedError (before any write) when no document is found
    or more than ``settings.ingest_max_remove_share`` of a store's documents would go, unless
    ``prune``, and StalePlanError when another writer changed a store mid-run. Bad documents
    (unloadable, unchunkable, or with a bad embedding vector) are reported in
    ``report.skipped`` and skipped; ``report.partial`` says whether any was.
    """
    root = Path(knowledge_dir or settings.knowledge_dir)
    report = IngestReport(knowledge_dir=str(root))
    with _stage(report, "scan"):
        scan = scan_knowledge(root, settings.max_document_bytes)
    for warning in scan.warnings:
        log.warning("%s", warning)
    with _stage(report, "chunk"):
        checks = [store.check_chunk for store in stores]
        chunked = chunk_scan(scan.documents, embedder.count_tokens, chunk_token_limit(settings, embedder), checks)
    with _stage(report, "plan"):
        # Read once per store: the wipe check and the diff share it.
        states = [read_store_state(store) for store in stores]
        plan = plan_ingest(
            scan,
            chunked,
            states,
            embedder.identity(),
            rebuild=rebuild,
            prune=prune,
            max_remove_share=settings.ingest_max_remove_share,
        )
    with _stage(report, "l0_index"):
        save_l0_index(plan, settings.l0_index_path)
    with _stage(report, "embed"):
        embeddings = embed_plan(
            plan,
            embedder,
            EmbeddingCache.under(settings.data_dir),
            batch_size=settings.embedding_batch_size,
            progress=progress,
        )
    with _stage(report, "title_vectors"):
        embed_titles(plan, embedder, EmbeddingCache.under(settings.data_dir))
    changes: dict[str, StoreChanges] = {}
    for store in stores:
        with _stage(report, f"{store.name}_write"):
            changes[store.name] = apply_plan(store, plan, embeddings)
    fill_report(report, plan, embeddings, changes)
    record_index_state(settings, stores, plan, embeddings)
    log.info("ingested %s: %s", root, report.stores)
    return report


def record_index_state(
    settings: RagSettings, stores: Sequence[VectorStore], plan: IngestPlan, embeddings: ChunkEmbeddings
) -> None:
    """Write what ``rag doctor`` / ``warm_up`` verify ``stores`` against (``rag_core.health``)
    once ``plan`` is applied to them; the chunks of skipped documents were not written."""
    rejected = frozenset(c.chunk_id for c in plan.chunks if c.doc_id in embeddings.skipped_documents)
    write_index_state(settings, stores, plan.chunks, plan.identity, rejected)


def fill_report(
    report: IngestReport, plan: IngestPlan, embeddings: ChunkEmbeddings, changes: dict[str, StoreChanges]
) -> IngestReport:
    """Complete ``report`` (stage times already in it) from the stages' values."""
    skipped_docs = embeddings.skipped_documents
    report.documents_seen = plan.documents_seen
    report.documents_ingested = sum(1 for d in plan.documents if d.doc_id not in skipped_docs)
    report.skipped = [*plan.skipped, *embeddings.skipped]
    report.warnings = list(plan.warnings)
    report.chunks_total = sum(1 for c in plan.chunks if c.doc_id not in skipped_docs)
    report.chunks_embedded = len(plan.to_embed())
    report.passages_embedded = embeddings.embedded
    report.embedding_cache_hits = embeddings.cache_hits
    report.stores = changes
    for name, store_plan in plan.stores.items():
        recorded = store_plan.recorded
        if store_plan.model_changed and recorded is not None:
            log.warning(
                "%s was built with %s; re-embedding every chunk with %s",
                name,
                recorded.describe(),
                plan.identity.describe(),
            )
            report.model_changed[name] = f"{recorded.describe()} -> {plan.identity.describe()}"
    return report
