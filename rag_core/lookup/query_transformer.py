"""KnowledgeQueryTransformer: pasted-query analysis + L0 analysis -> TransformedQuery.

Steps: NFKC and whitespace normalisation; :func:`rag_core.lookup.pasted.analyze_pasted` splits
a pasted alert, label set, event, log line or PromQL expression into informative text and
noise and lifts alert and metric names; an acronym of a compound the knowledge base names
("kcm") gets the compound written beside it (:mod:`rag_core.acronyms`); L0 matches the
informative text and the lifted names (exact, fuzzy and partial name matches, keywords,
entities, named categories); the filter policy below picks at most one category filter.

Dense views: a query of several clauses (a symptom list, a log line with its context, "X, but
Y") also gets each clause as a view of its own (:func:`clause_views`); the query vector averages
them with the whole query (:mod:`rag_core.lookup.query_vector`).

Category filter policy (the filter is never a hard restriction: the retriever runs the
unfiltered search beside a filtered one and fuses both):

1. the query names exactly one category outright (``etcd``, ``alertmanager``) and no whole-name
   match points to another category: filter on it (``named_category``);
2. else the documents matched by whole name (exact or fuzzy) all lie in one category and the
   query names no other: filter on it (``name_match``);
3. partial name matches, keywords and entities only give hints (rerank signals), never a filter;
   conflicting or several categories give no filter (``ambiguous``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from rag_core.l0 import L0Hints, L0Index
from rag_core.lookup.admission import QueryWindow, first_terms
from rag_core.lookup.pasted import PastedQuery, PastedSummary, analyze_pasted
from rag_core.text import lexical_tokens, normalize, split_camel_words

# Clause boundaries: sentence punctuation, a full stop or comma before a space (English; a
# Chinese comma joins parts of one statement more often than two observations: splitting there
# cost on the Chinese suite), dashes between words, and the conjunctions that join two
# observations ("... but ...", "... yet ...", "... and ...").
_CLAUSE_BREAK = re.compile(r"[;；。！？!?\n]|[.,]\s|\s--?\s|\b(?:but|yet|and)\b", re.IGNORECASE)
MAX_VIEWS = 4
_MIN_CLAUSE_CHARS = 8  # shorter pieces carry no meaning of their own ("pod", "is 0")


def clause_views(text: str, limit: int = MAX_VIEWS) -> list[str]:
    """The first ``limit`` clauses of ``text`` long enough to mean something on their own;
    ``[]`` when there are fewer than two (the whole query is then its only view)."""
    pieces = (p.strip() for p in _CLAUSE_BREAK.split(text) if p)
    kept = [p for p in pieces if len(p) >= _MIN_CLAUSE_CHARS]
    return kept[:limit] if len(kept) > 1 else []


@dataclass
class TransformedQuery:
    """The query as the retriever sees it.

    ``original``: the query as given (kept for the trace). ``rewritten``: the text embedded:
    for a pasted query the informative part (see ``pasted``), CamelCase names written out as
    words, names fuzzy-matched through a typo written correctly; for a plain question the
    normalised query with CamelCase words written out; truncated to ``max_query_chars`` and to
    the embedding model's query window (tokens). ``truncated``: part of the query was left out.
    ``lexical_terms`` feed the stores' full-text channel: the rewritten text's tokens plus the
    pasted label values and lifted names. ``category_filter`` (None = unfiltered only) and
    ``filter_reason`` follow the module's policy; ``proposed_filter`` is what the policy chose
    even when the caller disabled the L0 filter (``filter_reason="disabled"``). ``views``: the
    rewritten text's clauses (:func:`clause_views`), embedded beside it. ``acronyms``: query word
    -> the knowledge base's compound it abbreviates (:mod:`rag_core.acronyms`), written beside the
    word before L0 and both channels see the query.
    """

    original: str
    rewritten: str
    hints: L0Hints
    category_filter: str | None
    lexical_terms: list[str] = field(default_factory=list)
    truncated: bool = False
    filter_reason: str = "no_signal"
    proposed_filter: str | None = None
    pasted: PastedQuery | None = None
    views: list[str] = field(default_factory=list)
    acronyms: dict[str, str] = field(default_factory=dict)

    def summary(self) -> QueryTransformSummary:
        return QueryTransformSummary(
            original_chars=len(self.original),
            rewritten=self.rewritten[:200],
            views=[v[:100] for v in self.views],
            truncated=self.truncated,
            category_filter=self.category_filter,
            filter_reason=self.filter_reason,
            proposed_filter=self.proposed_filter,
            domain_hints=self.hints.domains,
            named_categories=self.hints.named_categories,
            matched_keywords=self.hints.matched_keywords,
            entities=self.hints.entities,
            l0_titles=self.hints.matched_titles,
            name_corrections=self.hints.corrections,
            acronyms=self.acronyms,
            pasted=self.pasted.summary() if self.pasted and self.pasted.pasted else None,
        )


class QueryTransformSummary(BaseModel):
    """What the trace keeps of the transformed query (``RetrievalDetails.query_transform``):
    ``original_chars`` (length of the query as given), ``rewritten`` (first 200 characters) and
    ``views`` (first 100 each), the filter decision (``category_filter``, ``filter_reason``,
    ``proposed_filter``; see :class:`TransformedQuery`), the L0 hints that drove it, the acronyms
    expanded and the pasted query's summary (None for a plain question). Defaults let rows of
    older versions read back."""

    model_config = ConfigDict(extra="ignore")

    original_chars: int = 0
    rewritten: str = ""
    views: list[str] = []
    truncated: bool = False
    category_filter: str | None = None
    filter_reason: str = "no_signal"
    proposed_filter: str | None = None
    domain_hints: list[str] = []
    named_categories: list[str] = []
    matched_keywords: list[str] = []
    entities: list[str] = []
    l0_titles: list[str] = []
    name_corrections: dict[str, str] = {}
    acronyms: dict[str, str] = {}
    pasted: PastedSummary | None = None


def choose_filter(hints: L0Hints) -> tuple[str | None, str]:
    """(category filter or None, reason) by the module's policy."""
    named = [c for c in hints.named_categories if c.strip()]
    strong = sorted({m.category for m in hints.matches if m.strong_name and m.category.strip()})
    if len(named) == 1:
        if strong and strong != named:
            return None, "ambiguous:named_category_vs_name_match"
        return named[0], "named_category"
    if len(named) > 1:
        both = [c for c in named if c in strong]
        return (both[0], "name_match") if len(both) == 1 and len(strong) == 1 else (None, "ambiguous")
    if len(strong) == 1:
        return strong[0], "name_match"
    return None, "ambiguous" if strong else "no_signal"


class KnowledgeQueryTransformer:
    """Runs pasted-query analysis and L0 on the query. ``l0`` may be None (no index yet): then
    there are no hints and no filter."""

    def __init__(self, l0: L0Index | None, max_query_chars: int = 2000, window: QueryWindow | None = None):
        self.l0 = l0
        self.max_query_chars = max_query_chars
        self.window = window

    def transform(self, query: str, use_l0_filter: bool = True) -> TransformedQuery:
        """``query`` -> TransformedQuery. ``use_l0_filter=False`` never sets a category filter
        (the policy's choice stays in ``proposed_filter``); hints are computed either way.
        Admission (:mod:`rag_core.lookup.admission`): the text work sees at most ``2 *
        max_query_chars`` characters, the embedded text (and so its views) at most ``window``'s
        tokens; ``truncated`` says either cut something."""
        # Normalising is per character: bound it before anything else (NFKC only expands).
        head = query[: self.max_query_chars * 2]
        text = " ".join(normalize(head).split())
        truncated = len(text) > self.max_query_chars or len(head) < len(query)
        text = text[: self.max_query_chars]
        # The parsers need the line structure (events, "summary:" lines): normalise per line.
        lines = "\n".join(" ".join(ln.split()) for ln in normalize(head).splitlines())
        pasted = analyze_pasted(lines[: self.max_query_chars * 2])
        informative = " ".join(pasted.text.split()) if pasted.pasted else text
        expansions: dict[str, str] = {}
        if self.l0 is not None:
            informative, expansions = self.l0.acronyms.expand(informative)
        hints = (
            self.l0.analyze_query(informative, pasted.alert_names, pasted.metric_names)
            if self.l0 is not None
            else L0Hints()
        )
        corrected = informative
        for span, name in hints.corrections.items():  # a typo'd name written correctly
            at = corrected.lower().find(span)
            corrected = corrected[:at] + name + corrected[at + len(span) :] if at >= 0 else f"{corrected} {name}"
        dense = split_camel_words(corrected)[: self.max_query_chars]
        if self.window is not None:
            dense, cut = self.window.fit(dense)
            truncated = truncated or cut
        # Lexical terms from the unsplit text: the tokenizer keeps a CamelCase name's joined form.
        lexical_source = " ".join([corrected, *pasted.label_values, *pasted.alert_names])
        proposed, reason = choose_filter(hints)
        return TransformedQuery(
            original=query,
            rewritten=dense,
            hints=hints,
            category_filter=proposed if use_l0_filter else None,
            lexical_terms=first_terms(lexical_tokens(lexical_source)),
            truncated=truncated,
            filter_reason=reason if use_l0_filter else "disabled",
            proposed_filter=proposed,
            pasted=pasted,
            views=clause_views(dense),
            acronyms=expansions,
        )
