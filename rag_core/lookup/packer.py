"""KnowledgeContextPacker: evidence blocks -> one ContextPack under a character budget.

Each block is written as a header (rank, title, doc id, breadcrumb, hit reasons) and its
content. Headers are never cut. Content is shared out by water-filling: every block gets the
same allowance, and what short blocks leave over goes to the longer ones, so the top block
cannot starve the rest. Content beyond its allowance is truncated (with "…") after its
header. When the allowance falls below ``MIN_CONTENT_CHARS``, the lowest-ranked block is
omitted (listed in ``omittedDocIds``) and the share recomputed. Output depends only on the
input (deterministic).
"""

from __future__ import annotations

from rag_core.lookup.contracts import ContextPack, EvidenceBlock

MIN_CONTENT_CHARS = 120
STRATEGY = "rank_order_fair_share_truncate_content"
_SEP = "\n\n"


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
            contents = [b.content.strip() for b in kept]
            level = water_fill([len(c) for c in contents], self.char_budget - fixed)
            starved = any(len(c) > level and level < MIN_CONTENT_CHARS for c in contents)
            if kept and (fixed > self.char_budget or starved):
                kept.pop()  # the lowest-ranked block gives way
                continue
            break
        parts = [h + _truncate(c, level) for h, c in zip(headers, contents, strict=True)]
        packed = _SEP.join(parts)
        return ContextPack(
            packed_text=packed,
            strategy=STRATEGY,
            char_budget=self.char_budget,
            used_chars=len(packed),
            included_doc_ids=[b.doc_id for b in kept],
            omitted_doc_ids=[b.doc_id for b in blocks[len(kept) :]],
        )


def _truncate(content: str, limit: int) -> str:
    if len(content) <= limit:
        return content
    return content[: max(0, limit - 1)].rstrip() + "…"
