"""Incremental ingestion: scan -> chunk -> L0 index -> embed what changed -> upsert/delete.

Content hashes decide what is embedded: a chunk whose id and hash are already in a store is
left alone, so re-ingesting an unchanged knowledge base embeds nothing. Every store (Milvus,
and pgvector when the sidecar is enabled) is diffed on its own, so a store that missed a run
catches up on the next one; vectors needed by several stores are embedded once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from rag_core.embedding import BadVectorError, Embedder, ModelIdentity, make_embedder
from rag_core.health import write_index_state
from rag_core.ingest.chunking import chunk_document
from rag_core.ingest.documents import scan_documents
from rag_core.l0 import L0Index
from rag_core.models import Chunk, DocumentIssue, KnowledgeDocument
from rag_core.settings import RagSettings
from rag_core.stores.base import VectorStore
from rag_core.stores.milvus import check_varchar_limits
from rag_core.text import lexical_string

log = logging.getLogger(__name__)


@dataclass
class StoreChanges:
    """Chunk counts of one store after an ingest run."""

    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0


@dataclass
class IngestReport:
    """What one ``ingest`` run did. ``stage_seconds`` maps stage name -> wall seconds."""

    knowledge_dir: str
    documents_seen: int = 0
    documents_ingested: int = 0
    skipped: list[DocumentIssue] = field(default_factory=list)
    warnings: list[DocumentIssue] = field(default_factory=list)
    chunks_total: int = 0
    chunks_embedded: int = 0
    stores: dict[str, StoreChanges] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    model_changed: dict[str, str] = field(default_factory=dict)

    @property
    def main(self) -> StoreChanges:
        return next(iter(self.stores.values()), StoreChanges())

    def to_dict(self) -> dict:
        d = asdict(self)
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


def chunk_documents(docs: Sequence[KnowledgeDocument], settings: RagSettings,
                    report: IngestReport, embedder: Embedder | None = None,
                    ) -> tuple[list[KnowledgeDocument], list[Chunk]]:
    """Chunk every document with the active model's tokenizer and window (``embedder``, else the
    one the settings name); a document whose chunking fails is skipped and reported."""
    embedder = embedder or make_embedder(settings)
    count, limit = embedder.count_tokens, chunk_token_limit(settings, embedder)
    kept, chunks = [], []
    for doc in docs:
        try:
            doc_chunks = chunk_document(doc, count, limit)
            for chunk in doc_chunks:
                check_varchar_limits(chunk, lexical_string(chunk.embed_text))
        except Exception as exc:  # one bad document never stops the batch
            report.skipped.append(DocumentIssue(doc.doc_id, f"cannot be chunked: {exc}"))
            continue
        kept.append(doc)
        chunks.extend(doc_chunks)
    return kept, chunks


class IngestRefusedError(RuntimeError):
    """An ingest would empty or mostly remove an index (wrong or unmounted knowledge dir?) and
    pruning was not asked for; nothing was written. The message names the directory and counts."""


def ingest(settings: RagSettings, embedder: Embedder, stores: Sequence[VectorStore],
           knowledge_dir: Path | None = None, rebuild: bool = False,
           progress: bool = True, prune: bool = False) -> IngestReport:
    """Bring ``stores`` and the L0 index in step with the Markdown files under ``knowledge_dir``.

    ``stores[0]`` is the main path. ``rebuild`` drops and recreates every store first.
    Raises FileNotFoundError / NotADirectoryError for a missing root, StoreError when a
    store is unreachable, and IngestRefusedError (before any write) when no document is found
    or more than ``settings.ingest_max_remove_share`` of a store's documents would go, unless
    ``prune``. Bad documents are reported in ``report.skipped`` and skipped.
    """
    root = Path(knowledge_dir or settings.knowledge_dir)
    report = IngestReport(knowledge_dir=str(root))
    with _stage(report, "scan"):
        docs, issues = scan_documents(root, max_bytes=settings.max_document_bytes)
    # Directory symlinks pointing outside the root are reported too, but are not documents.
    report.documents_seen = len(docs) + sum(i.path.lower().endswith((".md", ".markdown")) for i in issues)
    report.skipped.extend(issues)
    report.warnings = [w for doc in docs for w in doc.warnings]
    for warning in report.warnings:
        log.warning("%s", warning)
    with _stage(report, "chunk"):
        docs, chunks = chunk_documents(docs, settings, report, embedder)
    report.documents_ingested = len(docs)
    report.chunks_total = len(chunks)
    # Read once: the wipe check and each store's diff use the same scan.
    held = {store.name: store.chunk_hashes() for store in stores}
    if not prune:
        refuse_wipe(root, report, docs, held, settings.ingest_max_remove_share)
    with _stage(report, "l0_index"):
        L0Index.build(docs).save(settings.l0_index_path)

    # Documents that failed this run keep their old chunks: skipping must not delete knowledge.
    protected = {i.path for i in report.skipped}
    current = {c.chunk_id for c in chunks}
    vectors: dict[str, np.ndarray] = {}
    identity = embedder.identity()
    if rebuild or any(_model_differs(store, identity) for store in stores):
        # Something is about to be dropped or re-embedded: the model must work first, so a
        # model that cannot load (EmbedderLoadError, endpoint down) loses nothing of the index.
        embedder.embed_passages(["model check"], ["model check"])
    rejected_any: set[str] = set()
    for store in stores:
        with _stage(report, f"{store.name}_prepare"):
            recorded = prepare_store(store, identity, rebuild)
            dropped = rebuild or (recorded is not None and recorded.dimension != identity.dimension)
            stored = {} if dropped else held[store.name]
        if recorded is not None and recorded != identity:
            # Vectors of another model are not comparable with this one's: re-embed everything.
            log.warning("%s was built with %s; re-embedding every chunk with %s", store.name,
                        recorded.describe(), identity.describe())
            report.model_changed[store.name] = f"{recorded.describe()} -> {identity.describe()}"
            stored = {cid: (doc, "") for cid, (doc, _) in stored.items()}
        todo, changes = _diff(chunks, stored, protected)
        _embed_missing(todo, vectors, embedder, settings.embedding_batch_size, report, progress)
        rejected = {c.chunk_id for c in todo if c.chunk_id not in vectors}
        rejected_any |= rejected
        todo = [c for c in todo if c.chunk_id not in rejected]
        with _stage(report, f"{store.name}_write"):
            _upsert_in_batches(store, todo, vectors)
            store.record_model(identity)
            stale = [cid for cid, (doc_id, _) in stored.items()
                     if (cid not in current and doc_id not in protected)
                     # a rejected chunk keeps its old vector, unless that came from another model
                     or (cid in rejected and store.name in report.model_changed)]
            store.delete_chunks(stale)
            # Sealed rows are searched by the engine's index, not rebuilt per search (issue 14:
            # 100.7 ms unflushed vs 14.2 ms flushed at 454 chunks on Milvus Lite 3).
            store.flush()
        changes.removed = len(stale)
        report.stores[store.name] = changes
    report.chunks_embedded = len(vectors)
    # What `rag doctor` / warm_up verify the stores against (rag_core.health).
    write_index_state(settings, stores, chunks, identity, frozenset(rejected_any))
    log.info("ingested %s: %s", root, report.stores)
    return report


def refuse_wipe(root: Path, report: IngestReport, docs: Sequence[KnowledgeDocument],
                held: dict[str, dict[str, tuple[str, str]]], max_share: float) -> None:
    """IngestRefusedError when ``root`` yields no document, or when a store would lose more than
    ``max_share`` of the documents it holds (``held``: store name -> its ``chunk_hashes()``;
    documents that failed to load are kept, not lost)."""
    if report.documents_seen == 0:
        raise IngestRefusedError(f"no Markdown document found under {root}: refusing to touch the index "
                                 "(wrong or unmounted directory?); pass --prune to empty it on purpose")
    keep = {d.doc_id for d in docs} | {i.path for i in report.skipped}
    for name, hashes in held.items():
        doc_ids = {doc_id for doc_id, _ in hashes.values()}
        gone = doc_ids - keep
        if doc_ids and len(gone) / len(doc_ids) > max_share:
            raise IngestRefusedError(
                f"{root} has {len(docs)} document(s) but {name} holds {len(doc_ids)}: this ingest would "
                f"remove {len(gone)} ({len(gone) / len(doc_ids):.0%}, over RAG_INGEST_MAX_REMOVE_SHARE="
                f"{max_share:.0%}); pass --prune if that is intended")


def _model_differs(store: VectorStore, identity: ModelIdentity) -> bool:
    recorded = store.recorded_model()
    return recorded is not None and recorded != identity


def prepare_store(store: VectorStore, identity: ModelIdentity, rebuild: bool) -> ModelIdentity | None:
    """Create/open ``store`` for ``identity``'s vectors; returns the model it was built with (None
    when new or unrecorded). A store of another dimension is dropped and recreated: its vectors
    cannot be searched with this model anyway, and the caller re-embeds everything."""
    if rebuild:
        store.drop()
    recorded = store.recorded_model()
    if recorded is not None and recorded.dimension != identity.dimension:
        log.warning("%s holds %s-d vectors of %s; recreating it for %s", store.name, recorded.dimension,
                    recorded.describe(), identity.describe())
        store.drop()
    store.ensure_schema(identity.dimension)
    return recorded


def _diff(chunks: list[Chunk], stored: dict[str, tuple[str, str]],
          protected: set[str]) -> tuple[list[Chunk], StoreChanges]:
    changes, todo = StoreChanges(), []
    for chunk in chunks:
        old = stored.get(chunk.chunk_id)
        if old is None:
            changes.added += 1
            todo.append(chunk)
        elif old[1] != chunk.content_hash:
            changes.updated += 1
            todo.append(chunk)
        else:
            changes.unchanged += 1
    return todo, changes


def _embed_missing(todo: list[Chunk], vectors: dict[str, np.ndarray], embedder: Embedder,
                   batch_size: int, report: IngestReport, progress: bool) -> None:
    # Length-sorted steps pad least: sentence-transformers sorts only within one encode call.
    missing = sorted((c for c in todo if c.chunk_id not in vectors), key=lambda c: len(c.embed_text))
    if not missing:
        return
    with _stage(report, "embed"), tqdm(total=len(missing), desc="embedding chunks", unit="chunk",
                                       disable=not progress) as bar:
        step = max(batch_size, 256)
        for i in range(0, len(missing), step):
            batch = missing[i:i + step]
            try:
                out = embedder.embed_passages([c.embed_text for c in batch], _labels(batch))
                vectors.update(zip((c.chunk_id for c in batch), out, strict=True))
            except BadVectorError:
                _embed_one_by_one(batch, vectors, embedder, report)
            bar.update(len(batch))


def _labels(chunks: Sequence[Chunk]) -> list[str]:
    return [f"chunk {c.chunk_id} ({c.breadcrumb}) of document {c.doc_id}" for c in chunks]


def _embed_one_by_one(batch: Sequence[Chunk], vectors: dict[str, np.ndarray], embedder: Embedder,
                      report: IngestReport) -> None:
    """A batch held a NaN/inf/zero vector: embed it chunk by chunk, skip and report the bad ones."""
    for chunk in batch:
        try:
            vectors[chunk.chunk_id] = embedder.embed_passages([chunk.embed_text], _labels([chunk]))[0]
        except BadVectorError as exc:
            log.warning("%s", exc)
            report.skipped.append(DocumentIssue(chunk.doc_id, str(exc)))


def _upsert_in_batches(store: VectorStore, todo: list[Chunk], vectors: dict[str, np.ndarray],
                       batch: int = 512) -> None:
    for i in range(0, len(todo), batch):
        part = todo[i:i + batch]
        store.upsert(part, np.stack([vectors[c.chunk_id] for c in part]))
