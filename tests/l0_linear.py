"""The L0 lookup as it was before issue 23: every query scores every document (a Python loop
over all entries, and one rapidfuzz ``cdist`` over every fuzzy choice).

Kept verbatim (only the loop, the fuzzy pass and the category pass; the index's build, its
fuzzy choices and ``_unique`` are shared) as the reference the indexed ``L0Index.analyze_query`` must equal
(``tests/test_l0_indexed.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from rapidfuzz import fuzz, process

from rag_core.l0 import (
    _ASCII_WORD,
    _MIN_COMPACT,
    FUZZY_CUTOFF,
    FUZZY_LENGTH_SLACK,
    FUZZY_MARGIN,
    FUZZY_MAX_WORDS,
    FUZZY_MIN_LEN,
    MAX_MATCHES,
    NAME_COVERAGE,
    DocMatch,
    L0Entry,
    L0Hints,
    L0Index,
    _form,
    _unique,
    compact,
)
from rag_core.text import normalize, tokenize


class LinearL0Index(L0Index):
    """``L0Index`` answering by a linear scan over every entry (the pre-issue-23 code)."""

    def __init__(self, entries: Iterable[L0Entry]) -> None:
        super().__init__(entries)
        # The index's fuzzy choices in the pre-issue-23 (scan) order: (compact name, doc id, display name).
        per_name = zip(self._fuzzy_sorted, self._fuzzy_docs, strict=True)
        ranked = sorted((order, c, d, name) for c, docs in per_name for order, d, name in docs)
        self._linear_choices = [(c, d, name) for _order, c, d, name in ranked]

    def analyze_query(self, query: str, alert_names: Iterable[str] = (), metric_names: Iterable[str] = ()) -> L0Hints:
        alerts, metrics = _unique(alert_names), _unique(metric_names)
        text = " ".join([query, *alerts, *(m.replace("_", " ") for m in metrics)])
        q_tokens = set(tokenize(text))
        q_compact = compact(text)
        fuzzy, corrections = self._linear_fuzzy(text, q_compact)
        matches: list[DocMatch] = []
        keywords: list[str] = []
        entities: list[str] = []
        for e in self.entries.values():
            reasons, score = [], 0.0
            name_score = max((self._name_score(f, q_tokens, q_compact) for f in self._names[e.doc_id]), default=0.0)
            if name_score >= 1.0:
                reasons.append("title")
                score += 2.0
            elif e.doc_id in fuzzy:
                reasons.append(f"title~fuzzy:{fuzzy[e.doc_id] / 100:.2f}")
                score += 1.0 + fuzzy[e.doc_id] / 100
            elif name_score >= NAME_COVERAGE:
                reasons.append(f"title~partial:{name_score:.2f}")
                score += 1.0 + name_score
            for kw in e.keywords:
                if _linear_term_in(kw, q_tokens, q_compact):
                    reasons.append(f"keyword:{kw}")
                    keywords.append(kw)
                    score += 0.5
            for ent in e.entities:
                if _linear_term_in(ent, q_tokens, q_compact):
                    reasons.append(f"entity:{ent}")
                    entities.append(ent)
                    score += 0.5
            if reasons:
                matches.append(
                    DocMatch(
                        doc_id=e.doc_id, title=e.title, category=e.category, score=round(score, 4), reasons=reasons
                    )
                )
        matches.sort(key=lambda m: (-m.score, m.doc_id))
        fuzzy_names = {m.title for m in matches if m.name_kind == "fuzzy"} | {
            n for m in matches if m.name_kind == "fuzzy" for n in self.entries[m.doc_id].names
        }
        corrections = {span: name for span, name in corrections.items() if name in fuzzy_names}
        named_categories = self._linear_categories(q_tokens, q_compact)
        by_name = [m for m in matches if m.strong_name] or [m for m in matches if m.name_kind == "partial"] or matches
        domains_from_names = any(m.strong_name for m in matches)
        match_count, matches = len(matches), matches[:MAX_MATCHES]  # the one change since: the cap
        return L0Hints(
            match_count=match_count,
            matched_doc_ids=[m.doc_id for m in matches],
            matched_titles=_unique(m.title for m in matches if m.name_kind),
            matched_keywords=_unique(keywords),
            domains=sorted({m.category for m in by_name if m.category.strip()} | set(named_categories)),
            domains_from_names=domains_from_names,
            entities=_unique(entities),
            matches=matches,
            named_categories=named_categories,
            alert_names=alerts,
            metric_names=metrics,
            corrections=corrections,
        )

    def _linear_categories(self, q_tokens: set[str], q_compact: str) -> list[str]:
        named = []
        for cat in {e.category for e in self.entries.values() if e.category}:
            c, toks = _form(cat)
            if not c:
                continue
            if (toks and toks <= q_tokens and len(toks) == 1) or (
                len(c) >= _MIN_COMPACT and len(toks) > 1 and c in q_compact
            ):
                named.append(cat)
        return sorted(c for c in named if not any(c != o and compact(c) in compact(o) for o in named))

    def _linear_fuzzy(self, text: str, q_compact: str) -> tuple[dict[str, float], dict[str, str]]:
        fuzzy_choices = self._linear_choices
        if not fuzzy_choices:
            return {}, {}
        words = _ASCII_WORD.findall(normalize(text))
        exact_names = {c for c, _, _ in fuzzy_choices}
        spans: dict[str, None] = {}
        for n in range(1, FUZZY_MAX_WORDS + 1):
            for i in range(len(words) - n + 1):
                span = "".join(words[i : i + n]).lower()
                if len(span) >= FUZZY_MIN_LEN and span not in exact_names:
                    spans[span] = None
        if not spans:
            return {}, {}
        span_list = list(spans)
        choices = [c for c, _, _ in fuzzy_choices]
        scores = process.cdist(span_list, choices, scorer=fuzz.ratio, score_cutoff=FUZZY_CUTOFF - FUZZY_MARGIN)
        best: dict[str, float] = {}
        corrections: dict[str, str] = {}
        for row, span in zip(scores, span_list, strict=True):
            per_doc: dict[str, tuple[float, str]] = {}
            for j in row.nonzero()[0]:
                c, doc_id, name = fuzzy_choices[j]
                if abs(len(c) - len(span)) > max(2.0, FUZZY_LENGTH_SLACK * len(c)):
                    continue
                if row[j] > per_doc.get(doc_id, (0.0, ""))[0]:
                    per_doc[doc_id] = (float(row[j]), name)
            ranked = sorted(per_doc.items(), key=lambda kv: -kv[1][0])
            if not ranked or ranked[0][1][0] < FUZZY_CUTOFF:
                continue
            if len(ranked) > 1 and ranked[1][1][0] > ranked[0][1][0] - FUZZY_MARGIN:
                continue
            doc_id, (score, name) = ranked[0]
            if score > best.get(doc_id, 0.0):
                best[doc_id] = round(score, 1)
                corrections[span] = name
        return best, corrections


def _linear_term_in(term: str, q_tokens: set[str], q_compact: str) -> bool:
    c, toks = _form(term)
    if not c:
        return False
    if len(c) >= 2 and not c.isascii() and c in q_compact:
        return True
    return bool(toks) and toks <= q_tokens
