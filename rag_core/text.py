"""Text normalisation and tokenisation shared by the L0 index and the lexical search channel.

English: NFKC (folds full-width forms), lower case, CamelCase and digit boundaries split
(``KubePodCrashLooping`` -> ``kube pod crash looping``) with the joined form kept too, so an
alert name matches whether it is written as one word or several. Chinese: runs of CJK
characters are segmented with jieba (search mode, which also yields the shorter words inside
long ones). The lexical (BM25) channel indexes Chinese as overlapping character bigrams plus
jieba's words of three or more characters (:func:`lexical_tokens`): bigrams match paraphrases
that segment differently (Lucene's CJKAnalyzer does the same; Kwok 1997, "Comparing
representations in Chinese information retrieval", SIGIR), the long words keep exact phrases.
The L0 index keeps jieba's words, since it matches whole names and keywords.

The lexical channel also drops URLs (a link target is an address, not content: the path
``k8s.io/apiserver/pkg/endpoints/...`` made a certificate runbook match "apiserver ... request")
and adds the acronym of every name of three or more words (``kube-controller-manager`` ->
``kcm``, ``HorizontalPodAutoscaler`` -> ``hpa``, ``kube-state-metrics`` -> ``ksm``), the
way operators abbreviate components in chat; the same analysis runs on queries and chunks.
"""

from __future__ import annotations

import logging
import marshal
import re
import unicodedata
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import Stemmer

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _jieba() -> Any:
    """The jieba module, imported on first use: about 0.2 s (pkg_resources included) that a
    process without Chinese text, such as `rag --help` or an English lookup, does not pay."""
    with warnings.catch_warnings():
        # jieba 0.42.1 (the latest) imports pkg_resources, which warns on stderr at every import.
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import jieba
    jieba.setLogLevel(logging.WARNING)
    return jieba


_dictionary_cache_dir: Path | None = None


def keep_dictionary_in(directory: Path) -> None:
    """Keep jieba's prepared dictionary in ``directory`` (``RagSettings.model_cache_dir``): the
    components that know the data dir call this before any Chinese text is tokenised. Until then
    the dictionary is built in memory and written nowhere (jieba's own default is a
    ``jieba.cache`` in the system temp dir, outside the data dir: issue 46.8)."""
    global _dictionary_cache_dir
    _dictionary_cache_dir = directory


def _segmenter() -> Any:
    """jieba with its dictionary loaded (:func:`_load_dictionary`)."""
    jieba = _jieba()
    if not jieba.dt.initialized:
        _load_dictionary(jieba.dt)
    return jieba


def _load_dictionary(dt: Any) -> None:
    """Load jieba's prefix dictionary into ``dt`` (its ``Tokenizer``): from the prepared file in
    the dictionary directory when there is one (0.3 s), else built from ``dict.txt`` (1-2.4 s on
    this machine) and written there. Done here rather than by ``dt.initialize()`` so that nothing
    is written outside that directory, and the file is named by a digest of the dictionary and
    jieba's version (jieba reuses its default ``jieba.cache`` without checking either). The
    fields set are those ``initialize`` sets; the format is its cache file's (marshal)."""
    from rag_core.model_cache import source_digest

    with dt.lock:
        if dt.initialized:
            return
        path = None
        if _dictionary_cache_dir is not None:
            with dt.get_dict_file() as fh:
                digest = source_digest([Path(fh.name)], _jieba().__version__)
            path = _dictionary_cache_dir / f"jieba-{digest}.marshal"
        dt.FREQ, dt.total = (_read_dictionary(path) if path else None) or _build_dictionary(dt, path)
        dt.initialized = True


def _read_dictionary(path: Path) -> tuple[dict[str, int], int] | None:
    """The prepared dictionary at ``path``; None when it is absent or unreadable (then rebuilt)."""
    try:
        freq, total = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    return freq, total


def _build_dictionary(dt: Any, keep: Path | None) -> tuple[dict[str, int], int]:
    """jieba's (prefix frequencies, total) from its dictionary file, written to ``keep`` (when
    given; a failed write is logged)."""
    from rag_core.fileio import temp_beside

    with dt.get_dict_file() as fh:
        built: tuple[dict[str, int], int] = dt.gen_pfdict(fh)
    if keep is not None:
        try:
            with temp_beside(keep) as tmp:
                Path(tmp).write_bytes(marshal.dumps(built))
        except OSError as exc:
            log.warning("jieba dictionary not kept in %s: %s", keep.parent, exc)
    return built


def warm_up() -> None:
    """Load jieba's dictionary now: it loads on the first Chinese text of a process, which
    costs that call 0.3 s from the prepared file, 1-2.4 s without (measured on this 2-core machine)."""
    _segmenter()


# Bumped whenever lexical_string changes; part of every chunk's content hash, so the next
# ingest rewrites the stores' lexical columns (2: Chinese as character bigrams; 3: URLs dropped,
# acronyms of names of three or more words added).
LEXICAL_ANALYZER_VERSION = 3

_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN = re.compile(rf"[{_CJK}]+|[A-Za-z0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_CAMEL_WORD = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z]+[a-z0-9]*)+\b|\b[a-z]+(?:[A-Z]+[a-z0-9]+)+\b")
_IS_CJK = re.compile(rf"[{_CJK}]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
_URL = re.compile(r"\b(?:https?|ftp)://[^\s)\]>\"'`]+")
# Three or more words joined by hyphens or underscores: ``kube-controller-manager``.
_COMPOUND = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]+(?:[-_][A-Za-z]+){2,}(?![A-Za-z0-9])")
_MIN_ACRONYM_WORDS = 3  # two-letter acronyms ("kp" for kube-proxy) collide with too much

# Function words that carry no retrieval signal; small on purpose (BM25's IDF does the rest).
STOPWORDS = frozenset(
    """a an and are as at be by can do does for from has have how i if in is it its my no not
    of on or our so that the their there this to was we what when where which who why will
    with you your 的 了 是 在 和 与 或 及 吗 呢 啊 吧 我 我们 你 怎么 如何 什么 为什么 一个 这个 那个
    有 没有 会 要 就 都 也 还 被 把 对 从 到 时 时候""".split()
)


def normalize(text: str) -> str:
    """NFKC-normalise (full-width -> ASCII, compatibility forms folded) and drop control chars."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Besides the C0/C1 controls and DEL (category Cc): characters that move the cursor or reorder
# what a terminal shows (line/paragraph separators; the bidirectional controls of "Trojan
# Source", CVE-2021-42574).
_INVISIBLE = frozenset("\u2028\u2029\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def escape_controls(text: str) -> str:
    """``text`` with every control character written out visibly, for a terminal or a report
    line: ``\\n``, ``\\r``, ``\\t``, other C0/C1 controls and DEL as ``\\xNN``, line separators,
    bidi controls and lone surrogates as ``\\uNNNN``; everything else (backslashes included)
    unchanged. A file name or a stored query then cannot start a line of its own, move the
    cursor or send an escape sequence to the operator's terminal."""
    if text.isprintable():  # the common case: nothing to escape (every character above is non-printable)
        return text
    return "".join(_escape_char(ch) for ch in text)


def _escape_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if unicodedata.category(ch) == "Cc":
        return f"\\x{ord(ch):02x}"
    # Cs: a lone surrogate (an undecodable byte of a file name) cannot be written to a terminal.
    return f"\\u{ord(ch):04x}" if ch in _INVISIBLE or unicodedata.category(ch) == "Cs" else ch


_STEMMER = Stemmer.Stemmer("english")
_stem_lock = __import__("threading").Lock()


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Snowball (Porter 2) English stem of a lower-case word: ``failing``/``failed`` -> ``fail``."""
    with _stem_lock:  # PyStemmer objects are not thread-safe
        return cast(str, _STEMMER.stemWord(word))  # PyStemmer has no type stubs


def split_camel(word: str) -> list[str]:
    """``KubePodCrashLooping`` -> ``['Kube', 'Pod', 'Crash', 'Looping']``; ``etcdGRPC`` -> ``['etcd', 'GRPC']``."""
    return _CAMEL.findall(word) or [word]


def split_camel_words(text: str) -> str:
    """``KubeJobCompletion failed`` -> ``Kube Job Completion failed``: CamelCase identifiers
    written out as words (embedding models see whole words; the joined form stays in the
    lexical terms through :func:`tokenize`)."""
    return _CAMEL_WORD.sub(lambda m: " ".join(_CAMEL.findall(m.group(0))), text)


@lru_cache(maxsize=4096)
def _cjk_words(run: str) -> tuple[str, ...]:
    return tuple(w for w in _segmenter().cut_for_search(run) if w.strip())


@lru_cache(maxsize=4096)
def _cjk_bigrams(run: str) -> tuple[str, ...]:
    if len(run) < 2:
        return (run,)
    bigrams = tuple(run[i : i + 2] for i in range(len(run) - 1))
    return bigrams + tuple(w for w in _cjk_words(run) if len(w) > 2)


def tokenize(
    text: str, *, keep_stopwords: bool = False, cjk_bigrams: bool = False, acronyms: bool = False
) -> list[str]:
    """Lower-case retrieval tokens of ``text`` in order (duplicates kept).

    English words are Snowball-stemmed; a CamelCase or mixed word yields its stemmed parts
    and, when it has more than one part, the joined lower-case word unstemmed (the exact
    alert name). Chinese runs give jieba's words, or with ``cjk_bigrams`` overlapping
    character bigrams plus jieba's words of three or more characters. Stop words are dropped
    unless ``keep_stopwords``. ``acronyms`` adds :func:`acronym` of every CamelCase name and
    every hyphen- or underscore-joined name (after the name's own tokens).
    """
    out: list[str] = []
    cjk = _cjk_bigrams if cjk_bigrams else _cjk_words
    text = normalize(text)
    for run in _RUN.findall(text):
        if _IS_CJK.match(run):
            out.extend(w for w in cjk(run) if keep_stopwords or w not in STOPWORDS)
            continue
        parts = [p.lower() for p in split_camel(run)]
        out.extend(stem(p) for p in parts if keep_stopwords or p not in STOPWORDS)
        if len(parts) > 1:
            out.append(run.lower())
            if acronyms:
                out.extend(acronym(parts))
    if acronyms:
        for name in _COMPOUND.findall(text):
            out.extend(acronym(re.split(r"[-_]", name.lower())))
    return out


def acronym(words: list[str]) -> list[str]:
    """``["kube", "controller", "manager"]`` -> ``["kcm"]``: the lower-case initials of a name
    of at least three alphabetic words; ``[]`` otherwise (fewer words, or a number among them)."""
    if len(words) < _MIN_ACRONYM_WORDS or not all(w.isalpha() for w in words):
        return []
    return ["".join(w[0] for w in words).lower()]


def is_cjk(text: str) -> bool:
    """True when ``text`` contains at least one CJK ideograph."""
    return bool(_IS_CJK.search(text))


def script(text: str) -> str | None:
    """``"cjk"`` or ``"latin"``: the script most of ``text``'s words are written in (None when
    it has neither). A Latin word counts as two ideographs, about the length of a Chinese word
    (jieba's words on the Chinese runbook corpus average 1.8 ideographs), so
    "apiserver 老是回 429，一大片请求被拒" is ``cjk`` and an English sentence naming one
    Chinese term stays ``latin``."""
    ideographs = len(_IS_CJK.findall(text))
    latin = 2 * len(_LATIN_WORD.findall(text))
    if ideographs == latin == 0:
        return None
    return "cjk" if ideographs >= latin else "latin"


def lexical_terms(tokens: list[str]) -> list[str]:
    """Tokens in the form the stores' full-text indexes hold: ASCII words only.

    Milvus' analyzers ("standard", "jieba") and PostgreSQL's ``simple`` text search would
    re-segment Chinese words their own way; encoding each CJK token as ``zh`` + UTF-8 hex
    makes both stores index exactly the tokens of :func:`tokenize`, so the lexical channel
    behaves the same on the main path and the sidecar.
    """
    return [("zh" + t.encode("utf-8").hex()) if _IS_CJK.search(t) else t for t in tokens]


def lexical_tokens(text: str) -> list[str]:
    """Store-ready lexical (BM25) tokens of ``text``: :func:`lexical_terms` of
    :func:`tokenize` with Chinese as character bigrams and acronyms, URLs left out (module
    docstring)."""
    return lexical_terms(tokenize(_URL.sub(" ", text), cjk_bigrams=True, acronyms=True))


def lexical_string(text: str) -> str:
    """Space-joined :func:`lexical_tokens` of ``text`` (what the stores' lexical column holds)."""
    return " ".join(lexical_tokens(text))
