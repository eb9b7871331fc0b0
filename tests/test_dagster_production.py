"""The production instance (dagster.production.yaml) on the embedded PostgreSQL.

Dagster's run, event and schedule storage goes into a fresh database of the session's embedded
PostgreSQL (reached through its Unix socket: DAGSTER_PG_HOST empty, PGHOST the socket dir). The
start check passes, and fails in one redacted line on a wrong DSN; the ingest job runs as
``make run`` launches it; ``dagster-daemon run -w workspace.yaml`` (a subprocess, for as long as
a test needs) evaluates the knowledge sensor, launches the run it queues and fails a run that never
started; the nightly schedule's tick at the next 02:00 UTC is evaluated with Dagster's public
``build_schedule_context``; the runs, ticks and materializations are read back from the instance.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
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
    ns.dsn = psycopg.conninfo.make_conninfo(pg_dsn, dbname=db)
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


def _run_daemon_until(done: Callable[[], bool], timeout_s: float = 300.0) -> None:
    """Run ``dagster-daemon run -w workspace.yaml`` (the production daemon, as the YAML's header
    starts it, on this instance) until ``done()`` holds; then stop it and its code server. Fails
    the test when the daemon exits or ``timeout_s`` pass first (with the daemon's log tail)."""
    daemon = Path(sys.executable).parent / "dagster-daemon"
    log = tempfile.NamedTemporaryFile("w+", prefix="rag-dagster-daemon-", suffix=".log")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(daemon), "run", "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the code server stops with it
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not done():
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"daemon exit code {proc.poll()} before the condition held:\n{log.read()[-3000:]}")
            time.sleep(2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def test_sensor_run_and_schedule_state_through_the_daemon_on_postgres(prod):
    from rag_assets.defs.schedules import nightly_evaluation

    # The ingest job above read this knowledge base: the sensor's first tick requests a run only
    # for what changed since (rag_assets.defs.schedules.last_ingested_stat).
    doc = next(prod.kb.rglob("*.md"))
    doc.write_text(doc.read_text() + "\nEdited after the last ingest.\n")
    by_sensor = dg.RunsFilter(tags={"rag/trigger": "knowledge_change"})
    with dg.DagsterInstance.get() as instance:
        # The sensor ticks, its run is queued, the run queue launches it and it finishes.
        _run_daemon_until(lambda: any(r.status in FINISHED for r in instance.get_runs(by_sensor)))
        sensor_runs = instance.get_runs(by_sensor)
        assert len(sensor_runs) == 1 and sensor_runs[0].job_name == "ingest_job"
        assert sensor_runs[0].status == dg.DagsterRunStatus.SUCCESS
        states = {s.name: s for s in instance.all_instigator_state()}
        sensor = states["knowledge_change_sensor"]
        ticks = instance.get_ticks(sensor.instigator_origin_id, sensor.selector_id)
        assert [t.run_ids for t in ticks if t.status.value == "SUCCESS"] == [[sensor_runs[0].run_id]]
        # The scheduler keeps the nightly schedule's state in the same storage.
        assert "nightly_evaluation" in states
        # The next 02:00 UTC tick (dagster's own clock cannot be set from outside the daemon): the
        # nightly evaluation of the UTC day that has just ended.
        now = datetime.now(UTC)
        end = now.replace(hour=2, minute=0, second=0, microsecond=0)
        end += timedelta(days=1) if end <= now else timedelta(0)
        request = nightly_evaluation(dg.build_schedule_context(instance=instance, scheduled_execution_time=end))
        assert nightly_evaluation.job_name == "nightly_evaluation_job"
        assert request.partition_key == (end - timedelta(days=1)).date().isoformat()


def test_a_run_that_never_started_is_marked_failed_by_run_monitoring(prod):
    """A run whose worker crashed before starting stays NOT_STARTED; the daemon's run monitoring
    (enabled in the production YAML) fails it once start_timeout_seconds have passed."""
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
        # Created 181 s ago as far as the run storage knows (the daemon compares with its own clock).
        with psycopg.connect(prod.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE runs SET create_timestamp = create_timestamp - interval '181 seconds' WHERE run_id = %s",
                (run.run_id,),
            )

        def failed() -> bool:
            current = instance.get_run_by_id(run.run_id)
            return current is not None and current.status == dg.DagsterRunStatus.FAILURE

        _run_daemon_until(failed)
