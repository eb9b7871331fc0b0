"""KnowledgeContextPacker on real runbooks: cuts only at line, sentence or code-block boundaries."""

import re

import pytest
from conftest import RUNBOOKS, RUNBOOKS_ZH, need_shared

from rag_core.ingest.documents import scan_documents
from rag_core.lookup.contracts import EvidenceBlock
from rag_core.lookup.packer import TRUNCATED, KnowledgeContextPacker, block_header, cut_content
from rag_core.settings import SAMPLE_KNOWLEDGE_DIR

FENCE = re.compile(r"^\s*(```|~~~)")
OMITTED = re.compile(r"^\s*\[code block omitted: \d+ lines\]$")
SENTENCE_END = ".!?;。！？；"


def _block(rank: int, doc_id: str, content: str) -> EvidenceBlock:
    return EvidenceBlock(
        rank=rank,
        doc_id=doc_id,
        title=doc_id.rsplit("/", 1)[-1],
        breadcrumb="Body",
        category="c",
        retrieval_layer="L1",
        content=content,
        similarity=0.5,
        final_score=0.5,
    )


def _code_lines(text: str) -> set[str]:
    """The lines inside fenced code blocks of ``text`` (fence lines excluded)."""
    lines, inside = set(), False
    for line in text.split("\n"):
        if FENCE.match(line):
            inside = not inside
        elif inside and line.strip():
            lines.add(line)
    return lines


def _contents(root) -> list[tuple[str, str]]:
    """(doc id, body) of every document under ``root``."""
    docs, _ = scan_documents(root)
    return [(d.doc_id, d.body.strip()) for d in docs]


def _check_pack(sources: list[tuple[str, str]], budget: int) -> None:
    blocks = [_block(i + 1, d, c) for i, (d, c) in enumerate(sources)]
    pack = KnowledgeContextPacker(budget).pack(blocks)
    text = pack.packed_text
    assert pack.used_chars == len(text) <= budget
    assert pack.included_doc_ids + pack.omitted_doc_ids == [d for d, _ in sources]
    kept = blocks[: len(pack.included_doc_ids)]
    starts = [text.index(block_header(b)) for b in kept] + [len(text) + 2]
    for i, b in enumerate(kept):
        body = text[starts[i] + len(block_header(b)) : starts[i + 1] - 2]
        # Every cut is marked (a whole block may gain a closing fence it lacked); fences are balanced.
        whole = body in (b.content, b.content + "\n```")
        assert whole != body.endswith(TRUNCATED), (budget, body[-80:])
        assert sum(1 for line in body.split("\n") if FENCE.match(line)) % 2 == 0, (budget, body)
    source_lines = {line for _, c in sources for line in c.split("\n")}
    code_lines = {line for _, c in sources for line in _code_lines(c)}
    whole_lines = source_lines | {line for b in kept for line in block_header(b).split("\n")}
    for line in text.split("\n"):
        if line in whole_lines or line == TRUNCATED or OMITTED.match(line) or FENCE.match(line):
            continue
        assert not any(c.startswith(line) for c in code_lines), f"budget {budget}: cut inside code: {line!r}"
        # Any other line is the head of a prose line that ends a sentence (never inside a word).
        assert line.endswith(tuple(SENTENCE_END)) and any(s.startswith(line) for s in source_lines), (budget, line)


def test_cut_content_keeps_lines_sentences_and_code_blocks_whole():
    text = "First sentence here. Second one follows.\n\n```bash\nkubectl get pods -n prod\nkubectl logs x\n```\nAfter."
    assert cut_content(text, len(text)) == text
    assert cut_content(text, 60) == f"First sentence here. Second one follows.\n\n{TRUNCATED}"
    assert cut_content(text, 35) == f"First sentence here.\n{TRUNCATED}"
    omitted = "[code block omitted: 4 lines]"
    assert cut_content(text, 88) == f"First sentence here. Second one follows.\n\n{omitted}\n{TRUNCATED}"
    zh = "第一句话说明告警的含义。第二句话给出排查步骤，比较长一些。第三句。"
    assert cut_content(zh, 30) == f"第一句话说明告警的含义。\n{TRUNCATED}"
    assert cut_content("`a. b` c", 7) == TRUNCATED  # no sentence end inside an inline code span


def test_pack_of_the_sample_kb_cuts_only_at_boundaries_for_many_budgets():
    sources = _contents(SAMPLE_KNOWLEDGE_DIR)
    assert len(sources) >= 3 and all("```" in c for _, c in sources[:3])
    for start in range(0, len(sources), 3):
        for budget in range(300, 4200, 53):
            _check_pack(sources[start : start + 3], budget)


@pytest.mark.parametrize("root", [RUNBOOKS, RUNBOOKS_ZH], ids=["en", "zh"])
def test_pack_of_the_shared_runbooks_cuts_only_at_boundaries(root):
    sources = _contents(need_shared(root))
    assert len(sources) >= 20 and sum("```" in c for _, c in sources) >= 5
    for start in range(0, len(sources), 4):
        for budget in range(400, 4000, 211):
            _check_pack(sources[start : start + 4], budget)
