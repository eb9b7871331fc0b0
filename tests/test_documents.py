"""Loading knowledge documents: frontmatter, fallbacks and every kind of bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rag_core.ingest.documents import (
    EMPTY_FILE_REASON,
    NO_BODY_REASON,
    SECTION_PAGE_REASON,
    DocumentError,
    SkipDocument,
    load_document,
    scan_documents,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
RUNBOOKS = SHARED / "corpora" / "prometheus-runbooks" / "content" / "runbooks"
RUNBOOKS_ZH = SHARED / "corpora" / "kubesphere-runbooks-zh" / "content.zh" / "runbooks"


def write(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_bytes(content.encode("utf-8"))
    else:
        path.write_bytes(content)
    return path


def load(root: Path, rel: str, content: str | bytes, **kw):
    return load_document(write(root, rel, content), root, **kw)


def error_of(root: Path, rel: str, content: str | bytes, kind=DocumentError, **kw):
    with pytest.raises(kind) as info:
        load(root, rel, content, **kw)
    assert info.value.issue.path == rel
    return info.value.issue


# --- fields and fallbacks ------------------------------------------------------------------


def test_frontmatter_fields(tmp_path):
    doc = load(
        tmp_path,
        "services/Checkout.md",
        """---
title: "  Checkout   Pod\tOOM  "
category: services
keywords: [OOMKilled, memory limit, " heap ", OOMKilled]
entities: checkout-service, kubernetes ,
aliases:
  - Checkout out of memory
  - 结账服务内存溢出
priority: 2
owner: team-checkout
updated: 2026-01-20
reviewed: 2026-01-21T10:30:00Z
history: [{at: 2025-12-01, by: ann}]
---

# CheckoutPodOOMKilled

Body text.
""",
    )
    assert doc.doc_id == "services/Checkout.md"
    assert doc.title == "Checkout Pod OOM"
    assert doc.category == "services"
    assert doc.keywords == ("OOMKilled", "memory limit", "heap")
    assert doc.entities == ("checkout-service", "kubernetes")
    assert doc.aliases == ("Checkout out of memory", "结账服务内存溢出")
    assert doc.priority == 2.0
    assert doc.h1 == "CheckoutPodOOMKilled"
    assert doc.metadata == {
        "owner": "team-checkout",
        "updated": "2026-01-20",
        "reviewed": "2026-01-21T10:30:00+00:00",
        "history": [{"at": "2025-12-01", "by": "ann"}],
    }
    assert doc.body.startswith("\n# CheckoutPodOOMKilled")
    assert doc.body_line_offset == 14


def test_domain_is_an_alias_of_category_and_list_scalars_keep_their_text(tmp_path):
    doc = load(
        tmp_path,
        "x/a.md",
        "---\ndomain: '  Payments  Team '\nkeywords: [on, 1.10, 2024-01-01]\n"
        "aliases: 退款，退货、refund\npriority: '1.5'\n---\nbody\n",
    )
    assert doc.category == "Payments Team"
    assert doc.keywords == ("on", "1.10", "2024-01-01")  # YAML 1.1 would say True, 1.1, date
    assert doc.aliases == ("退款", "退货", "refund")
    assert doc.priority == 1.5
    assert "domain" not in doc.metadata


def test_category_wins_over_domain_which_stays_in_metadata(tmp_path):
    doc = load(tmp_path, "a.md", "---\ncategory: db\ndomain: data\n---\nbody\n")
    assert doc.category == "db"
    assert doc.metadata == {"domain": "data"}


@pytest.mark.parametrize(
    ("rel", "content", "title", "h1", "category"),
    [
        ("kubernetes/KubeX.md", "# Kube  X   Down ##\n\ntext\n", "Kube X Down", "Kube X Down", "kubernetes"),
        (
            "a/b/c.md",
            "Setext *Title*\nspans lines\n===\n\ntext\n",
            "Setext Title spans lines",
            "Setext Title spans lines",
            "a",
        ),
        ("root-level.md", "## only an h2\n\ntext\n", "root-level", None, ""),
        ("x/no-heading.markdown", "just text\n", "no-heading", None, "x"),
        ("x/late.md", "intro\n\n## h2\n\n# Later H1 `code`\n", "Later H1 code", "Later H1 code", "x"),
        ("x/fm-empty-title.md", "---\ntitle: ''\ncategory: ''\n---\n# From H1\n", "From H1", "From H1", "x"),
    ],
)
def test_title_h1_and_category_fallbacks(tmp_path, rel, content, title, h1, category):
    doc = load(tmp_path, rel, content)
    assert (doc.title, doc.h1, doc.category) == (title, h1, category)


def test_hash_lines_in_code_and_frontmatter_are_not_the_h1(tmp_path):
    doc = load(tmp_path, "a.md", "---\n# a yaml comment\ntitle:\n---\n```\n# not a heading\n```\n\nReal\n====\n")
    assert doc.h1 == "Real"
    assert doc.title == "Real"


def test_first_h1_found_far_down_a_document(tmp_path):
    filler = "".join(f"- item {i}\n  continued\n" for i in range(3000))
    doc = load(tmp_path, "a.md", f"intro\n\n{filler}\nDeep Title\n==========\n\ntext\n")
    assert doc.h1 == "Deep Title"


# --- bad input -----------------------------------------------------------------------------


def test_bom_before_frontmatter_is_stripped(tmp_path):
    doc = load(tmp_path, "a.md", "\ufeff---\ntitle: With BOM\n---\nbody\n")
    assert doc.title == "With BOM"
    assert "\ufeff" not in doc.body


def test_crlf_line_endings_are_normalised(tmp_path):
    doc = load(tmp_path, "a.md", b"---\r\nkeywords: a, b\r\n---\r\nTitle\r\nwith CR\r\n=====\r\n\r\ntext\r\n")
    assert doc.title == "Title with CR"
    assert doc.keywords == ("a", "b")
    assert "\r" not in doc.body
    assert doc.body == "Title\nwith CR\n=====\n\ntext\n"


@pytest.mark.parametrize(
    ("frontmatter", "kind"), [("- a\n- b", "a list"), ("just text", "a single str"), ("42", "a single int")]
)
def test_frontmatter_that_is_not_a_mapping(tmp_path, frontmatter, kind):
    issue = error_of(tmp_path, "a.md", f"---\n{frontmatter}\n---\nbody\n")
    assert issue.line == 1
    assert f"must be a mapping of fields, got {kind}" in issue.reason


@pytest.mark.parametrize("frontmatter", ["", "# only a comment\n", "\n\n"])
def test_empty_frontmatter_block_is_fine(tmp_path, frontmatter):
    doc = load(tmp_path, "cat/a.md", f"---\n{frontmatter}---\n# Title\n\nbody\n")
    assert (doc.title, doc.category, doc.metadata) == ("Title", "cat", {})


def test_unquoted_dates_become_iso_strings(tmp_path):
    doc = load(
        tmp_path, "a.md", "---\nupdated: 2026-01-20\nat: 2026-01-20 10:00:00\nnested: {when: [2026-02-01]}\n---\nbody\n"
    )
    assert doc.metadata == {"updated": "2026-01-20", "at": "2026-01-20T10:00:00", "nested": {"when": ["2026-02-01"]}}


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("---\ntitle: ok\nkeywords:\n\t- tabbed\n---\nbody\n", 4),  # tab indentation
        ("---\ntitle: ok\nsummary: a: b\n---\nbody\n", 3),  # unquoted 'key: a: b'
        ("\ufeff---\n\ntitle: x\nsummary: a: b\n---\nbody\n", 4),  # BOM does not shift lines
        ("---\ntitle: !custom x\n---\nbody\n", 2),  # unknown tag
    ],
)
def test_invalid_yaml_reports_the_source_line(tmp_path, source, line):
    issue = error_of(tmp_path, "a.md", source)
    assert issue.reason.startswith("invalid YAML frontmatter:")
    assert issue.line == line
    assert str(issue).startswith(f"a.md:{line}: invalid YAML")


def test_unclosed_frontmatter(tmp_path):
    issue = error_of(tmp_path, "a.md", "---\ntitle: x\n\n# Heading\n")
    assert (issue.line, issue.reason) == (1, "frontmatter opened with '---' is never closed")


def test_invalid_utf8_names_the_byte_offset_and_line(tmp_path):
    issue = error_of(tmp_path, "a.md", b"---\ntitle: x\n---\nfine\nbad \xff here\n")
    assert issue.line == 5
    assert issue.reason == "not valid UTF-8: byte 0xff at byte offset 26"


def test_binary_file_with_md_name(tmp_path):
    issue = error_of(tmp_path, "img.md", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert issue.reason.startswith("binary file")


@pytest.mark.parametrize("content", [b"", b"   \n\n\t\n", b"\xef\xbb\xbf\n"])
def test_empty_file_is_skipped(tmp_path, content):
    issue = error_of(tmp_path, "a.md", content, kind=SkipDocument)
    assert issue.reason == EMPTY_FILE_REASON


def test_section_page_without_body_is_skipped(tmp_path):
    issue = error_of(tmp_path, "k8s/_index.md", "---\ntitle: kubernetes\nweight: 10\n---", kind=SkipDocument)
    assert issue.reason == SECTION_PAGE_REASON
    issue = error_of(tmp_path, "k8s/page.md", "---\ntitle: kubernetes\n---\n\n  \n", kind=SkipDocument)
    assert issue.reason == NO_BODY_REASON


def test_section_page_with_a_body_loads(tmp_path):
    assert load(tmp_path, "k8s/_index.md", "---\ntitle: K8s\n---\nAbout this section.\n").title == "K8s"


def test_large_document_loads_whole_and_the_size_cap_applies(tmp_path):
    para = "The pod restarts because the liveness probe fails; check `kubectl describe`.\n"
    section = "## Diagnosis\n\n" + para * 10 + "\n- item one\n- item two\n\n"
    content = "---\ntitle: Big\n---\n# Big\n\n" + section * (5_000_000 // len(section))
    path = write(tmp_path, "big.md", content)
    assert path.stat().st_size > 4_900_000
    doc = load_document(path, tmp_path)
    assert doc.title == "Big" and doc.h1 == "Big"
    assert doc.body == content.split("---\n", 2)[2]  # the whole body, nothing cut or altered
    with pytest.raises(DocumentError, match="over the max_bytes limit of 1000000"):
        load_document(path, tmp_path, max_bytes=1_000_000)


@pytest.mark.parametrize(
    ("frontmatter", "field", "line"),
    [
        ("title: [a, b]", "'title' must be text, got list", 2),
        ("x: 1\ntitle:\n  a: b", "'title' must be text, got dict", 4),
        ("category: [db]", "'category' must be text, got list", 2),
        ("keywords: {a: b}", "'keywords' must be a list or text, got a mapping", 2),
        ("keywords:\n  - ok\n  - [nested]", "'keywords' item 2 must be text, got list", 4),
        ("priority: high", "'priority' must be a number, got 'high'", 2),
        ("priority: true", "'priority' must be a number, got True", 2),
    ],
)
def test_wrong_field_types_name_the_field_and_line(tmp_path, frontmatter, field, line):
    issue = error_of(tmp_path, "a.md", f"---\n{frontmatter}\n---\nbody\n")
    assert field in issue.reason
    assert issue.line == line


def test_yaml_alias_bomb_is_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    issue = error_of(tmp_path, "a.md", "---\n" + "\n".join(lines) + "\n---\nbody\n")
    assert "frontmatter has more than" in issue.reason


# --- symlinks and scanning -----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "kb"
    outside = tmp_path / "outside"
    write(outside, "secret.md", "# Secret\n\ntext\n")
    write(root, "b/good.md", "# Good\n\ntext\n")
    write(root, "a/also.markdown", "---\ntitle: Also\n---\ntext\n")
    write(root, "root.md", "text at the root\n")
    write(root, "a/bad.md", "---\ntitle: [x]\n---\ntext\n")
    write(root, "a/_index.md", "---\ntitle: a\n---\n")
    write(root, "a/empty.md", b"")
    write(root, "a/notes.txt", "not markdown")
    write(root, ".git/hidden.md", "# hidden\n")
    os.symlink(outside / "secret.md", root / "b" / "escape.md")
    os.symlink(root / "b" / "good.md", root / "a" / "inside-link.md")
    os.symlink(outside, root / "linked-dir")
    os.symlink(root / "missing.md", root / "b" / "broken.md")
    return root


def test_symlink_outside_the_root_is_not_followed(tree):
    with pytest.raises(DocumentError) as info:
        load_document(tree / "b" / "escape.md", tree)
    assert info.value.issue.path == "b/escape.md"
    assert "symlink points outside the knowledge root" in info.value.issue.reason
    assert load_document(tree / "a" / "inside-link.md", tree).doc_id == "a/inside-link.md"


def test_scan_keeps_going_and_reports_every_bad_document(tree):
    docs, issues = scan_documents(tree)
    assert [d.doc_id for d in docs] == ["a/also.markdown", "a/inside-link.md", "b/good.md", "root.md"]
    assert [d.category for d in docs] == ["a", "a", "b", ""]
    reasons = {i.path: i.reason for i in issues}
    assert set(reasons) == {"a/_index.md", "a/bad.md", "a/empty.md", "b/broken.md", "b/escape.md", "linked-dir"}
    assert reasons["a/_index.md"] == SECTION_PAGE_REASON
    assert reasons["a/empty.md"] == EMPTY_FILE_REASON
    assert reasons["b/broken.md"].startswith("broken symlink")
    assert "outside the knowledge root" in reasons["linked-dir"]
    assert scan_documents(tree) == (docs, issues)  # deterministic


def test_symlink_loops_are_reported_and_the_batch_goes_on(tree):
    os.symlink("loop.md", tree / "b" / "loop.md")  # points at itself
    os.symlink(tree / "b" / "pong.md", tree / "b" / "ping.md")
    os.symlink(tree / "b" / "ping.md", tree / "b" / "pong.md")
    docs, issues = scan_documents(tree)
    reasons = {i.path: i.reason for i in issues}
    assert {"b/loop.md", "b/ping.md", "b/pong.md"} <= set(reasons)
    assert all(reasons[p].startswith("symlink loop") for p in ("b/loop.md", "b/ping.md", "b/pong.md"))
    assert reasons["b/broken.md"].startswith("broken symlink")
    assert "b/good.md" in [d.doc_id for d in docs]


def test_scan_root_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        scan_documents(tmp_path / "nope")
    write(tmp_path, "file.md", "x")
    with pytest.raises(NotADirectoryError, match="file.md"):
        scan_documents(tmp_path / "file.md")


def test_crlf_bom_document_in_a_batch(tmp_path):
    write(tmp_path, "x/win.md", b"\xef\xbb\xbf---\r\ntitle: Windows\r\n---\r\n# H\r\n\r\nbody\r\n")
    docs, issues = scan_documents(tmp_path)
    assert issues == []
    assert docs[0].title == "Windows" and "\r" not in docs[0].body


# --- the real corpora ----------------------------------------------------------------------


@pytest.mark.parametrize("root", [RUNBOOKS, RUNBOOKS_ZH], ids=["runbooks", "runbooks-zh"])
def test_real_corpora_load_with_only_section_pages_skipped(root):
    if not root.is_dir():
        pytest.skip(f"{root} is absent: the shared corpora live in ../shared beside the repo")
    docs, issues = scan_documents(root)
    assert len(docs) > 40
    assert issues and all(i.path.endswith("_index.md") and i.reason == SECTION_PAGE_REASON for i in issues)
    for doc in docs:
        assert doc.title and "\r" not in doc.title and doc.body.strip()
        assert doc.category == doc.doc_id.split("/")[0]
    crash = next(d for d in docs if d.doc_id == "kubernetes/KubePodCrashLooping.md")
    assert crash.h1 == "KubePodCrashLooping"


@pytest.mark.parametrize("second", ["title", "Title"])
def test_repeated_frontmatter_key_warns_with_line_and_last_value_wins(tmp_path, second):
    path = tmp_path / "doc.md"
    path.write_text(f"---\ntitle: First\ncategory: ops\n{second}: Second\n---\n# H\n\nbody\n")
    doc = load_document(path, tmp_path)
    assert doc.title == "Second"
    assert len(doc.warnings) == 1
    warning = doc.warnings[0]
    assert (warning.path, warning.line) == ("doc.md", 4)
    assert f"'{second}'" in warning.reason and "last value wins" in warning.reason
