"""Query admission: what one query may make the pipeline do, measured as the model measures it.

Two bounds, applied by :class:`rag_core.lookup.query_transformer.KnowledgeQueryTransformer`:

* characters (``RAG_MAX_QUERY_CHARS``) bound the text work: NFKC, pasted-query parsing, L0
  matching and BM25 terms run on at most ``2 * max_query_chars`` characters of the query
  (normalising a 1 MB query took 2.1 s of a lookup's 7.8 s before this bound);
* tokens bound the model work: the text embedded is cut to the embedding model's window
  (``Embedder.max_tokens``, counted by its own tokenizer, ``Embedder.count_tokens``). Encoding
  grows with tokens (2,000 emoji are 2,005 e5 tokens and took 15 s where 10 tokens took 0.14 s,
  on this loaded 2-core machine), so characters alone do not bound it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: BM25 terms one query may send to the stores (its first distinct terms; a question has tens).
MAX_LEXICAL_TERMS = 128


@dataclass(frozen=True)
class QueryWindow:
    """The query window of the embedding model in use: ``max_tokens`` tokens as its tokenizer
    (``count_tokens``, special tokens and prefix included) counts them."""

    max_tokens: int
    count_tokens: Callable[[str], int]

    def fit(self, text: str) -> tuple[str, bool]:
        """``(prefix, cut)``: the longest prefix of ``text`` within ``max_tokens`` (cut back to a
        space when one is in its last tenth, so no word is halved); ``cut`` is False when ``text``
        fits whole. ``O(log len(text))`` tokenizer calls: token counts grow with the prefix."""
        if self.count_tokens(text) <= self.max_tokens:
            return text, False
        lo, hi = 0, len(text)  # count(text[:lo]) fits, count(text[:hi]) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.count_tokens(text[:mid]) <= self.max_tokens:
                lo = mid
            else:
                hi = mid
        space = text.rfind(" ", 0, lo + 1)
        end = space if space > lo * 0.9 else lo
        return text[:end].rstrip(), True


def first_terms(terms: list[str], limit: int = MAX_LEXICAL_TERMS) -> list[str]:
    """The first ``limit`` distinct ``terms`` in order of appearance, sorted (the stores' order)."""
    return sorted(list(dict.fromkeys(terms))[:limit])
