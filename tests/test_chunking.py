"""Heading-aware chunking: breadcrumbs, token budget, coverage, stable ids, speed."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from rag_core.embedding import make_embedder
from rag_core.ingest.chunking import chunk_document
from rag_core.ingest.documents import load_document, scan_documents
from rag_core.models import Chunk, KnowledgeDocument
from rag_core.settings import RagSettings

SHARED = Path(__file__).resolve().parents[2] / "shared"
RUNBOOKS = SHARED / "corpora" / "prometheus-runbooks" / "content" / "runbooks"
RUNBOOKS_ZH = SHARED / "corpora" / "kubesphere-runbooks-zh" / "content.zh" / "runbooks"


@pytest.fixture(scope="module")
def count():
    """The default backend's counter: what ingest sizes chunks with."""
    return make_embedder(RagSettings(_env_file=None)).count_tokens


def make_doc(body: str, title: str = "Doc Title", doc_id: str = "cat/doc.md") -> KnowledgeDocument:
    return KnowledgeDocument(doc_id=doc_id, title=title, category="cat", body=body)


def assert_well_formed(doc: KnowledgeDocument, chunks: list[Chunk], count, max_tokens: int) -> None:
    """Budget, order, slices and coverage: every non-blank body character is in a chunk."""
    body = doc.body
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    previous_end = 0
    for chunk in chunks:
        assert count(chunk.embed_text) <= max_tokens, (chunk.breadcrumb, chunk.text[:80])
        assert 0 <= previous_end <= chunk.start < chunk.end <= len(body)
        assert body[previous_end : chunk.start].strip() == "", body[previous_end : chunk.start][:80]
        assert chunk.text.endswith(body[chunk.start : chunk.end])  # a slice, or header + slice
        assert chunk.text == body[chunk.start : chunk.end] or chunk.text.startswith("|")
        title = " ".join(doc.title.split())
        assert chunk.breadcrumb.startswith(title) or chunk.breadcrumb.endswith("…")
        assert "\r" not in chunk.breadcrumb
        previous_end = chunk.end
    assert body[previous_end:].strip() == ""


def breadcrumbs(chunks: list[Chunk]) -> list[str]:
    return [c.breadcrumb for c in chunks]


# --- breadcrumbs and sections ---------------------------------------------------------------


def test_breadcrumb_skips_the_document_h1_and_nests_headings(count):
    body = """# KubePodCrashLooping

Intro under the H1.

## Diagnosis

Check the pod.

### Logs ###

Read the logs.

## Mitigation

Fix it.
"""
    chunks = chunk_document(make_doc(body, title="Kube Pod Crash Looping"), count)
    assert breadcrumbs(chunks) == [
        "Kube Pod Crash Looping",
        "Kube Pod Crash Looping > Diagnosis",
        "Kube Pod Crash Looping > Diagnosis > Logs",
        "Kube Pod Crash Looping > Mitigation",
    ]
    assert chunks[0].text == "# KubePodCrashLooping\n\nIntro under the H1."
    assert chunks[2].text == "### Logs ###\n\nRead the logs."


def test_h1_that_is_not_the_first_heading_nor_the_title_stays(count):
    body = "Preamble.\n\n## Part\n\ntext\n\n# Appendix\n\nmore\n\n## Notes\n\nnotes\n"
    chunks = chunk_document(make_doc(body, title="Guide"), count)
    assert breadcrumbs(chunks) == ["Guide", "Guide > Part", "Guide > Appendix", "Guide > Appendix > Notes"]


def test_h1_matching_the_title_is_dropped_even_when_not_first(count):
    body = "## Before\n\ntext\n\n# Guide\n\nunder the h1\n\n## After\n\nmore\n"
    chunks = chunk_document(make_doc(body, title="Guide"), count)
    assert breadcrumbs(chunks) == ["Guide > Before", "Guide", "Guide > After"]


def test_setext_headings_and_inline_markup(count):
    body = (
        "Main\n====\n\nintro\n\nThe *first*\n`part`\n----------\n\nbody one\n\n"
        "### [Linked](http://x) &amp; more\n\nbody two\n"
    )
    chunks = chunk_document(make_doc(body, title="T"), count)
    assert breadcrumbs(chunks) == ["T", "T > The first part", "T > The first part > Linked & more"]


def test_hash_lines_in_fenced_code_are_not_headings(count):
    body = "## Fix\n\n```bash\n# restart the pod\nkubectl delete pod x\n## still code\n```\n\n~~~\n# tilde fence\n~~~\n"
    chunks = chunk_document(make_doc(body), count)
    assert breadcrumbs(chunks) == ["Doc Title > Fix"]
    assert chunks[0].text == body.rstrip()


def test_headings_inside_lists_and_quotes_do_not_start_sections(count):
    body = "## Real\n\n- item\n\n  # not a section\n\n> # quoted\n\ntext\n"
    assert breadcrumbs(chunk_document(make_doc(body), count)) == ["Doc Title > Real"]


def test_empty_and_heading_only_sections_make_no_chunk_but_their_text_is_kept(count):
    body = "# Title\n\n## Empty\n\n## Parent\n### Child\n\nChild text.\n\n## Trailing\n\n### Also empty\n"
    doc = make_doc(body, title="Title")
    chunks = chunk_document(doc, count)
    assert breadcrumbs(chunks) == ["Title > Parent > Child"]
    assert chunks[0].text == body.strip()  # carried headings in front, trailing ones appended
    assert_well_formed(doc, chunks, count, 240)
    assert chunk_document(make_doc("# Only\n\n## Headings\n"), count) == []
    assert chunk_document(make_doc("  \n\n"), count) == []


def test_crlf_body_built_by_hand_leaks_no_cr_into_breadcrumbs(count):
    body = "# T\r\n\r\n## Sub\r\nsection\r\n\r\ntext\r\n"
    chunks = chunk_document(make_doc(body), count)
    assert breadcrumbs(chunks) == ["Doc Title > Sub"]


def test_crlf_file_end_to_end(tmp_path, count):
    source = b"\xef\xbb\xbf---\r\ntitle: Win\r\n---\r\n# H1\r\n\r\n## Step  One\r\n\r\ndo it\r\n"
    (tmp_path / "a.md").write_bytes(source)
    chunks = chunk_document(load_document(tmp_path / "a.md", tmp_path), count)
    assert breadcrumbs(chunks) == ["Win > Step One"]
    assert all("\r" not in c.text for c in chunks)


# --- the token budget -----------------------------------------------------------------------

EN_SENTENCE = "The kubelet restarts the container after the liveness probe fails three times in a row."
ZH_SENTENCE = "检查容器日志，确认应用是否因为内存不足而退出。"


@pytest.mark.parametrize("max_tokens", [40, 64, 240])  # 40: breadcrumb, heading and one sentence
def test_long_paragraphs_split_at_sentences_within_budget(count, max_tokens):
    body = "## Long\n\n" + " ".join([EN_SENTENCE] * 40) + "\n\n" + ZH_SENTENCE * 40 + "\n"
    doc = make_doc(body)
    chunks = chunk_document(doc, count, max_tokens)
    assert len(chunks) > 2
    assert_well_formed(doc, chunks, count, max_tokens)
    english = [c for c in chunks if "kubelet" in c.text and "检查" not in c.text]
    assert len(english) >= 2 and all(c.text.rstrip().endswith(".") for c in english[:-1])  # cut after a sentence
    chinese = [c for c in chunks if "检查" in c.text and "kubelet" not in c.text]
    assert chinese and all(c.text.endswith("。") for c in chinese)


def test_a_counter_s_fixed_part_is_budgeted_once_not_per_piece(count):
    """A counter that adds 7 tokens to every call (prefix, specials) cuts as one without them."""
    body = "## Long\n\n" + " ".join([EN_SENTENCE] * 12) + "\n\n" + ZH_SENTENCE * 12 + "\n"
    doc = make_doc(body)
    base = count("")
    plain = chunk_document(doc, lambda text: count(text) - base, 64)
    padded = chunk_document(doc, lambda text: count(text) - base + 7, 71)
    assert len(plain) > 2
    assert [(c.start, c.end) for c in padded] == [(c.start, c.end) for c in plain]


def test_text_without_any_cut_point_is_cut_hard_within_budget(count):
    blob = "".join(random.Random(1).choice("abcdefghij0123456789") for _ in range(6000))
    doc = make_doc(f"## Blob\n\n{blob}\n\n## 中文\n\n{'无标点的中文文本' * 300}\n")
    chunks = chunk_document(doc, count, 64)
    assert len(chunks) > 10
    assert_well_formed(doc, chunks, count, 64)


def test_table_split_repeats_the_header(count):
    header = "| alert | severity | action |\n|---|---|---|\n"
    rows = "".join(f"| Alert{i} | warning | restart service number {i} |\n" for i in range(120))
    body = f"## Alerts\n\nIntro.\n\n{header}{rows}\nAfter the table.\n"
    doc = make_doc(body)
    chunks = chunk_document(doc, count, 100)
    assert len(chunks) > 3
    assert_well_formed(doc, chunks, count, 100)
    table_chunks = [c for c in chunks if "| Alert" in c.text]
    assert len(table_chunks) >= 2 and all(header in c.text for c in table_chunks)
    continued = [c for c in table_chunks if c.text.startswith(header)]
    assert len(continued) == len(table_chunks) - 1  # the first keeps its own header in place
    for chunk in continued:
        assert chunk.text == header + body[chunk.start : chunk.end]
        assert body[chunk.start :].startswith("| Alert")  # offsets cover the original rows
    seen_rows = [line for c in table_chunks for line in c.text.splitlines() if line.startswith("| Alert")]
    assert seen_rows == [r for r in rows.splitlines()]


def test_fenced_code_stays_whole_when_it_fits_and_splits_by_lines_otherwise(count):
    code = "```python\n" + "".join(f"value_{i} = compute({i})\n" for i in range(12)) + "```\n"
    body = "## Code\n\n" + "Some words here. " * 20 + "\n\n" + code + "\n" + "More words. " * 20 + "\n"
    doc = make_doc(body)
    chunks = chunk_document(doc, count, 120)
    assert_well_formed(doc, chunks, count, 120)
    assert any(code.strip() in c.text for c in chunks)
    big = "```\n" + "".join(f"line {i} of a long log output\n" for i in range(300)) + "```\n"
    doc = make_doc("## Log\n\n" + big)
    chunks = chunk_document(doc, count, 80)
    assert len(chunks) > 5
    assert_well_formed(doc, chunks, count, 80)
    assert all(doc.body[c.end] == "\n" for c in chunks[:-1])  # cut between lines


def test_small_pieces_are_merged_up_to_the_budget(count):
    body = "## Many\n\n" + "".join(f"Paragraph {i} is short.\n\n" for i in range(60))
    chunks = chunk_document(make_doc(body), count, 120)
    assert len(chunks) < 10
    assert all(count(c.embed_text) > 60 for c in chunks[:-1])


def test_breadcrumb_longer_than_the_budget_is_shortened(count):
    heading = " ".join(f"word{i}" for i in range(200))
    doc = make_doc(f"## {heading}\n\nSome text.\n")
    chunks = chunk_document(doc, count, 64)
    assert chunks and all(c.breadcrumb.endswith("…") for c in chunks)
    assert_well_formed(doc, chunks, count, 64)


def test_a_counter_that_does_not_add_up_still_keeps_the_limit():
    def lumpy(text: str) -> int:  # joins cost extra tokens: not additive
        return len(text.split()) + 3 * text.count("\n\n") + text.count("x")

    blob = "x" * 300 + " " + "abc" * 200
    body = "## S\n\n" + "\n\n".join(["one two three four five"] * 40) + "\n\n" + blob + "\n"
    doc = make_doc(body)
    chunks = chunk_document(doc, lumpy, 40)
    assert_well_formed(doc, chunks, lumpy, 40)


def test_max_tokens_too_small_is_an_error(count):
    with pytest.raises(ValueError, match="max_tokens"):
        chunk_document(make_doc("text"), count, 4)


# --- ids and hashes -------------------------------------------------------------------------

SECTIONS = {
    "Meaning": "Pod is crash looping. " * 30,
    "Impact": "Service degraded. " * 5,
    "Diagnosis": "Check the logs. " * 80,
    "Mitigation": "Fix the config. " * 5,
}


def sectioned(sections: dict[str, str]) -> str:
    return "# Alert\n\n" + "".join(f"## {name}\n\n{text}\n\n" for name, text in sections.items())


def test_chunk_ids_are_stable_and_survive_edits_elsewhere(count):
    doc = make_doc(sectioned(SECTIONS))
    first = chunk_document(doc, count, 64)
    assert [(c.chunk_id, c.content_hash) for c in first] == [
        (c.chunk_id, c.content_hash) for c in chunk_document(doc, count, 64)
    ]
    edited = dict(SECTIONS, Impact="Service degraded badly and for much longer. " * 12)
    second = chunk_document(make_doc(sectioned(edited)), count, 64)
    by_crumb = lambda chunks, name: [(c.chunk_id, c.content_hash) for c in chunks if c.breadcrumb.endswith(name)]  # noqa: E731
    for name in ("Meaning", "Diagnosis", "Mitigation"):
        assert by_crumb(first, name) == by_crumb(second, name)
    old, new = by_crumb(first, "Impact"), by_crumb(second, "Impact")
    assert len(new) > len(old) and new[0][0] == old[0][0] and new[0][1] != old[0][1]


def test_repeated_heading_paths_get_distinct_ids(count):
    body = "## Example\n\none\n\n## Example\n\ntwo\n"
    chunks = chunk_document(make_doc(body), count)
    assert len({c.chunk_id for c in chunks}) == 2


def test_content_hash_covers_title_and_category_but_ids_do_not(count):
    body = "## S\n\ntext\n"
    base = chunk_document(make_doc(body, title="A"), count)[0]
    renamed = chunk_document(make_doc(body, title="B"), count)[0]
    assert base.chunk_id == renamed.chunk_id and base.content_hash != renamed.content_hash
    moved = chunk_document(KnowledgeDocument("cat/doc.md", "A", "other", body), count)[0]
    assert moved.content_hash != base.content_hash
    assert chunk_document(make_doc(body, title="A", doc_id="cat/else.md"), count)[0].chunk_id != base.chunk_id


# --- coverage over generated documents ------------------------------------------------------

WORDS = "pod node alert memory disk latency error restart config kubectl probe the a of".split()


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return "".join(
            rng.choice("容器节点内存磁盘延迟错误重启配置检查日志") for _ in range(rng.randint(3, 40))
        ) + rng.choice("。！？；，")
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30)))
    return words.capitalize() + rng.choice([".", "!", "?", "", ";"])


def _block(rng: random.Random) -> str:
    kind = rng.randrange(14)
    if kind == 0:
        return "#" * rng.randint(1, 6) + " " + _sentence(rng) + rng.choice(["", " ##"])
    if kind == 1:
        return _sentence(rng) + "\n" + rng.choice("=-") * rng.randint(1, 8)
    if kind == 2:
        return "\n".join(
            "- " + _sentence(rng) + ("\n  " + _sentence(rng) if rng.random() < 0.3 else "")
            for _ in range(rng.randint(1, 15))
        )
    if kind == 3:
        cols = rng.randint(1, 4)
        rows = ["| " + " | ".join(_sentence(rng) for _ in range(cols)) + " |" for _ in range(rng.randint(1, 30))]
        return "| " + " | ".join(f"h{i}" for i in range(cols)) + " |\n|" + "---|" * cols + "\n" + "\n".join(rows)
    if kind == 4:
        choices = ["# comment", "## not heading", "x = 1", ""]
        lines = [rng.choice(choices) or _sentence(rng) for _ in range(rng.randint(0, 60))]
        return "```sh\n" + "\n".join(lines) + ("\n```" if rng.random() < 0.9 else "")
    if kind == 5:
        return "".join(rng.choice("abcdefgh/_-=") for _ in range(rng.randint(100, 1500)))
    if kind == 6:
        return "> " + _sentence(rng) + "\n> # quoted heading"
    if kind == 7:
        return "    indented code\n    # not a heading"
    if kind == 8:
        return rng.choice(["---", "***", "<!-- comment -->", "<div>\n# html\n</div>", "[ref]: http://example.com"])
    if kind == 9:
        return rng.choice(["", "   ", "\t", " \n \n"])
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 25)))


def generated_body(seed: int) -> str:
    rng = random.Random(seed)
    blocks = [_block(rng) for _ in range(rng.randint(1, 25))] + [_sentence(rng) or "text"]
    rng.shuffle(blocks)
    return "".join(b + rng.choice(["\n", "\n\n", "\n\n\n", "\n  \n"]) for b in blocks)


@pytest.mark.parametrize("seed", range(60))
def test_generated_documents_are_fully_covered_within_budget(count, seed):
    doc = make_doc(generated_body(seed), title=f"Generated {seed}")
    for max_tokens in (32, 80, 240):
        chunks = chunk_document(doc, count, max_tokens)
        assert_well_formed(doc, chunks, count, max_tokens)


# --- the real corpora -----------------------------------------------------------------------


def corpus_docs(root: Path) -> list[KnowledgeDocument]:
    if not root.is_dir():
        pytest.skip(f"{root} is absent: the shared corpora live in ../shared beside the repo")
    return scan_documents(root)[0]


@pytest.mark.parametrize("root", [RUNBOOKS, RUNBOOKS_ZH], ids=["runbooks", "runbooks-zh"])
@pytest.mark.parametrize("max_tokens", [64, 240])
def test_real_corpora_chunk_within_budget_with_full_coverage(count, root, max_tokens):
    for doc in corpus_docs(root):
        chunks = chunk_document(doc, count, max_tokens)
        assert chunks, doc.doc_id
        assert_well_formed(doc, chunks, count, max_tokens)


def test_runbook_crash_looping_breadcrumbs(count):
    docs = {d.doc_id: d for d in corpus_docs(RUNBOOKS)}
    chunks = chunk_document(docs["kubernetes/KubePodCrashLooping.md"], count)
    assert "Kube Pod Crash Looping > Diagnosis" in breadcrumbs(chunks)
    assert breadcrumbs(chunks)[0] == "Kube Pod Crash Looping > Meaning"
    assert chunks[0].text.startswith("# KubePodCrashLooping\n\n## Meaning")


def test_five_megabyte_document_chunks_in_seconds(tmp_path, count):
    section = (
        "## Diagnosis step\n\n" + " ".join([EN_SENTENCE] * 6) + "\n\n- check `kubectl get pods`\n"
        "- check events\n\n| k | v |\n|---|---|\n| a | b |\n\n```\n# comment\nls\n```\n\n"
    )
    body = "# Big\n\n" + section * (5_000_000 // len(section))
    (tmp_path / "big.md").write_text(body)
    started = time.perf_counter()
    doc = load_document(tmp_path / "big.md", tmp_path)
    chunks = chunk_document(doc, count)
    elapsed = time.perf_counter() - started
    assert len(chunks) > 5000
    assert elapsed < 60, f"{elapsed:.1f}s"  # about 6 s on an idle 2-core machine
    previous_end = 0
    for chunk in chunks[::97]:
        assert chunk.start >= previous_end and count(chunk.embed_text) <= 240
        previous_end = chunk.end
