"""Jobs, the nightly evaluation schedule and the knowledge-change sensor.

- ``ingest_job``: the ingest and index groups (documents -> chunks -> plan -> L0, embeddings ->
  Milvus, pgvector: one scan, one embedding of what changed, one write per store).
- ``nightly_evaluation_job``: fixtures, evaluations, reports and the trace export of one day;
  the ``nightly_evaluation`` schedule runs it at 02:00 UTC for the day that has just ended.
- ``refresh_job`` / ``trace_export_job``: everything but the traces / the traces only; what
  ``python -m rag_assets.run`` runs (in that order, so today's export holds its lookups).
- ``golden_suites_job``: every golden suite (case file + its corpus, own index); the
  ``nightly_golden_suites`` schedule runs it at 03:00 UTC.
- ``knowledge_change_sensor`` requests ``ingest_job`` when the Markdown content changes.
"""

from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from rag_assets.defs.resources import RagSettingsResource
from rag_assets.timing import DAILY_PARTITIONS, NIGHTLY_CRON, TIMEZONE, previous_day_key

INGEST_GROUPS = ("ingest", "index")
EVALUATION_GROUPS = ("evaluation", "reports", "traces")
TRACE_ASSETS = dg.AssetSelection.assets("trace_tables", "production_signals", "mined_cases")
EXECUTABLE = dg.AssetSelection.all() - dg.AssetSelection.assets("tool_invocation")
#: Every job touches the shared stores; dagster.production.yaml limits runs with this tag to one.
STORE_TAGS = {"rag/stores": "shared"}
SUITES_CRON = "0 3 * * *"

#: The sensor-triggered ingest retries a failed step (a store briefly down, a lock timeout):
#: 3 tries in all, 30 s then 60 s apart. Bad input (no knowledge dir) fails without retry.
INGEST_RETRY = dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL)

ingest_job = dg.define_asset_job(
    "ingest_job",
    selection=dg.AssetSelection.groups(*INGEST_GROUPS),
    tags=STORE_TAGS,
    op_retry_policy=INGEST_RETRY,
    description="Scan, chunk and index the knowledge directory (incremental). Failed steps are "
    "retried (3 tries, exponential backoff from 30 s).",
)

nightly_evaluation_job = dg.define_asset_job(
    "nightly_evaluation_job",
    selection=dg.AssetSelection.groups(*EVALUATION_GROUPS) - dg.AssetSelection.assets("tool_invocation"),
    partitions_def=DAILY_PARTITIONS,
    tags=STORE_TAGS,
    description="Record fixtures on both stores, evaluate, report, gate, publish; export one day of traces.",
)

golden_suites_job = dg.define_asset_job(
    "golden_suites_job",
    selection=dg.AssetSelection.groups("suites"),
    tags=STORE_TAGS,
    description="Every golden suite of golden/suites.yaml on its own index: ingest, record, evaluate, gate.",
)

refresh_job = dg.define_asset_job(
    "refresh_job",
    selection=EXECUTABLE - TRACE_ASSETS - dg.AssetSelection.groups("suites"),
    tags=STORE_TAGS,
    description="The configured knowledge base: ingest, index, evaluate, report, publish (suites run apart).",
)

trace_export_job = dg.define_asset_job(
    "trace_export_job",
    selection=TRACE_ASSETS,
    partitions_def=DAILY_PARTITIONS,
    tags=STORE_TAGS,
    description="Export one day of tool_invocation rows to Parquet; its production signals and mined cases.",
)


@dg.schedule(
    cron_schedule=NIGHTLY_CRON,
    execution_timezone=TIMEZONE,
    job=nightly_evaluation_job,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly at 02:00 UTC: record both stores (Milvus, pgvector) on the golden "
    "cases, evaluate, report, gate against the baseline, publish, append the "
    "retrieval history, and export the traces of the UTC day that has just ended "
    "(partition = that day).",
)
def nightly_evaluation(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    """At 02:00 UTC: the nightly evaluation, exporting the traces of the previous UTC day."""
    tick = context.scheduled_execution_time or datetime.now(UTC)
    key = previous_day_key(tick)
    return dg.RunRequest(run_key=key, partition_key=key, tags={"rag/trigger": "nightly"})


@dg.schedule(
    cron_schedule=SUITES_CRON,
    execution_timezone=TIMEZONE,
    job=golden_suites_job,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly at 03:00 UTC, after the nightly evaluation: every golden suite of "
    "golden/suites.yaml on its own index, each gated against its stored baseline.",
)
def nightly_golden_suites(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    """At 03:00 UTC, after the nightly evaluation: every golden suite (English, hard English,
    Chinese runbooks and the sample knowledge base), each gated against its stored baseline."""
    tick = context.scheduled_execution_time or datetime.now(UTC)
    return dg.RunRequest(run_key=f"suites-{tick:%Y-%m-%d}", tags={"rag/trigger": "nightly"})


@dg.sensor(
    job=ingest_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute: requests ingest_job when a Markdown file that ingestion reads "
    "(same walker: hidden entries and outside symlinks excluded) was added, removed "
    "or changed. Sizes and mtimes are compared first; only the files whose size or "
    "mtime moved are hashed, so a touch alone does not re-ingest and an edit reads one file.",
)
def knowledge_change_sensor(
    context: dg.SensorEvaluationContext, rag: RagSettingsResource
) -> dg.RunRequest | dg.SkipReason:
    """Requests an ingest when the content of the ingested Markdown files differs from the cursor.

    The first evaluation (no cursor, or a cursor of an older format) compares with the files
    the last complete ingest in this instance read (``make run`` or an earlier sensor run) and
    requests one only when they differ or there is none: the index may predate the sensor. A
    missing or Markdown-free knowledge directory is skipped with the reason.
    """
    from rag_assets.fingerprint import fingerprint, parse_cursor
    from rag_assets.layout import AssetFiles

    settings = rag.get_settings()
    root = settings.knowledge_dir
    if not root.is_dir():
        return dg.SkipReason(f"knowledge directory {root} does not exist")
    previous = parse_cursor(context.cursor)
    now = fingerprint(root, previous, AssetFiles.under(settings.data_dir).sensor_state).fingerprint
    if now.files == 0:
        return dg.SkipReason(f"no Markdown files under {root}")
    if previous is None:
        try:
            ingested = last_ingested_stat(context.instance, root)
        except dg.DagsterInvariantViolationError:  # evaluated without an instance (tests)
            ingested = None
        if ingested == now.stat:
            context.update_cursor(now.cursor())
            return dg.SkipReason("knowledge unchanged since the last ingest in this instance")
    if previous is not None and now.stat == previous.stat:
        return dg.SkipReason("knowledge unchanged (sizes and mtimes)")
    context.update_cursor(now.cursor())
    if previous is not None and now.content == previous.content:
        return dg.SkipReason("files touched but their contents are unchanged")
    return dg.RunRequest(
        tags={
            "rag/trigger": "knowledge_change",
            "rag/corpus_hash": (now.content or "")[:16],
            "rag/previous_hash": ((previous.content if previous else None) or "none")[:16],
        }
    )


def last_ingested_stat(instance: dg.DagsterInstance, root: Path) -> str | None:
    """The stat digest of ``root``'s files as read by the latest ``knowledge_documents`` run that
    also wrote the main store (one run: a scan whose ingest failed does not count); ``None``
    when there is none or it scanned another directory."""
    from rag_assets.fingerprint import STAT_DIGEST_KEY

    scan = instance.get_latest_materialization_event(dg.AssetKey("knowledge_documents"))
    store = instance.get_latest_materialization_event(dg.AssetKey("milvus_collection"))
    if scan is None or store is None or scan.run_id != store.run_id or scan.asset_materialization is None:
        return None
    metadata = scan.asset_materialization.metadata
    scanned, digest = metadata.get("knowledge_dir"), metadata.get(STAT_DIGEST_KEY)
    if scanned is None or digest is None or scanned.value != str(root.resolve()):
        return None
    return str(digest.value)
