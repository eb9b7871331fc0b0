"""Golden suites (case file + corpus) and L0 filter cost accounting."""

from pathlib import Path

import pytest
from conftest import make_settings

from rag_core.evaluation.cases import load_cases
from rag_core.evaluation.evaluator import evaluate
from rag_core.evaluation.filter_cost import classify
from rag_core.evaluation.fixtures import CaseFixture, FixtureSet
from rag_core.evaluation.reports import render_baseline_markdown
from rag_core.evaluation.suites import DEFAULT_SUITES_FILE, SuiteFileError, load_suites, suite_settings
from rag_core.settings import PROJECT_ROOT, SAMPLE_KNOWLEDGE_DIR

EXPECTED = ["etcd/etcdDatabaseQuotaLowSpace.md"]


def _fixture(
    final: list[str], unfiltered: list[str] | None, filtered_docs: list[str], category: str | None = "kubernetes"
) -> CaseFixture:
    def rows(docs: list[str]) -> list[dict]:
        return [{"rank": i, "doc_id": d} for i, d in enumerate(docs, start=1)]

    probe = (
        None
        if category is None
        else {
            "category_filter": category,
            "filtered_docs": filtered_docs,
            "unfiltered_candidates": rows(unfiltered or []),
        }
    )
    return CaseFixture.model_validate(
        {"case_id": "c1", "store": "milvus", "candidates": rows(final), "filter_probe": probe}
    )


@pytest.mark.parametrize(
    ("final", "unfiltered", "filtered_docs", "effect"),
    [
        (["k/A.md", "k/B.md"], [EXPECTED[0], "k/A.md"], ["k/A.md", "k/B.md"], "hurt"),
        (["k/A.md", EXPECTED[0]], ["k/A.md", EXPECTED[0]], ["k/A.md"], "rescued"),
        ([EXPECTED[0], "k/A.md"], ["k/A.md", EXPECTED[0]], [EXPECTED[0]], "helped"),
        ([EXPECTED[0]], [EXPECTED[0]], [EXPECTED[0]], "no_difference"),
    ],
)
def test_filter_effect_compares_ranks_with_and_without_the_filter(final, unfiltered, filtered_docs, effect):
    outcome = classify(_fixture(final, unfiltered, filtered_docs), EXPECTED)
    assert outcome.effect == effect
    assert outcome.category_filter == "kubernetes"


def test_no_filter_and_old_fixtures_are_told_apart():
    assert classify(_fixture([EXPECTED[0]], None, [], category=None), EXPECTED).effect == "no_filter"
    assert classify(_fixture([EXPECTED[0]], None, [EXPECTED[0]]), EXPECTED).effect == "unknown"


def test_report_lists_the_cases_the_filter_hurt_first(tmp_path):
    cases_file = tmp_path / "cases.yaml"
    cases_file.write_text(
        "cases:\n"
        f"- {{id: a-helped, scenario: chat, query: q1, expected_docs: [{EXPECTED[0]}]}}\n"
        f"- {{id: z-hurt, scenario: chat, query: q2, expected_docs: [{EXPECTED[0]}]}}\n"
    )
    cases = load_cases(cases_file)
    helped = _fixture([EXPECTED[0]], ["k/A.md", EXPECTED[0]], [EXPECTED[0]])
    hurt = _fixture(["k/A.md"], [EXPECTED[0]], ["k/A.md"]).model_copy(update={"case_id": "z-hurt"})
    fixtures = FixtureSet(
        directory=str(tmp_path),
        store="milvus",
        fixtures={"a-helped": helped.model_copy(update={"case_id": "a-helped"}), "z-hurt": hurt},
    )
    report = evaluate(cases, fixtures)
    assert report.filter_cost is not None
    assert report.filter_cost.counts["hurt"] == 1 and report.filter_cost.counts["helped"] == 1
    md = render_baseline_markdown(report)
    section = md[md.index("## L0 category filter cost") :]
    assert section.index("`z-hurt`") < section.index("`a-helped`")


def test_repo_suites_file_loads_with_paths_resolved():
    suites = load_suites(DEFAULT_SUITES_FILE)
    names = [s.name for s in suites]
    assert {"sample", "runbooks-en", "runbooks-en-hard", "runbooks-zh"} <= set(names)
    sample = next(s for s in suites if s.name == "sample")
    assert sample.knowledge_dir == SAMPLE_KNOWLEDGE_DIR.resolve()
    assert sample.cases == (PROJECT_ROOT / "golden" / "cases.yaml").resolve()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            "suites:\n- {name: a, cases: x.yaml, knowledge_dir: k}\n- {name: a, cases: y.yaml, knowledge_dir: k}\n",
            "duplicate suite name(s) a",
        ),
        ("suites:\n- {name: Bad Name, cases: x.yaml, knowledge_dir: k}\n", "suites.0.name"),
        ("suites:\n- {name: a, knowledge_dir: k}\n", "suites.0.cases"),
        ("suites: [\n", "not valid YAML"),
    ],
)
def test_bad_suites_file_names_the_file_and_field(tmp_path, body, needle):
    path = tmp_path / "suites.yaml"
    path.write_text(body)
    with pytest.raises(SuiteFileError) as err:
        load_suites(path, root=tmp_path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_suite_settings_give_each_suite_its_own_index(tmp_path):
    suites = load_suites(DEFAULT_SUITES_FILE)
    base = make_settings(tmp_path)
    derived = [suite_settings(base, s) for s in suites]
    assert len({d.collection for d in derived}) == len(suites)
    assert len({d.pg_table for d in derived}) == len(suites)
    assert len({d.data_dir for d in derived}) == len(suites)
    assert all(d.data_dir.parent == tmp_path / "suites" for d in derived)


@pytest.mark.integration
def test_run_suite_ingests_records_and_evaluates(tmp_path, embedder):
    from rag_core.evaluation.suites import GoldenSuite
    from rag_core.recording.suites import run_suite

    cases = tmp_path / "cases.yaml"
    cases.write_text(
        "cases:\n"
        "- {id: s-1, scenario: aiops_alert, query: redis-sessions memory usage at 88% of its limit, "
        "expected_docs: [cache/RedisMemoryHigh.md], expected_keywords: [maxmemory]}\n"
        "- {id: s-2, scenario: chat, query: fulfillment consumer group is 50k messages behind, "
        "expected_docs: [queues/KafkaConsumerLagHigh.md]}\n"
    )
    suite = GoldenSuite(name="tiny", cases=cases, knowledge_dir=SAMPLE_KNOWLEDGE_DIR)
    missing = GoldenSuite(name="gone", cases=cases, knowledge_dir=tmp_path / "absent")
    base = make_settings(tmp_path / "data")

    skipped = run_suite(base, missing, embedder, tmp_path / "reports", with_sidecar=False)
    assert skipped.status == "skipped" and "absent" in (skipped.reason or "")

    outcome = run_suite(base, suite, embedder, tmp_path / "reports", with_sidecar=False)
    assert outcome.status == "ok", outcome.reason
    report = outcome.reports["milvus"]
    assert report.summary.case_count == 2 and report.summary.not_run == 0
    assert report.summary.recall_at_k[5] == 1.0
    assert report.filter_cost is not None
    assert outcome.current_files is not None and outcome.comparison_files is not None
    assert outcome.current_files.markdown_path == Path(outcome.report_dir or "") / "current.md"
    assert outcome.current_files.markdown_path.is_file() and outcome.comparison_files.json_path.is_file()
    assert (tmp_path / "data" / "suites" / "tiny" / "fixtures" / "milvus" / "s-1.json").is_file()
    # The report says which models ranked: the main one and the rerank's second one.
    assert report.manifest is not None and report.manifest.ensemble_model_id == "use-multilingual-v3"
    assert "+ `use-multilingual-v3` (rerank)" in outcome.current_files.markdown_path.read_text()
