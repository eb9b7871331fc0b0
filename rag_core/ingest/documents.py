"""Load Markdown knowledge documents: frontmatter, title/category fallbacks, bad-input reports.

``load_document`` reads one file and returns a ``KnowledgeDocument`` or raises a
``DocumentProblem`` (``DocumentError`` for a broken document, ``SkipDocument`` for one left
out on purpose, such as an ``_index.md`` section page with no body). ``scan_documents``
walks a knowledge root and never lets one bad file stop the batch.

Frontmatter is located with markdown-it-py's ``front_matter_plugin`` and read with PyYAML's
safe loader. Only the top of a document is parsed here (enough to find the frontmatter and
the first H1), so loading a multi-megabyte document stays cheap; chunking parses the body.
"""

from __future__ import annotations

import base64
import datetime as dt
import errno
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.front_matter import front_matter_plugin

from rag_core.models import DocumentIssue, KnowledgeDocument

MARKDOWN_SUFFIXES = (".md", ".markdown")
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
SECTION_PAGE_NAMES = frozenset({"_index.md", "_index.markdown"})

SECTION_PAGE_REASON = "section page with no body"
EMPTY_FILE_REASON = "empty file"
NO_BODY_REASON = "frontmatter only, no body"

_BOM = b"\xef\xbb\xbf"
# A line that could be (part of) an H1: ATX '#' or a setext '===' underline. Used only to
# prove there is no H1 further on, so a big document without one is not parsed whole.
_MAYBE_H1 = re.compile(r"^ {0,3}(?:#(?:[ \t]|$)|=+[ \t]*$)", re.MULTILINE)
_INLINE_MARKUP = re.compile(r"[\\`*_\[\]<>&!~]")
_LIST_FIELDS = ("keywords", "entities", "aliases")
_LIST_SEPARATORS = re.compile(r"[,，、]")  # ASCII, full-width and ideographic enumeration comma
# A frontmatter with more values than this is not a knowledge document's metadata
# (YAML aliases can make a tiny file expand enormously).
_MAX_FRONTMATTER_VALUES = 10_000


class DocumentProblem(Exception):
    """Base of the per-document exceptions; ``issue`` says which file, line and why."""

    def __init__(self, issue: DocumentIssue):
        super().__init__(str(issue))
        self.issue = issue


class DocumentError(DocumentProblem):
    """The document is broken (unreadable, bad frontmatter, ...) and is not ingested."""


class SkipDocument(DocumentProblem):
    """The document is left out on purpose (empty file, section page without a body)."""


# --- Markdown helpers shared with chunking ------------------------------------------------


@lru_cache(maxsize=1)
def block_parser() -> MarkdownIt:
    """CommonMark + GFM tables + frontmatter, block level only (inline parsing disabled).

    Token ``.map`` gives 0-based ``[start_line, end_line)``; headings' inline tokens keep
    the raw heading source in ``.content`` (see ``inline_text``).
    """
    return MarkdownIt("commonmark").use(front_matter_plugin).enable("table").disable("inline")


@lru_cache(maxsize=1)
def _inline_parser() -> MarkdownIt:
    return MarkdownIt("commonmark")


def collapse_ws(text: str) -> str:
    """Whitespace runs (including newlines and ``\\r``) to one space, ends stripped."""
    return " ".join(text.split())


def inline_text(source: str) -> str:
    """Plain text of inline Markdown (a heading's source): markup, links and HTML dropped."""
    if not _INLINE_MARKUP.search(source):
        return collapse_ws(source)  # nothing to render: skip the inline parser (hot path)
    tokens = _inline_parser().parseInline(source)
    text = "".join(_plain(tokens[0].children or [])) if tokens else ""
    return collapse_ws(text) or collapse_ws(source)


def _plain(tokens: list[Token]) -> Iterator[str]:
    for tok in tokens:
        if tok.type in ("text", "code_inline"):
            yield tok.content
        elif tok.type in ("softbreak", "hardbreak"):
            yield " "
        elif tok.children:
            yield from _plain(tok.children)


def normalize_newlines(text: str) -> str:
    """``\\r\\n`` and lone ``\\r`` to ``\\n`` (what markdown-it does, so line maps agree)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


# --- Reading and decoding ------------------------------------------------------------------


def doc_id_for(path: Path, root: Path) -> str:
    """POSIX path of ``path`` relative to ``root``; the absolute path when outside the root.

    Symlinks are not resolved: the id is where the file appears in the knowledge tree.
    """
    abs_path = Path(os.path.abspath(path))
    try:
        return abs_path.relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        return abs_path.as_posix()


def _fail(doc_id: str, reason: str, line: int | None = None) -> DocumentError:
    return DocumentError(DocumentIssue(path=doc_id, reason=reason, line=line))


def _check_link(path: Path, root: Path, doc_id: str) -> None:
    """Refuse files whose real location is outside the root (symlink escape)."""
    if not os.path.lexists(path):
        raise _fail(doc_id, "file not found")
    if not path.exists():
        raise _fail(doc_id, f"{_dangling_kind(path)} (-> {os.readlink(path)})")
    if Path(doc_id).is_absolute():
        return  # caller asked for a file outside the root; nothing to escape from
    real, real_root = path.resolve(), root.resolve()
    if not real.is_relative_to(real_root):
        raise _fail(doc_id, f"symlink points outside the knowledge root (-> {real}); not followed")
    if not real.is_file():
        raise _fail(doc_id, "not a regular file")


def _dangling_kind(path: Path) -> str:
    """``symlink loop`` when following ``path`` loops (ELOOP), else ``broken symlink``."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop"
    return "broken symlink"


def _read_bytes(path: Path, doc_id: str, max_bytes: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise _fail(doc_id, f"file is {size} bytes, over the max_bytes limit of {max_bytes}")
        return path.read_bytes()
    except OSError as exc:
        raise _fail(doc_id, f"cannot read file: {exc.strerror or exc}") from exc


def _decode(raw: bytes, doc_id: str) -> str:
    """UTF-8 text with BOM removed and newlines normalised; binary / bad UTF-8 raise."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise _fail(doc_id, f"binary file (NUL byte at byte offset {nul})", line)
    offset = len(_BOM) if raw.startswith(_BOM) else 0
    try:
        text = raw[offset:].decode("utf-8")
    except UnicodeDecodeError as exc:
        pos = offset + exc.start
        line = raw.count(b"\n", 0, pos) + 1
        reason = f"not valid UTF-8: byte 0x{raw[pos]:02x} at byte offset {pos}"
        raise _fail(doc_id, reason, line) from exc
    return normalize_newlines(text)


# --- Locating frontmatter and the first H1 ---------------------------------------------------


@dataclass(frozen=True)
class _Head:
    """What the top of a document holds: frontmatter (source, line span) and the first H1."""

    frontmatter: str | None
    fm_end_line: int  # first body line (0 when there is no frontmatter)
    h1: str | None


def _opens_frontmatter(text: str) -> bool:
    """First line is exactly ``---`` (what a YAML frontmatter block opens with)."""
    end = text.find("\n")
    return text[: end if end >= 0 else len(text)].rstrip() == "---"


def _prefix(text: str, n_lines: int) -> tuple[str, bool]:
    """The first ``n_lines`` lines of ``text`` and whether that is the whole text."""
    pos = -1
    for _ in range(n_lines):
        pos = text.find("\n", pos + 1)
        if pos < 0:
            return text, True
    return text[: pos + 1], pos + 1 >= len(text)


def _scan_head(text: str, doc_id: str) -> _Head:
    """Parse growing prefixes until the frontmatter and the first H1 are settled.

    A block that ends before the prefix's last line cannot change when more text follows
    (Markdown blocks are decided top-down), so those tokens are final. Documents with no H1
    end up parsed whole, which costs about 1 s per MB of list-heavy Markdown.
    """
    n_lines = 256
    while True:
        src, complete = _prefix(text, n_lines)
        settled_lines = src.count("\n") - 1 if not complete else math.inf
        tokens = block_parser().parse(src)
        has_fm = bool(tokens) and tokens[0].type == "front_matter"
        if not has_fm and _opens_frontmatter(src):
            if complete:
                raise _fail(doc_id, "frontmatter opened with '---' is never closed", 1)
            n_lines *= 4
            continue
        h1 = _first_h1(tokens, settled_lines)
        if h1 is not None or complete or not _MAYBE_H1.search(text, _line_start(src, n_lines - 2)):
            fm = tokens[0] if has_fm else None
            return _Head(fm.content if fm else None, fm.map[1] if fm and fm.map else 0, h1)
        n_lines *= 4


def _first_h1(tokens: list[Token], settled_lines: float) -> str | None:
    """Text of the first top-level H1, or None when none is settled yet (or there is none)."""
    for i, tok in enumerate(tokens):
        if not tok.map or tok.level != 0:
            continue
        if tok.map[1] > settled_lines:
            return None  # this block may still grow (e.g. into a setext heading)
        if tok.type == "heading_open" and tok.tag == "h1":
            return inline_text(tokens[i + 1].content)
    return None


def _line_start(text: str, line: int) -> int:
    pos = 0
    for _ in range(line):
        nxt = text.find("\n", pos)
        if nxt < 0:
            return len(text)
        pos = nxt + 1
    return pos


# --- Frontmatter fields --------------------------------------------------------------------


def _load_yaml(source: str, doc_id: str) -> tuple[Any, dict[str, yaml.Node]]:
    """Constructed YAML data plus the key -> value node map (for literal text and lines).

    Raises DocumentError with the 1-based source line (frontmatter starts on line 2).
    """
    loader = yaml.SafeLoader(source)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 2 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _fail(doc_id, f"invalid YAML frontmatter: {problem}", line) from exc
    finally:
        loader.dispose()
    nodes: dict[str, yaml.Node] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:  # last one wins, as in the constructed dict
            if isinstance(key, yaml.ScalarNode):
                nodes[str(key.value).strip().lower()] = value
    return data, nodes


def duplicate_keys(source: str, doc_id: str) -> list[DocumentIssue]:
    """One warning per frontmatter key given more than once, case-insensitively (``title:``
    twice, or ``Title:`` and ``title:``), at the line of the repeat. The last value wins, as
    in YAML's own mapping construction; the document is still ingested."""
    try:
        node = yaml.compose(source, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []  # _load_yaml reports the error itself
    if not isinstance(node, yaml.MappingNode):
        return []
    seen: dict[str, str] = {}
    issues = []
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        folded = str(key.value).strip().lower()
        if folded in seen:
            issues.append(
                DocumentIssue(
                    path=doc_id,
                    line=key.start_mark.line + 2,
                    reason=f"frontmatter key '{key.value}' repeats '{seen[folded]}': the last value wins",
                )
            )
        else:
            seen[folded] = str(key.value)
    return issues


def _node_line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 2 if node is not None else None


def _scalar_text(value: Any, node: yaml.Node | None) -> str | None:
    """The author's literal text of a scalar (``1.10`` stays ``1.10``, ``yes`` stays ``yes``)."""
    if value is None or isinstance(value, (list, dict, set, tuple, bytes)):
        return None
    if isinstance(node, yaml.ScalarNode):
        return str(node.value)
    return value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else str(value)


def _text_field(fm: dict[str, Any], nodes: dict[str, yaml.Node], name: str, doc_id: str) -> str | None:
    value, node = fm.get(name), nodes.get(name)
    if value is None:
        return None
    text = _scalar_text(value, node)
    if text is None:
        kind = type(value).__name__
        raise _fail(doc_id, f"frontmatter field '{name}' must be text, got {kind}", _node_line(node))
    return collapse_ws(text) or None


def _list_field(fm: dict[str, Any], nodes: dict[str, yaml.Node], name: str, doc_id: str) -> tuple[str, ...]:
    """A list or a comma-separated string -> stripped, de-duplicated items (order kept)."""
    value, node = fm.get(name), nodes.get(name)
    if value is None:
        return ()
    if isinstance(value, dict):
        raise _fail(doc_id, f"frontmatter field '{name}' must be a list or text, got a mapping", _node_line(node))
    if isinstance(value, (list, tuple, set)):
        item_nodes = node.value if isinstance(node, yaml.SequenceNode) else [None] * len(value)
        items = []
        for i, (item, item_node) in enumerate(zip(value, item_nodes, strict=True)):
            if item is None:
                continue
            text = _scalar_text(item, item_node)
            if text is None:
                raise _fail(
                    doc_id,
                    f"frontmatter field '{name}' item {i + 1} must be text, got {type(item).__name__}",
                    _node_line(item_node or node),
                )
            items.append(text)
    else:
        items = _LIST_SEPARATORS.split(_scalar_text(value, node) or "")
    cleaned = (collapse_ws(item) for item in items)
    return tuple(dict.fromkeys(item for item in cleaned if item))


def _priority(fm: dict[str, Any], nodes: dict[str, yaml.Node], doc_id: str) -> float | None:
    value = fm.get("priority")
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise _fail(
            doc_id, f"frontmatter field 'priority' must be a number, got {value!r}", _node_line(nodes.get("priority"))
        )
    return number


def _json_safe(value: Any, budget: list[int]) -> Any:
    """Dates -> ISO strings, keys -> str, sets/tuples -> lists, bytes -> base64 (recursively)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("too many values")
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_safe(v, budget) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        items = sorted(value, key=repr) if isinstance(value, set) else value
        return [_json_safe(v, budget) for v in items]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


@dataclass(frozen=True)
class _Fields:
    title: str | None
    category: str | None
    keywords: tuple[str, ...]
    entities: tuple[str, ...]
    aliases: tuple[str, ...]
    priority: float | None
    metadata: dict[str, Any]
    warnings: tuple[DocumentIssue, ...] = ()


def _parse_frontmatter(source: str | None, doc_id: str) -> _Fields:
    data, nodes = _load_yaml(source, doc_id) if source and source.strip() else (None, {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single {type(data).__name__} value"
        raise _fail(doc_id, f"frontmatter must be a mapping of fields, got {kind}", 1)
    fm = {str(k).strip().lower(): v for k, v in data.items()}
    cat_key = "category" if fm.get("category") is not None else "domain"
    used = {"title", cat_key, "priority", *_LIST_FIELDS}
    budget = [_MAX_FRONTMATTER_VALUES]
    try:
        metadata = {str(k): _json_safe(v, budget) for k, v in data.items() if str(k).strip().lower() not in used}
    except ValueError:
        raise _fail(doc_id, f"frontmatter has more than {_MAX_FRONTMATTER_VALUES} values", 1) from None
    keywords, entities, aliases = (_list_field(fm, nodes, f, doc_id) for f in _LIST_FIELDS)
    return _Fields(
        title=_text_field(fm, nodes, "title", doc_id),
        category=_text_field(fm, nodes, cat_key, doc_id),
        keywords=keywords,
        entities=entities,
        aliases=aliases,
        priority=_priority(fm, nodes, doc_id),
        metadata=metadata,
        warnings=tuple(duplicate_keys(source, doc_id)) if source else (),
    )


# --- Public API ------------------------------------------------------------------------------


def load_document(path: Path, root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> KnowledgeDocument:
    """Read one Markdown file under ``root`` into a ``KnowledgeDocument``.

    ``doc_id`` is ``path`` relative to ``root`` (POSIX). Title: frontmatter ``title``, else
    the first H1 (ATX or setext), else the file stem. Category: frontmatter ``category`` (or
    ``domain``), else the first folder under ``root`` (``""`` at the root). ``keywords``,
    ``entities`` and ``aliases`` accept a list or a comma-separated string; ``priority`` must
    be numeric; every other field goes to ``metadata`` with dates as ISO strings. The body has
    BOM removed and newlines normalised to ``\\n``.

    Raises ``DocumentError`` (``.issue`` names the doc, line and reason) for: a symlink
    pointing outside ``root``, a file over ``max_bytes``, a binary file (NUL bytes), invalid
    UTF-8 (byte offset and line), unclosed or invalid YAML frontmatter (source line), a
    frontmatter that is not a mapping, a field of the wrong type. Raises ``SkipDocument`` for
    an empty file and for a document whose body is blank (``_index.md`` section pages).
    """
    path, root = Path(path), Path(root)
    doc_id = doc_id_for(path, root)
    _check_link(path, root, doc_id)
    raw = _read_bytes(path, doc_id, max_bytes)
    text = _decode(raw, doc_id)
    if not text.strip():
        raise SkipDocument(DocumentIssue(path=doc_id, reason=EMPTY_FILE_REASON))
    head = _scan_head(text, doc_id)
    fields = _parse_frontmatter(head.frontmatter, doc_id)
    body = text[_line_start(text, head.fm_end_line) :]
    if not body.strip():
        reason = SECTION_PAGE_REASON if path.name.lower() in SECTION_PAGE_NAMES else NO_BODY_REASON
        raise SkipDocument(DocumentIssue(path=doc_id, reason=reason))
    return KnowledgeDocument(
        doc_id=doc_id,
        title=fields.title or head.h1 or collapse_ws(path.stem) or path.name,
        category=fields.category or _folder_category(doc_id),
        body=body,
        keywords=fields.keywords,
        entities=fields.entities,
        aliases=fields.aliases,
        h1=head.h1,
        priority=fields.priority,
        metadata=fields.metadata,
        body_line_offset=head.fm_end_line,
        warnings=fields.warnings,
    )


def _folder_category(doc_id: str) -> str:
    parts = Path(doc_id).parts
    if Path(doc_id).is_absolute() or len(parts) < 2:
        return ""
    return collapse_ws(parts[0])


def _is_markdown(name: str) -> bool:
    return name.lower().endswith(MARKDOWN_SUFFIXES) and not name.startswith(".")


def _walk(root: Path, issues: list[DocumentIssue]) -> Iterator[tuple[str, Path]]:
    """(doc id, file) of the Markdown files under ``root``; hidden entries skipped, directory
    symlinks not followed. The id is ``doc_id_for``'s, built from the directory's relative path
    once per directory: ``doc_id_for`` per file is pathlib parsing that cost ~0.5 ms a file."""
    real_root = root.resolve()

    def unreadable(exc: OSError) -> None:
        where = doc_id_for(Path(exc.filename), root) if exc.filename else root.as_posix()
        issues.append(DocumentIssue(path=where, reason=f"cannot list directory: {exc.strerror}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=False):
        here = Path(dirpath)
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == os.curdir else rel.replace(os.sep, "/") + "/"
        for name in list(dirnames):
            if name.startswith("."):
                dirnames.remove(name)
            elif (here / name).is_symlink() and not (here / name).resolve().is_relative_to(real_root):
                issues.append(
                    DocumentIssue(
                        path=doc_id_for(here / name, root),
                        reason="symlinked directory points outside the knowledge root; not followed",
                    )
                )
        yield from ((prefix + name, here / name) for name in filenames if _is_markdown(name))


def list_markdown(root: Path) -> tuple[list[Path], list[DocumentIssue]]:
    """The Markdown files under ``root`` (recursively, sorted by doc id) without reading them,
    and one ``DocumentIssue`` per directory that cannot be listed or symlinked directory leading
    outside the root. Cheap (one ``os.walk``): the streaming ingest lists the whole tree first.

    Raises ``FileNotFoundError`` when ``root`` does not exist and ``NotADirectoryError`` when
    it is not a directory.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"knowledge root {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"knowledge root {root} is not a directory")
    issues: list[DocumentIssue] = []
    return [path for _, path in sorted(_walk(root, issues))], issues


def list_doc_ids(root: Path) -> tuple[list[str], list[DocumentIssue]]:
    """``list_markdown`` as sorted doc ids (``root / doc_id`` is the file): strings only, so
    listing 100k files holds ~10 MB, not the ~35 MB of as many ``Path`` objects. Same issues
    and errors as ``list_markdown``."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"knowledge root {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"knowledge root {root} is not a directory")
    issues: list[DocumentIssue] = []
    doc_ids = sorted(doc_id for doc_id, _ in _walk(root, issues))
    return doc_ids, issues


def load_documents(
    paths: Iterable[Path], root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[list[KnowledgeDocument], list[DocumentIssue]]:
    """``load_document`` of each of ``paths``: ``(documents, issues)``, one issue per file that
    failed to load or was skipped on purpose. One bad file never stops the batch."""
    docs: list[KnowledgeDocument] = []
    issues: list[DocumentIssue] = []
    for path in paths:
        try:
            docs.append(load_document(path, root, max_bytes=max_bytes))
        except DocumentProblem as problem:
            issues.append(problem.issue)
    return docs, issues


def scan_documents(
    root: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[list[KnowledgeDocument], list[DocumentIssue]]:
    """Load every ``.md`` / ``.markdown`` file under ``root`` (recursively, sorted by doc id).

    Returns ``(documents, issues)``: one ``DocumentIssue`` per file that failed to load or
    was skipped on purpose (reasons ``SECTION_PAGE_REASON``, ``EMPTY_FILE_REASON``,
    ``NO_BODY_REASON``), plus one per directory symlink leading outside the root. Hidden
    files and directories (leading ``.``) are ignored. One bad file never stops the batch.

    Raises ``FileNotFoundError`` when ``root`` does not exist and ``NotADirectoryError`` when
    it is not a directory.
    """
    root = Path(root)
    paths, issues = list_markdown(root)
    docs, load_issues = load_documents(paths, root, max_bytes=max_bytes)
    return docs, [*issues, *load_issues]


def markdown_files(root: Path) -> list[tuple[str, Path]]:
    """(doc id, file) of the Markdown files ``scan_documents`` reads under ``root``, sorted by
    doc id: the same walk (hidden entries skipped, directory symlinks not followed, symlinked
    directories outside the root refused). Listing problems are ``scan_documents``' to report; a
    missing ``root`` yields ``[]``. For change detection (the Dagster sensor) without loading anything."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(_walk(root, []))
