"""Production signals of one day of trace rows: which lookups went badly, and how often, per origin.

Pure functions over :class:`~rag_core.traces.rows.TraceRow` (no database, no Dagster): the
``production_signals`` asset computes the day's figures with them, and the case miner
(``rag_core.evaluation.mining``) takes the flagged lookups.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rag_core.lookup.contracts import RelevanceLevel
from rag_core.lookup.trace_row import RetrievalDetails
from rag_core.traces.rows import PRODUCTION_ORIGINS, TraceRow

__all__ = [
    "SIGNALS",
    "FlaggedLookup",
    "claims_support",
    "day_signals",
    "drift",
    "flag_lookups",
    "normalise_query",
]

#: The per-lookup signals, in report order. ``weak``: relevance NONE or WEAK (the tool did not
#: claim support); ``l0_fallback``: only L0 answered; ``degraded``: status degraded or error;
#: ``retried``: attempt 2 ran; ``truncated``: the query was cut to the model's limit;
#: ``slow_p95`` / ``slow_slo``: latency above the day's p95 (of its origin) / above
#: ``RAG_TRACE_SLOW_MS``; ``reasked``: the same query came again in the session within
#: ``RAG_TRACE_REASK_WINDOW_S`` (this answer did not serve the agent); ``disagreement``: Milvus
#: and the pgvector sidecar put different documents first (only where the sidecar answered).
SIGNALS = ("weak", "l0_fallback", "degraded", "retried", "truncated", "slow_p95", "slow_slo", "reasked", "disagreement")
#: Trailing nights a drift flag compares against, and the fewest it needs.
DRIFT_NIGHTS = 28
DRIFT_MIN_NIGHTS = 7
# A share drifts when outside the trailing mean +- 3 standard deviations (Shewhart's control
# limits) and at least this far from it, so a flat history does not flag one odd lookup.
_DRIFT_MIN_DELTA = 0.05

_SPACE = re.compile(r"\s+")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")


def claims_support(level: RelevanceLevel | str | None) -> bool:
    """Whether the tool claimed its evidence answers the query (``relevanceLevel`` RELEVANT or
    PRECISE). The one place mining and signals decide this (the calibrated ``confidence`` may
    replace it)."""
    return str(getattr(level, "value", level)) in (RelevanceLevel.RELEVANT.value, RelevanceLevel.PRECISE.value)


def normalise_query(text: str | None) -> str:
    """``text`` compared as a query: case-folded, whitespace collapsed, edge punctuation gone."""
    return _EDGE_PUNCT.sub("", _SPACE.sub(" ", (text or "").casefold()).strip())


@dataclass(frozen=True)
class FlaggedLookup:
    """One traced lookup with its read-back details and the ``SIGNALS`` it raised."""

    row: TraceRow
    details: RetrievalDetails
    flags: frozenset[str]

    @property
    def origin(self) -> str:
        """The row's origin (``library`` for rows without one)."""
        return self.row.origin or "library"

    @property
    def top_doc_ids(self) -> list[str]:
        """The doc ids of the evidence blocks the tool returned, best first."""
        return [e.doc_id for e in self.details.evidence]


def flag_lookups(rows: Sequence[TraceRow], slow_ms: float, reask_window_s: float) -> list[FlaggedLookup]:
    """``rows`` (any order) flagged with ``SIGNALS``, in the same order. ``slow_ms``: the latency
    SLO in ms; ``reask_window_s``: seconds within which the same normalised query in one session
    is a re-ask (the earlier lookup is flagged)."""
    details = [RetrievalDetails.read(r.retrieval_details) for r in rows]
    p95 = _p95_by_origin(rows)
    reasked = _reasked(rows, reask_window_s)
    out = []
    for i, (row, d) in enumerate(zip(rows, details, strict=True)):
        flags = {
            "weak": not claims_support(d.relevance_level),
            "l0_fallback": row.retrieval_layer == "L0",
            "degraded": row.status in ("degraded", "error"),
            "retried": any(a.attempt >= 2 for a in d.attempts),
            "truncated": d.query_truncated,
            "slow_p95": row.latency_ms is not None and row.latency_ms > p95.get(row.origin or "library", float("inf")),
            "slow_slo": row.latency_ms is not None and row.latency_ms > slow_ms,
            "reasked": i in reasked,
            "disagreement": _sidecar_compared(d) and d.sidecar.top_doc_ids[0] != d.evidence[0].doc_id,
        }
        out.append(FlaggedLookup(row, d, frozenset(k for k, v in flags.items() if v)))
    return out


def _sidecar_compared(d: RetrievalDetails) -> bool:
    return d.sidecar.status in ("available", "degraded") and bool(d.sidecar.top_doc_ids) and bool(d.evidence)


def _p95_by_origin(rows: Sequence[TraceRow]) -> dict[str, float]:
    latencies: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.latency_ms is not None:
            latencies[r.origin or "library"].append(r.latency_ms)
    # statistics.quantiles' "inclusive" method is linear interpolation (polars' and NumPy's default).
    return {o: statistics.quantiles(v, n=20, method="inclusive")[-1] for o, v in latencies.items() if len(v) >= 2}


def _reasked(rows: Sequence[TraceRow], window_s: float) -> set[int]:
    by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if r.session_id:
            by_key[(r.session_id, normalise_query(r.input))].append(i)
    out = set()
    for indexes in by_key.values():
        indexes.sort(key=lambda i: rows[i].created_at)
        for earlier, later in zip(indexes, indexes[1:], strict=False):
            if (rows[later].created_at - rows[earlier].created_at).total_seconds() <= window_s:
                out.add(earlier)
    return out


def day_signals(flagged: Sequence[FlaggedLookup]) -> dict[str, dict[str, float | int]]:
    """The day's figures per production origin and for ``production`` (all of them): ``lookups``
    (count), ``sidecar_compared`` (lookups where the sidecar answered too) and, per signal, its
    share in [0, 1] of the lookups (``disagreement``: of the ``sidecar_compared`` ones; 0.0 when
    there are none). Evaluation lookups are left out; origins without lookups are absent."""
    groups: dict[str, list[FlaggedLookup]] = defaultdict(list)
    for f in flagged:
        if f.origin in PRODUCTION_ORIGINS:
            groups[f.origin].append(f)
            groups["production"].append(f)
    return {origin: _figures(items) for origin, items in sorted(groups.items())}


def _figures(items: Sequence[FlaggedLookup]) -> dict[str, float | int]:
    compared = sum(1 for f in items if _sidecar_compared(f.details))
    figures: dict[str, float | int] = {"lookups": len(items), "sidecar_compared": compared}
    for signal in SIGNALS:
        base = compared if signal == "disagreement" else len(items)
        figures[signal] = sum(1 for f in items if signal in f.flags) / base if base else 0.0
    return figures


def drift(today: Mapping[str, float | int], trailing: Sequence[Mapping[str, float | int]]) -> dict[str, str]:
    """Signals of ``today`` (one origin's figures) that drifted against ``trailing`` (the same
    origin's figures of earlier nights, newest last; the last ``DRIFT_NIGHTS`` are used): signal ->
    ``up`` or ``down``. Empty with fewer than ``DRIFT_MIN_NIGHTS`` earlier nights."""
    recent = list(trailing)[-DRIFT_NIGHTS:]
    if len(recent) < DRIFT_MIN_NIGHTS:
        return {}
    out = {}
    for signal in SIGNALS:
        history = [float(n.get(signal, 0.0)) for n in recent]
        mean, sd = statistics.fmean(history), statistics.pstdev(history)
        delta = float(today.get(signal, 0.0)) - mean
        if abs(delta) > max(3 * sd, _DRIFT_MIN_DELTA):
            out[signal] = "up" if delta > 0 else "down"
    return out
