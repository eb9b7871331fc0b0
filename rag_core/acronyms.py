"""Acronyms of the knowledge base's own compound terms, for colloquial queries.

Operators shorten the components a runbook names in full: "kcm" for ``kube-controller-manager``,
"ksm" for ``kube-state-metrics``, "npd" for ``node-problem-detector``. Such a query shares no
token with its runbook, so neither BM25 nor L0 sees the link, and the dense model rarely knows the
shorthand. The table maps the initials of each hyphenated compound of 3-4 alphabetic words that a
document's prose writes (``compounds_of``, kept per document in the L0 index) to the compound;
the query transformer writes the compound beside a query word equal to one acronym
(:meth:`AcronymTable.expansions`), and the trace shows the expansion.

Guards, since a wrong expansion adds a false lead:

- only compounds of prose and inline code: link targets, bare URLs and fenced code blocks (pod
  names, URL slugs, flags) are left out;
- an acronym two different compounds share is dropped (a trailing plural "s" is one compound:
  ``kube-state-metric`` / ``kube-state-metrics``);
- an acronym that is a word of the index's own names, keywords, entities or summaries is dropped
  (the knowledge base uses it as a word of its own);
- a compound with a function word ("higher-than-expected", "up-to-date") is a phrase, not a
  name, and one with a placeholder part ("kube-proxy-xxxxx") is an example; both are left out;
- a query word is expanded only when written all lower or all upper case, 3-4 letters, standing
  alone (no letter or digit on either side).

Acronym extraction from text usually looks for defining patterns ("Persistent Volume Claim
(PVC)": Schwartz & Hearst 2003, "A simple algorithm for identifying abbreviation definitions in
biomedical text", PSB); runbooks define few, but name their components as hyphenated compounds,
whose initials are the shorthand.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from rag_core.text import STOPWORDS, acronym

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_LINK_TARGET = re.compile(r"\]\([^)]*\)|https?://\S+")
_COMPOUND = re.compile(r"(?<![\w/.-])[A-Za-z]{2,}(?:-[A-Za-z]{2,}){2,3}(?![\w/.-])")
_QUERY_WORD = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{3,4}(?![A-Za-z0-9])")
# Function words that make a hyphenated compound a phrase ("higher-than-expected", "up-to-date"):
# rag_core.text's stop words plus the prepositions and comparisons such phrases use.
_PHRASE_WORDS = STOPWORDS | {"than", "up", "out", "off", "over", "under", "per", "via", "into", "onto"}
MAX_COMPOUNDS = 50  # per document: a runbook names a handful of components


def compounds_of(markdown: str, limit: int = MAX_COMPOUNDS) -> list[str]:
    """Distinct lower-cased hyphenated compounds of 3-4 alphabetic words (each 2+ letters) in
    ``markdown``'s prose, in order of first occurrence, at most ``limit``."""
    prose = _LINK_TARGET.sub(" ", _FENCE.sub(" ", markdown))
    found = dict.fromkeys(m.lower() for m in _COMPOUND.findall(prose))
    # A phrase joined by hyphens ("higher-than-expected") is prose, not a component name.
    return [c for c in found if not any(p in _PHRASE_WORDS or len(set(p)) == 1 for p in c.split("-"))][:limit]


def _stem(compound: str) -> str:
    return compound[:-1] if compound.endswith("s") else compound


def _words_used(words: Iterable[str], texts: Iterable[str]) -> set[str]:
    """The ``words`` (lower case) that occur as whole words in ``texts``, any case. ``str.find``
    over the joined lower-cased texts: a word set of 100k documents' summaries, or one regex
    alternation over them, took 1.6-1.9 s."""
    text = "\n".join(texts).lower()
    used = set()
    for word in words:
        at = text.find(word)
        while at >= 0:
            end = at + len(word)
            if not _is_word_char(text[at - 1 : at]) and not _is_word_char(text[end : end + 1]):
                used.add(word)
                break
            at = text.find(word, end)
    return used


def _is_word_char(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


class AcronymTable:
    """Acronym -> compound over a knowledge base (module docstring for the guards).

    ``compounds``: doc id -> that document's compounds (``compounds_of``); ``vocabulary``: words
    the index itself uses (any case; an acronym among them is not expanded)."""

    def __init__(self, compounds: Mapping[str, Iterable[str]], vocabulary: Iterable[str] = ()) -> None:
        spellings: dict[str, Counter[str]] = defaultdict(Counter)
        for doc_compounds in compounds.values():
            for c in doc_compounds:
                spellings[acronym(c.split("-"))[0]][c] += 1
        unique = {short: seen for short, seen in spellings.items() if len({_stem(c) for c in seen}) == 1}
        used = _words_used(unique, vocabulary)
        self.table: dict[str, str] = {
            short: max(seen, key=lambda c: (seen[c], c)) for short, seen in unique.items() if short not in used
        }

    def __len__(self) -> int:
        return len(self.table)

    def expansions(self, query: str) -> dict[str, str]:
        """``{query word: compound}`` for each query word that is a known acronym (first
        occurrence order); empty when none is."""
        out: dict[str, str] = {}
        for word in _QUERY_WORD.findall(query):
            if (word.islower() or word.isupper()) and word.lower() in self.table:
                out.setdefault(word, self.table[word.lower()])
        return out

    def expand(self, query: str) -> tuple[str, dict[str, str]]:
        """``(query with each acronym followed by its compound in parentheses, expansions)``:
        "kcm 挂了" -> "kcm (kube-controller-manager) 挂了"."""
        found = self.expansions(query)
        if not found:
            return query, found

        def written(m: re.Match[str]) -> str:
            word = m.group(0)
            return f"{word} ({found[word]})" if word in found else word

        return _QUERY_WORD.sub(written, query), found
