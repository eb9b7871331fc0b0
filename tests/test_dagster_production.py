"""The production instance (dagster.production.yaml) on the embedded PostgreSQL.

Dagster's run, event and schedule storage goes into a fresh database of the session's embedded
PostgreSQL (reached through its Unix socket: DAGSTER_PG_HOST empty, PGHOST the socket dir). The
start check passes, and fails in one redacted line on a wrong DSN; the ingest job runs as
``make run`` launches it; the nightly schedule tick and the knowledge sensor are evaluated by the
daemon's own iteration functions against the code location served from ``workspace.yaml``; the
runs, ticks and materializations are read back from the instance.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("dagster_postgres", reason="the postgres extra is not installed")

import dagster as dg  # noqa: E402
import psycopg  # noqa: E402

from rag_core.settings import SAMPLE_KNOWLEDGE_DIR  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PG_VARS = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD")
UNSET = (
    "RAG_PG_DSN",
    "RAG_MILVUS_URI",
    "RAG_MILVUS_TOKEN",
    "RAG_REPORTS_DIR",
    "RAG_PUBLISHED_DIR",
    "RAG_COLLECTION",
    "RAG_PG_TABLE",
    "RAG_BASELINE",
)
SECRET = "s3cret-pw-xyz"


@pytest.fixture(scope="module")
def prod(pg_dsn: str) -> Iterator[SimpleNamespace]:
    """DAGSTER_HOME with the production YAML, a fresh Dagster database, a small knowledge base."""
    socket_dir = parse_qs(urlsplit(pg_dsn).query)["host"][0]
    db = f"dagster_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    tmp = Path(tempfile.mkdtemp(prefix="rag-dagster-prod-"))
    ns = SimpleNamespace(tmp=tmp, home=tmp / "home", data=tmp / "data", kb=tmp / "kb", db=db)
    ns.home.mkdir()
    shutil.copyfile(ROOT / "dagster.production.yaml", ns.home / "dagster.yaml")
    for folder in ("cache", "queues"):  # two folders: fast to embed
        shutil.copytree(SAMPLE_KNOWLEDGE_DIR / folder, ns.kb / folder)
    with pytest.MonkeyPatch.context() as mp:
        for var in UNSET:
            mp.delenv(var, raising=False)
        env = {
            "DAGSTER_HOME": ns.home,
            "DAGSTER_PG_HOST": "",
            "PGHOST": socket_dir,
            "DAGSTER_PG_PORT": "5432",
            "DAGSTER_PG_DB": db,
            "DAGSTER_PG_USER": "postgres",
            "DAGSTER_PG_PASSWORD": "",
            "RAG_DATA_DIR": ns.data,
            "RAG_KNOWLEDGE_DIR": ns.kb,
            "RAG_GOLDEN_CASES": ROOT / "golden" / "cases.yaml",
            "RAG_SIDECAR_ENABLED": "false",
        }
        for var, value in env.items():
            mp.setenv(var, str(value))
        try:
            yield ns
        finally:
            from rag_core.stores.milvus_server import stop_server

            try:
                stop_server(ns.data)
            except Exception:  # noqa: BLE001 - nothing was started
                pass
            shutil.rmtree(tmp, ignore_errors=True)


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rag_assets.instance", "check"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_start_check_passes_on_the_production_yaml(prod):
    done = _check()
    assert done.returncode == 0, done.stderr
    assert "postgresql+psycopg2://postgres@" in done.stdout and prod.db in done.stdout


def test_start_check_names_the_setting_and_redacts_the_password(prod):
    done = _check(DAGSTER_PG_HOST="127.0.0.1", DAGSTER_PG_PORT="9", DAGSTER_PG_PASSWORD=SECRET)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "DAGSTER_PG_HOST" in lines[0] and "DAGSTER_PG_PORT" in lines[0] and "cannot connect" in lines[0]
    assert SECRET not in done.stderr + done.stdout and "***" in lines[0]


def test_start_check_names_a_missing_variable_and_a_wrong_scheme(prod, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_PG_DB"}
    done = subprocess.run(
        [sys.executable, "-m", "rag_assets.instance", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "DAGSTER_PG_DB is not set" in done.stderr
    bare = tmp_path / "dagster.yaml"
    bare.write_text(
        (prod.home / "dagster.yaml").read_text().replace("scheme: postgresql+psycopg2", "scheme: postgresql")
    )
    done = subprocess.run(
        [sys.executable, "-m", "rag_assets.instance", "check", "--config", str(bare)],
        cwd=ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "scheme" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_ingest_job_runs_on_postgres_storage_and_is_read_back(prod):
    from rag_assets.launch import launch_job

    with dg.DagsterInstance.get() as instance:
        result = launch_job(instance, "ingest_job", tags={"rag/trigger": "test"})
        assert result.success
        runs = instance.get_runs(
            dg.RunsFilter(
                job_name="ingest_job", tags={".dagster/repository": "__repository__@rag_assets", "rag/trigger": "test"}
            )
        )
        assert [r.run_id for r in runs] == [result.run_id]
        assert runs[0].status == dg.DagsterRunStatus.SUCCESS and runs[0].job_code_origin is not None
        event = instance.get_latest_materialization_event(dg.AssetKey("milvus_collection"))
        assert event is not None and event.run_id == result.run_id
        assert "postgres" in type(instance.run_storage).__module__


def test_schedule_tick_and_sensor_evaluation_on_postgres(prod):
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._daemon.sensor import execute_sensor_iteration
    from dagster._scheduler.scheduler import launch_scheduled_runs

    log = logging.getLogger("test_dagster_production")
    # The ingest job above read this knowledge base: the sensor's first tick requests a run only
    # for what changed since (rag_assets.defs.schedules.last_ingested_stat).
    doc = next(prod.kb.rglob("*.md"))
    doc.write_text(doc.read_text() + "\nEdited after the last ingest.\n")
    with dg.DagsterInstance.get() as instance:
        target = WorkspaceFileTarget(paths=[str(ROOT / "workspace.yaml")])
        with WorkspaceProcessContext(instance, target) as context:
            list(execute_sensor_iteration(context, log, None, None))
            # The daemon's first iteration records the schedule's state as of now; the next one
            # (its clock set past the following 02:00 UTC) fires that tick.
            now = datetime.now(UTC)
            list(launch_scheduled_runs(context, log, end_datetime_utc=now, iteration_times={}))
            end = now.replace(hour=2, minute=1, second=0, microsecond=0)
            end += timedelta(days=1) if end <= now else timedelta(0)
            list(launch_scheduled_runs(context, log, end_datetime_utc=end, iteration_times={}))
        sensor_runs = instance.get_runs(dg.RunsFilter(tags={"rag/trigger": "knowledge_change"}))
        assert len(sensor_runs) == 1 and sensor_runs[0].job_name == "ingest_job"
        nightly = instance.get_runs(dg.RunsFilter(job_name="nightly_evaluation_job"))
        assert len(nightly) == 1
        assert nightly[0].tags["dagster/partition"] == (end - timedelta(days=1)).date().isoformat()
        for run in (*sensor_runs, *nightly):  # queued: the daemon's queue would launch them
            assert run.status == dg.DagsterRunStatus.QUEUED
        states = {s.name: s for s in instance.all_instigator_state()}
        for name, kind in (
            ("knowledge_change_sensor", InstigatorType.SENSOR),
            ("nightly_evaluation", InstigatorType.SCHEDULE),
        ):
            ticks = instance.get_ticks(states[name].instigator_origin_id, states[name].selector_id)
            assert ticks and ticks[0].status.value == "SUCCESS", (name, kind, ticks[:1])


def test_a_run_that_never_started_is_marked_failed_by_run_monitoring(prod, monkeypatch):
    """A run whose worker crashed before starting stays NOT_STARTED; the daemon's run monitoring
    (enabled in the production YAML) fails it once start_timeout_seconds have passed."""
    from dagster._daemon.monitoring import run_monitoring

    from rag_assets.launch import reconstructable_job

    with dg.DagsterInstance.get() as instance:
        assert instance.run_monitoring_enabled and instance.run_monitoring_start_timeout_seconds == 180
        recon = reconstructable_job("ingest_job")
        run = instance.create_run_for_job(
            job_def=recon.get_definition(),
            tags={"rag/trigger": "crash-test"},
            job_code_origin=recon.get_python_origin(),
        )
        [record] = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))
        assert record.dagster_run.status == dg.DagsterRunStatus.NOT_STARTED
        later = record.create_timestamp.timestamp() + 181
        monkeypatch.setattr(run_monitoring, "get_current_timestamp", lambda: later)
        run_monitoring.monitor_starting_run(instance, record, logging.getLogger("test"))
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
