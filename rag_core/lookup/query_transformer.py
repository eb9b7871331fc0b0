"""KnowledgeQueryTransformer: L0 analysis of the query -> TransformedQuery."""

from __future__ import annotations

from dataclasses import dataclass, field

from rag_core.l0 import L0Hints, L0Index
from rag_core.text import lexical_terms, normalize, tokenize


@dataclass
class TransformedQuery:
    """The query as the retriever sees it.

    ``category_filter`` is set only when L0 found exactly one nonblank domain and that domain
    comes from documents matched by name (title, H1, file name or alias). A domain resting on
    keyword or entity matches alone ("bank", "backup") stays a hint (it feeds the rerank's
    domain signal) but does not filter: the filter is a hard restriction, and a filtered
    attempt that is good enough by similarity is never retried unfiltered.
    ``rewritten`` is the text embedded (the original, NFKC-normalised and truncated to
    ``max_query_chars``); ``lexical_terms`` feed the stores' full-text channel.
    """

    original: str
    rewritten: str
    hints: L0Hints
    category_filter: str | None
    lexical_terms: list[str] = field(default_factory=list)
    truncated: bool = False

    def summary(self) -> dict:
        return {"original_chars": len(self.original), "rewritten": self.rewritten[:200],
                "truncated": self.truncated, "category_filter": self.category_filter,
                "domain_hints": self.hints.domains, "matched_keywords": self.hints.matched_keywords,
                "entities": self.hints.entities, "l0_titles": self.hints.matched_titles}


class KnowledgeQueryTransformer:
    """Runs L0 on the query. ``l0`` may be None (no index yet): then there are no hints."""

    def __init__(self, l0: L0Index | None, max_query_chars: int = 2000):
        self.l0 = l0
        self.max_query_chars = max_query_chars

    def transform(self, query: str) -> TransformedQuery:
        text = " ".join(normalize(query).split())
        truncated = len(text) > self.max_query_chars
        text = text[: self.max_query_chars]
        hints = self.l0.analyze_query(text) if self.l0 is not None else L0Hints()
        domains = [d for d in hints.domains if d.strip()]
        return TransformedQuery(
            original=query, rewritten=text, hints=hints,
            category_filter=domains[0] if len(domains) == 1 and hints.domains_from_names else None,
            lexical_terms=sorted(set(lexical_terms(tokenize(text)))), truncated=truncated,
        )
