"""The rag_assets code location on the real embedded components (Milvus Lite, embedded
PostgreSQL with pgvector, the packaged MiniLM model) over the sample knowledge base.

One module-scoped materialization through the main command (``python -m rag_assets.run``),
preceded by a failing run (missing knowledge directory), is shared by the assertions. Every
directory (RAG data dir, DAGSTER_HOME, stored baseline) is temporary.
"""

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import polars as pl
import pytest

from rag_assets import run
from rag_assets.definitions import defs
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource, build_resources
from rag_assets.timing import TRACE_START_DATE, today_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
KNOWLEDGE = ROOT / "golden" / "knowledge"
CASES = ROOT / "golden" / "cases.yaml"
UNSET = (
    "RAG_PG_DSN",
    "RAG_MILVUS_URI",
    "RAG_MILVUS_TOKEN",
    "RAG_SIDECAR_ENABLED",
    "RAG_REPORTS_DIR",
    "RAG_PUBLISHED_DIR",
    "RAG_COLLECTION",
    "RAG_PG_TABLE",
)
BUILT = (
    "knowledge_documents",
    "chunks",
    "l0_index",
    "milvus_collection",
    "pgvector_table",
    "golden_cases",
    "retrieval_fixtures_milvus",
    "retrieval_fixtures_pgvector",
    "golden_evaluation_milvus",
    "golden_evaluation_pgvector",
    "baseline_report",
    "comparison_report",
    "publish_reports",
    "retrieval_history",
    "trace_tables",
)


def _main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run.main(list(argv))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def env():
    """Temporary DAGSTER_HOME, data dir and (absent) stored baseline, set as the main command's
    environment; the embedded PostgreSQL started under the data dir is stopped afterwards.

    Not pytest's tmp_path: as root, PostgreSQL runs as the ``pgserver`` user, which must
    traverse every parent directory, and pytest resets ``/tmp/pytest-of-<user>`` to mode 0700
    whenever another pytest session starts (see conftest_pg.py).
    """
    tmp = Path(tempfile.mkdtemp(prefix="rag-dagster-it-"))
    ns = SimpleNamespace(
        tmp=tmp, home=tmp / "dagster_home", data=tmp / "data", baseline=tmp / "stored" / "baseline.json"
    )
    with pytest.MonkeyPatch.context() as mp:
        for var in UNSET:
            mp.delenv(var, raising=False)
        for var, value in {
            "DAGSTER_HOME": ns.home,
            "RAG_DATA_DIR": ns.data,
            "RAG_KNOWLEDGE_DIR": KNOWLEDGE,
            "RAG_GOLDEN_CASES": CASES,
            "RAG_BASELINE": ns.baseline,
        }.items():
            mp.setenv(var, str(value))
        try:
            yield ns
        finally:
            from rag_core.stores.pgserver import stop_embedded

            with contextlib.suppress(Exception):
                stop_embedded(ns.data / "pgdata", mode="immediate")
            with contextlib.suppress(Exception):  # the embedded Milvus server outlives the runs
                from rag_core.stores.milvus_server import stop_server

                stop_server(ns.data)
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def runs(env):
    """A run on a missing knowledge directory, then the real one, both via ``run.main``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_KNOWLEDGE_DIR", str(env.tmp / "missing"))
        failed = _main()
    ok = _main()
    return SimpleNamespace(failed=failed, ok=ok, instance=dg.DagsterInstance.get())


def _metadata(instance, asset: str, partition: str | None = None) -> dict:
    if partition is None:
        event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    else:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
        ).records
        event = records[0].event_log_entry if records else None
    assert event is not None, f"{asset} was not materialized"
    return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


def _check(instance, asset: str, name: str):
    record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(dg.AssetKey(asset), name))
    assert record is not None and record.event is not None, f"{asset}:{name} did not run"
    return record.event.dagster_event.event_specific_data


# --- the main command ------------------------------------------------------------------------


def test_missing_knowledge_dir_fails_the_first_asset_and_nothing_downstream(runs, env):
    code, out = runs.failed
    assert code == 1
    assert "step knowledge_documents failed: knowledge directory unusable" in out
    assert str(env.tmp / "missing") in out
    [not_run] = [line for line in out.splitlines() if line.strip().startswith("not run")]
    for asset in ("chunks", "l0_index", "milvus_collection", "pgvector_table", "baseline_report", "publish_reports"):
        assert f"materialized {asset}:" not in out
        assert asset in not_run


def test_main_command_builds_everything_after_a_failed_run(runs, env):
    code, out = runs.ok
    assert code == 0, out
    for asset in BUILT:
        assert f"materialized {asset}:" in out
    for name in ("baseline.md", "baseline.json", "comparison.md", "comparison.json"):
        assert str(env.data / "reports" / name) in out
        assert (env.data / "reports" / name).is_file()
        assert (env.data / "published" / name).is_file()
    assert str(env.data / "traces" / "tool_invocation" / f"day={today_key()}" / "part-0.parquet") in out
    assert (env.home / "dagster.yaml").is_file()


def test_rag_doctor_verifies_both_stores_after_the_main_command(runs, env):
    """The Dagster ingest leaves the index state the CLI ingest leaves: one ingest, one state."""
    from typer.testing import CliRunner

    from rag_core.cli import app

    res = CliRunner().invoke(app, ["doctor", "--sidecar", "--json"])
    report = json.loads(res.output[res.output.index("{") :])
    assert res.exit_code == 0, res.output
    assert report["state_problem"] is None
    assert {s["store"] for s in report["stores"] if s["ok"] and s["checked_chunks"] > 0} == {"milvus", "pgvector"}


def test_change_sensor_first_tick_sees_the_main_command_s_ingest(runs, env):
    """``make ui`` after ``make run``: the sensor's first tick requests no second ingest."""
    sensor = defs.resolve_sensor_def("knowledge_change_sensor")
    context = dg.build_sensor_context(
        resources={"rag": RagSettingsResource()}, definitions=defs, instance=runs.instance
    )
    result = sensor.evaluate_tick(context)
    assert not result.run_requests and "since the last ingest" in (result.skip_message or "")


def test_ingest_and_index_metadata(runs, env):
    docs = _metadata(runs.instance, "knowledge_documents")
    assert docs["document_count"] == 34 and docs["skipped_count"] == 1
    assert [r.data["path"] for r in docs["skipped_documents"].records] == ["databases/_index.md"]
    chunks = _metadata(runs.instance, "chunks")
    frame = pl.read_parquet(env.data / "tables" / "chunks.parquet")
    assert chunks["dagster/row_count"] == frame.height > docs["document_count"]
    assert {c.name for c in chunks["dagster/column_schema"].columns} == set(frame.columns)
    assert frame["tokens"].max() <= 256
    l0 = _metadata(runs.instance, "l0_index")
    assert l0["entries"] == docs["document_count"] and l0["domains"] >= 5 and l0["keywords"] > 0
    for store in ("milvus_collection", "pgvector_table"):
        meta = _metadata(runs.instance, store)
        assert meta["status"] == "available"
        assert meta["dagster/row_count"] == frame.height
        assert meta["added"] + meta["updated"] + meta["unchanged"] == frame.height
        assert meta["removed"] == 0


def test_evaluation_and_report_metadata(runs, env):
    cases = _metadata(runs.instance, "golden_cases")["case_count"]
    for path in ("milvus", "pgvector"):
        fixtures = _metadata(runs.instance, f"retrieval_fixtures_{path}")
        assert fixtures["status"] == "available" and fixtures["fixture_count"] == cases
        evaluation = _metadata(runs.instance, f"golden_evaluation_{path}")
        assert evaluation["run_count"] == cases and evaluation["not_run"] == 0
        assert 0.5 <= evaluation["recall@5"] <= 1.0 and 0.0 < evaluation["mrr"] <= 1.0
    baseline = _metadata(runs.instance, "baseline_report")
    assert baseline["report"].startswith("#") and isinstance(baseline["recall@5"], float)
    assert baseline["summary"]["summary"]["case_count"] == cases
    stored = json.loads((env.data / "reports" / "baseline.json").read_text())
    assert stored["summary"]["mrr"] == pytest.approx(baseline["mrr"])
    comparison = _metadata(runs.instance, "comparison_report")
    assert comparison["sidecar_status"] == "available" and 0.0 <= comparison["top5_overlap"] <= 1.0
    assert "pgvector" in comparison["report"] and "milvus" in comparison["report"]
    assert _metadata(runs.instance, "publish_reports")["file_count"] == 6


def test_checks_pass_on_the_sample(runs, env):
    gate = _check(runs.instance, "baseline_report", "baseline_regression")
    assert gate.passed and "no stored baseline" in gate.description
    assert _check(runs.instance, "knowledge_documents", "documents_have_title_and_category").passed
    for path in ("milvus", "pgvector"):
        assert _check(runs.instance, f"retrieval_fixtures_{path}", "every_case_has_a_fixture").passed
    parity = _check(runs.instance, "comparison_report", "sidecar_parity")
    assert "top5_overlap" in parity.metadata


# --- traces ----------------------------------------------------------------------------------


def test_todays_trace_partition_holds_the_evaluation_lookups(runs, env):
    meta = _metadata(runs.instance, "trace_tables", today_key())
    frame = pl.read_parquet(env.data / "traces" / "tool_invocation" / f"day={today_key()}" / "part-0.parquet")
    cases = _metadata(runs.instance, "golden_cases")["case_count"]
    assert meta["dagster/row_count"] == frame.height
    for path in ("milvus", "pgvector"):
        assert frame.filter(pl.col("session_id").str.starts_with(f"eval-{path}-")).height >= cases
    assert sum(meta["retrieval_layer_counts"].values()) == frame.height
    assert 0.0 <= meta["fallback_rate"] <= 1.0
    assert 0.0 < meta["latency_p50_ms"] <= meta["latency_p95_ms"] <= meta["latency_p99_ms"]


def test_trace_partition_of_a_given_day(runs, env):
    day = TRACE_START_DATE  # the first partition: no lookups were traced that day here
    result = defs.resolve_job_def("trace_export_job").execute_in_process(
        instance=runs.instance, partition_key=day, raise_on_error=False
    )
    assert result.success
    meta = _metadata(runs.instance, "trace_tables", day)
    if day != today_key():
        assert meta["dagster/row_count"] == 0 and "fallback_rate" not in meta
    path = env.data / "traces" / "tool_invocation" / f"day={day}" / "part-0.parquet"
    assert pl.read_parquet(path).columns == [c.name for c in meta["dagster/column_schema"].columns]


def test_main_command_runs_are_in_their_job_history(runs, env):
    """``make run``'s runs carry the code location's repository tag: the UI lists them under the
    job (runs filtered by job name and repository tag)."""
    for job in ("refresh_job", "trace_export_job"):
        history = runs.instance.get_runs(
            dg.RunsFilter(
                job_name=job, tags={".dagster/repository": "__repository__@rag_assets", "rag/trigger": "rag_assets.run"}
            )
        )
        assert history, f"no {job} run in the job's history"
        for run_ in history:  # a reconstructable job's run: its Python origin is the definitions module
            assert run_.job_code_origin is not None
    [traces] = runs.instance.get_runs(
        dg.RunsFilter(job_name="trace_export_job", tags={"rag/trigger": "rag_assets.run"}), limit=1
    )
    assert traces.tags["dagster/partition"] == today_key() and traces.status == dg.DagsterRunStatus.SUCCESS


# --- the sidecar down --------------------------------------------------------------------------


def test_sidecar_unavailable_reports_instead_of_failing(runs, env):
    data = env.tmp / "sidecar_down"
    for sub in ("fixtures", "evaluation", "reports", "dagster"):  # dagster: the stored asset outputs
        shutil.copytree(env.data / sub, data / sub)
    rag = RagSettingsResource(data_dir=str(data), pg_dsn="postgresql://rag:s3cret-pw@127.0.0.1:9/rag")
    resources = build_resources(rag, EvaluationConfigResource(baseline_path=str(env.baseline)))
    selection = dg.AssetSelection.assets(
        "pgvector_table", "retrieval_fixtures_pgvector", "golden_evaluation_pgvector", "comparison_report"
    )
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],
        resources=resources,
        instance=runs.instance,
        selection=selection,
        raise_on_error=False,
    )
    assert result.success
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert meta["pgvector_table"]["status"].value == "unavailable"
    assert "s3cret-pw" not in meta["pgvector_table"]["reason"].value
    assert meta["retrieval_fixtures_pgvector"]["status"].value == "unavailable"
    assert meta["golden_evaluation_pgvector"]["not_run"].value == meta["golden_evaluation_pgvector"]["case_count"].value
    assert meta["comparison_report"]["sidecar_status"].value == "unavailable"
    comparison = json.loads((data / "reports" / "comparison.json").read_text())
    assert comparison["main"]["summary"]["run_count"] > 0
    parity = next(c for c in result.get_asset_check_evaluations() if c.check_name == "sidecar_parity")
    assert not parity.passed and parity.severity == dg.AssetCheckSeverity.WARN


# --- the UI --------------------------------------------------------------------------------------


def test_ui_serves_the_lineage_runs_descriptions_and_charts(runs, env):
    """The webserver on the instance ``make run`` filled: lineage, descriptions, the runs in
    their job's history, re-execution accepted, charts inline in the report metadata."""
    script = ROOT / "scripts" / "check_dagster_ui.py"
    done = subprocess.run(
        [sys.executable, str(script), "--timeout", "150", "--dagster-home", str(env.home), "--data-dir", str(env.data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trace_tables <- tool_invocation" in done.stdout
    assert "job refresh_job: 2 of 2 `make run` run(s) in its history" in done.stdout
    assert "re-execute refresh_job run" in done.stdout and "accepted" in done.stdout
    assert "baseline_report.recall_chart: chart inline" in done.stdout
    assert "retrieval_history.trend_chart: chart inline" in done.stdout
