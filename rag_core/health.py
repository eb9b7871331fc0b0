"""Store health: verify each vector store against what the last ingest wrote.

``rag ingest`` ends by writing the index state (``<data_dir>/index_state.json``, see
``rag_core.ingest.index_state``): per store the row count, the embedding model and a deterministic
sample of chunk ids with their content hashes. ``check_health`` compares a store with it:

* rows: ``count()`` equals the recorded count;
* model: the store's model record equals the recorded one (and the active model, when given);
* sample: ``fetch(ids)`` returns every sampled chunk with the recorded hash, the hash recomputed
  from the stored title/breadcrumb/category/text matches (the row is not damaged), the stored
  vector passes the shared vector check, and searching with it finds the chunk itself first
  (the vector index answers correctly); the sampled chunks' documents have a stored centroid.

A store an ingest left part-written (``apply_pending.json``: a write fault, a kill) fails too.

With ``documents=True`` (``rag doctor``) the document sets are cross-checked: each store's
against the one the last ingest recorded (another writer changed it since?), against the L0
index, and the stores against each other; documents the last ingest skipped may differ.

Used by ``LookupKnowledgeTool.warm_up`` (its return value), ``rag doctor`` and the fault bench.
A store that fails a check is an error in every lookup's trace, never "found nothing".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag_core.embedding.base import ModelIdentity
from rag_core.ingest.index_state import (
    StoreState,
    describe_pending,
    documents_digest,
    pending_applies,
    read_index_state,
)
from rag_core.models import content_hash
from rag_core.settings import RagSettings
from rag_core.stores.base import MissingCentroidsError, VectorStore
from rag_core.stores.vectors import VectorCheckError, check_query_vector

PROBE_SIZE = 8  # of the sampled chunks, those searched for with their own vector
_SELF_MATCH = 0.99  # a chunk's own vector must come back at (near) cosine 1


@dataclass
class StoreHealth:
    """One store's verdict: ``ok`` and, when not, ``problems`` (one line each)."""

    store: str
    ok: bool = True
    rows: int | None = None
    expected_rows: int | None = None
    checked_chunks: int = 0
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)


@dataclass
class HealthReport:
    """Every store's verdict; ``ok`` only when all are. ``summary()`` is one line."""

    stores: list[StoreHealth]
    state_problem: str | None = None
    document_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state_problem is None and not self.document_problems and all(s.ok for s in self.stores)

    def problems_of(self, store: str) -> list[str]:
        """Problems found in one store (a missing index state is not one: nothing to compare)."""
        return [p for s in self.stores if s.store == store for p in s.problems]

    def summary(self) -> str:
        if self.ok:
            return "; ".join(f"{s.store}: ok ({s.rows} rows, {s.checked_chunks} chunks verified)" for s in self.stores)
        parts = [self.state_problem] if self.state_problem else []
        parts += [f"{s.store}: {'; '.join(s.problems)}" for s in self.stores if s.problems]
        return " | ".join(parts + self.document_problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "state_problem": self.state_problem,
            "document_problems": self.document_problems,
            "stores": [asdict(s) for s in self.stores],
        }


def written_stores(settings: RagSettings) -> list[str]:
    """Names of the stores the ingests of ``settings.data_dir`` wrote (the index state's entries)."""
    state, _ = read_index_state(settings)
    return sorted(state or {})


def check_health(
    settings: RagSettings, stores: Sequence[VectorStore], active: ModelIdentity | None = None, documents: bool = False
) -> HealthReport:
    """Verify ``stores`` against the index state of ``settings.data_dir`` (module docstring);
    ``documents`` also cross-checks the document sets (reads every chunk id of each store).
    Never raises: an unreachable store is a problem in the report."""
    state, why = read_index_state(settings)
    pending = pending_applies(settings)
    report = HealthReport(stores=[], state_problem=why)
    held: dict[str, set[str]] = {}
    for store in stores:
        health = StoreHealth(store=store.name)
        report.stores.append(health)
        if store.name in pending:
            health.fail(
                f"the ingest {describe_pending(pending[store.name])} stopped while writing it: it holds part of "
                "that run's changes; run `rag ingest` (it rewrites this store whole)"
            )
        try:
            _check_store(store, (state or {}).get(store.name), active, health, state is not None)
            if documents:
                held[store.name] = {doc_id for doc_id, _ in store.chunk_hashes().values()}
        except Exception as exc:  # any failure to read the store is what we report
            health.fail(f"cannot be read: {type(exc).__name__}: {exc}"[:400])
    if documents and state is not None:
        report.document_problems = _document_problems(settings.l0_index_path, held, state)
    return report


def _document_problems(l0_path: Path, held: dict[str, set[str]], state: dict[str, StoreState]) -> list[str]:
    """Where the stores' document sets (``held``), the L0 index and the index state disagree."""
    problems = []
    skipped = {doc_id for s in state.values() for doc_id in s.skipped}
    for name, docs in held.items():
        recorded = state.get(name)
        if recorded and recorded.documents is not None and recorded.documents_digest != documents_digest(docs):
            problems.append(
                f"{name} holds {len(docs)} documents, not the {recorded.documents} the last ingest left "
                "(written since by another writer?): run `rag ingest`"
            )
    try:
        # The JSON list of L0 entries (``L0Index.save``); only the doc ids are needed here.
        l0 = {entry["doc_id"] for entry in json.loads(l0_path.read_text())}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [*problems, f"the L0 index {l0_path} cannot be read ({exc}): run `rag ingest`"]
    sets = [*held.items(), ("the L0 index", l0)]
    for (name_a, a), (name_b, b) in zip(sets, sets[1:], strict=False):
        only_a, only_b = sorted(a - b - skipped), sorted(b - a - skipped)
        if only_a or only_b:
            problems.append(
                f"{name_a} and {name_b} hold different documents: {_some(only_a)} only in {name_a}, "
                f"{_some(only_b)} only in {name_b}: run `rag ingest`"
            )
    return problems


def _some(doc_ids: list[str]) -> str:
    examples = ", ".join(repr(d) for d in doc_ids[:3])
    return f"{len(doc_ids)} ({examples}{', ...' if len(doc_ids) > 3 else ''})" if doc_ids else "0"


def _check_store(
    store: VectorStore, expected: StoreState | None, active: ModelIdentity | None, health: StoreHealth, have_state: bool
) -> None:
    health.rows = store.count()
    recorded = store.recorded_model()
    if active is not None and recorded is not None and recorded != active:
        health.fail(f"built with {recorded.describe()} but the active model is {active.describe()}: run `rag ingest`")
    if expected is None:
        if have_state:
            health.fail("not in the index state: it was not written by the last ingest")
        return
    health.expected_rows = expected.rows
    if health.rows != expected.rows:
        health.fail(f"holds {health.rows} rows but the last ingest left {expected.rows}")
    if expected.model and (recorded is None or recorded.to_dict() != expected.model):
        found = recorded.describe() if recorded else "no model record"
        health.fail(
            f"model record is {found}, the last ingest recorded {ModelIdentity.from_dict(expected.model).describe()}"
        )
    _check_sample(store, expected.sample, health)


def _check_sample(store: VectorStore, sample: dict[str, str], health: StoreHealth) -> None:
    rows = store.fetch(list(sample))
    missing = [cid for cid in sample if cid not in rows]
    if missing:
        health.fail(f"{len(missing)} of {len(sample)} sampled chunks are missing (e.g. {missing[0]})")
    damaged, bad_vectors, probes, misses = [], [], 0, []
    for cid, row in rows.items():
        recomputed = content_hash(row.title, row.breadcrumb, row.category, row.text)
        if row.content_hash != sample[cid] or recomputed != row.content_hash:
            damaged.append(cid)
            continue
        try:
            vector = check_query_vector(row.vector)
        except VectorCheckError as exc:
            bad_vectors.append(f"{cid} ({exc})")
            continue
        if probes < PROBE_SIZE:
            probes += 1
            hits = store.search(vector, 3)
            if not hits or hits[0].chunk_id != cid and hits[0].similarity < _SELF_MATCH:
                misses.append(cid)
    health.checked_chunks = len(rows)
    _check_centroids(store, sorted({row.doc_id for row in rows.values()}), health)
    if damaged:
        health.fail(
            f"{len(damaged)} sampled chunks have content that does not match their hash "
            f"(damaged rows, e.g. {damaged[0]})"
        )
    if bad_vectors:
        health.fail(f"{len(bad_vectors)} sampled chunks have invalid vectors, e.g. {bad_vectors[0]}")
    if misses:
        health.fail(
            f"the vector index does not find {len(misses)} of {probes} sampled chunks by their own "
            f"vector (damaged index, e.g. {misses[0]}): rebuild with `rag ingest --rebuild`"
        )


def _check_centroids(store: VectorStore, doc_ids: list[str], health: StoreHealth) -> None:
    """Every document of the sample has its centroid (the document-similarity signal)."""
    try:
        missing = set(doc_ids) - set(store.document_centroids(doc_ids))
    except MissingCentroidsError as exc:
        health.fail(str(exc))
        return
    if missing:
        health.fail(
            f"{len(missing)} of {len(doc_ids)} sampled documents have no stored centroid "
            f"(e.g. {min(missing)}): run `rag ingest`"
        )
