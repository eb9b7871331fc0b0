"""The rag_assets code location without real stores: loading, lineage, schedule, sensor,
bad input, the blocking regression gate, the trace statistics and the store lock."""

import importlib.util
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from rag_assets.definitions import defs
from rag_assets.defs.resources import (
    EvaluationConfigResource,
    RagSettingsResource,
    build_resources,
    settings_resource_from_env,
)
from rag_assets.defs.traces import trace_frame, trace_stats
from rag_assets.locks import StoreBusyError, store_lock
from rag_assets.timing import DAILY_PARTITIONS, TRACE_START_DATE, previous_day_key, trace_start_date
from rag_core.evaluation.testing import make_fixture, make_manifest, write_fixture_dir
from rag_core.traces.rows import TraceRow

ROOT = Path(__file__).resolve().parent.parent
ALL_DEFS = [*defs.assets, *defs.asset_checks]


def _load_ui_script():
    spec = importlib.util.spec_from_file_location("check_dagster_ui", ROOT / "scripts" / "check_dagster_ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resources(tmp_path: Path, **rag) -> dict:
    rag.setdefault("data_dir", str(tmp_path / "data"))
    return build_resources(
        RagSettingsResource(**rag), EvaluationConfigResource(baseline_path=str(tmp_path / "stored" / "baseline.json"))
    )


def _step_failure(result, step_key: str) -> str:
    event = next(e for e in result.get_step_failure_events() if e.step_key == step_key)
    data = event.step_failure_data
    return data.user_failure_data.description if data.user_failure_data else data.error.to_string()


# --- loading and lineage -----------------------------------------------------------------------


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)
    for name in ("ingest_job", "nightly_evaluation_job", "refresh_job", "trace_export_job", "golden_suites_job"):
        assert defs.resolve_job_def(name) is not None
    assert defs.resolve_schedule_def("nightly_evaluation").cron_schedule == "0 2 * * *"
    assert defs.resolve_schedule_def("nightly_golden_suites").job_name == "golden_suites_job"
    assert defs.resolve_sensor_def("knowledge_change_sensor") is not None


def test_lineage_matches_the_expected_graph():
    expected = _load_ui_script().EXPECTED_LINEAGE
    graph = defs.resolve_asset_graph()
    actual = {
        key.to_user_string(): {p.to_user_string() for p in graph.get(key).parent_keys}
        for key in graph.get_all_asset_keys()
    }
    assert actual == {k: set(v) for k, v in expected.items()}


def test_groups_checks_and_partitions():
    graph = defs.resolve_asset_graph()
    groups = {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert groups["knowledge_documents"] == groups["chunks"] == "ingest"
    assert groups["l0_index"] == groups["milvus_collection"] == groups["pgvector_table"] == "index"
    assert groups["ingest_plan"] == groups["chunk_embeddings"] == "index"
    assert groups["baseline_report"] == groups["comparison_report"] == "reports"
    assert groups["trace_tables"] == "traces" and groups["golden_cases"] == "evaluation"
    checks = {c.to_user_string() for c in graph.asset_check_keys}
    assert checks == {
        "baseline_report:baseline_regression",
        "comparison_report:sidecar_parity",
        "knowledge_documents:documents_have_title_and_category",
        "retrieval_fixtures_milvus:every_case_has_a_fixture",
        "retrieval_fixtures_pgvector:every_case_has_a_fixture",
    }
    blocking = {spec.key.to_user_string() for a in defs.asset_checks for spec in a.check_specs if spec.blocking}
    assert blocking == {"baseline_report:baseline_regression"}
    assert graph.get(dg.AssetKey("trace_tables")).partitions_def == DAILY_PARTITIONS
    assert graph.get(dg.AssetKey("golden_evaluation_milvus")).freshness_policy is not None


# --- schedule and sensor -----------------------------------------------------------------------


def test_nightly_tick_targets_the_previous_day():
    schedule = defs.resolve_schedule_def("nightly_evaluation")
    tick = datetime.now(UTC).replace(hour=2, minute=0, second=0, microsecond=0)
    context = dg.build_schedule_context(scheduled_execution_time=tick, repository_def=defs.get_repository_def())
    data = schedule.evaluate_tick(context)
    [request] = data.run_requests
    assert request.partition_key == previous_day_key(tick)
    assert schedule.job_name == "nightly_evaluation_job"
    assert previous_day_key(tick) in DAILY_PARTITIONS.get_partition_keys(current_time=tick)
    assert previous_day_key(datetime(2026, 1, 1, 2, 0)) == "2025-12-31"


def test_schedules_and_sensor_have_descriptions_and_the_ingest_retries():
    for name in ("nightly_evaluation", "nightly_golden_suites"):
        assert len(defs.resolve_schedule_def(name).description or "") > 40
    assert "walker" in (defs.resolve_sensor_def("knowledge_change_sensor").description or "")
    policy = defs.resolve_job_def("ingest_job").op_retry_policy
    assert policy is not None and policy.max_retries == 2 and policy.backoff == dg.Backoff.EXPONENTIAL


def test_trace_partitions_start_on_a_fixed_day(tmp_path, monkeypatch):
    from rag_assets.timing import FIRST_TRACE_DAY

    # Exported days on disk do not move the start: the partition set is fixed at load time.
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    (tmp_path / "traces" / "tool_invocation" / "day=2026-10-17").mkdir(parents=True)
    assert trace_start_date({}) == FIRST_TRACE_DAY
    assert trace_start_date({"RAG_TRACE_START_DATE": "2026-09-01"}) == "2026-09-01"
    with pytest.raises(ValueError, match="RAG_TRACE_START_DATE='Sept' is not a UTC day"):
        trace_start_date({"RAG_TRACE_START_DATE": "Sept"})
    assert DAILY_PARTITIONS.start.date().isoformat() == TRACE_START_DATE


def test_sensor_requests_ingest_when_markdown_changes(tmp_path):
    knowledge = tmp_path / "kb"
    (knowledge / "ops").mkdir(parents=True)
    doc = knowledge / "ops" / "A.md"
    doc.write_text("# A\n\nbody\n")
    sensor = defs.resolve_sensor_def("knowledge_change_sensor")
    rag = RagSettingsResource(knowledge_dir=str(knowledge), data_dir=str(tmp_path / "data"))

    def tick(cursor):
        context = dg.build_sensor_context(cursor=cursor, resources={"rag": rag}, definitions=defs)
        data = sensor.evaluate_tick(context)
        return data, data.cursor or cursor

    first, cursor = tick(None)
    assert len(first.run_requests) == 1 and cursor
    again, same = tick(cursor)
    assert not again.run_requests and same == cursor
    doc.write_text("# A\n\nchanged body\n")
    changed, new_cursor = tick(cursor)
    assert len(changed.run_requests) == 1 and new_cursor != cursor
    (knowledge / "notes.txt").write_text("not markdown")
    assert not tick(new_cursor)[0].run_requests
    # What ingestion does not read does not trigger: hidden dirs and files, an outside symlinked dir.
    (knowledge / ".git").mkdir()
    (knowledge / ".git" / "HEAD.md").write_text("# x\n\ny\n")
    (knowledge / "ops" / ".draft.md").write_text("# x\n\ny\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "B.md").write_text("# B\n\nb\n")
    (knowledge / "linked").symlink_to(outside, target_is_directory=True)
    assert not tick(new_cursor)[0].run_requests
    (outside / "B.md").write_text("# B\n\nchanged\n")
    assert not tick(new_cursor)[0].run_requests
    # A touch (mtime moves, bytes do not) updates the cursor without a run.
    stat = doc.stat()
    os.utime(doc, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    touched, touched_cursor = tick(new_cursor)
    assert not touched.run_requests and "unchanged" in touched.skip_message and touched_cursor != new_cursor

    missing = RagSettingsResource(knowledge_dir=str(tmp_path / "nope"))
    result = sensor.evaluate_tick(dg.build_sensor_context(resources={"rag": missing}, definitions=defs))
    assert not result.run_requests and "does not exist" in result.skip_message


def test_change_detection_reads_only_the_files_whose_stat_moved(tmp_path):
    from rag_assets.fingerprint import fingerprint

    kb, state = tmp_path / "kb", tmp_path / "data" / "sensor" / "knowledge_files.json"
    docs = [kb / "ops" / f"D{i}.md" for i in range(5)]
    for i, doc in enumerate(docs):
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(f"# D{i}\n\nbody {i}\n")
    first = fingerprint(kb, None, state)
    assert first.hashed == 5 and first.fingerprint.files == 5 and state.is_file()
    assert fingerprint(kb, first.fingerprint, state).hashed == 0  # unchanged: nothing read
    docs[2].write_text("# D2\n\nedited body\n")
    edited = fingerprint(kb, first.fingerprint, state)
    assert edited.hashed == 1 and edited.fingerprint.content != first.fingerprint.content
    st = docs[3].stat()
    os.utime(docs[3], ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    touched = fingerprint(kb, edited.fingerprint, state)
    assert touched.hashed == 1 and touched.fingerprint.content == edited.fingerprint.content
    assert touched.fingerprint.stat != edited.fingerprint.stat
    docs[4].unlink()
    removed = fingerprint(kb, touched.fingerprint, state)
    assert removed.hashed == 0 and removed.fingerprint.files == 4
    state.unlink()  # a lost state file costs one full read, not a wrong answer
    again = fingerprint(kb, None, state)
    assert again.hashed == 4 and again.fingerprint == removed.fingerprint


def test_sensor_first_tick_skips_what_the_last_ingest_in_the_instance_read(tmp_path):
    from rag_assets.fingerprint import STAT_DIGEST_KEY, stat_digest

    knowledge = tmp_path / "kb"
    knowledge.mkdir()
    (knowledge / "A.md").write_text("# A\n\nbody\n")
    sensor = defs.resolve_sensor_def("knowledge_change_sensor")
    rag = RagSettingsResource(knowledge_dir=str(knowledge), data_dir=str(tmp_path / "data"))
    instance = dg.DagsterInstance.ephemeral()

    def first_tick():
        context = dg.build_sensor_context(resources={"rag": rag}, definitions=defs, instance=instance)
        return sensor.evaluate_tick(context)

    def ingested(stat: str, store: bool = True) -> None:
        meta = {"knowledge_dir": dg.MetadataValue.path(str(knowledge.resolve())), STAT_DIGEST_KEY: stat}
        instance.report_runless_asset_event(dg.AssetMaterialization("knowledge_documents", metadata=meta))
        if store:
            instance.report_runless_asset_event(dg.AssetMaterialization("milvus_collection"))

    assert len(first_tick().run_requests) == 1  # nothing ingested in this instance yet
    ingested(stat_digest(knowledge)[0])
    skipped = first_tick()
    assert not skipped.run_requests and "since the last ingest" in skipped.skip_message and skipped.cursor
    ingested("0" * 64)  # the last ingest read other files
    assert len(first_tick().run_requests) == 1


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["missing", "empty", "no_markdown"])
def test_unusable_knowledge_dir_fails_the_first_asset(tmp_path, layout):
    knowledge = tmp_path / "kb"
    if layout != "missing":
        knowledge.mkdir()
    if layout == "no_markdown":
        (knowledge / "readme.txt").write_text("hello")
    result = dg.materialize(
        ALL_DEFS,
        resources=_resources(tmp_path, knowledge_dir=str(knowledge)),
        instance=dg.DagsterInstance.ephemeral(),
        selection=dg.AssetSelection.groups("ingest", "index"),
        raise_on_error=False,
    )
    assert not result.success
    assert result.get_failed_step_keys() == {"knowledge_documents"}
    message = _step_failure(result, "knowledge_documents")
    assert str(knowledge) in message
    assert ("does not exist" in message) if layout == "missing" else ("no loadable Markdown" in message)
    assert not result.get_asset_materialization_events()
    assert not (tmp_path / "data" / "tables" / "chunks.parquet").exists()


def test_unusable_case_file_fails_golden_cases(tmp_path):
    cases = tmp_path / "cases.yaml"
    cases.write_text("cases:\n- {id: a, scenario: chat, query: ''}\n")
    result = dg.materialize(
        ALL_DEFS,
        resources=_resources(tmp_path, golden_cases=str(cases)),
        instance=dg.DagsterInstance.ephemeral(),
        selection=dg.AssetSelection.assets("golden_cases"),
        raise_on_error=False,
    )
    assert not result.success
    assert "query" in _step_failure(result, "golden_cases")


# --- the blocking regression gate (fixtures written by hand; no store, no model) -------------------

CASES = {"c1": "ops/A.md", "c2": "ops/B.md", "c3": "ops/C.md", "c4": "ops/D.md"}
REPORT_SELECTION = dg.AssetSelection.assets(
    "golden_cases", "golden_evaluation_milvus", "baseline_report", "publish_reports"
)


def _write_cases(path: Path) -> Path:
    lines = ["cases:"] + [
        f"- {{id: {cid}, scenario: chat, query: 'about {doc}', expected_docs: [{doc}]}}" for cid, doc in CASES.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_milvus_fixtures(data_dir: Path, hits: set[str]) -> None:
    out = data_dir / "fixtures" / "milvus"
    for old in out.glob("*.json") if out.exists() else []:
        old.unlink()
    fixtures = [make_fixture(cid, [doc] if cid in hits else ["ops/Other.md"]) for cid, doc in CASES.items()]
    write_fixture_dir(out, fixtures, make_manifest("milvus", case_count=len(CASES)))


def test_failing_regression_gate_blocks_publication(tmp_path):
    data_dir = tmp_path / "data"
    resources = _resources(tmp_path, golden_cases=str(_write_cases(tmp_path / "cases.yaml")))
    instance = dg.DagsterInstance.ephemeral()

    def run():
        return dg.materialize(
            ALL_DEFS, resources=resources, instance=instance, selection=REPORT_SELECTION, raise_on_error=False
        )

    # No stored baseline yet: the gate passes with a note and the reports are published.
    _write_milvus_fixtures(data_dir, hits=set(CASES))
    first = run()
    assert first.success
    [check] = first.get_asset_check_evaluations()
    assert check.passed and "no stored baseline" in check.description
    published = data_dir / "published" / "baseline.json"
    assert json.loads(published.read_text())["summary"]["mrr"] == 1.0

    stored = tmp_path / "stored" / "baseline.json"
    stored.parent.mkdir()
    stored.write_text((data_dir / "reports" / "baseline.json").read_text())

    # Two cases now miss: the gate fails, publish_reports is skipped, the published copy stays.
    _write_milvus_fixtures(data_dir, hits={"c1", "c2"})
    second = run()
    assert not second.success
    [check] = second.get_asset_check_evaluations()
    assert not check.passed and "recall@5 dropped" in check.description
    materialized = {e.asset_key.to_user_string() for e in second.get_asset_materialization_events()}
    assert "baseline_report" in materialized and "publish_reports" not in materialized
    assert json.loads((data_dir / "reports" / "baseline.json").read_text())["summary"]["mrr"] == 0.5
    assert json.loads(published.read_text())["summary"]["mrr"] == 1.0


def test_baseline_report_metadata_types(tmp_path):
    resources = _resources(tmp_path, golden_cases=str(_write_cases(tmp_path / "cases.yaml")))
    _write_milvus_fixtures(tmp_path / "data", hits={"c1", "c2", "c3"})
    result = dg.materialize(
        ALL_DEFS,
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        selection=REPORT_SELECTION,
        raise_on_error=False,
    )
    metadata = next(
        e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("baseline_report")
    )
    assert isinstance(metadata["report"], dg.MarkdownMetadataValue)
    assert isinstance(metadata["summary"], dg.JsonMetadataValue)
    assert isinstance(metadata["recall@5"], dg.FloatMetadataValue) and metadata["recall@5"].value == 0.75
    assert isinstance(metadata["mrr"], dg.FloatMetadataValue)


def test_report_metadata_shows_the_chart_inline_and_survives_the_renderer(tmp_path):
    resources = _resources(tmp_path, golden_cases=str(_write_cases(tmp_path / "cases.yaml")))
    _write_milvus_fixtures(tmp_path / "data", hits={"c1", "c2", "c3"})
    result = dg.materialize(
        ALL_DEFS,
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        selection=REPORT_SELECTION,
        raise_on_error=False,
    )
    metadata = next(
        e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("baseline_report")
    )
    report = metadata["report"].value
    # The file keeps its relative link; the UI gets the PNG itself (its renderer allows data:).
    assert "![recall@K per store](baseline-recall.png)" in (tmp_path / "data" / "reports" / "baseline.md").read_text()
    assert "![recall@K per store](data:image/png;base64,iVBORw0KGgo" in report
    assert "baseline-recall.png)" not in report
    assert metadata["recall_chart"].value.startswith("![recall@K per store](data:image/png;base64,")
    assert "<br>" not in report
    case_rows = [line for line in report.splitlines() if line.startswith(("| `c1`", "| `c2`", "| `c3`"))]
    assert case_rows and all(line.count(" | ") == 5 for line in case_rows)  # one row per case, 6 cells
    for value in metadata.values():  # 4 decimal places at most
        if isinstance(value, dg.FloatMetadataValue):
            assert value.value == round(value.value, 4)
    assert "0.3333333" not in json.dumps(metadata["summary"].value)


# --- resources -----------------------------------------------------------------------------------


def test_settings_resource_falls_back_to_rag_settings(monkeypatch, tmp_path):
    for var in ("RAG_DATA_DIR", "RAG_MILVUS_URI", "RAG_PG_DSN", "RAG_SIDECAR_ENABLED", "RAG_TOP_K"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAG_TOP_K", "7")
    settings = RagSettingsResource(data_dir=str(tmp_path)).get_settings()
    assert settings.data_dir == tmp_path and settings.top_k == 7 and settings.milvus_uri is None
    assert settings.sidecar_enabled

    monkeypatch.setenv("RAG_MILVUS_URI", "http://milvus.example:19530")
    monkeypatch.setenv("RAG_PG_DSN", "postgresql://u:secret@db.example/rag")
    monkeypatch.setenv("RAG_SIDECAR_ENABLED", "false")
    bound = settings_resource_from_env()
    assert isinstance(bound.milvus_uri, dg.EnvVar) and bound.data_dir is None
    resolved = dg.materialize([_settings_probe], resources={"rag": bound}, instance=dg.DagsterInstance.ephemeral())
    assert resolved.output_for_node("_settings_probe") == ("http://milvus.example:19530", False)


@dg.asset
def _settings_probe(rag: RagSettingsResource) -> tuple:
    settings = rag.get_settings()
    return settings.milvus_uri_value, settings.sidecar_enabled


# --- traces and locks ----------------------------------------------------------------------------


def test_trace_frame_and_stats():
    t = datetime(2026, 11, 28, 12, tzinfo=UTC)
    rows = [
        TraceRow(
            id=str(i),
            retrieval_layer=layer,
            status="ok",
            latency_ms=float(ms),
            created_at=t,
            retrieval_details={"fallback_reason": fb, "candidate_count": 3},
        )
        for i, (layer, ms, fb) in enumerate(
            [
                ("L1", 10, None),
                ("L1", 20, None),
                ("L0+L1", 30, "attempt 1 low quality"),
                ("L0", 40, "l0_fallback: down"),
            ]
        )
    ]
    frame = trace_frame(rows)
    assert frame.schema["created_at"] == pl.Datetime("us", "UTC")
    # Every TraceRow field is a column (details as JSON text), plus the flattened details.
    assert set(TraceRow.model_fields) <= set(frame.columns)
    assert frame["id"].to_list() == ["0", "1", "2", "3"] and frame["candidate_count"].to_list() == [3] * 4
    assert json.loads(frame["retrieval_details"][2]) == rows[2].retrieval_details
    stats = trace_stats(frame)
    assert stats["row_count"] == 4
    assert stats["layers"] == {"L0": 1, "L0+L1": 1, "L1": 2}
    assert stats["fallback_rate"] == 0.5 and stats["l0_fallback_rate"] == 0.25
    assert stats["latency_p50_ms"] == pytest.approx(25.0)
    assert 37 < stats["latency_p95_ms"] < stats["latency_p99_ms"] <= 40
    empty = trace_stats(trace_frame([]))
    assert empty["row_count"] == 0 and empty["fallback_rate"] is None and empty["latency_p50_ms"] is None


def test_store_lock_makes_a_second_run_wait_then_fail(tmp_path):
    lock_file = tmp_path / "locks" / "milvus.lock"
    held, release = threading.Event(), threading.Event()

    def holder():
        with store_lock(lock_file, 5):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    try:
        with pytest.raises(StoreBusyError, match="another run"), store_lock(lock_file, 0.3):
            pass
    finally:
        release.set()
        thread.join()
    with store_lock(lock_file, 1):  # free again once the holder is done
        pass


def _empty_plan_and_embeddings(tmp_path: Path):
    """A plan with nothing to do and its (empty) embeddings: the store assets' inputs."""
    from rag_core.embedding import ModelIdentity
    from rag_core.ingest.embed import ChunkEmbeddings
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.plan import IngestPlan

    identity = ModelIdentity("fake", "fake", 4, "0" * 16)
    plan = IngestPlan(str(tmp_path / "kb"), identity, (), (), (), (), 0, {})
    return plan, ChunkEmbeddings(EmbeddingCache.under(tmp_path / "data"), identity, frozenset())


def test_store_assets_wait_for_the_store_lock(tmp_path):
    from rag_assets.defs.index import milvus_collection
    from rag_assets.defs.resources import MilvusStoreResource
    from rag_assets.layout import AssetFiles

    resources = _resources(tmp_path)
    milvus = MilvusStoreResource(rag=resources["rag"], lock_timeout_s=0.3)
    plan, embeddings = _empty_plan_and_embeddings(tmp_path)
    lock_file = AssetFiles.under(tmp_path / "data").lock_file("milvus")
    with store_lock(lock_file, 1), pytest.raises(StoreBusyError, match="still held by another process"):
        milvus_collection(
            dg.build_asset_context(), rag=resources["rag"], milvus=milvus, ingest_plan=plan, chunk_embeddings=embeddings
        )


def test_store_writers_are_in_concurrency_pools_limited_to_one():
    import yaml

    graph = defs.resolve_asset_graph()
    pools = {k: graph.get(dg.AssetKey(k)).pools for k in ("milvus_collection", "pgvector_table")}
    assert pools == {"milvus_collection": {"rag_milvus"}, "pgvector_table": {"rag_pgvector"}}
    for name in ("dagster.local.yaml", "dagster.production.yaml"):
        config = yaml.safe_load((ROOT / name).read_text())
        assert config["concurrency"]["pools"]["default_limit"] == 1, name
        assert "config" not in config["run_coordinator"], name  # run limits live under concurrency


def test_disabled_sidecar_is_reported_not_failed(tmp_path):
    from rag_assets.defs.index import pgvector_table

    resources = _resources(tmp_path, sidecar_enabled=False)
    plan, embeddings = _empty_plan_and_embeddings(tmp_path)
    table = pgvector_table(
        dg.build_asset_context(),
        rag=resources["rag"],
        pgvector=resources["pgvector"],
        ingest_plan=plan,
        chunk_embeddings=embeddings,
    )
    assert table.metadata["status"] == "disabled"
    selection = dg.AssetSelection.assets("golden_cases", "retrieval_fixtures_pgvector", "golden_evaluation_pgvector")
    result = dg.materialize(
        ALL_DEFS,
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        selection=selection,
        raise_on_error=False,
    )
    assert result.success
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert meta["retrieval_fixtures_pgvector"]["status"].value == "unavailable"
    evaluation = meta["golden_evaluation_pgvector"]
    assert evaluation["not_run"].value == evaluation["case_count"].value > 0
    assert "recall@5" not in evaluation


def test_unreachable_trace_store_fails_the_export_without_leaking_the_password(tmp_path):
    resources = _resources(tmp_path, pg_dsn="postgresql://rag:s3cret-pw@127.0.0.1:9/rag")
    result = dg.materialize(
        ALL_DEFS,
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        selection=dg.AssetSelection.assets("trace_tables"),
        partition_key=TRACE_START_DATE,
        raise_on_error=False,
    )
    assert not result.success
    message = _step_failure(result, "trace_tables")
    assert "StoreError" in message and "s3cret-pw" not in message
    assert not (tmp_path / "data" / "traces").exists()
