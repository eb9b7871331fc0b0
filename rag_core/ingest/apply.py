"""Ingestion stage 3: write one plan's changes to one store.

``apply_plan`` first re-reads the store and refuses (``StalePlanError``) when it no longer holds
what the plan was made against: another ingest wrote in between, and applying this diff could
delete its chunks or leave them half-replaced. Then: upsert the planned chunks with their
vectors, record the model, delete the planned chunk ids, store the centroids of the documents
that changed or had none (``rag_core.ingest.centroids``), flush. A store to recreate (a rebuild,
another dimension) or to re-embed (a model change) is written whole into a new collection/table
(``VectorStore.rebuild``) that replaces the served one atomically at the end (issue 26: a lookup
in another process sees the old index or the new one, never a part); a failure leaves the old
one served. A new store is marked incomplete (``ModelIdentity.incomplete``) while it is written.
Documents the embed stage skipped (a bad vector) keep their stored chunks (not across a rebuild).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType

from rag_core.embedding.base import ModelIdentity
from rag_core.ingest.centroids import stale_centroids, write_centroids
from rag_core.ingest.embed import ChunkEmbeddings
from rag_core.ingest.plan import IngestPlan, StoreChanges, StorePlan, StoreState, read_store_state
from rag_core.models import Chunk
from rag_core.stores.base import VectorStore

log = logging.getLogger(__name__)

#: Chunks per upsert call (each store batches further to its own limits).
UPSERT_BATCH = 512


class StalePlanError(RuntimeError):
    """The store changed between planning and applying (another writer); nothing was written.
    The message names the store; plan again."""


def apply_plan(store: VectorStore, plan: IngestPlan, embeddings: ChunkEmbeddings) -> StoreChanges:
    """Write ``plan.stores[store.name]`` to ``store`` with vectors from ``embeddings``.

    Returns the chunk counts written (documents skipped by the embed stage left out). Raises
    KeyError when the plan has no entry for the store, StalePlanError when the store's hashes
    or recorded model changed since planning, ValueError when ``embeddings`` are of another
    model, StoreError when the store fails mid-way (the next run converges: writes are by id).
    """
    store_plan = plan.stores[store.name]
    if embeddings.identity != plan.identity:
        raise ValueError(
            f"embeddings of {embeddings.identity.describe()} cannot apply a plan for {plan.identity.describe()}"
        )
    now = read_store_state(store)
    if now.digest() != store_plan.state_digest:
        raise StalePlanError(
            f"{store.name} changed since this ingest was planned (now {len(now.held)} chunks, "
            f"planned against {len(store_plan.held)}; another ingest wrote in between): nothing written, "
            "plan again"
        )
    skipped = embeddings.skipped_documents
    upsert = [c for c in store_plan.upsert if c.doc_id not in skipped]
    delete = _deletions(store_plan, skipped)
    if store_plan.drop or store_plan.rewrite:
        # Every chunk is written: into a new collection/table, swapped in whole when done.
        with store.rebuild() as fresh:
            _write(fresh, plan, None, upsert, [], embeddings, {})
    else:
        _write(store, plan, store_plan.recorded, upsert, delete, embeddings, store_plan.held)
    return _changes(store_plan, upsert, delete)


def _write(
    store: VectorStore,
    plan: IngestPlan,
    recorded: ModelIdentity | None,
    upsert: Sequence[Chunk],
    delete: Sequence[str],
    embeddings: ChunkEmbeddings,
    held: Mapping[str, tuple[str, str]],
) -> None:
    """``held``: the store's chunks before (``{}`` for a new store)."""
    stale = stale_centroids(held, upsert, delete, store.centroid_doc_ids() if held else set())
    store.ensure_schema(plan.identity.dimension)
    if recorded != plan.identity:
        # A new store: until the last row is written it holds unrecorded vectors. The marker
        # makes a run after an interruption rewrite it whole (never take half-written rows for
        # current ones) and lookups refuse it meanwhile.
        store.record_model(plan.identity.incomplete())
    _upsert_in_batches(store, upsert, embeddings)
    store.record_model(plan.identity)
    store.delete_chunks(delete)
    write_centroids(store, stale, embeddings.cache, embeddings.identity)
    # Sealed rows are searched by the engine's index, not rebuilt per search (issue 14:
    # 100.7 ms unflushed vs 14.2 ms flushed at 454 chunks on Milvus Lite 3).
    store.flush()


def _deletions(store_plan: StorePlan, skipped: frozenset[str]) -> list[str]:
    """Planned deletions, minus those of skipped documents (they keep their old chunks) - unless
    those chunks hold another model's vectors, which must not stay next to this model's."""
    keep_old = not store_plan.model_changed
    delete = [cid for cid in store_plan.delete if not (keep_old and store_plan.held.get(cid, ("", ""))[0] in skipped)]
    if not keep_old and not store_plan.drop:
        planned = set(delete)
        delete += [cid for cid, (doc_id, _) in store_plan.held.items() if doc_id in skipped and cid not in planned]
    return delete


def _changes(store_plan: StorePlan, upsert: Sequence[Chunk], delete: Sequence[str]) -> StoreChanges:
    written = {c.chunk_id for c in upsert}
    planned = store_plan.changes
    held = {} if store_plan.drop else store_plan.held
    added = sum(1 for cid in written if cid not in held)
    return StoreChanges(added=added, updated=len(written) - added, removed=len(delete), unchanged=planned.unchanged)


def _upsert_in_batches(store: VectorStore, chunks: Sequence[Chunk], embeddings: ChunkEmbeddings) -> None:
    for i in range(0, len(chunks), UPSERT_BATCH):
        part = chunks[i : i + UPSERT_BATCH]
        store.upsert(part, embeddings.vectors_for(part))


class StoreWriter:
    """Writes one store batch by batch (the streaming ingest): the same writes as ``apply_plan``,
    spread over the batches of one run.

    Use as a context manager over the whole run. ``state`` is what the run planned against; the
    first write re-reads the store and raises StalePlanError when it moved since (another writer).
    A store to recreate or re-embed (``fresh``: rebuild, another dimension or model, or a store
    left incomplete) is filled batch by batch inside one ``VectorStore.rebuild()``, swapped in when
    the context exits normally and discarded on an exception (Ctrl-C, a full disk): the previous
    index stays served. A new store carries the incomplete marker until ``finish``.
    ``before_write(store name)`` runs once before the first write into a served (not fresh) index:
    the caller records there that the apply is under way (``index_state.mark_apply_started``).
    ``rewrite``: fresh although the model is the same (a store a faulted ingest left part-written).
    """

    def __init__(
        self,
        store: VectorStore,
        state: StoreState,
        identity: ModelIdentity,
        rebuild: bool,
        before_write: Callable[[str], None] | None = None,
        rewrite: bool = False,
    ) -> None:
        recorded = state.recorded
        self.store, self.identity = store, identity
        self.drop = rebuild or (recorded is not None and recorded.dimension != identity.dimension)
        self.fresh = self.drop or rewrite or (recorded is not None and recorded != identity)
        self.recorded = recorded
        self.changes = StoreChanges()
        self._digest, self._planned_rows = state.digest(), len(state.held)
        self._held = state.held
        self._have: set[str] | None = None  # doc ids holding a centroid when the run started
        self._stack = ExitStack()
        self._target: VectorStore | None = None
        self._before_write = before_write

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        return bool(self._stack.__exit__(exc_type, exc, tb))

    def _open(self) -> VectorStore:
        if self._target is not None:
            return self._target
        now = read_store_state(self.store)
        if now.digest() != self._digest:
            raise StalePlanError(
                f"{self.store.name} changed since this ingest was planned (now {len(now.held)} chunks, "
                f"planned against {self._planned_rows}; another ingest wrote in between): nothing written, "
                "plan again"
            )
        if not self.fresh and self._before_write is not None:
            self._before_write(self.store.name)
        target = self._stack.enter_context(self.store.rebuild()) if self.fresh else self.store
        target.ensure_schema(self.identity.dimension)
        if self.fresh or self.recorded != self.identity:
            target.record_model(self.identity.incomplete())
        self._target = target
        return target

    def write(self, store_plan: StorePlan, embeddings: ChunkEmbeddings) -> StoreChanges:
        """Write one batch's plan (``plan_store`` over the batch's documents) with its vectors;
        returns that batch's counts (also added to ``changes``). StoreError / OSError as the
        store raises them."""
        skipped = embeddings.skipped_documents
        upsert = [c for c in store_plan.upsert if c.doc_id not in skipped]
        delete = _deletions(store_plan, skipped)
        if self.fresh:
            stale = stale_centroids({}, upsert, (), ())
        else:
            if self._have is None:
                self._have = self.store.centroid_doc_ids()
            stale = stale_centroids(store_plan.held, upsert, delete, self._have)
        if upsert or (delete and not self.fresh) or stale:
            target = self._open()
            _upsert_in_batches(target, upsert, embeddings)
            if not self.fresh:
                target.delete_chunks(delete)
            write_centroids(target, stale, embeddings.cache, embeddings.identity)
        batch = _changes(store_plan, upsert, delete)
        self._add(batch)
        return batch

    def finish(self, removed: Sequence[str]) -> None:
        """After the last batch: delete ``removed`` (chunks of documents no longer in the tree)
        and those documents' centroids, record the model and flush. The swap of a fresh store
        happens when the context exits."""
        target = self._open()
        if not self.fresh:
            target.delete_chunks(removed)
            target.delete_centroids(sorted({self._held[cid][0] for cid in removed if cid in self._held}))
        if not self.drop:
            self.changes.removed += len(removed)
        target.record_model(self.identity)
        target.flush()

    def _add(self, batch: StoreChanges) -> None:
        c = self.changes
        c.added, c.updated = c.added + batch.added, c.updated + batch.updated
        c.removed, c.unchanged = c.removed + batch.removed, c.unchanged + batch.unchanged
