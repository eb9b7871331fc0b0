"""Golden case loading: the shared files, and every kind of bad input named precisely."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import need_shared

from rag_core.evaluation.cases import CaseFileError, GoldenCase, load_cases

SHARED_GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden"
REPO_GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _write(tmp_path: Path, text: str, name: str = "cases.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(CaseFileError) as info:
        load_cases(path)
    return str(info.value)


def test_shared_visible_cases_load_as_they_are():
    cases = load_cases(need_shared(SHARED_GOLDEN / "runbooks-visible.yaml"))
    assert len(cases) == 16
    assert {c.scenario for c in cases} == {"chat", "aiops_alert"}
    first = cases[0]
    assert first.id == "v-en-001"
    assert first.expected_docs == ["kubernetes/KubeSchedulerDown.md"]
    assert first.expected_keywords == ["scheduler"]
    assert first.expected_breadcrumbs == []


@pytest.mark.parametrize(
    "path",
    sorted(SHARED_GOLDEN.glob("*.yaml")) + sorted(p for p in REPO_GOLDEN.glob("*.yaml") if p.name != "suites.yaml"),
    ids=lambda p: p.name,
)
def test_every_golden_file_in_the_project_loads(path: Path):
    assert load_cases(path)


def test_top_level_list_and_lenient_scalars(tmp_path: Path):
    path = _write(
        tmp_path,
        "- {id: 17, scenario: runbook_search, query: ' q ', expected_docs: a/b.md}\n",
    )
    [case] = load_cases(path)
    assert case == GoldenCase(id="17", scenario="runbook_search", query="q", expected_docs=["a/b.md"])


def test_jsonl_cases(tmp_path: Path):
    rows = [
        {"id": "j1", "scenario": "chat", "query": "q1", "expected_docs": ["a.md"]},
        {
            "id": "j2",
            "scenario": "aiops_alert",
            "query": "q2",
            "expected_docs": ["b.md"],
            "expected_breadcrumbs": ["B > Meaning"],
            "notes": "unknown keys are ignored",
        },
    ]
    path = _write(tmp_path, "\n".join(json.dumps(r) for r in rows) + "\n\n", "cases.jsonl")
    cases = load_cases(path)
    assert [c.id for c in cases] == ["j1", "j2"]
    assert cases[1].expected_breadcrumbs == ["B > Meaning"]


def test_malformed_jsonl_names_the_line(tmp_path: Path):
    path = _write(tmp_path, '{"id": "j1"}\n{not json\n', "cases.jsonl")
    message = _error(path)
    assert "cases.jsonl" in message and "line 2" in message


def test_malformed_yaml_names_file_and_line(tmp_path: Path):
    path = _write(tmp_path, "cases:\n- {id: a, scenario: chat\n- {id: b}\n")
    message = _error(path)
    assert str(path) in message
    assert "malformed YAML" in message and "line 3" in message


def test_case_without_expected_docs_names_case_and_field(tmp_path: Path):
    path = _write(
        tmp_path,
        "cases:\n"
        "- {id: ok-1, scenario: chat, query: q, expected_docs: [a.md]}\n"
        "- {id: bad-1, scenario: chat, query: q, expected_docs: []}\n"
        "- {scenario: chat, query: q}\n",
    )
    with pytest.raises(CaseFileError) as info:
        load_cases(path)
    problems = info.value.problems
    assert any("'bad-1'" in p and "index 1" in p and "expected_docs" in p for p in problems)
    # The third case has no id: it is named by its index.
    assert any(p.startswith("index 2") and "'id'" in p for p in problems)


def test_unanswerable_case_has_no_expected_docs(tmp_path: Path):
    path = _write(
        tmp_path,
        "cases:\n- {id: u-1, scenario: chat, query: how do I renew a passport, unanswerable: true}\n",
    )
    (case,) = load_cases(path)
    assert case.unanswerable and case.expected_docs == []
    bad = _write(
        tmp_path,
        "cases:\n- {id: u-2, scenario: chat, query: q, unanswerable: true, expected_docs: [a.md]}\n",
    )
    with pytest.raises(CaseFileError) as info:
        load_cases(bad)
    assert any("'u-2'" in p and "unanswerable" in p for p in info.value.problems)


def test_blank_expected_doc_and_blank_query(tmp_path: Path):
    path = _write(
        tmp_path,
        "cases:\n- {id: a, scenario: chat, query: '  ', expected_docs: ['x.md', ' ']}\n",
    )
    message = _error(path)
    assert "field 'query'" in message and "field 'expected_docs'" in message


def test_unknown_scenario_type(tmp_path: Path):
    path = _write(tmp_path, "cases:\n- {id: a, scenario: Chat Bot, query: q, expected_docs: [x.md]}\n")
    message = _error(path)
    assert "unknown scenario type" in message and "'a'" in message and "scenario" in message


@pytest.mark.parametrize("text", ["", "   \n# only a comment\n", "cases: []\n", "cases:\n"])
def test_empty_case_file(tmp_path: Path, text: str):
    assert "no cases" in _error(_write(tmp_path, text))


def test_mapping_without_cases_key(tmp_path: Path):
    assert "'cases:'" in _error(_write(tmp_path, "items: []\n"))


def test_duplicate_ids_name_both_positions(tmp_path: Path):
    path = _write(
        tmp_path,
        "cases:\n"
        "- {id: d, scenario: chat, query: q, expected_docs: [x.md]}\n"
        "- {id: e, scenario: chat, query: q, expected_docs: [x.md]}\n"
        "- {id: d, scenario: chat, query: q2, expected_docs: [y.md]}\n",
    )
    message = _error(path)
    assert "duplicate case id 'd' at index 0 and index 2" in message


def test_id_must_be_usable_as_fixture_name(tmp_path: Path):
    path = _write(tmp_path, "- {id: a/b, scenario: chat, query: q, expected_docs: [x.md]}\n")
    assert "file name" in _error(path)


def test_missing_file_is_a_case_file_error(tmp_path: Path):
    assert "cannot read" in _error(tmp_path / "nope.yaml")
