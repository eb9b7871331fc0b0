"""``python -m rag_assets.run`` (``make run``): build everything on the embedded defaults.

Runs two Dagster jobs against the instance in ``DAGSTER_HOME`` (default ``<repo>/.dagster_home``,
given the repo's ``dagster.local.yaml`` as its ``dagster.yaml`` when it has none). Each run is
created with the code location's origin and executed as a reconstructable job
(``rag_assets.launch``), so the UI (``make ui``) lists it in its job's history and can re-execute
it:

1. ``refresh_job``: documents -> chunks -> L0 / Milvus / pgvector -> fixtures -> evaluations ->
   baseline and comparison reports -> regression gate -> publish;
2. ``trace_export_job`` for today's UTC partition (after 1., so it holds 1.'s lookups).

Then prints what was built and where the reports are. Exit status: 0 when both runs succeeded,
1 otherwise (a failed step, or the regression gate blocking publication), 2 for bad arguments.
Settings come from the environment only (RAG_KNOWLEDGE_DIR, RAG_GOLDEN_CASES, RAG_DATA_DIR, ...).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from rag_assets.layout import DEFAULT_DAGSTER_HOME, LOCAL_INSTANCE_YAML
from rag_assets.timing import DAILY_PARTITIONS, TRACE_START_DATE, today_key

QUIET_LOGGERS = ("pymilvus", "grpc")
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def prepare_dagster_home() -> Path:
    """Set DAGSTER_HOME (default ``<repo>/.dagster_home``), create it, and copy the repo's
    ``dagster.local.yaml`` into it as ``dagster.yaml`` when it has none. Returns the absolute path."""
    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_DAGSTER_HOME).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists() and LOCAL_INSTANCE_YAML.is_file():
        shutil.copyfile(LOCAL_INSTANCE_YAML, home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _failure_text(event) -> str:
    data = event.step_failure_data
    user = getattr(data, "user_failure_data", None)
    if user is not None and user.description:
        return user.description
    if data.error is not None:
        return (data.error.message or "").strip().splitlines()[0] if data.error.message else data.error.cls_name
    return "failed"


def _metadata_value(value) -> object:
    return getattr(value, "value", value)


HEADLINE_KEYS = (
    "verdict",
    "status",
    "reason",
    "dagster/row_count",
    "entries",
    "domains",
    "added",
    "updated",
    "removed",
    "unchanged",
    "fixture_count",
    "recall@5",
    "mrr",
    "top5_overlap",
    "fallback_rate",
    "latency_p95_ms",
    "file_count",
)


def _headline(metadata: dict) -> str:
    parts = []
    for key in HEADLINE_KEYS:
        if key in metadata:
            value = _metadata_value(metadata[key])
            if value in ("", None):
                continue
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            parts.append(f"{key.removeprefix('dagster/')}={shown}")
    return ", ".join(parts) or "(no headline figures: see the asset in `make ui`)"


def print_result(title: str, result, out=None) -> dict[str, dict]:
    """Print one run's materializations, check results, failures and the assets that did not
    run; return the materialization metadata by asset key."""
    out = out or sys.stdout
    print(f"\n== {title}: {'succeeded' if result.success else 'FAILED'} (run {result.run_id})", file=out)
    materialized: dict[str, dict] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        key = mat.asset_key.to_user_string()
        materialized[key] = dict(mat.metadata)
        print(f"  materialized {key}: {_headline(materialized[key])}", file=out)
    for check in result.get_asset_check_evaluations():
        verdict = "passed" if check.passed else f"FAILED ({check.severity.value})"
        print(f"  check {check.asset_check_key.to_user_string()}: {verdict} - {check.description}", file=out)
    failed = set()
    for event in result.get_step_failure_events():
        failed.add(event.step_key)
        print(f"  step {event.step_key} failed: {_failure_text(event)}", file=out)
    planned = {k.to_user_string() for k in result.job_def.asset_layer.executable_asset_keys}
    not_run = sorted(planned - materialized.keys() - failed)
    if not_run:  # downstream of a failed step or of a failed blocking check: never started
        print(f"  not run (an upstream step or a blocking check failed): {', '.join(not_run)}", file=out)
    return materialized


def _path_of(metadata: dict | None, key: str) -> str | None:
    if not metadata or key not in metadata:
        return None
    return str(_metadata_value(metadata[key]))


def print_locations(materialized: dict[str, dict], home: Path, out=None) -> None:
    """Print where the reports, the published copies and the trace export are."""
    out = out or sys.stdout
    print("\nWhere things are:", file=out)
    for asset, key, label in (
        ("baseline_report", "markdown_path", "baseline report (Markdown)"),
        ("baseline_report", "json_path", "baseline report (JSON)"),
        ("comparison_report", "markdown_path", "comparison report (Markdown)"),
        ("comparison_report", "json_path", "comparison report (JSON)"),
        ("publish_reports", "published_dir", "published reports"),
        ("retrieval_history", "markdown_path", "morning view (history)"),
        ("trace_tables", "path", "trace export (Parquet)"),
    ):
        path = _path_of(materialized.get(asset), key)
        print(f"  {label:30} {path or '(not materialized in this run)'}", file=out)
    print(f"  {'Dagster instance':30} {home}  (browse it with `make ui`)", file=out)


#: Seconds between two looks at the run's events (each a small query of the instance's SQLite).
PROGRESS_POLL_S = 1.0
_STEP_EVENTS = {"STEP_START": "started", "STEP_SUCCESS": "done", "STEP_FAILURE": "FAILED"}


def _step_line(entry: Any, started: dict[str, float], began: float) -> str:
    """``  [seconds since began] step: started`` / ``done in N s`` / ``FAILED in N s`` (``began``:
    epoch seconds; ``started``: step start times, updated)."""
    step, what = entry.step_key, _STEP_EVENTS[entry.dagster_event.event_type_value]
    elapsed = entry.timestamp - began
    if what == "started":
        started[step] = entry.timestamp
        return f"  [{elapsed:6.1f} s] {step}: started"
    return f"  [{elapsed:6.1f} s] {step}: {what} in {entry.timestamp - started.get(step, entry.timestamp):.1f} s"


@contextmanager
def stage_progress(instance: Any, run_tag: str, out: TextIO | None = None) -> Iterator[None]:
    """While the body runs, print a line per step of the run tagged ``rag/progress=run_tag`` as it
    starts, succeeds or fails, with the seconds since the body began and each step's duration:
    a job of several minutes is not silent. Reads the instance's event log (a thread)."""
    import dagster as dg

    out = out or sys.stdout
    began, stop = time.time(), threading.Event()
    kinds = {getattr(dg.DagsterEventType, name) for name in _STEP_EVENTS}

    def watch() -> None:
        run_id, cursor, started = None, None, dict[str, float]()
        while True:
            done = stop.wait(PROGRESS_POLL_S)
            if run_id is None:
                runs = instance.get_runs(filters=dg.RunsFilter(tags={"rag/progress": run_tag}), limit=1)
                run_id = runs[0].run_id if runs else None
            if run_id is not None:
                page = instance.get_records_for_run(run_id, cursor=cursor, of_type=kinds)
                cursor = page.cursor
                for record in page.records:
                    print(_step_line(record.event_log_entry, started, began), file=out, flush=True)
            if done:
                return

    watcher = threading.Thread(target=watch, name="stage-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def _launch(instance: Any, job_name: str, tags: dict[str, str], out: TextIO, partition_key: str | None = None) -> Any:
    from rag_assets.launch import launch_job

    run_tag = uuid.uuid4().hex
    print(f"\n{job_name}: running (a line per step)", file=out, flush=True)
    with stage_progress(instance, run_tag, out):
        return launch_job(
            instance,
            job_name,
            run_config=RUN_CONFIG,
            tags={**tags, "rag/progress": run_tag},
            partition_key=partition_key,
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m rag_assets.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trace-day",
        default=None,
        metavar="YYYY-MM-DD",
        help="UTC day of tool_invocation rows to export (default: today)",
    )
    args = parser.parse_args(argv)
    day = args.trace_day or today_key()
    if day not in DAILY_PARTITIONS.get_partition_keys():
        parser.print_usage(sys.stderr)
        print(
            f"--trace-day must be a UTC day YYYY-MM-DD from {TRACE_START_DATE} to today, got {day!r}", file=sys.stderr
        )
        return 2

    home = prepare_dagster_home()
    for name in QUIET_LOGGERS:  # reconnect chatter of the embedded Milvus Lite, not errors
        logging.getLogger(name).setLevel(logging.ERROR)
    import dagster as dg

    from rag_assets.defs.schedules import STORE_TAGS

    instance = dg.DagsterInstance.get()
    tags = {**STORE_TAGS, "rag/trigger": "rag_assets.run"}
    # Our stdout as the command began: an in-process step may swap sys.stdout while it runs
    # (compute-log capture) and not give back a redirected one.
    out = sys.stdout
    refresh = _launch(instance, "refresh_job", tags, out)
    materialized = print_result("refresh_job", refresh, out)
    traces = _launch(instance, "trace_export_job", tags, out, partition_key=day)
    materialized.update(print_result(f"trace_export_job [{day}]", traces, out))
    print_locations(materialized, home, out)
    ok = refresh.success and traces.success
    if not ok:
        print("\nFAILED: see the failed steps and checks above (details: `make ui`, Runs).", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
