"""The CLI views in an 80-column terminal: lookup leads with the answer, tables and records fit
without breaking URIs or paths, and no value from outside (file name, doc id, stored query) can
forge a line or send an escape sequence to the terminal."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console
from rich.text import Text

from rag_core.cli.recording import _print_outcomes
from rag_core.cli.views import print_ingest_report, print_lookup, print_servers, print_traces
from rag_core.ingest.pipeline import IngestReport
from rag_core.lookup.contracts import (
    ContextPack,
    EvidenceBlock,
    LookupResult,
    RelevanceLevel,
    RerankEntry,
    RetrievalTrace,
)
from rag_core.models import DocumentIssue
from rag_core.recording.suites import SuiteOutcome
from rag_core.text import escape_controls
from rag_core.traces.rows import TraceRow

DOC = "kubernetes/kube-controller-manager/KubeControllerManagerDown.md"
CRUMB = "Kube Controller Manager Down > Diagnosis > Check the leader election lease and the pod logs"


def _result(blocks: int = 5) -> LookupResult:
    evidence = [
        EvidenceBlock(
            rank=i + 1,
            doc_id=DOC.replace("Down", f"Down{i}"),
            title="Kube Controller Manager Down",
            breadcrumb=CRUMB,
            category="kubernetes",
            retrieval_layer="L1",
            content="text",
            similarity=0.8,
            final_score=0.9,
            hit_reasons=["dense similarity 0.812", "bm25 rank 2", "title match", "L0 keyword kube-controller-manager"],
        )
        for i in range(blocks)
    ]
    rerank = [
        RerankEntry(
            doc_id=b.doc_id,
            base_score=0.8,
            contributions={"title_match": 0.05, "lexical": 0.03},
            final_score=0.9,
            rank_before=2,
            rank_after=b.rank,
        )
        for b in evidence
    ]
    return LookupResult(
        query="controller manager down",
        found=True,
        evidence_blocks=evidence,
        context_pack=ContextPack(
            packed_text="packed", strategy="s", char_budget=100, used_chars=6, included_doc_ids=[], omitted_doc_ids=[]
        ),
        retrieval_trace=RetrievalTrace(store="milvus", layer="L1", attempts=[]),
        rerank_trace=rerank,
        relevance_level=RelevanceLevel.RELEVANT,
        semantic_support=True,
        completeness_hint="complete",
        retrieved_domains_this_session=[],
        message="ok",
    )


def _render(
    width: int, wide: bool | None = None, explain: bool = False, result: LookupResult | None = None
) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    print_lookup(console, result or _result(), wide, explain)
    return console.export_text().splitlines()


def test_eighty_columns_lead_with_the_verdict_then_a_few_whole_lines_per_document():
    lines = _render(80)
    assert lines[0].startswith("RELEVANT") and "status ok" in lines[0]  # the verdict first
    assert lines.index("1. " + DOC.replace("Down", "Down0")) <= 3  # then the first document, whole
    assert len(lines) <= 3 + 5 * 6 + 1  # verdict, five blocks of at most six lines, one pack line
    assert CRUMB in " ".join(line.strip() for line in lines)  # wrapped at words, not one per line
    assert "0.800" in lines[lines.index("1. " + DOC.replace("Down", "Down0")) + 3]  # its similarity
    assert not any("rerank" in line or "hit reasons" in line for line in lines)  # behind --explain


def test_wrapped_lines_keep_their_indent():
    result = _result(1)
    long_line = "kubectl -n kube-system get pods -l component=kube-controller-manager -o wide " * 3
    result.evidence_blocks[0].content = f"# Title\n\n{long_line}\nsecond line"
    lines = _render(80, result=result)
    body = lines[lines.index("1. " + DOC.replace("Down", "Down0")) + 1 :]
    assert all(line.startswith("   ") for line in body[:-1] if line.strip())  # the pack line is not a block's
    evidence = [line for line in body if "kube-system" in line or "component=" in line or "-o wide" in line]
    assert len(evidence) >= 2 and all(line.startswith("     ") for line in evidence)


def test_explain_adds_the_rerank_arithmetic_and_the_context_pack():
    lines = _render(80, explain=True)
    assert any("rerank: title_match+0.050, lexical+0.030 (rank 2->1)" in line for line in lines)
    assert any("hit reasons: dense similarity 0.812" in line for line in lines)
    assert any("context pack 6/100 chars" in line and "╭" in line for line in lines)
    result = _result(1)
    result.context_pack.packed_text = "## A > B\n\tcode line\nlast \x1b[2J line"
    lines = _render(80, explain=True, result=result)
    assert "│     code line" in " ".join(lines) and any("last \\x1b[2J line" in line for line in lines)  # lines kept


def test_a_wide_terminal_or_wide_flag_keeps_the_table():
    for lines in (_render(200), _render(80, wide=True)):
        assert any("┃ #" in line or "│ 1" in line for line in lines)
    narrow_table = _render(80, wide=True)
    assert len(narrow_table) > len(_render(80))  # what --stacked avoids


def _raw_terminal() -> Console:
    """A terminal that gets escape sequences (styles on), to see what reaches it byte for byte."""
    return Console(file=io.StringIO(), width=80, force_terminal=True, color_system="standard")


def test_control_characters_in_doc_ids_breadcrumbs_and_evidence_reach_the_terminal_escaped():
    result = _result(1)
    block = result.evidence_blocks[0]
    block.doc_id, block.breadcrumb = "evil\x1b[2J.md", "Title > \x1b]0;owned\x07"
    block.content = "first \x1b[31mred\x1b[0m line"
    console = _raw_terminal()
    print_lookup(console, result)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[2J" not in out and "\x1b]0;" not in out and "\x1b[31m" not in out
    assert "evil\\x1b[2J.md" in out and "\\x1b]0;owned\\x07" in out and "first \\x1b[31mred" in out


def test_a_file_name_with_a_newline_cannot_forge_a_skipped_line():
    forged = "real.md\nskipped: other.md: forged line\n\x1b[2J"
    report = IngestReport(knowledge_dir="/kb\nIngested /elsewhere", skipped=[DocumentIssue(forged, "bad YAML\nat 3")])
    console = Console(width=80, record=True, color_system=None)
    print_ingest_report(console, report)
    lines = console.export_text().splitlines()
    assert [line for line in lines if line.startswith("skipped:")] == [
        "skipped: real.md\\nskipped: other.md: forged line\\n\\x1b[2J: bad YAML\\nat 3"
    ]
    assert lines[0].startswith("Ingested /kb\\nIngested /elsewhere: 0 of 0 documents")


def test_a_stored_query_with_escape_sequences_reaches_the_terminal_escaped_and_on_one_line():
    rows = [
        TraceRow(session_id="s-1", input="clear \x1b[2J\x1b[H screen\nforged row", status="ok", latency_ms=12.5),
        TraceRow(session_id="s\x1b[31m2", input="a " * 100, status="error", error="boom\nTraceback"),
    ]
    console = _raw_terminal()
    print_traces(console, rows)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[2J" not in out and "\x1b[H" not in out and "\x1b[31m2" not in out
    assert "clear \\x1b[2J\\x1b[H screen\\nforged row" in out and "s\\x1b[31m2" in out
    plain_lines = Text.from_ansi(out).plain.splitlines()
    assert len(plain_lines) == 5  # two rows: header + input, and header + input + error
    assert all(len(line) <= 80 for line in plain_lines)


def test_server_status_fits_eighty_columns_with_uris_and_paths_whole():
    data = "/srv/rag/data-dir-of-the-production-knowledge-base/milvus/milvus.db"
    rows = [
        {
            "server": "milvus",
            "running": True,
            "pid": 4242,
            "uri": "http://127.0.0.1:52991",
            "engine": "milvus-lite",
            "engine_version": "2.5.1",
            "uptime_s": 35.2,
            "db_path": data,
            "in_use": True,
        },
        {"server": "postgres", "running": False, "data_dir": "/srv/rag/pgdata", "in_use": True},
    ]
    console = Console(width=80, record=True, color_system=None)
    print_servers(console, rows, "embedded servers")
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any(line.split()[-1] == "http://127.0.0.1:52991" for line in lines)
    assert any(line.split()[-1] == data for line in lines)


def test_the_suites_table_fits_eighty_columns_with_suite_names_whole():
    summary = SimpleNamespace(case_count=120, strong=100, medium=12, miss=8, recall_at_k={5: 0.933}, mrr=0.871)
    cost = SimpleNamespace(counts={"hurt": 1, "rescued": 2, "helped": 3, "no_difference": 114})
    report = SimpleNamespace(summary=summary, filter_cost=cost, store_status=SimpleNamespace(status="available"))
    outcomes = [
        SuiteOutcome.model_construct(
            suite="runbooks-en-hard", status="ok", reports={"milvus": report, "pgvector": report}, gate=None
        ),
        SuiteOutcome(suite="runbooks-zh", status="skipped", reason="corpus ../shared/corpora/zh\nnot found"),
    ]
    console = Console(width=80, record=True, color_system=None)
    _print_outcomes(outcomes, console)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert sum("runbooks-en-hard" in line for line in lines) == 2
    assert "runbooks-zh: skipped: corpus ../shared/corpora/zh\\nnot found" in lines


def test_escape_controls_writes_every_control_character_in_one_visible_form():
    raw = "a\nb\r\tc\x1b[2J\x07\x7f\x85\u202e\u2028\udcff back\\slash"
    assert escape_controls(raw) == "a\\nb\\r\\tc\\x1b[2J\\x07\\x7f\\x85\\u202e\\u2028\\udcff back\\slash"
    assert escape_controls("中文 emoji😀 nbsp\u00a0 plain") == "中文 emoji😀 nbsp\u00a0 plain"  # printable: unchanged
