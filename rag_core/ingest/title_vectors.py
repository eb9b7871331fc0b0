"""Title vectors at ingest: each document title embedded once (passage side, as the rerank's title
similarity embeds it) into the data dir's embedding cache, so a fresh lookup process reads them
instead of embedding its candidates' titles on first use (issue 26: a one-shot ``rag lookup``)."""

from __future__ import annotations

import logging

from rag_core.embedding.base import Embedder
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.plan import IngestPlan
from rag_core.ingest.title_similarity import TitleSimilarity

log = logging.getLogger(__name__)


def embed_titles(plan: IngestPlan, embedder: Embedder, cache: EmbeddingCache) -> int:
    """Embed the titles of ``plan``'s documents not yet in ``cache``; returns how many were.

    Never raises: a failure is logged and lookups embed the titles on first use instead.
    """
    titles = sorted({c.title for c in plan.chunks})
    try:
        return TitleSimilarity(embedder, disk=cache).embed_titles(titles)
    except Exception as exc:  # the index is whole without them; lookups only get slower
        log.warning("title vectors not embedded at ingest: %s: %s", type(exc).__name__, exc)
        return 0
