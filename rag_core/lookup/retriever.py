"""KnowledgeDocumentRetriever: L1 attempts against one store, dense + lexical fused by RRF.

Policy: without a category filter, one unfiltered attempt. With one (see
:mod:`rag_core.lookup.query_transformer`), attempt 1 (filtered) and attempt 2 (unfiltered) run
side by side and are fused: the filter can add in-category candidates but can never hide an
unfiltered one, and a filtered hit gets no hard priority (the rerank gives it at most a small
``filtered_attempt`` bonus). ``RetrievalOutcome.fallback_reason`` says why the filtered attempt
alone would not have done (failed or low quality: no candidates, no candidate that would
survive post-processing, or top similarity below ``reference_threshold``).

Concurrency: every channel search of a lookup (dense and lexical, of each attempt) is submitted
at once to a small shared thread pool and the calling thread gathers them; pool tasks never wait
on each other, so the pool cannot deadlock however many lookups run at once. The store clients
are thread-safe. A failing channel is recorded in its attempt's ``error``; the others still count.

Fusion: reciprocal rank fusion over every ranked list (dense and lexical of each attempt),
score = sum over lists of 1 / (k + rank), k = 60 (Cormack, Clarke & Büttcher, SIGIR 2009).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from rag_core.lookup.contracts import RetrievalAttempt
from rag_core.lookup.query_transformer import TransformedQuery
from rag_core.models import StoreHit
from rag_core.settings import RagSettings
from rag_core.stores.base import VectorStore

# Shared by every retriever in the process: 2 channels x 2 attempts for one lookup, a few
# lookups at once; store calls mostly wait on I/O or release the GIL in native code.
SEARCH_WORKERS = 8
_POOL = ThreadPoolExecutor(max_workers=SEARCH_WORKERS, thread_name_prefix="l1-search")
atexit.register(_POOL.shutdown, wait=False, cancel_futures=True)

RRF_K = 60


@dataclass
class Candidate:
    """A chunk found by L1: its best hit, fused RRF score, channels and attempt numbers.

    The similarity stages add, on a copy: ``document_similarity``, the query's cosine with the
    chunk's document title plus its cosine with the document's centroid, in [-2, 2]
    (:mod:`rag_core.lookup.document_similarity`); ``ensemble_similarity``, the second model's
    cosine of query and chunk, in [-1, 1] (:mod:`rag_core.lookup.ensemble`). None: not known
    (the signal is off or failed for this lookup)."""

    hit: StoreHit
    rrf: float
    channels: set[str] = field(default_factory=set)
    attempts: set[int] = field(default_factory=set)
    filtered: bool = False
    dense_rank: int | None = None
    lexical_rank: int | None = None
    lexical_score: float | None = None
    document_similarity: float | None = None
    ensemble_similarity: float | None = None

    @property
    def similarity(self) -> float:
        return self.hit.similarity


@dataclass
class RetrievalOutcome:
    """All candidates (best first by RRF), the attempts made, why attempt 2 ran, and the
    ``(dimension,)`` query vector they searched with (None when no search ran). ``error``: every
    attempt failed; ``partial_error``: some channel or attempt failed while others answered (the
    candidates are theirs, so the ranking may differ from a healthy store's)."""

    candidates: list[Candidate]
    attempts: list[RetrievalAttempt]
    fallback_reason: str | None = None
    error: str | None = None
    query_vector: np.ndarray | None = None  # the vector the attempts searched with
    stage_error: str | None = None  # a later stage's store call that failed (a signal lost)

    @property
    def partial_error(self) -> str | None:
        """The errors of the channels or attempts that failed while others answered
        (``"attempt N: ..."``) and ``stage_error``, at most 500 characters; None when none
        failed or all did."""
        if self.error:
            return None
        errors = [f"attempt {a.attempt}: {a.error}" for a in self.attempts if a.error]
        return "; ".join([*errors, *filter(None, [self.stage_error])])[:500] or None


Ranked = tuple[int, str, bool, list[StoreHit]]  # (attempt, channel, filtered, hits best first)
_Pending = tuple[Future[tuple[list[StoreHit], float]], float]  # (future, submitted at)


def fuse(
    dense: list[StoreHit], lexical: list[StoreHit], attempt: int, filtered: bool, k: int = RRF_K
) -> dict[str, Candidate]:
    """RRF-fuse one attempt's two ranked hit lists into candidates keyed by chunk id."""
    return fuse_lists([(attempt, "dense", filtered, dense), (attempt, "lexical", filtered, lexical)], k)


def fuse_lists(lists: Sequence[Ranked], k: int = RRF_K) -> dict[str, Candidate]:
    """RRF over any number of ranked lists (each weighted 1). A candidate keeps the dense hit
    (the store's own raw score) when it has one, its best rank per channel, its best lexical
    score, and ``filtered`` when a filtered attempt found it."""
    out: dict[str, Candidate] = {}
    for attempt, channel, filtered, hits in lists:
        for rank, hit in enumerate(hits, start=1):
            c = out.get(hit.chunk_id)
            if c is None:
                c = out[hit.chunk_id] = Candidate(hit=hit, rrf=0.0, filtered=filtered)
            c.rrf += 1.0 / (k + rank)
            c.channels.add(channel)
            c.attempts.add(attempt)
            c.filtered = c.filtered or filtered
            if channel == "dense":
                if c.dense_rank is None or rank < c.dense_rank:
                    c.dense_rank = rank
                c.hit = hit  # the dense hit carries the store's own raw score
            else:
                c.lexical_rank = rank if c.lexical_rank is None else min(rank, c.lexical_rank)
                if hit.lexical_score is not None:
                    c.lexical_score = max(hit.lexical_score, c.lexical_score or 0.0)
    return out


def low_quality_reason(cands: list[Candidate], settings: RagSettings) -> str | None:
    """Why a set of candidates is low quality, or None when it is good enough."""
    if not cands:
        return "no_candidates"
    top = max(c.similarity for c in cands)
    if top < settings.min_block_similarity:
        return "no_evidence_survives_postprocessing"
    if top < settings.reference_threshold:
        return f"top_similarity_below_reference_threshold({top:.3f}<{settings.reference_threshold})"
    return None


class KnowledgeDocumentRetriever:
    """Runs the L1 attempts on ``store`` for a transformed query and its query vector."""

    def __init__(self, store: VectorStore, settings: RagSettings, pool: ThreadPoolExecutor | None = None):
        self.store = store
        self.settings = settings
        self.pool = pool or _POOL

    def _submit(self, fn: Callable[[], list[StoreHit]]) -> _Pending:
        return self.pool.submit(_timed_call, fn), time.perf_counter()

    def _start_attempt(self, tq: TransformedQuery, vector: np.ndarray, category: str | None) -> dict[str, _Pending]:
        k = self.settings.top_k
        store = self.store

        def dense() -> list[StoreHit]:
            return store.search(vector, k, category)

        def lexical() -> list[StoreHit]:
            return store.search_lexical(tq.lexical_terms, vector, k, category)

        if not _warm(store):  # first use of this store: its lazy set-up runs alone, once
            with _WARM_LOCK:
                if not _warm(store):
                    first = self._submit(dense)
                    first[0].exception()
                    _WARM.add(store)
                    return {"dense": first, "lexical": self._submit(lexical)}
        return {"dense": self._submit(dense), "lexical": self._submit(lexical)}

    def _finish_attempt(
        self, tq: TransformedQuery, category: str | None, attempt: int, futures: dict[str, _Pending]
    ) -> tuple[list[Ranked], RetrievalAttempt]:
        """Gather one attempt's channels. Never raises: a channel error goes into ``error``."""
        lists: list[Ranked] = []
        errors: list[str] = []
        ended = []
        for channel, (future, _submitted) in futures.items():
            try:
                hits, finished = future.result()
                lists.append((attempt, channel, category is not None, hits))
                ended.append(finished)
            except Exception as exc:  # the tool must answer even when the store is down
                errors.append(f"{channel}: {type(exc).__name__}: {exc}")
                ended.append(time.perf_counter())
        t0 = min(started for _, started in futures.values())
        ranked = sorted(fuse_lists(lists).values(), key=lambda c: -c.rrf)
        failed = len(errors) == len(futures)
        # Queueing in the shared pool counts: the attempt took from submission to its last channel.
        rec = RetrievalAttempt(
            attempt=attempt,
            query=tq.rewritten[:200],
            filter=category,
            top_k=self.settings.top_k,
            candidate_count=len(ranked),
            top_similarity=round(max(c.similarity for c in ranked), 4) if ranked else None,
            duration_ms=round((max(ended) - t0) * 1000, 2),
            error="; ".join(errors)[:500] or None,
            low_quality_reason=None if failed else low_quality_reason(ranked, self.settings),
        )
        return lists, rec

    def search_once(
        self, tq: TransformedQuery, vector: np.ndarray, category: str | None, attempt: int
    ) -> tuple[dict[str, Candidate], RetrievalAttempt]:
        """One attempt: dense and lexical search (concurrently) with the same filter, fused.
        Never raises: a store error is recorded in the attempt."""
        lists, rec = self._finish_attempt(tq, category, attempt, self._start_attempt(tq, vector, category))
        return fuse_lists(lists), rec

    def retrieve(self, tq: TransformedQuery, vector: np.ndarray) -> RetrievalOutcome:
        """Unfiltered attempt, plus the filtered one beside it when the query has a category
        filter; all channels run concurrently and are fused together (module docstring)."""
        plan: list[tuple[int, str | None]] = [(1, None)]
        if tq.category_filter is not None:
            plan = [(1, tq.category_filter), (2, None)]
        started = {n: self._start_attempt(tq, vector, cat) for n, cat in plan}
        lists: list[Ranked] = []
        attempts: list[RetrievalAttempt] = []
        for n, cat in plan:
            more, rec = self._finish_attempt(tq, cat, n, started[n])
            lists += more
            attempts.append(rec)
        fallback = None
        if tq.category_filter is not None:
            first = attempts[0]
            failed_all = first.error is not None and not any(a == 1 for a, *_ in lists)
            fallback = "attempt_1_failed" if failed_all else first.low_quality_reason
        ranked = sorted(fuse_lists(lists).values(), key=lambda c: (-c.rrf, -c.similarity, c.hit.chunk_id))
        failed = [a for a in attempts if a.error and not any(x == a.attempt for x, *_ in lists)]
        error = failed[-1].error if len(failed) == len(attempts) else None
        return RetrievalOutcome(ranked, attempts, fallback, error, query_vector=vector)


# Stores that have answered once in this process. A store connects and loads its collection
# lazily on first use; the first call on a store runs alone (other lookups wait on the lock) so
# that set-up is not raced by concurrent calls (seen with Milvus Lite 3: "collection released").
_WARM: weakref.WeakSet[object] = weakref.WeakSet()
_WARM_LOCK = threading.Lock()


def _warm(store: object) -> bool:
    try:
        return store in _WARM
    except TypeError:  # not weak-referenceable: treat as warm (no set-up race to avoid)
        return True


def _timed_call(fn: Callable[[], list[StoreHit]]) -> tuple[list[StoreHit], float]:
    """Run one channel search in the pool; returns its hits and when it finished."""
    return fn(), time.perf_counter()
