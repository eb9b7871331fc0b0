"""Document centroids at ingest: what the document-similarity rerank signal needs per document
(``rag_core.lookup.document_similarity``), computed when a document's chunks are written and stored
with the index, so a lookup reads one row per candidate document whatever the document's size
(issue 44: a 10,000-heading document made every lookup read its 10,000 chunk vectors).

A document's centroid is the unit mean of its chunks' vectors in chunk-id order: the same float32
numbers a lookup computed from the stored chunk vectors before, so rankings do not change. The
vectors come from the embedding cache (every vector written went through it), and for chunks the
cache no longer holds (the cache file was deleted) from the store's own rows.

A store keeps one centroid per document holding chunks. ``stale_centroids`` picks those of
the documents a write changed and of the documents that have none yet (an index written before
centroids were stored, or a run that failed between the chunk write and the centroid write), so
the next ingest converges; centroids of documents that lost every chunk are deleted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from rag_core.embedding.base import ModelIdentity
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.models import Chunk
from rag_core.stores.base import VectorStore

#: A mean shorter than this has no direction: the document gets no centroid.
MIN_NORM = 1e-6


def centroid(vectors: np.ndarray) -> np.ndarray | None:
    """The unit mean (float32, (dim,)) of (n, dim) float32 unit vectors; None when there are none
    or they cancel out (norm of the mean < ``MIN_NORM``)."""
    if not len(vectors):
        return None
    mean = vectors.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return mean / norm if norm >= MIN_NORM else None


def stale_centroids(
    held: Mapping[str, tuple[str, str]], upsert: Sequence[Chunk], delete: Collection[str], have: Collection[str]
) -> dict[str, dict[str, str]]:
    """The documents whose centroid a write makes stale, each with every chunk it holds once the
    write is done (doc id -> ``{chunk_id: content_hash}``; ``{}``: it lost every chunk).

    ``held`` is ``{chunk_id: (doc_id, hash)}`` of the documents in scope before the write (``{}``
    for a new store), ``upsert`` the chunks written, ``delete`` the chunk ids removed, ``have``
    the doc ids holding a centroid before. Stale: a document with a chunk written or removed, or
    one in scope without a centroid."""
    members: dict[str, dict[str, str]] = {}
    for cid, (doc_id, content_hash) in held.items():
        members.setdefault(doc_id, {})[cid] = content_hash
    changed = {held[cid][0] for cid in delete if cid in held}
    for chunk in upsert:
        members.setdefault(chunk.doc_id, {})[chunk.chunk_id] = chunk.content_hash
        changed.add(chunk.doc_id)
    gone = set(delete)
    return {
        doc_id: {c: h for c, h in chunks.items() if c not in gone}
        for doc_id, chunks in members.items()
        if doc_id in changed or doc_id not in have
    }


def compute_centroids(
    members: Mapping[str, Mapping[str, str]], cache: EmbeddingCache, identity: ModelIdentity, store: VectorStore
) -> dict[str, np.ndarray | None]:
    """Doc id -> centroid of its ``members`` (``{chunk_id: content_hash}``; None: no chunk or no
    direction). Vectors are read from ``cache`` under ``identity``, those it lacks from
    ``store.fetch``. KeyError naming the chunk when neither holds a vector."""
    hashes = {h for chunks in members.values() for h in chunks.values()}
    cached = cache.get_many(identity, hashes)
    lacking = [cid for chunks in members.values() for cid, h in chunks.items() if h not in cached]
    stored = {cid: row.vector for cid, row in store.fetch(lacking).items()} if lacking else {}
    out: dict[str, np.ndarray | None] = {}
    for doc_id, chunks in members.items():
        vectors = []
        for cid in sorted(chunks):
            vector = cached.get(chunks[cid])
            if vector is None:
                vector = stored.get(cid)
            if vector is None:
                raise KeyError(f"no vector for chunk {cid} of {doc_id} in the embedding cache or the store")
            vectors.append(vector)
        out[doc_id] = centroid(np.asarray(vectors, dtype=np.float32).reshape(len(vectors), identity.dimension))
    return out


def write_centroids(
    store: VectorStore, stale: Mapping[str, Mapping[str, str]], cache: EmbeddingCache, identity: ModelIdentity
) -> None:
    """After the chunk write: store the centroids of the ``stale`` documents (``stale_centroids``)
    and delete those of documents left without one. StoreError as the store raises it; KeyError
    from ``compute_centroids``."""
    if not stale:
        return
    found = compute_centroids(stale, cache, identity, store)
    store.put_centroids({d: c for d, c in found.items() if c is not None})
    store.delete_centroids([d for d, c in found.items() if c is None])
