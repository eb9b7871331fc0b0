"""Split the embed stage into shards that separate workers can run, and join their results.

A chunk's shard is a pure function of its content hash, so the shards of one plan are disjoint,
cover ``plan.to_embed()`` exactly, and two chunks with the same content (one vector, shared by
hash) always fall into the same shard: no vector is embedded twice. Each shard embeds through
the same embedding cache (SQLite, safe across processes); ``merge_embeddings`` joins the
shards' ``ChunkEmbeddings`` into what one ``embed_plan`` over the whole plan returns (the same
content hashes, skipped documents and counts).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from rag_core.ingest.embed import ChunkEmbeddings
from rag_core.ingest.plan import IngestPlan
from rag_core.models import DocumentIssue


def shard_of(content_hash: str, shards: int) -> int:
    """The shard (``0 <= shard < shards``) of a chunk content hash: the first 8 bytes of its
    sha256, modulo ``shards`` (stable across processes and Python versions, unlike ``hash``).

    Raises ValueError when ``shards`` < 1.
    """
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    return int.from_bytes(hashlib.sha256(content_hash.encode()).digest()[:8], "big") % shards


def shard_plan(plan: IngestPlan, shard: int, shards: int) -> IngestPlan:
    """``plan`` with each store's upserts cut to the chunks of ``shard`` of ``shards`` (what
    ``embed_plan`` then embeds); deletes, documents and everything else unchanged.

    Raises ValueError when ``shard`` is not in ``[0, shards)``.
    """
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not in [0, {shards})")
    stores = {
        name: dataclasses.replace(
            store, upsert=tuple(c for c in store.upsert if shard_of(c.content_hash, shards) == shard)
        )
        for name, store in plan.stores.items()
    }
    return dataclasses.replace(plan, stores=stores)


def merge_embeddings(parts: Sequence[ChunkEmbeddings]) -> ChunkEmbeddings:
    """One ``ChunkEmbeddings`` from the shards' (in shard order): the union of their content
    hashes, one skipped-document issue per document (the first shard's), counts summed.

    Raises ValueError for no parts or parts of different models (they belong to other plans).
    """
    if not parts:
        raise ValueError("no shard embeddings to merge")
    identity = parts[0].identity
    if any(p.identity != identity for p in parts):
        raise ValueError("shard embeddings of different models cannot be merged")
    skipped: dict[str, DocumentIssue] = {}
    for part in parts:
        for issue in part.skipped:
            skipped.setdefault(issue.path, issue)
    return ChunkEmbeddings(
        parts[0].cache,
        identity,
        frozenset().union(*(p.content_hashes for p in parts)),
        tuple(skipped.values()),
        sum(p.embedded for p in parts),
        sum(p.cache_hits for p in parts),
        sum(p.model_calls for p in parts),
    )
