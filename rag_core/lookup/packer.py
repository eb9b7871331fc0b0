"""KnowledgeContextPacker: evidence blocks -> one ContextPack under a character budget.

Each block is written as a header (rank, title, doc id, breadcrumb, hit reasons) and its
content. Headers are never cut. Content is shared out by water-filling: every block gets the
same allowance, and what short blocks leave over goes to the longer ones, so the top block
cannot starve the rest. Content beyond its allowance is cut at a line, sentence or fenced
code-block boundary (``cut_content``), never inside a word or a code line, and the cut is marked
with ``TRUNCATED``. When the allowance falls below ``MIN_CONTENT_CHARS``, the lowest-ranked block
is omitted (listed in ``omittedDocIds``) and the share recomputed. Output depends only on the
input (deterministic).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from rag_core.lookup.contracts import ContextPack, EvidenceBlock

MIN_CONTENT_CHARS = 120
STRATEGY = "rank_order_fair_share_boundary_cut"
TRUNCATED = "[… truncated]"
_SEP = "\n\n"
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
# A sentence ends at . ! ? ; followed by a space, or at a CJK full stop, exclamation or question mark.
_SENTENCE_END = re.compile(r"[.!?;](?=\s)|[。！？；]")


def block_header(block: EvidenceBlock) -> str:
    reasons = ", ".join(block.hit_reasons)
    return f"[{block.rank}] {block.title} ({block.doc_id})\nsection: {block.breadcrumb}\nwhy: {reasons}\n"


def water_fill(lengths: list[int], available: int) -> int:
    """The level L with sum(min(n, L)) <= available, as large as possible (L >= 0)."""
    remaining, left = available, len(lengths)
    for n in sorted(lengths):
        share = remaining // left if left else 0
        if n > share:
            return share
        remaining -= n
        left -= 1
    return max(lengths, default=0)


class KnowledgeContextPacker:
    """Packs blocks in rank order into at most ``char_budget`` characters."""

    def __init__(self, char_budget: int = 4000):
        self.char_budget = char_budget

    def pack(self, blocks: list[EvidenceBlock]) -> ContextPack:
        kept = list(blocks)
        while True:
            headers = [block_header(b) for b in kept]
            fixed = sum(len(h) for h in headers) + len(_SEP) * max(0, len(kept) - 1)
            contents = [_close_fences(b.content.strip()) for b in kept]
            level = water_fill([len(c) for c in contents], self.char_budget - fixed)
            starved = any(len(c) > level and level < MIN_CONTENT_CHARS for c in contents)
            if kept and (fixed > self.char_budget or starved):
                kept.pop()  # the lowest-ranked block gives way
                continue
            break
        parts = [h + cut_content(c, level) for h, c in zip(headers, contents, strict=True)]
        packed = _SEP.join(parts)
        return ContextPack(
            packed_text=packed,
            strategy=STRATEGY,
            char_budget=self.char_budget,
            used_chars=len(packed),
            included_doc_ids=[b.doc_id for b in kept],
            omitted_doc_ids=[b.doc_id for b in blocks[len(kept) :]],
        )


def cut_content(content: str, limit: int) -> str:
    """``content`` if it fits in ``limit`` characters, else its longest head that ends at a line,
    sentence or fenced code-block boundary, followed by a line ``TRUNCATED``; at most ``limit``
    characters (the packer only cuts with ``limit >= MIN_CONTENT_CHARS``). A fenced code block is
    kept whole or, when it does not fit, replaced by one line saying how many lines it had."""
    if len(content) <= limit:
        return content
    room = limit - len(TRUNCATED) - 1
    kept: list[str] = []
    used = -1  # the first line needs no newline before it
    for unit, is_code in _units(content):
        if used + 1 + len(unit) <= room:
            kept.append(unit)
            used += 1 + len(unit)
            continue
        if is_code:
            indent, n_lines = unit[: len(unit) - len(unit.lstrip())], unit.count("\n") + 1
            head = f"{indent}[code block omitted: {n_lines} lines]"
            head = head if used + 1 + len(head) <= room else ""
        else:
            head = _sentence_head(unit, room - used - 1)
        if head:
            kept.append(head)
        break
    return "\n".join([*kept, TRUNCATED])


def _units(content: str) -> Iterator[tuple[str, bool]]:
    """Lines of ``content``, a fenced code block (to its closing fence, or to the end with a
    closing fence added when it has none) as one unit; each with whether it is a code block."""
    lines = content.split("\n")
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            yield lines[i], False
            i += 1
            continue
        fence, end = opening.group(1), i + 1
        while end < len(lines) and not lines[end].lstrip().startswith(fence):
            end += 1
        unclosed = f"\n{lines[i][: opening.start(1)]}{fence}" if end == len(lines) else ""
        yield "\n".join(lines[i : end + 1]) + unclosed, True
        i = end + 1


def _close_fences(content: str) -> str:
    """``content`` with a closing fence added to a code block that has none, so that it cannot
    swallow the blocks packed after it."""
    return "\n".join(unit for unit, _ in _units(content))


def _sentence_head(line: str, room: int) -> str:
    """The longest head of a prose line that ends a sentence outside an inline code span and
    fits in ``room`` characters ("" when none does)."""
    best = ""
    for end in _SENTENCE_END.finditer(line):
        head = line[: end.end()]
        if len(head) > room:
            break
        if head.count("`") % 2 == 0:
            best = head
    return best
