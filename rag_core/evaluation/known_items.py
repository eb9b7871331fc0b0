"""Known-item queries generated from runbook corpora: the training and cross-validation data of
the learned rerank (:mod:`rag_core.evaluation.cv`). Nothing here reads a golden case.

Every query expects one document (its source runbook; for a cross-lingual one, the runbook of the
same alert in the other corpus) and names the index it must be asked on. Kinds, per runbook:

- ``section``: the first ``QUERY_CHARS`` characters of its Meaning / Impact / Diagnosis section
  (含义 / 影响 / 诊断 in Chinese), the alert name and title removed, asked on a copy of the corpus
  from which that section was removed in every runbook (:func:`without_section`): a symptom
  description found only through the runbook's other sections, never through the sentence it
  came from.
- ``truncated``, ``word-drop``, ``typo``: paraphrase-like variants of each ``section`` query (its
  first ``TRUNCATE_WORDS`` words / ``TRUNCATE_CHARS`` Chinese characters; each word or Chinese
  clause dropped with probability ``DROP_P``; ``TYPOS`` words with one adjacent swap, deletion or
  doubled letter, Chinese: ``TYPOS`` characters deleted), on the same held-out index.
- ``title``: the frontmatter title (the H1 where there is none), lower-cased, with one typo, on
  the whole corpus: the alert-style query that names its runbook.
- ``crosslingual``: the Meaning / Impact section of the runbook of the same alert (same path) in
  the other language, on the whole corpus (:func:`known_item_cases`): Chinese/English mixes, a
  paraphrase sharing only Latin names with its target.

Randomness is seeded per (seed, document, heading, kind), so one seed gives the same queries on
every machine and adding a document changes no other document's queries. The corpora are the
knowledge dirs of the golden suites ``runbooks-en`` and ``runbooks-zh`` unless given
(:func:`default_corpora`); ``rag eval cv`` prints the size per language and kind.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rag_core.evaluation.cases import GoldenCase
from rag_core.markdown import md_table
from rag_core.text import split_camel_words

__all__ = [
    "SEED",
    "KnownItem",
    "default_corpora",
    "first_section",
    "generate",
    "index_dirs",
    "known_item_cases",
    "section_query",
    "size_table",
    "without_section",
]

SEED = 25
QUERY_CHARS = 200
HEADINGS = {"en": ("Meaning", "Impact", "Diagnosis"), "zh": ("含义", "影响", "诊断")}
# (query language, corpus language, sections of the query's runbook asked cross-lingually)
CROSSLINGUAL = (("zh", "en", ("含义", "影响")), ("en", "zh", ("Meaning", "Impact")))
DEFAULT_SUITE_CORPORA = {"en": "runbooks-en", "zh": "runbooks-zh"}
TRUNCATE_WORDS = 12
TRUNCATE_CHARS = 40
DROP_P = 0.3
TYPOS = 2
MIN_QUERY_CHARS = 12  # shorter section texts ("TODO", a link) are no query
_CLAUSE = re.compile(r"(?<=[，。；、,;：:])")
_TITLE = re.compile(r"^title:\s*(.+?)\s*$", re.M)
_SECTION = re.compile(r"^## (.+?)\n(.*?)(?=^## |\Z)", re.S | re.M)
_DROP = re.compile(r"\A---\n.*?\n---\n|<details>.*?</details>|```.*?```", re.S)
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


@dataclass(frozen=True)
class KnownItem:
    """One generated query: ``language`` of the query text, ``corpus`` (language) and ``index``
    (corpus language, ``<corpus>-without-<heading>`` for held-out sections) it is asked on, the
    expected ``doc_id`` (path relative to the corpus root), ``kind`` (module docstring)."""

    id: str
    query: str
    doc_id: str
    language: str
    corpus: str
    index: str
    kind: str
    heading: str = ""

    @property
    def group(self) -> str:
        """``<query language>-><corpus language>``, the row of the CV tables."""
        return f"{self.language}->{self.corpus}"


def default_corpora() -> dict[str, Path]:
    """Language -> knowledge dir of the golden suites ``runbooks-en`` / ``runbooks-zh``
    (``golden/suites.yaml``); a language whose suite or directory is missing is left out."""
    from rag_core.evaluation.suites import load_suites

    by_name = {s.name: s.knowledge_dir for s in load_suites()}
    return {
        lang: by_name[name]
        for lang, name in DEFAULT_SUITE_CORPORA.items()
        if name in by_name and by_name[name].is_dir()
    }


def first_section(path: Path, heading: str) -> str:
    """The text of the first ``## `` section of ``path`` whose heading contains ``heading``,
    without front matter, folded details, code and link targets, on one line ('' when absent)."""
    text = _DROP.sub("", path.read_text(encoding="utf-8"))
    for m in _SECTION.finditer(text):
        if heading in m.group(1):
            lines = (ln.strip(" ->*") for ln in _LINK.sub(r"\1", m.group(2)).splitlines())
            return " ".join(ln for ln in lines if ln)
    return ""


def section_query(path: Path, heading: str) -> str:
    """The first ``QUERY_CHARS`` characters of ``path``'s ``heading`` section without the
    alert's own name (the file name), as a known-item query ('' when there is no such section)."""
    query = first_section(path, heading)[:QUERY_CHARS]
    return re.sub(re.escape(path.stem), "", query, flags=re.I).strip()


def without_section(text: str, heading: str) -> str:
    """``text`` without its first ``## `` section whose heading contains ``heading``."""
    for m in _SECTION.finditer(text):
        if heading in m.group(1):
            return text[: m.start()] + text[m.end() :]
    return text


def known_item_cases(source: Path, heading: str, target: Path) -> list[GoldenCase]:
    """One case per runbook present under both roots: the ``heading`` section of ``source``'s
    copy (:func:`section_query`) expects ``target``'s copy."""
    docs = {p.relative_to(source).as_posix() for p in source.rglob("*.md")}
    shared = sorted(d for d in docs if (target / d).is_file() and not d.endswith("_index.md"))
    cases = []
    for doc in shared:
        query = section_query(source / doc, heading)
        if query:
            case_id = f"{heading}-{Path(doc).stem}"
            cases.append(GoldenCase(id=case_id, scenario="chat", query=query, expected_docs=[doc]))
    return cases


def rng_for(seed: int, *parts: str) -> random.Random:
    """A random generator seeded by ``seed`` and ``parts`` (stable across runs and machines)."""
    digest = hashlib.sha256("\x1f".join((str(seed), *parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def title_of(path: Path) -> str:
    """The frontmatter ``title`` of ``path``, else its first H1, else its file stem."""
    text = path.read_text(encoding="utf-8")
    front = re.match(r"\A---\n(.*?)\n---\n", text, re.S)
    if front and (m := _TITLE.search(front.group(1))):
        return m.group(1).strip("'\"")
    h1 = re.search(r"^# (.+)$", text, re.M)
    return h1.group(1).strip() if h1 else path.stem


def without_names(text: str, path: Path) -> str:
    """``text`` without the runbook's alert name (file stem), its title and the title written
    out as words (``KubeletTooManyPods``, ``Kubelet Too Many Pods``), case-insensitive."""
    names = {path.stem, title_of(path), split_camel_words(path.stem)}
    for name in sorted((n for n in names if len(n) > 2), key=len, reverse=True):
        text = re.sub(re.escape(name), "", text, flags=re.I)
    return re.sub(r"\s{2,}", " ", text).strip(" ,.:;，。")


def section_text(path: Path, heading: str) -> str:
    """The runbook's ``heading`` section as a query: first ``QUERY_CHARS`` characters, names
    removed ('' when absent or shorter than ``MIN_QUERY_CHARS``)."""
    query = without_names(first_section(path, heading)[:QUERY_CHARS], path)
    return query if len(query) >= MIN_QUERY_CHARS else ""


def truncated(query: str, language: str) -> str:
    """The first ``TRUNCATE_WORDS`` words (``TRUNCATE_CHARS`` characters for Chinese)."""
    return query[:TRUNCATE_CHARS] if language == "zh" else " ".join(query.split()[:TRUNCATE_WORDS])


def word_drop(query: str, language: str, rng: random.Random) -> str:
    """Each word (Chinese: clause) dropped with probability ``DROP_P``; at least one kept."""
    parts = [p for p in _CLAUSE.split(query) if p.strip()] if language == "zh" else query.split()
    kept = [p for p in parts if rng.random() >= DROP_P] or [rng.choice(parts)]
    return ("" if language == "zh" else " ").join(kept)


def typo(word: str, rng: random.Random) -> str:
    """``word`` with one adjacent swap, deletion or doubled letter at a random inner place."""
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if kind == 1:
        return word[:i] + word[i + 1 :]
    return word[:i] + word[i] + word[i:]


def with_typos(query: str, language: str, rng: random.Random, n: int = TYPOS) -> str:
    """``n`` typos: in ``n`` random words of 4+ letters (Chinese: ``n`` CJK characters deleted)."""
    if language == "zh":
        chars = list(query)
        cjk = [i for i, ch in enumerate(chars) if "\u4e00" <= ch <= "\u9fff"]
        for i in sorted(rng.sample(cjk, min(n, len(cjk))), reverse=True):
            del chars[i]
        return "".join(chars)
    words = query.split()
    long = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha()]
    for i in rng.sample(long, min(n, len(long))):
        words[i] = typo(words[i], rng)
    return " ".join(words)


def runbooks(root: Path) -> list[Path]:
    """The runbooks under ``root`` (section ``_index.md`` pages left out), sorted."""
    return sorted(p for p in root.rglob("*.md") if p.name != "_index.md")


def held_out_corpus(root: Path, heading: str, dest: Path) -> Path:
    """A copy of ``root`` under ``dest`` with the first ``heading`` section of every document
    removed (:func:`without_section`); a file is rewritten only when it differs."""
    for path in sorted(root.rglob("*.md")):
        target = dest / path.relative_to(root)
        text = without_section(path.read_text(encoding="utf-8"), heading)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    return dest


def generate(corpora: Mapping[str, Path], seed: int = SEED) -> list[KnownItem]:
    """Every known-item query (module docstring) of ``corpora`` (language ``en``/``zh`` -> corpus
    root; cross-lingual ones only when both are given), in a stable order. ValueError for a
    language without ``HEADINGS``."""
    unknown = sorted(set(corpora) - set(HEADINGS))
    if unknown:
        raise ValueError(f"known items: no section headings for language(s) {unknown}; known: {sorted(HEADINGS)}")
    items: list[KnownItem] = []
    for lang, root in corpora.items():
        for path in runbooks(root):
            doc = path.relative_to(root).as_posix()
            for heading in HEADINGS[lang]:
                query = section_text(path, heading)
                if not query:
                    continue
                index = f"{lang}-without-{heading}"
                base = f"{lang}:{doc}:{heading}"
                variants = {
                    "section": query,
                    "truncated": truncated(query, lang),
                    "word-drop": word_drop(query, lang, rng_for(seed, doc, heading, "drop")),
                    "typo": with_typos(query, lang, rng_for(seed, doc, heading, "typo")),
                }
                seen: set[str] = set()
                for kind, text in variants.items():
                    if len(text) >= MIN_QUERY_CHARS and text not in seen:
                        seen.add(text)
                        items.append(KnownItem(f"{base}:{kind}", text, doc, lang, lang, index, kind, heading))
            title = with_typos(title_of(path).lower(), "en", rng_for(seed, doc, "title"), n=1)
            items.append(KnownItem(f"{lang}:{doc}:title", title, doc, "en", lang, lang, "title"))
    for source, target, headings in CROSSLINGUAL:
        if source not in corpora or target not in corpora:
            continue
        for heading in headings:
            for case in known_item_cases(corpora[source], heading, corpora[target]):
                doc = case.expected_docs[0]
                query = without_names(case.query, corpora[source] / doc)
                if len(query) >= MIN_QUERY_CHARS:
                    item_id = f"{source}->{target}:{doc}:{heading}"
                    items.append(KnownItem(item_id, query, doc, source, target, target, "crosslingual", heading))
    return items


def index_dirs(items: Sequence[KnownItem], corpora: Mapping[str, Path], scratch: Path) -> dict[str, Path]:
    """Knowledge dir of every index the ``items`` name (held-out copies written under ``scratch``)."""
    dirs: dict[str, Path] = {}
    for name in sorted({i.index for i in items}):
        lang, _, heading = name.partition("-without-")
        dirs[name] = held_out_corpus(corpora[lang], heading, scratch / name) if heading else corpora[lang]
    return dirs


def size_table(items: Sequence[KnownItem]) -> str:
    """Queries per (query language -> corpus) and kind, with the documents asked for, as Markdown."""
    counts = Counter((i.group, i.kind) for i in items)
    kinds = sorted({k for _, k in counts})
    groups = sorted({g for g, _ in counts})
    docs = {g: len({i.doc_id for i in items if i.group == g}) for g in groups}
    rows = [
        [g, str(docs[g]), *(str(counts[(g, k)]) for k in kinds), str(sum(counts[(g, k)] for k in kinds))]
        for g in groups
    ]
    return md_table(["query -> corpus", "docs", *kinds, "total"], rows)
