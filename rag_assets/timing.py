"""Time in the code location: the daily trace partitions, the nightly run and its freshness.

Everything is UTC: trace rows carry ``created_at`` as timestamptz and a partition is one UTC
day, ``[00:00, 24:00)``. The nightly evaluation runs at 02:00 and exports the day that has just
ended; its assets must have materialized between 01:00 and 04:00, else they are overdue.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import dagster as dg

TIMEZONE = "UTC"
NIGHTLY_CRON = "0 2 * * *"
TRACE_START_DATE = "2026-01-01"

#: One partition per UTC day. ``end_offset=1`` makes today's (still growing) day a partition
#: too, so ``run.py`` and the UI can export it; the nightly run re-exports it complete.
DAILY_PARTITIONS = dg.DailyPartitionsDefinition(start_date=TRACE_START_DATE, timezone=TIMEZONE,
                                                end_offset=1)

#: A missed or failed nightly run leaves the evaluation assets overdue after 04:00 UTC.
NIGHTLY_FRESHNESS = dg.FreshnessPolicy.cron(deadline_cron="0 4 * * *",
                                            lower_bound_delta=timedelta(hours=3),
                                            timezone=TIMEZONE)


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
