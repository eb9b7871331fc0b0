"""The old import path of :mod:`rag_core.ingest.title_similarity` (the title vectors moved to ingest,
which computes them for the rerank; lookup reads them): ``TITLE_LABEL`` and ``TitleSimilarity``."""

from rag_core.ingest.title_similarity import TITLE_LABEL, TitleSimilarity

__all__ = ["TITLE_LABEL", "TitleSimilarity"]
