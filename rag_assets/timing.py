"""Time in the code location: the daily trace partitions, the nightly run and its freshness.

Everything is UTC: trace rows carry ``created_at`` as timestamptz and a partition is one UTC
day, ``[00:00, 24:00)``. The nightly evaluation runs at 02:00 and exports the day that has just
ended; its assets must have materialized between 01:00 and 04:00, else they are overdue.

The trace partitions start where the traces start (``trace_start_date``), so the UI does not
show months of "Missing" days before the first lookup.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg

TIMEZONE = "UTC"
NIGHTLY_CRON = "0 2 * * *"
TRACE_START_ENV = "RAG_TRACE_START_DATE"
_DAY_DIR = re.compile(r"^day=(\d{4}-\d{2}-\d{2})$")


def exported_trace_days(data_dir: Path) -> list[str]:
    """The UTC days (``YYYY-MM-DD``, sorted) that have a trace export under ``data_dir``."""
    from rag_assets.layout import AssetFiles

    root = AssetFiles.under(data_dir).trace_parquet("x").parent.parent
    days = [m.group(1) for p in (root.iterdir() if root.is_dir() else []) if (m := _DAY_DIR.match(p.name))]
    return sorted(days)


def _default_data_dir() -> Path | None:
    from rag_core.settings import RagSettings

    try:
        return RagSettings().data_dir
    except ValueError:  # bad RAG_* settings: the assets report them; the partitions still load
        return None


def trace_start_date(
    env: Mapping[str, str] | None = None, data_dir: Path | None = None, now: datetime | None = None
) -> str:
    """The first trace partition (``YYYY-MM-DD``).

    ``RAG_TRACE_START_DATE`` when set; else the earliest exported trace day in the data dir,
    but never later than yesterday (UTC): the first nightly tick exports yesterday, which must
    be a partition. Raises ValueError naming ``RAG_TRACE_START_DATE`` for a value that is not a
    date.
    """
    env = os.environ if env is None else env
    raw = env.get(TRACE_START_ENV, "").strip()
    if raw:
        try:
            return date.fromisoformat(raw).isoformat()
        except ValueError:
            raise ValueError(f"{TRACE_START_ENV}={raw!r} is not a UTC day YYYY-MM-DD") from None
    yesterday = ((now or datetime.now(UTC)).astimezone(UTC) - timedelta(days=1)).date().isoformat()
    data_dir = data_dir if data_dir is not None else _default_data_dir()
    found = exported_trace_days(data_dir) if data_dir is not None else []
    return min([*found[:1], yesterday])


TRACE_START_DATE = trace_start_date()

#: One partition per UTC day. ``end_offset=1`` makes today's (still growing) day a partition
#: too, so ``run.py`` and the UI can export it; the nightly run re-exports it complete.
DAILY_PARTITIONS = dg.DailyPartitionsDefinition(start_date=TRACE_START_DATE, timezone=TIMEZONE, end_offset=1)

#: A missed or failed nightly run leaves the evaluation assets overdue after 04:00 UTC.
NIGHTLY_FRESHNESS = dg.FreshnessPolicy.cron(
    deadline_cron="0 4 * * *", lower_bound_delta=timedelta(hours=3), timezone=TIMEZONE
)


def day_key(day: date) -> str:
    """The partition key of a UTC day: ``YYYY-MM-DD``."""
    return day.isoformat()


def previous_day_key(moment: datetime) -> str:
    """The key of the UTC day before ``moment`` (naive = UTC): the day a 02:00 tick exports."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return day_key((aware.astimezone(UTC) - timedelta(days=1)).date())


def today_key(now: datetime | None = None) -> str:
    """The partition key of the current UTC day."""
    return day_key((now or datetime.now(UTC)).astimezone(UTC).date())
