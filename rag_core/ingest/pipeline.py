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

import hashlib
import heapq
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tqdm.auto import tqdm

from rag_core import text
from rag_core.components import chunk_checks
from rag_core.embedding import Embedder, make_embedder
from rag_core.fileio import temp_beside
from rag_core.ingest.apply import StalePlanError, StoreWriter
from rag_core.ingest.documents import list_doc_ids, load_documents
from rag_core.ingest.embed import ChunkEmbeddings, embed_plan
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.index_lock import index_lock, writer_command
from rag_core.ingest.index_state import (
    SAMPLE_SIZE,
    describe_pending,
    mark_apply_done,
    mark_apply_started,
    pending_applies,
    write_index_state,
)
from rag_core.ingest.plan import (
    IngestPlan,
    IngestRefusedError,
    StoreChanges,
    StoreState,
    chunk_scan,
    is_failure,
    plan_store,
    read_store_state,
    refuse_wipe,
    refuse_wipe_listed,
)
from rag_core.ingest.title_vectors import embed_titles
from rag_core.l0 import L0Index
from rag_core.models import Chunk, DocumentIssue, KnowledgeDocument
from rag_core.settings import RagSettings
from rag_core.stores.base import VectorStore

__all__ = [
    "IngestInterrupted",
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
    rewritten: dict[str, str] = field(default_factory=dict)

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
    text.keep_dictionary_in(settings.model_cache_dir)
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


class IngestInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGINT) stopped an ingest between writes. The message says how far it got; the
    batches written are in the stores and every vector embedded is in the embedding cache, so
    the next run resumes without embedding them again. A store being rebuilt keeps its old index."""


def ingest(
    settings: RagSettings,
    embedder: Embedder,
    stores: Sequence[VectorStore],
    knowledge_dir: Path | None = None,
    rebuild: bool = False,
    progress: bool = True,
    prune: bool = False,
    batch_docs: int | None = None,
    command: str | None = None,
) -> IngestReport:
    """Bring ``stores`` and the L0 index in step with the Markdown files under ``knowledge_dir``.

    One writer per index: the whole run holds ``index_lock`` on the data dir (``command``
    describes this run to a refused second writer; IndexBusyError when another holds it past
    ``settings.ingest_lock_wait``). A store a faulted earlier run left part-written (listed in
    ``apply_pending.json``) is rewritten whole, like a rebuild, so the run converges to what a
    clean build gives (``report.rewritten`` says which and why); a fault after this run wrote
    into a served index leaves that store listed there with this process's pid
    (``index_state.part_written``).

    Streams: the tree is listed once, then documents are loaded, chunked, planned, embedded and
    written ``batch_docs`` (default ``settings.ingest_batch_docs``) at a time, so memory is
    bounded by the batch, not the corpus (only chunk ids and hashes of the stores are held
    whole). Each batch's vectors are in the embedding cache before its store write. Documents
    gone from the tree are deleted, the L0 index and the index state written, after the last
    batch. ``progress`` shows chunks done/total (estimated from the batches so far), chunks/s
    and the ETA on stderr.

    ``stores[0]`` is the main store. ``rebuild`` recreates every store (the old one stays served
    until the new one is whole). Raises FileNotFoundError / NotADirectoryError for a missing
    root, StoreError when a store is unreachable, IngestRefusedError (before any write) when no
    document is found or more than ``settings.ingest_max_remove_share`` of a store's documents
    would go, unless ``prune``, StalePlanError when another writer changed a store mid-run,
    OSError (e.g. ENOSPC) when a write fails, IngestInterrupted on Ctrl-C. Bad documents
    (unloadable, unchunkable, or with a bad embedding vector) are reported in ``report.skipped``
    and skipped; ``report.partial`` says whether any was.
    """
    text.keep_dictionary_in(settings.model_cache_dir)
    command = writer_command(command)
    with index_lock(settings, command):
        return _ingest_locked(settings, embedder, stores, knowledge_dir, rebuild, progress, prune, batch_docs, command)


def _ingest_locked(
    settings: RagSettings,
    embedder: Embedder,
    stores: Sequence[VectorStore],
    knowledge_dir: Path | None,
    rebuild: bool,
    progress: bool,
    prune: bool,
    batch_docs: int | None,
    command: str,
) -> IngestReport:
    root = Path(knowledge_dir or settings.knowledge_dir)
    report = IngestReport(knowledge_dir=str(root))
    with _stage(report, "scan"):
        doc_ids, listing_issues = list_doc_ids(root)  # root / doc_id is the file
    report.documents_seen = len(doc_ids)
    report.skipped.extend(listing_issues)
    with _stage(report, "plan"):
        states = [read_store_state(store) for store in stores]
        if not prune:
            refuse_wipe_listed(root, doc_ids, {s.name: s.held for s in states}, settings.ingest_max_remove_share)
    pending = pending_applies(settings)
    rewrite = frozenset(s.name for s in stores if s.name in pending)
    for name in sorted(rewrite):
        report.rewritten[name] = f"left part-written by {describe_pending(pending[name])}: rewritten whole"
        log.warning("%s was %s from the embedding cache", name, report.rewritten[name])
    run = _Run(settings, embedder, stores, states, root, rebuild, report, rewrite)
    step = batch_docs or settings.ingest_batch_docs

    def before_write(store: str) -> None:
        mark_apply_started(settings, store, command)

    try:
        with ExitStack() as stack:
            # Entered first, left last: the L0 index replaces the old one only after every store did.
            l0 = stack.enter_context(_L0Writer(settings.l0_index_path))
            writers = [
                stack.enter_context(StoreWriter(st, s, run.identity, rebuild, before_write, st.name in rewrite))
                for st, s in zip(stores, states, strict=True)
            ]
            bar = stack.enter_context(_Progress(len(doc_ids), progress))
            for i in range(0, len(doc_ids), step):
                run.batch(doc_ids[i : i + step], writers, bar, l0)
            with _stage(report, "finish"):
                # Each batch took its documents out of by_doc: what is left is no longer in the tree.
                for writer, by_doc in zip(writers, run.by_doc, strict=True):
                    writer.finish([cid for held in by_doc.values() for cid in held])
    except KeyboardInterrupt:
        raise IngestInterrupted(
            f"ingest interrupted after {run.documents_done} of {len(doc_ids)} documents "
            f"({run.chunks_written} chunks written, {run.chunks_cached} embedded and cached): "
            "run it again to resume (cached chunks are not embedded again)"
        ) from None
    for writer, store in zip(writers, stores, strict=True):
        report.stores[store.name] = writer.changes
        if writer.fresh and not writer.drop and writer.recorded is not None and writer.recorded != run.identity:
            log.warning(
                "%s was built with %s; re-embedding every chunk with %s",
                store.name,
                writer.recorded.describe(),
                run.identity.describe(),
            )
            report.model_changed[store.name] = f"{writer.recorded.describe()} -> {run.identity.describe()}"
    failed = {i.path for i in report.skipped if is_failure(i)}
    write_index_state(settings, stores, run.sample.chunks(), run.identity, skipped=failed)
    mark_apply_done(settings, [s.name for s in stores])
    for warning in report.warnings:
        log.warning("%s", warning)
    log.info("ingested %s: %s", root, report.stores)
    return report


class _Run:
    """The state of one streaming ingest: per-store held chunks by document, counters, sample."""

    def __init__(
        self,
        settings: RagSettings,
        embedder: Embedder,
        stores: Sequence[VectorStore],
        states: Sequence[StoreState],
        root: Path,
        rebuild: bool,
        report: IngestReport,
        rewrite: frozenset[str] = frozenset(),
    ) -> None:
        self.settings, self.embedder, self.stores, self.root = settings, embedder, stores, root
        self.rebuild, self.report, self.rewrite = rebuild, report, rewrite
        self.identity = embedder.identity()
        self.cache = EmbeddingCache.under(settings.data_dir)
        self.max_tokens = chunk_token_limit(settings, embedder)
        self.checks = [store.check_chunk for store in stores]
        self.names = [s.name for s in states]
        self.recorded = [s.recorded for s in states]
        # {doc_id: {chunk_id: (doc_id, hash)}} per store: a batch diffs only its own documents.
        self.by_doc: list[dict[str, dict[str, tuple[str, str]]]] = []
        for state in states:
            by_doc: dict[str, dict[str, tuple[str, str]]] = {}
            for cid, held in state.held.items():
                by_doc.setdefault(held[0], {})[cid] = held
            self.by_doc.append(by_doc)
        self.sample = _Sample(SAMPLE_SIZE)
        self.documents_done = self.chunks_written = self.chunks_cached = 0

    def batch(self, doc_ids: Sequence[str], writers: Sequence[StoreWriter], bar: _Progress, l0: _L0Writer) -> None:
        """Load, chunk, plan, embed and write one batch of files (``doc_ids`` under the root)."""
        report = self.report
        paths = [self.root / d for d in doc_ids]
        with _stage(report, "scan"):
            docs, issues = load_documents(paths, self.root, max_bytes=self.settings.max_document_bytes)
        with _stage(report, "chunk"):
            chunked = chunk_scan(docs, self.embedder.count_tokens, self.max_tokens, self.checks)
        bar.planned(len(paths), len(chunked.chunks))
        with _stage(report, "plan"):
            skipped = (*issues, *chunked.issues)
            protected = {i.path for i in skipped}
            batch_ids = set(doc_ids)
            plans = {}
            for name, recorded, by_doc in zip(self.names, self.recorded, self.by_doc, strict=True):
                held = {cid: h for doc in batch_ids for cid, h in by_doc.pop(doc, {}).items()}
                state = StoreState(name, held, recorded)
                plans[name] = plan_store(
                    state, chunked.chunks, self.identity, protected, self.rebuild, name in self.rewrite
                )
            plan = IngestPlan(
                str(self.root),
                self.identity,
                chunked.documents,
                chunked.chunks,
                skipped,
                tuple(w for d in chunked.documents for w in d.warnings),
                len(paths),
                plans,
            )
        with _stage(report, "embed"):
            embeddings = embed_plan(
                plan,
                self.embedder,
                self.cache,
                batch_size=self.settings.embedding_batch_size,
                on_embedded=bar.update,
            )
        bar.update(len(chunked.chunks) - embeddings.embedded)
        self.chunks_cached += embeddings.embedded
        with _stage(report, "title_vectors"):
            embed_titles(plan, self.embedder, self.cache)
        for writer, store in zip(writers, self.stores, strict=True):
            with _stage(report, f"{store.name}_write"):
                writer.write(plan.stores[store.name], embeddings)
        rejected = embeddings.skipped_documents
        kept = [c for c in chunked.chunks if c.doc_id not in rejected]
        with _stage(report, "l0_index"):
            l0.add(plan.documents, Counter(c.doc_id for c in plan.chunks))
        self.sample.add(kept)
        self.documents_done += len(paths)
        self.chunks_written += sum(len(p.upsert) for p in plans.values())
        report.documents_ingested += sum(1 for d in chunked.documents if d.doc_id not in rejected)
        report.chunks_total += len(kept)
        report.chunks_embedded += len(plan.to_embed())
        report.passages_embedded += embeddings.embedded
        report.embedding_cache_hits += embeddings.cache_hits
        report.skipped.extend((*skipped, *embeddings.skipped))
        report.warnings.extend(plan.warnings)


class _Progress:
    """A tqdm bar of chunks (to stderr): done / estimated total, chunks/s, ETA. The total is
    estimated from the chunks per document of the batches so far, times the documents listed."""

    def __init__(self, documents: int, enabled: bool) -> None:
        self.documents, self.docs_seen, self.chunks_seen = documents, 0, 0
        self.bar = tqdm(total=None, desc="ingest", unit="chunk", disable=not enabled, dynamic_ncols=True)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def planned(self, documents: int, chunks: int) -> None:
        """A batch of ``documents`` yielded ``chunks``: re-estimate the total."""
        self.docs_seen, self.chunks_seen = self.docs_seen + documents, self.chunks_seen + chunks
        per_doc = self.chunks_seen / max(self.docs_seen, 1)
        self.bar.total = self.chunks_seen + round(per_doc * (self.documents - self.docs_seen))
        self.bar.refresh()

    def update(self, chunks: int) -> None:
        if chunks:
            self.bar.update(chunks)


class _L0Writer:
    """The L0 index written entry by entry into a temp file beside it, renamed over the old one
    only when the whole run succeeded (the same JSON list ``L0Index.save`` writes, so
    ``L0Index.load`` reads it; not held in memory: ~1 KB per document)."""

    def __init__(self, path: Path) -> None:
        self._temp = temp_beside(path)
        self._first = True

    def __enter__(self) -> _L0Writer:
        tmp = self._temp.__enter__()
        self._file = open(tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        self._file.write("[")
        return self

    def add(self, documents: Sequence[KnowledgeDocument], chunk_counts: Counter[str]) -> None:
        # Not L0Index.build: the index's query-side caches would fill with every batch's names.
        for entry in L0Index.entries_of(documents, chunk_counts):
            self._file.write(("" if self._first else ", ") + json.dumps(asdict(entry), ensure_ascii=False))
            self._first = False

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            try:
                if exc_type is None:
                    self._file.write("]")
            finally:
                self._file.close()
        except BaseException as close_exc:  # a full disk at the last write: remove the temp file
            self._temp.__exit__(type(close_exc), close_exc, close_exc.__traceback__)
            raise
        return self._temp.__exit__(exc_type, exc, tb)


class _Sample:
    """A deterministic sample of at most ``size`` chunks over a whole run (the index state's
    spot-check): the chunks with the smallest hash of their id, kept in a bounded heap."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._heap: list[tuple[int, str, Chunk]] = []  # max-heap by negated key

    def add(self, chunks: Sequence[Chunk]) -> None:
        for c in chunks:
            key = -int.from_bytes(hashlib.blake2b(c.chunk_id.encode(), digest_size=8).digest(), "big")
            item = (key, c.chunk_id, c)
            if len(self._heap) < self.size:
                heapq.heappush(self._heap, item)
            elif item[:2] > self._heap[0][:2]:
                heapq.heapreplace(self._heap, item)

    def chunks(self) -> list[Chunk]:
        return [c for _, _, c in self._heap]


def record_index_state(
    settings: RagSettings, stores: Sequence[VectorStore], plan: IngestPlan, embeddings: ChunkEmbeddings
) -> None:
    """Write what ``rag doctor`` / ``warm_up`` verify ``stores`` against (``rag_core.health``)
    once ``plan`` is applied to them; the chunks of skipped documents were not written."""
    rejected = frozenset(c.chunk_id for c in plan.chunks if c.doc_id in embeddings.skipped_documents)
    failed = {i.path for i in (*plan.skipped, *embeddings.skipped) if is_failure(i)}
    write_index_state(settings, stores, plan.chunks, plan.identity, rejected, failed)


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
