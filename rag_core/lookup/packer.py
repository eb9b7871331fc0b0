"""KnowledgeContextPacker: evidence blocks -> one ContextPack under a character budget.

Each block is written as a header (rank, source, title, breadcrumb, hit reasons) and its
content. Headers are never cut; content is truncated (with "…") only after its header, and a
block that cannot fit its header plus ``MIN_CONTENT_CHARS`` of content is omitted and listed
in ``omittedSources``. Output depends only on the input (deterministic).
"""

from __future__ import annotations

from rag_core.lookup.contracts import ContextPack, EvidenceBlock

MIN_CONTENT_CHARS = 80
STRATEGY = "rank_order_truncate_content"
_SEP = "\n\n"


def block_header(block: EvidenceBlock) -> str:
    reasons = ", ".join(block.hit_reasons)
    return (f"[{block.rank}] {block.title} ({block.source})\n"
            f"section: {block.breadcrumb}\nwhy: {reasons}\n")


class KnowledgeContextPacker:
    """Packs blocks in rank order into at most ``char_budget`` characters."""

    def __init__(self, char_budget: int = 4000):
        self.char_budget = char_budget

    def pack(self, blocks: list[EvidenceBlock]) -> ContextPack:
        parts: list[str] = []
        included: list[str] = []
        omitted: list[str] = []
        used = 0
        for block in blocks:
            sep = _SEP if parts else ""
            header = block_header(block)
            room = self.char_budget - used - len(sep) - len(header)
            content = block.content.strip()
            if room < min(MIN_CONTENT_CHARS, len(content)) or room < 0:
                omitted.append(block.source)
                continue
            if len(content) > room:
                content = content[: max(0, room - 1)].rstrip() + "…"
            text = sep + header + content
            parts.append(text)
            used += len(text)
            included.append(block.source)
        packed = "".join(parts)
        return ContextPack(packed_text=packed, strategy=STRATEGY, char_budget=self.char_budget,
                           used_chars=len(packed), included_sources=included, omitted_sources=omitted)
