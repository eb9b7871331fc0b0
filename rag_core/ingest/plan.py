"""Ingestion stage 1: scan the documents once, chunk them once, diff each store -> ``IngestPlan``.

Nothing here writes: ``read_store_state`` only reads a store, ``plan_ingest`` is a pure function
of the scan, the chunks and the store states. The plan says, per store, which chunks to write
(added, changed, or all of them after a model change or a drop) and which to delete; the
embed stage (``rag_core.ingest.embed``) gets the vectors and the apply stage
(``rag_core.ingest.apply``) writes one store, refusing a plan its store has moved away from.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rag_core.embedding.base import ModelIdentity
from rag_core.ingest import documents as documents_module
from rag_core.ingest.chunking import chunk_document
from rag_core.ingest.documents import EMPTY_FILE_REASON, NO_BODY_REASON, SECTION_PAGE_REASON
from rag_core.models import Chunk, DocumentIssue, KnowledgeDocument
from rag_core.stores.base import VectorStore

log = logging.getLogger(__name__)

#: Files skipped on purpose (not a failure: the run is not "partial" because of them).
INTENTIONAL_SKIPS = frozenset({SECTION_PAGE_REASON, EMPTY_FILE_REASON, NO_BODY_REASON})
MARKDOWN_SUFFIXES = (".md", ".markdown")


class IngestRefusedError(RuntimeError):
    """An ingest would empty or mostly remove an index (wrong or unmounted knowledge dir?) and
    pruning was not asked for; nothing was written. The message names the directory and counts."""


@dataclass
class StoreChanges:
    """Chunk counts of one store for one ingest run."""

    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0


@dataclass(frozen=True)
class DocumentScan:
    """One scan of the knowledge root: the loadable documents and the files that were not."""

    root: Path
    documents: tuple[KnowledgeDocument, ...]
    issues: tuple[DocumentIssue, ...]

    @property
    def documents_seen(self) -> int:
        """Markdown files found (loaded or not); directory symlinks leaving the root do not count."""
        return len(self.documents) + sum(i.path.lower().endswith(MARKDOWN_SUFFIXES) for i in self.issues)

    @property
    def warnings(self) -> list[DocumentIssue]:
        """Problems that did not stop a document (e.g. a repeated frontmatter key)."""
        return [w for doc in self.documents for w in doc.warnings]


def scan_knowledge(root: Path, max_bytes: int) -> DocumentScan:
    """Load every Markdown document under ``root`` (files over ``max_bytes`` are skipped and
    reported). Raises FileNotFoundError / NotADirectoryError for an unusable root."""
    # Looked up on the module at call time so a caller (or a test) can count the scans.
    docs, issues = documents_module.scan_documents(Path(root), max_bytes=max_bytes)
    return DocumentScan(Path(root), tuple(docs), tuple(issues))


@dataclass(frozen=True)
class ChunkedDocuments:
    """The chunks of a scan. ``documents`` are those chunked; ``issues`` those that could not be."""

    documents: tuple[KnowledgeDocument, ...]
    chunks: tuple[Chunk, ...]
    issues: tuple[DocumentIssue, ...]


def chunk_scan(
    documents: Sequence[KnowledgeDocument],
    count_tokens: Callable[[str], int],
    max_tokens: int,
    checks: Sequence[Callable[[Chunk], None]] = (),
) -> ChunkedDocuments:
    """Chunk every document by headings with ``count_tokens`` and at most ``max_tokens`` per
    chunk; a document whose chunking fails, or with a chunk one of the target stores cannot
    hold (``checks``: each store's ``check_chunk``), is reported and left out; the rest go on."""
    kept: list[KnowledgeDocument] = []
    chunks: list[Chunk] = []
    issues: list[DocumentIssue] = []
    for doc in documents:
        try:
            doc_chunks = chunk_document(doc, count_tokens, max_tokens)
            for chunk in doc_chunks:
                for check in checks:
                    check(chunk)
        except Exception as exc:  # one bad document never stops the batch
            issues.append(DocumentIssue(doc.doc_id, f"cannot be chunked: {exc}"))
            continue
        kept.append(doc)
        chunks.extend(doc_chunks)
    return ChunkedDocuments(tuple(kept), tuple(chunks), tuple(issues))


@dataclass(frozen=True)
class StoreState:
    """What one store holds: ``held`` is ``{chunk_id: (doc_id, content_hash)}``, ``recorded``
    the embedding model it was built with (None when new or unrecorded)."""

    name: str
    held: Mapping[str, tuple[str, str]]
    recorded: ModelIdentity | None

    def digest(self) -> str:
        """sha256 over the held hashes and the recorded model: equal digests, same store state."""
        h = hashlib.sha256(repr(self.recorded).encode())
        for cid in sorted(self.held):
            doc_id, content_hash = self.held[cid]
            h.update(f"\x1e{cid}\x1f{doc_id}\x1f{content_hash}".encode())
        return h.hexdigest()


def read_store_state(store: VectorStore) -> StoreState:
    """Read ``store``'s chunk hashes and recorded model (StoreError when unreachable)."""
    return StoreState(store.name, store.chunk_hashes(), store.recorded_model())


@dataclass(frozen=True)
class StorePlan:
    """The changes of one store.

    ``drop``: recreate the store first (rebuild, or vectors of another dimension); then
    ``upsert`` holds every chunk. ``model_changed``: the store holds another model's vectors,
    so every chunk is re-written. ``rewrite``: every chunk is re-written into a new
    collection/table (a model change, or a store a faulted ingest left part-written).
    ``delete`` are chunk ids to remove. ``state_digest`` is ``StoreState.digest()`` at planning
    time: the apply stage refuses the plan when it differs.
    """

    store: str
    state_digest: str
    recorded: ModelIdentity | None
    drop: bool
    model_changed: bool
    upsert: tuple[Chunk, ...]
    delete: tuple[str, ...]
    held: Mapping[str, tuple[str, str]]
    changes: StoreChanges = field(default_factory=StoreChanges)
    rewrite: bool = False


@dataclass(frozen=True)
class IngestPlan:
    """Everything one ingest will do, decided before any write.

    ``documents``/``chunks``: what was loaded and chunked; ``skipped``: documents that failed
    to load or chunk (their old chunks are kept); ``stores``: store name -> ``StorePlan``;
    ``unavailable``: store name -> why it could not be read (no plan for it, e.g. a sidecar down).
    """

    knowledge_dir: str
    identity: ModelIdentity
    documents: tuple[KnowledgeDocument, ...]
    chunks: tuple[Chunk, ...]
    skipped: tuple[DocumentIssue, ...]
    warnings: tuple[DocumentIssue, ...]
    documents_seen: int
    stores: dict[str, StorePlan]
    unavailable: dict[str, str] = field(default_factory=dict)

    def to_embed(self) -> list[Chunk]:
        """The chunks some store must write, one per content hash (vectors are shared by hash)."""
        seen: dict[str, Chunk] = {}
        for plan in self.stores.values():
            for chunk in plan.upsert:
                seen.setdefault(chunk.content_hash, chunk)
        return list(seen.values())


def plan_ingest(
    scan: DocumentScan,
    chunked: ChunkedDocuments,
    states: Sequence[StoreState],
    identity: ModelIdentity,
    *,
    rebuild: bool = False,
    prune: bool = False,
    max_remove_share: float = 0.5,
    unavailable: Mapping[str, str] | None = None,
    rewrite: Collection[str] = (),
) -> IngestPlan:
    """The ``IngestPlan`` bringing each store of ``states`` in step with ``chunked``; a store
    named in ``rewrite`` (left part-written by a fault) is planned whole, as in a rebuild.

    Raises IngestRefusedError when the scan found no document, or a store would lose more
    than ``max_remove_share`` of its documents, unless ``prune``. Documents that failed to load
    or chunk are protected: their stored chunks are neither replaced nor deleted.
    """
    skipped = (*scan.issues, *chunked.issues)
    if not prune:
        refuse_wipe(
            scan.root,
            scan.documents_seen,
            chunked.documents,
            skipped,
            {s.name: s.held for s in states},
            max_remove_share,
        )
    protected = {i.path for i in skipped}
    stores = {s.name: plan_store(s, chunked.chunks, identity, protected, rebuild, s.name in rewrite) for s in states}
    return IngestPlan(
        str(scan.root),
        identity,
        chunked.documents,
        chunked.chunks,
        skipped,
        tuple(scan.warnings),
        scan.documents_seen,
        stores,
        dict(unavailable or {}),
    )


def plan_store(
    state: StoreState,
    chunks: Sequence[Chunk],
    identity: ModelIdentity,
    protected: set[str],
    rebuild: bool,
    rewrite: bool = False,
) -> StorePlan:
    """One store's diff: chunks whose id is new or whose content hash changed are written,
    stored chunks no longer produced (and not of a ``protected`` document) are deleted.
    ``rewrite``: every chunk is written (into a new collection/table), as after a model change."""
    recorded = state.recorded
    drop = rebuild or (recorded is not None and recorded.dimension != identity.dimension)
    model_changed = recorded is not None and recorded != identity
    rewrite = rewrite or model_changed
    stored: Mapping[str, tuple[str, str]] = {} if drop else state.held
    if rewrite and not drop:
        # Vectors of another model, or rows a fault left half-written: write every chunk again.
        stored = {cid: (doc, "") for cid, (doc, _) in stored.items()}
    changes, upsert = StoreChanges(), []
    for chunk in chunks:
        old = stored.get(chunk.chunk_id)
        if old is None:
            changes.added += 1
            upsert.append(chunk)
        elif old[1] != chunk.content_hash:
            changes.updated += 1
            upsert.append(chunk)
        else:
            changes.unchanged += 1
    current = {c.chunk_id for c in chunks}
    delete = tuple(cid for cid, (doc_id, _) in stored.items() if cid not in current and doc_id not in protected)
    changes.removed = len(delete)
    return StorePlan(
        state.name,
        state.digest(),
        recorded,
        drop,
        model_changed,
        tuple(upsert),
        delete,
        dict(state.held),
        changes,
        rewrite,
    )


def refuse_wipe(
    root: Path,
    documents_seen: int,
    docs: Sequence[KnowledgeDocument],
    skipped: Sequence[DocumentIssue],
    held: Mapping[str, Mapping[str, tuple[str, str]]],
    max_share: float,
) -> None:
    """IngestRefusedError when ``root`` yields no document, or when a store would lose more than
    ``max_share`` of the documents it holds (``held``: store name -> its chunk hashes; documents
    that failed to load are kept, not lost)."""
    keep = {d.doc_id for d in docs} | {i.path for i in skipped}
    _refuse(root, documents_seen, len(docs), keep, held, max_share)


def refuse_wipe_listed(
    root: Path, doc_ids: Sequence[str], held: Mapping[str, Mapping[str, tuple[str, str]]], max_share: float
) -> None:
    """``refuse_wipe`` from the listing alone (the streaming ingest decides before loading any
    document): every listed Markdown file counts as kept, as a file that later fails to load
    keeps its stored chunks. Same IngestRefusedError and message."""
    _refuse(root, len(doc_ids), len(doc_ids), set(doc_ids), held, max_share)


def _refuse(
    root: Path,
    documents_seen: int,
    n_docs: int,
    keep: set[str],
    held: Mapping[str, Mapping[str, tuple[str, str]]],
    max_share: float,
) -> None:
    if documents_seen == 0:
        raise IngestRefusedError(
            f"no Markdown document found under {root}: refusing to touch the index "
            "(wrong or unmounted directory?); pass --prune to empty it on purpose"
        )
    for name, hashes in held.items():
        doc_ids = {doc_id for doc_id, _ in hashes.values()}
        gone = doc_ids - keep
        if doc_ids and len(gone) / len(doc_ids) > max_share:
            raise IngestRefusedError(
                f"{root} has {n_docs} document(s) but {name} holds {len(doc_ids)}: this ingest would "
                f"remove {len(gone)} ({len(gone) / len(doc_ids):.0%}, over RAG_INGEST_MAX_REMOVE_SHARE="
                f"{max_share:.0%}); pass --prune if that is intended"
            )


def is_failure(issue: DocumentIssue) -> bool:
    """True when ``issue`` is a Markdown document that should have been ingested and was not
    (not a section page, an empty file or a frontmatter-only file, which are skipped on purpose)."""
    return issue.path.lower().endswith(MARKDOWN_SUFFIXES) and issue.reason not in INTENTIONAL_SKIPS
