"""Heading-aware chunking of a ``KnowledgeDocument`` body into ``Chunk``s under a token budget.

A section is a top-level heading (ATX or setext, found by markdown-it-py, so ``#`` lines in
fenced code are not headings) plus everything up to the next heading of any level. Content
before the first heading is a section too. A section whose content is blank (heading only)
makes no chunk of its own: its heading lines are carried into the next section's first chunk
(or, at the end of the document, appended to the last section), so every non-blank character
of the body lies in some chunk's ``[start, end)``.

The breadcrumb is the document title followed by the heading path; the first H1 is left out
when it is the first heading or its text is the title (it names the document, not a part).

Every chunk's ``embed_text`` (breadcrumb, blank line, text) counts at most ``max_tokens``
with the given ``count_tokens``. A section over the budget is cut into its top-level blocks;
a block still over it is cut at blank lines, then sentence ends (``. ! ?`` and ``。！？；``),
then line breaks, then hard at a character point found by counting tokens. A fenced or
indented code block is cut only at line breaks (then hard). A table is cut between rows and
its header row and separator are repeated at the top of every later piece: such a chunk's
``text`` is ``header + body[start:end]``, not a pure slice (``start``/``end`` are the
offsets of the rows it covers). Adjacent pieces of one section are then merged greedily up
to the budget, adding up their counts.

Counting is the cost (the tokenizer call, not Python): sizes guide what to count, runs of
blocks or sentences that look like they fit are counted as one, text that is obviously too
long is cut before it is counted, and a small section is counted once with its breadcrumb.
So most text is tokenised about once and chunking stays linear in the body size.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import pairwise

from markdown_it import MarkdownIt
from markdown_it.token import Token

from rag_core.ingest.documents import collapse_ws, inline_text
from rag_core.models import Chunk, KnowledgeDocument, content_hash

BREADCRUMB_SEPARATOR = " > "
DEFAULT_MAX_TOKENS = 240

_LINE_BREAK = re.compile(r"\r\n?|\n")  # markdown-it's own line breaks, so line maps agree
_BLANK_LINE = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])\s*")
_NEWLINE = re.compile(r"\n")
_TEXT_LEVELS = (_BLANK_LINE, _SENTENCE_END, _NEWLINE)
_CODE_LEVELS = (_NEWLINE,)
_ROW_LEVELS = (_SENTENCE_END,)
# Tokens allowed for each place where two separately counted texts are joined (pieces of a
# chunk, breadcrumb + text). WordPiece counts add up exactly across whitespace; the margin
# keeps the limit for counters that may gain a token there (e.g. BPE merging newlines).
_JOIN_MARGIN = 1
_MAX_REPAIRS = 6
_BYTES_PER_TOKEN_START = 3.0  # size guess until the section's own counts say better
_GUESS_SAFETY = 0.9


@lru_cache(maxsize=1)
def _body_parser() -> MarkdownIt:
    # No frontmatter plugin: the body has none, and a leading '---' is a thematic break here.
    return MarkdownIt("commonmark").enable("table").disable("inline")


@dataclass(frozen=True)
class _Block:
    kind: str  # "heading", "table", "code" or "text"
    start: int  # first line (0-based)
    end: int  # line after the block
    level: int = 0
    title: str = ""


@dataclass(frozen=True)
class _Section:
    path: tuple[str, ...]  # heading texts below the title
    start: int  # first line, including heading lines carried in from empty sections
    content: int  # first line after the section's own heading
    end: int


@dataclass(frozen=True)
class _Piece:
    start: int  # character offsets into the body
    end: int
    tokens: int  # of prefix + body[start:end], plus _JOIN_MARGIN per join inside
    prefix: str = ""  # repeated table header, when the piece continues a table
    recount: bool = False  # joined mid-word: the sum may be off, count the text again


def _blocks(tokens: list[Token]) -> list[_Block]:
    """Top-level blocks in order; headings carry their level and plain text."""
    out = []
    for i, tok in enumerate(tokens):
        if tok.level != 0 or tok.nesting < 0 or not tok.map:
            continue
        start, end = tok.map
        if tok.type == "heading_open":
            out.append(_Block("heading", start, end, int(tok.tag[1]), inline_text(tokens[i + 1].content)))
        elif tok.type == "table_open":
            out.append(_Block("table", start, end))
        elif tok.type in ("fence", "code_block"):
            out.append(_Block("code", start, end))
        else:
            out.append(_Block("text", start, end))
    return out


def _title_heading(heads: Sequence[_Block], title: str) -> int | None:
    """Index of the H1 that names the document (left out of breadcrumbs), if any."""
    first_h1 = next((i for i, h in enumerate(heads) if h.level == 1), None)
    if first_h1 is None:
        return None
    if first_h1 == 0 or heads[first_h1].title == collapse_ws(title):
        return first_h1
    return None


def _sections(blocks: Sequence[_Block], n_lines: int, title: str) -> list[_Section]:
    """Heading-delimited sections covering lines ``[0, n_lines)`` with their heading paths."""
    heads = [b for b in blocks if b.kind == "heading"]
    skip = _title_heading(heads, title)
    first = heads[0].start if heads else n_lines
    sections = [_Section((), 0, 0, first)] if first > 0 else []
    stack: list[tuple[int, str]] = []
    for i, head in enumerate(heads):
        while stack and stack[-1][0] >= head.level:
            stack.pop()
        if i != skip and head.title:
            stack.append((head.level, head.title))
        end = heads[i + 1].start if i + 1 < len(heads) else n_lines
        sections.append(_Section(tuple(t for _, t in stack), head.start, head.end, end))
    return sections


def _carry_empty(sections: list[_Section], has_content: Callable[[_Section], bool]) -> list[_Section]:
    """Fold heading-only sections into the next section with content (or the last one)."""
    out: list[_Section] = []
    pending: int | None = None
    for section in sections:
        if not has_content(section):
            pending = section.start if pending is None else pending
            continue
        if pending is not None:
            section, pending = replace(section, start=pending), None
        out.append(section)
    if pending is not None and out:
        out[-1] = replace(out[-1], end=sections[-1].end)
    return out


def _run_end(sizes: Sequence[int], i: int, limit: float) -> int:
    """End (exclusive) of the longest run from ``i`` whose summed size is within ``limit``."""
    j, total = i, 0
    while j < len(sizes) and total + sizes[j] <= limit:
        total, j = total + sizes[j], j + 1
    return j


def _chunk_id(doc_id: str, section_key: str, ordinal: int) -> str:
    return hashlib.sha1(f"{doc_id}\x1f{section_key}\x1f{ordinal}".encode()).hexdigest()[:32]


def _cuts(pattern: re.Pattern[str], text: str, lo: int, hi: int) -> list[int]:
    """Positions strictly inside (lo, hi) where a new piece may start."""
    return sorted({m.end() for m in pattern.finditer(text, lo, hi) if lo < m.end() < hi})


class _Chunker:
    """Holds one body, its line offsets and the counter; see ``chunk_document``."""

    def __init__(self, doc: KnowledgeDocument, count_tokens: Callable[[str], int], max_tokens: int):
        # Counts of separate texts add up only without the counter's fixed part (e5 counts a
        # "passage: " prefix and [CLS]/[SEP] on every call): count content, budget the rest once.
        overhead = count_tokens("")
        self.doc, self.body, self.max_tokens = doc, doc.body, max_tokens - overhead
        self.count: Callable[[str], int] = lambda text: count_tokens(text) - overhead
        self.line_starts = [0, *(m.end() for m in _LINE_BREAK.finditer(self.body))]
        self.blocks = _blocks(_body_parser().parse(self.body))
        self.ascii = self.body.isascii()
        self.seen_bytes = self.seen_tokens = 0
        self.block_starts = [b.start for b in self.blocks]

    # -- offsets ---------------------------------------------------------------------------
    def off(self, line: int) -> int:
        return self.line_starts[line] if line < len(self.line_starts) else len(self.body)

    def tokens(self, lo: int, hi: int) -> int:
        """Exact count of ``body[lo:hi]``; also teaches the size-per-token guess."""
        tokens = self.count(self.body[lo:hi])
        self.seen_bytes += self.size(lo, hi)
        self.seen_tokens += tokens
        return tokens

    def size(self, lo: int, hi: int) -> int:
        """UTF-8 bytes of ``body[lo:hi]`` (a CJK character is 3 bytes and about one token)."""
        return hi - lo if self.ascii else len(self.body[lo:hi].encode())

    @property
    def bytes_per_token(self) -> float:
        """What this section's counts say a token takes (3 until a few counts are in)."""
        if self.seen_tokens < 200:
            return _BYTES_PER_TOKEN_START
        return max(1.0, self.seen_bytes / self.seen_tokens)

    def likely_fits(self, size: float, budget: int) -> bool:
        """Guess from the size alone; a wrong guess only costs a counter call."""
        return size <= budget * self.bytes_per_token * _GUESS_SAFETY

    def surely_over(self, lo: int, hi: int, budget: int) -> bool:
        """True when ``[lo, hi)`` is far too long to be worth counting before cutting it."""
        return hi - lo > budget and self.size(lo, hi) > budget * self.bytes_per_token * 1.5

    # -- sections --------------------------------------------------------------------------
    def sections(self) -> list[_Section]:
        raw = _sections(self.blocks, len(self.line_starts), self.doc.title)
        return _carry_empty(raw, lambda s: bool(self.body[self.off(s.content) : self.off(s.end)].strip()))

    def breadcrumb(self, path: tuple[str, ...]) -> str:
        """Title and heading path, cut to half of ``max_tokens`` so room for text remains."""
        crumb = BREADCRUMB_SEPARATOR.join((collapse_ws(self.doc.title), *path))
        limit = self.max_tokens // 2
        # No subword tokenizer makes more tokens than UTF-8 bytes: short ones need no count.
        if len(crumb.encode()) <= limit or self.count(crumb) <= limit:
            return crumb
        lo, hi = 0, len(crumb)  # longest prefix that fits, then an ellipsis
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.count(crumb[:mid] + "…") <= limit else (lo, mid - 1)
        return crumb[:lo].rstrip() + "…"

    def section_texts(self, section: _Section) -> tuple[str, list[tuple[int, int, str]]]:
        """(breadcrumb, [(start, end, text)]) of one section's chunks.

        A section that looks small enough is counted once with its breadcrumb, which is all
        most sections need. Size guesses learn within the section only: its cuts must not
        depend on the rest of the document, or an edit elsewhere would change its chunks.
        """
        self.seen_bytes = self.seen_tokens = 0
        crumb = self.breadcrumb(section.path)
        lo, hi = self.off(section.start), self.off(section.end)
        if (
            self.likely_fits(self.size(lo, hi) + len(crumb.encode()), self.max_tokens)
            and self.count(f"{crumb}\n\n{self.body[lo:hi]}") <= self.max_tokens
        ):
            return crumb, self.checked([_Piece(lo, hi, 0)], crumb, 0)
        budget = self.max_tokens - self.count(crumb) - _JOIN_MARGIN
        pieces = self.merge(self.section_pieces(section, budget), budget)
        return crumb, self.checked(pieces, crumb, budget)

    # -- cutting ---------------------------------------------------------------------------
    def section_pieces(self, section: _Section, budget: int) -> list[_Piece]:
        """Pieces of one section, each within ``budget`` tokens (header repeats included).

        Its top-level blocks are packed: blocks over the budget are cut by kind, and the
        heading's tokens are reserved so it can always join the first piece.
        """
        lo, head_hi = self.off(section.start), self.off(section.content)
        head = self.split(lo, head_hi, budget, _TEXT_LEVELS)
        head_tokens = sum(p.tokens + _JOIN_MARGIN for p in head)
        room = budget - head_tokens if head_tokens <= budget // 2 else budget
        units = list(self.units(section))
        kinds = {ulo: (kind, block, uhi) for kind, block, ulo, uhi in units}

        def cut_unit(ulo: int, uhi: int) -> list[_Piece]:
            kind, block, _ = kinds[ulo]
            if kind == "table" and block is not None:  # "table" only comes from a block
                return self.table_pieces(block, ulo, uhi, room)
            return self.split(ulo, uhi, room, _CODE_LEVELS if kind == "code" else _TEXT_LEVELS)

        bounds = [u[2] for u in units] + [units[-1][3]] if units else []
        return head + self.pack(bounds, room, cut_unit)

    def units(self, section: _Section) -> Iterator[tuple[str, _Block | None, int, int]]:
        """(kind, block, lo, hi) per top-level block of the section's content; gaps go before."""
        first = bisect.bisect_left(self.block_starts, section.content)
        last = bisect.bisect_left(self.block_starts, section.end)
        blocks = self.blocks[first:last]
        bounds = [section.content, *(b.start for b in blocks if b.start > section.content), section.end]
        by_start = {b.start: b for b in blocks}
        for a, b in pairwise(bounds):
            block = by_start.get(a)
            kind = block.kind if block is not None else "text"
            if self.off(a) < self.off(b):
                yield kind, block, self.off(a), self.off(b)

    def split(
        self, lo: int, hi: int, budget: int, levels: Sequence[re.Pattern[str]], tokens: int | None = None
    ) -> list[_Piece]:
        """Cut ``[lo, hi)`` at the first level that has cut points, recursing; hard last."""
        if lo >= hi:
            return []
        if tokens is None and not (levels and self.surely_over(lo, hi, budget)):
            tokens = self.tokens(lo, hi)
        if tokens is not None and tokens <= budget:
            return [_Piece(lo, hi, tokens)]
        for i, pattern in enumerate(levels):
            cuts = _cuts(pattern, self.body, lo, hi)
            if cuts:
                rest = levels[i + 1 :]

                def cut_rest(a: int, b: int, rest: Sequence[re.Pattern[str]] = rest) -> list[_Piece]:
                    return self.split(a, b, budget, rest)

                return self.pack([lo, *cuts, hi], budget, cut_rest)
        return self.hard_split(lo, hi, budget)

    def pack(self, bounds: Sequence[int], budget: int, cut_one: Callable[[int, int], list[_Piece]]) -> list[_Piece]:
        """Pieces for the consecutive ranges ``bounds[k]..bounds[k+1]``.

        Runs of ranges that look like they fit together (by size) are counted as one, so a
        run of sentences or blocks costs one counter call, not one each; otherwise the first
        range goes alone through ``cut_one`` (which counts and cuts it).
        """
        out: list[_Piece] = []
        sizes = [self.size(a, b) for a, b in pairwise(bounds)]
        i = 0
        while i < len(sizes):
            run = self.run_piece(bounds, sizes, i, budget)
            if run is not None:
                out.append(run)
                i = bounds.index(run.end, i)
            else:
                out += cut_one(bounds[i], bounds[i + 1])
                i += 1
        return out

    def run_piece(self, bounds: Sequence[int], sizes: Sequence[int], i: int, budget: int) -> _Piece | None:
        """One piece of two or more ranges from ``i`` that fits, or None. A run that turns
        out too big is retried once, shortened by what its count showed."""
        limit = budget * self.bytes_per_token * _GUESS_SAFETY
        for _ in range(2):
            j = _run_end(sizes, i, limit)
            if j - i < 2:
                return None
            tokens = self.tokens(bounds[i], bounds[j])
            if tokens <= budget:
                return _Piece(bounds[i], bounds[j], tokens)
            limit = sum(sizes[i:j]) * budget / tokens * _GUESS_SAFETY
        return None

    def hard_split(self, lo: int, hi: int, budget: int) -> list[_Piece]:
        out = []
        chars_per_token = 4.0  # first guess; then learnt from the previous cut
        while lo < hi:
            end, tokens = self.fit(lo, hi, budget, chars_per_token)
            out.append(_Piece(lo, end, tokens))
            chars_per_token = max(0.5, (end - lo) / max(tokens, 1))
            lo = end
        return out

    def fit(self, lo: int, hi: int, budget: int, chars_per_token: float) -> tuple[int, int]:
        """Long ``[lo, end)`` (ending after whitespace when possible) within ``budget``.

        Secant steps on the token count from a guess at ``chars_per_token``, falling back to
        bisection; stops within about 1/16 of the best length. A few counts of about one
        piece's length each, not one per character.
        """
        good, good_tokens, bad = lo, 0, hi + 1
        guess = min(hi, lo + max(1, int(budget * chars_per_token)))
        for _ in range(64):
            tokens = self.tokens(lo, guess)
            if tokens <= budget:
                good, good_tokens = guess, tokens
            else:
                bad = guess
            if good == hi or bad - good <= max(1, (good - lo) // 16):
                break
            step = lo + (guess - lo) * budget // max(tokens, 1)
            guess = step if good < step < bad else (good + bad) // 2
        if good == lo:  # not even one character fits: take it anyway, the repair pass copes
            return lo + 1, self.tokens(lo, lo + 1)
        if good < hi:
            space = max(self.body.rfind(" ", (lo + good) // 2, good), self.body.rfind("\n", (lo + good) // 2, good))
            if space > lo:
                at_space = self.tokens(lo, space + 1)
                if at_space <= budget:
                    return space + 1, at_space
        return good, good_tokens

    def table_pieces(self, block: _Block, lo: int, hi: int, budget: int) -> list[_Piece]:
        """Rows packed under ``budget`` with header + separator repeated on later pieces."""
        header_lo, header_hi = self.off(block.start), self.off(block.start + 2)
        header = self.body[header_lo:header_hi]
        header_tokens = self.count(header)
        rows = [[self.off(line), self.off(line + 1)] for line in range(block.start + 2, block.end)]
        if header_tokens > budget // 2 or not rows or header_lo != lo:
            return self.split(lo, hi, budget, _CODE_LEVELS)
        rows[-1][1] = hi  # trailing blank lines ride with the last row
        pieces = [_Piece(lo, header_hi, header_tokens)]
        open_piece = True  # pieces[-1] holds the header (original or repeated)
        for row_lo, row_hi in rows:
            row_tokens = self.tokens(row_lo, row_hi)
            last, joined = pieces[-1], pieces[-1].tokens + row_tokens + _JOIN_MARGIN
            if open_piece and joined <= budget:
                pieces[-1] = replace(last, end=row_hi, tokens=joined)
            elif header_tokens + row_tokens + _JOIN_MARGIN <= budget:
                pieces.append(_Piece(row_lo, row_hi, header_tokens + row_tokens + _JOIN_MARGIN, prefix=header))
                open_piece = True
            else:  # one row alone is too big: cut it like text, without the header
                pieces += self.split(row_lo, row_hi, budget, _ROW_LEVELS, row_tokens)
                open_piece = False
        return pieces

    # -- merging and checking --------------------------------------------------------------
    def merge(self, pieces: Sequence[_Piece], budget: int) -> list[_Piece]:
        """Greedy left-to-right merge of adjacent pieces while the sum fits ``budget``."""
        out: list[_Piece] = []
        for piece in pieces:
            last = out[-1] if out else None
            tokens = last.tokens + piece.tokens + _JOIN_MARGIN if last else 0
            if last and not piece.prefix and last.end == piece.start and tokens <= budget:
                mid_word = not (self.body[piece.start - 1].isspace() or self.body[piece.start].isspace())
                out[-1] = replace(last, end=piece.end, tokens=tokens, recount=last.recount or piece.recount or mid_word)
            else:
                out.append(piece)
        return out

    def text_of(self, piece: _Piece) -> tuple[int, int, str]:
        """(start, end, text) with surrounding whitespace trimmed off the slice."""
        raw = self.body[piece.start : piece.end]
        stripped = raw.rstrip()
        lead = 0 if piece.prefix else len(stripped) - len(stripped.lstrip())
        start, end = piece.start + lead, piece.start + len(stripped)
        return start, end, piece.prefix + self.body[start:end]

    def checked(self, pieces: list[_Piece], crumb: str, budget: int, depth: int = 0) -> list[tuple[int, int, str]]:
        """Final (start, end, text) triples, trimmed; blank pieces dropped.

        A piece joined mid-word (hard cuts) is counted again with its breadcrumb and, if
        over the limit, cut with a tighter budget. After ``_MAX_REPAIRS`` rounds it is kept
        rather than losing text.
        """
        out = []
        for piece in pieces:
            start, end, text = self.text_of(piece)
            if not text.strip():
                continue
            over = self.count(f"{crumb}\n\n{text}") - self.max_tokens if piece.recount else 0
            if over <= 0 or depth >= _MAX_REPAIRS or end - start <= 1:
                out.append((start, end, text))
                continue
            tighter = max(1, budget - over - 1)
            again = self.merge(self.split(start, end, tighter, _TEXT_LEVELS), tighter)
            if len(again) == 1:  # no cut point helped: cut by characters
                again = self.hard_split(start, end, tighter)
            out += self.checked([replace(p, recount=True) for p in again], crumb, tighter, depth + 1)
        return out


def chunk_document(
    doc: KnowledgeDocument, count_tokens: Callable[[str], int], max_tokens: int = DEFAULT_MAX_TOKENS
) -> list[Chunk]:
    """Split ``doc.body`` into heading-aware chunks whose ``embed_text`` fits ``max_tokens``.

    ``count_tokens(text) -> int`` is the embedding model's counter (e.g.
    ``Embedder.count_tokens``). Returns chunks in body order with ``ordinal``
    0..n-1. ``start``/``end`` are character offsets into ``doc.body`` and ``text ==
    body[start:end]`` (whitespace at the ends trimmed), except a continued table piece whose
    ``text`` starts with the repeated table header. ``chunk_id`` is
    ``sha1(doc_id \\x1f heading path \\x1f ordinal within section)[:32]``, where a heading
    path that occurs twice in a document gets ``#2``, ``#3``... so ids stay unique; ids of
    untouched sections survive edits elsewhere. ``content_hash`` is sha256 of the
    lexical analyzer version, title, breadcrumb, category and text joined with ``\\x1f``.
    A body with no non-heading content yields ``[]``. Raises ``ValueError`` when ``max_tokens``
    leaves under 8 tokens beyond the counter's fixed part ``count_tokens("")``.
    """
    if max_tokens - count_tokens("") < 8:
        raise ValueError(f"max_tokens must leave at least 8 tokens for content, got {max_tokens}")
    chunker = _Chunker(doc, count_tokens, max_tokens)
    chunks: list[Chunk] = []
    seen: dict[str, int] = {}
    for section in chunker.sections():
        path_key = BREADCRUMB_SEPARATOR.join(section.path)
        seen[path_key] = seen.get(path_key, 0) + 1
        key = path_key if seen[path_key] == 1 else f"{path_key}#{seen[path_key]}"
        crumb, texts = chunker.section_texts(section)
        for i, (start, end, text) in enumerate(texts):
            chunks.append(
                Chunk(
                    chunk_id=_chunk_id(doc.doc_id, key, i),
                    doc_id=doc.doc_id,
                    title=doc.title,
                    breadcrumb=crumb,
                    category=doc.category,
                    text=text,
                    start=start,
                    end=end,
                    ordinal=len(chunks),
                    content_hash=content_hash(doc.title, crumb, doc.category, text),
                )
            )
    return chunks
