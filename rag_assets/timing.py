"""Time in the code location: the daily trace partitions, the nightly run and its freshness.

Everything is UTC: trace rows carry ``created_at`` as timestamptz and a partition is one UTC
day, ``[00:00, 24:00)``. The nightly evaluation runs at 02:00 and exports the day that has just
ended; its assets must have materialized between 01:00 and 04:00, else they are overdue.

The trace partitions start on a fixed day (``FIRST_TRACE_DAY``, or ``RAG_TRACE_START_DATE``):
the partition set is the same wherever and whenever the definitions load, never read from disk.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta

import dagster as dg

TIMEZONE = "UTC"
NIGHTLY_CRON = "0 2 * * *"
TRACE_START_ENV = "RAG_TRACE_START_DATE"
#: The first trace partition: the month the trace export started (earlier days have no rows).
FIRST_TRACE_DAY = "2026-11-01"


def trace_start_date(env: Mapping[str, str] | None = None) -> str:
    """The first trace partition (``YYYY-MM-DD``): ``RAG_TRACE_START_DATE`` when set, else
    ``FIRST_TRACE_DAY``. Raises ValueError naming ``RAG_TRACE_START_DATE`` for a value that is
    not a date."""
    env = os.environ if env is None else env
    raw = env.get(TRACE_START_ENV, "").strip()
    if not raw:
        return FIRST_TRACE_DAY
    try:
        return date.fromisoformat(raw).isoformat()
    except ValueError:
        raise ValueError(f"{TRACE_START_ENV}={raw!r} is not a UTC day YYYY-MM-DD") from None


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
