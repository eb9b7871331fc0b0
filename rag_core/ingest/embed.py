"""Ingestion stage 2: one vector per chunk content hash that some store needs, through the cache.

``embed_plan`` embeds each needed chunk once for every store of the plan: cached vectors (same
model, same content hash) are reused, the rest go to the model in length-sorted batches and are
cached. Every vector, cached or new, is checked (finite, L2 norm within ``NORM_SLACK`` of 1);
a chunk with a bad vector takes its whole document out of this run (reported with path,
heading and reason), so a document is never half-updated, and the other documents go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from rag_core.embedding.base import BadVectorError, Embedder, ModelIdentity
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.plan import IngestPlan
from rag_core.models import Chunk, DocumentIssue

log = logging.getLogger(__name__)

#: Accepted distance of a vector's L2 norm from 1 (backends normalise to float32 rounding).
NORM_SLACK = 1e-2
#: Passages per model call: big enough to amortise the call, small enough for steady progress.
MIN_STEP = 256


def vector_problem(vector: np.ndarray, dimension: int) -> str | None:
    """Why ``vector`` cannot be stored (wrong shape, non-finite, norm not ~1), or None."""
    v = np.asarray(vector)
    if v.shape != (dimension,):
        return f"embedding has shape {v.shape}, expected ({dimension},)"
    if not np.isfinite(v).all():
        return "non-finite (NaN or infinite) embedding vector"
    norm = float(np.linalg.norm(v))
    if abs(norm - 1.0) > NORM_SLACK:
        return f"embedding vector norm {norm:.3g}, expected 1"
    return None


@dataclass(frozen=True)
class ChunkEmbeddings:
    """The vectors of one plan, kept in ``cache`` under ``identity``.

    ``content_hashes``: hashes with a checked vector in the cache; ``skipped``: one issue per
    document dropped from this run because a chunk of it got a bad vector; ``embedded``: passages
    sent to the model; ``cache_hits``: vectors reused from the cache.
    """

    cache: EmbeddingCache
    identity: ModelIdentity
    content_hashes: frozenset[str]
    skipped: tuple[DocumentIssue, ...] = ()
    embedded: int = 0
    cache_hits: int = 0
    model_calls: int = 0

    @property
    def skipped_documents(self) -> frozenset[str]:
        """Doc ids left out of this run because of a bad vector."""
        return frozenset(i.path for i in self.skipped)

    def vectors_for(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """``(len(chunks), dimension)`` float32, read from the cache. KeyError naming the chunk
        when a vector is missing (the plan and these embeddings do not belong together)."""
        if not chunks:
            return np.zeros((0, self.identity.dimension), dtype=np.float32)
        found = self.cache.get_many(self.identity, (c.content_hash for c in chunks))
        missing = [c for c in chunks if c.content_hash not in found]
        if missing:
            c = missing[0]
            raise KeyError(
                f"no {self.identity.describe()} vector cached for chunk {c.chunk_id} "
                f"({c.doc_id}, {c.breadcrumb}); run the embed stage for this plan first"
            )
        return np.stack([found[c.content_hash] for c in chunks]).astype(np.float32, copy=False)


def embed_plan(
    plan: IngestPlan,
    embedder: Embedder,
    cache: EmbeddingCache,
    *,
    batch_size: int = 64,
    progress: bool = False,
    on_embedded: Callable[[int], None] | None = None,
) -> ChunkEmbeddings:
    """Vectors for ``plan.to_embed()``: from ``cache`` when present, else from ``embedder`` (then
    cached, step by step, so an interrupted run keeps every finished step). ``on_embedded(n)`` is
    called after each step with the passages it sent to the model (the streaming ingest's progress).
    Raises ValueError when the embedder is not the plan's model; EmbedderLoadError (or the
    endpoint's error) when the model cannot run, before anything is written anywhere; OSError
    (ENOSPC) when the cache cannot be written.
    """
    identity = embedder.identity()
    if identity != plan.identity:
        raise ValueError(f"the plan was made for {plan.identity.describe()}, the embedder is {identity.describe()}")
    needed = plan.to_embed()
    cached = cache.get_many(identity, (c.content_hash for c in needed))
    good: set[str] = set()
    for h, vector in cached.items():
        if vector_problem(vector, identity.dimension) is None:
            good.add(h)
    hits = len(good)
    missing = sorted((c for c in needed if c.content_hash not in good), key=lambda c: len(c.embed_text))
    bad: dict[str, DocumentIssue] = {}
    calls = 0
    with tqdm(total=len(missing), desc="embedding chunks", unit="chunk", disable=not progress) as bar:
        step = max(batch_size, MIN_STEP)
        for i in range(0, len(missing), step):
            batch = missing[i : i + step]
            vectors, problems, n = _embed_batch(batch, embedder, identity.dimension)
            calls += n
            cache.put_many(identity, vectors)
            good.update(vectors)
            for chunk, reason in problems:
                issue = DocumentIssue(
                    chunk.doc_id, f"chunk {chunk.chunk_id} skipped the document: {reason}", heading=chunk.breadcrumb
                )
                log.warning("%s", issue)
                bad.setdefault(chunk.doc_id, issue)
            bar.update(len(batch))
            if on_embedded is not None:
                on_embedded(len(batch))
    return ChunkEmbeddings(cache, identity, frozenset(good), tuple(bad.values()), len(missing), hits, calls)


def _embed_batch(
    batch: Sequence[Chunk], embedder: Embedder, dimension: int
) -> tuple[dict[str, np.ndarray], list[tuple[Chunk, str]], int]:
    """``({content_hash: vector}, [(chunk, reason)], model calls)`` for one batch. A batch the
    backend rejects (BadVectorError names only its first bad row) is retried chunk by chunk."""
    rows: list[tuple[Chunk, np.ndarray | str]]
    try:
        out = embedder.embed_passages([c.embed_text for c in batch], _labels(batch))
        rows, calls = list(zip(batch, np.asarray(out), strict=True)), 1
    except BadVectorError:
        rows, calls = [], 1
        for chunk in batch:
            calls += 1
            try:
                rows.append((chunk, embedder.embed_passages([chunk.embed_text], _labels([chunk]))[0]))
            except BadVectorError as exc:
                rows.append((chunk, str(exc).rsplit(": ", 1)[-1]))
    vectors: dict[str, np.ndarray] = {}
    problems: list[tuple[Chunk, str]] = []
    for chunk, vector in rows:
        problem = vector if isinstance(vector, str) else vector_problem(vector, dimension)
        if problem is None and not isinstance(vector, str):
            vectors[chunk.content_hash] = np.asarray(vector, dtype=np.float32)
        else:
            problems.append((chunk, problem or "bad embedding vector"))
    return vectors, problems, calls


def _labels(chunks: Sequence[Chunk]) -> list[str]:
    return [f"chunk {c.chunk_id} ({c.breadcrumb}) of document {c.doc_id}" for c in chunks]
