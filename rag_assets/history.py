"""The morning view: retrieval quality night after night, and what changed since last night.

Each nightly evaluation appends one ``NightRecord`` per night to ``history.jsonl`` in the
reports dir (a re-run the same night replaces that night's line): per store (``milvus`` = main,
``pgvector`` = sidecar) recall@5, MRR, strong/medium/miss counts, the p95 lookup latency of the
recorded golden lookups (ms) and every case's hit level and first-hit rank. ``history.md``
renders it for the on-call engineer: the verdict and the nights table first, then the cases that
changed since the previous night (newly missed, newly found, first-hit rank moved), then a trend
chart over the last 30 nights (``history-trend.png``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from rag_assets.files import write_text_atomic
from rag_assets.metadata import md_table
from rag_core.evaluation.evaluator import EvaluationReport
from rag_core.evaluation.fixtures import FixtureSet
from rag_core.evaluation.formats import FormatVersionError, VersionedFile, parse_json_model

HISTORY_FILE = "history.jsonl"
HISTORY_MD = "history.md"
TREND_PNG = "history-trend.png"
TREND_NIGHTS = 30
#: Below this absolute change a metric counts as unchanged (one case of 58 is 0.017).
EPSILON = 0.0005
STORE_LABELS = {"milvus": "main (Milvus)", "pgvector": "sidecar (pgvector)"}

Change = Literal["newly missed", "newly found", "rank worse", "rank better"]
#: Order of the changed-cases table: regressions first.
CHANGE_ORDER: tuple[Change, ...] = ("newly missed", "rank worse", "newly found", "rank better")


class HistoryError(ValueError):
    """``history.jsonl`` has a line that is not a night record (names the file and line)."""


class CaseState(BaseModel):
    """One case on one night: hit level (strong/medium/miss/not_run), first-hit rank (1 = top)."""

    hit_level: str
    first_hit_rank: int | None = None


class StoreNight(BaseModel):
    """One store's results of one night. Rates in [0, 1]; ``latency_p95_ms`` in milliseconds
    (None when the fixtures carry no timings); ``status`` available/unavailable."""

    status: str
    case_count: int
    run_count: int
    recall_at_5: float | None
    mrr: float | None
    strong: int
    medium: int
    miss: int
    not_run: int
    latency_p95_ms: float | None = None
    cases: dict[str, CaseState] = Field(default_factory=dict)


class NightRecord(VersionedFile):
    """One line of ``history.jsonl``: the UTC ``night`` (``YYYY-MM-DD``), when it was recorded,
    the Dagster run, each store's results (``stores``: store name -> its night) and the
    machine's 1/5/15-minute load average when recorded (``os.getloadavg``; the p95 latencies
    were measured under it; None in lines written before it was kept)."""

    V1_NAMES = {"paths": "stores"}
    night: str
    recorded_at: str
    run_id: str | None = None
    stores: dict[str, StoreNight]
    load_average: list[float] | None = None


class CaseChange(BaseModel):
    """A case whose outcome changed between two nights on one store."""

    store: str
    case_id: str
    change: Change
    before: CaseState
    after: CaseState


# --- building a night --------------------------------------------------------------------------


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile (linear interpolation), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = 0.95 * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def store_night(report: EvaluationReport, fixtures: FixtureSet | None) -> StoreNight:
    """One store's night from its evaluation report and (for latency) its recorded fixtures."""
    s = report.summary
    latencies = [f.latency_ms for f in (fixtures.fixtures.values() if fixtures else []) if f.latency_ms is not None]
    p95_ms = p95(latencies)
    return StoreNight(
        status=report.store_status.status,
        case_count=s.case_count,
        run_count=s.run_count,
        recall_at_5=s.recall_at_k.get(5),
        mrr=s.mrr,
        strong=s.strong,
        medium=s.medium,
        miss=s.miss,
        not_run=s.not_run,
        latency_p95_ms=None if p95_ms is None else round(p95_ms, 2),
        cases={c.case_id: CaseState(hit_level=c.hit_level, first_hit_rank=c.first_hit_rank) for c in report.cases},
    )


def night_of(report: EvaluationReport, now: datetime | None = None) -> str:
    """The UTC day the report's fixtures were recorded (manifest ``recorded_at``), else today."""
    recorded = report.manifest.recorded_at if report.manifest else None
    if recorded:
        try:
            return datetime.fromisoformat(recorded.replace("Z", "+00:00")).astimezone(UTC).date().isoformat()
        except ValueError:
            pass
    return (now or datetime.now(UTC)).astimezone(UTC).date().isoformat()


# --- the file ------------------------------------------------------------------------------


def load_history(path: Path) -> list[NightRecord]:
    """The nights in ``path``, oldest first ([] when the file does not exist).

    Raises HistoryError naming the file and line for a line that is not a night record or
    has a format version this code cannot read (older lines load with their old names mapped).
    """
    if not path.is_file():
        return []
    nights = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            nights.append(parse_json_model(line, NightRecord, f"{path}:{number}"))
        except FormatVersionError as exc:
            raise HistoryError(str(exc)) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            raise HistoryError(f"{path}:{number}: not a night record ({where}: {first['msg']})") from None
    return sorted(nights, key=lambda n: n.night)


def append_night(path: Path, night: NightRecord) -> list[NightRecord]:
    """Add ``night`` to the history file (replacing a record of the same night); returns the
    nights, oldest first. The file is rewritten atomically."""
    nights = [n for n in load_history(path) if n.night != night.night] + [night]
    nights.sort(key=lambda n: n.night)
    write_text_atomic(path, "".join(n.model_dump_json() + "\n" for n in nights))
    return nights


# --- comparing nights ------------------------------------------------------------------------


def _found(state: CaseState) -> bool:
    return state.hit_level in ("strong", "medium")


def case_changes(before: NightRecord, after: NightRecord) -> list[CaseChange]:
    """Cases whose outcome changed from ``before`` to ``after`` on each store both nights ran.

    newly missed: found (strong/medium) -> miss; newly found: miss -> found; rank worse /
    better: found both nights with a different first-hit rank. not_run cases are left out.
    Sorted regressions first, then by store and case id.
    """
    changes = []
    for store, now in after.stores.items():
        then = before.stores.get(store)
        if then is None:
            continue
        for case_id, new in now.cases.items():
            old = then.cases.get(case_id)
            if old is None:
                continue
            change: Change | None = None
            if _found(old) and new.hit_level == "miss":
                change = "newly missed"
            elif old.hit_level == "miss" and _found(new):
                change = "newly found"
            elif _found(old) and _found(new) and old.first_hit_rank != new.first_hit_rank:
                worse = (new.first_hit_rank or 10**6) > (old.first_hit_rank or 10**6)
                change = "rank worse" if worse else "rank better"
            if change:
                changes.append(CaseChange(store=store, case_id=case_id, change=change, before=old, after=new))
    store_order = list(after.stores)
    changes.sort(key=lambda c: (CHANGE_ORDER.index(c.change), store_order.index(c.store), c.case_id))
    return changes


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def verdict(before: NightRecord | None, after: NightRecord, changes: Sequence[CaseChange]) -> dict[str, str]:
    """Per store: ``better``, ``worse``, ``mixed``, ``unchanged`` or ``first night`` (recall@5 and
    MRR against the previous night; a newly missed case alone makes a store at least mixed)."""
    out = {}
    for store, now in after.stores.items():
        then = before.stores.get(store) if before else None
        if then is None:
            out[store] = "first night"
            continue
        deltas = [
            d
            for d in (_delta(then.recall_at_5, now.recall_at_5), _delta(then.mrr, now.mrr))
            if d is not None and abs(d) > EPSILON
        ]
        ups, downs = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
        missed = any(c.store == store and c.change == "newly missed" for c in changes)
        if downs and not ups:
            out[store] = "worse"
        elif ups and not downs:
            out[store] = "mixed" if missed else "better"
        elif ups and downs:
            out[store] = "mixed"
        else:
            out[store] = "mixed" if missed else "unchanged"
    return out


# --- rendering -----------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _signed(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f" ({value:+.{digits}f})"


def case_outcome(state: CaseState) -> str:
    """``"strong, rank 2"``, or the hit level alone when nothing was found."""
    return f"{state.hit_level}, rank {state.first_hit_rank}" if state.first_hit_rank else state.hit_level


def render_history_markdown(nights: Sequence[NightRecord], chart_file: str | None = TREND_PNG) -> str:
    """``history.md``: verdict, the nights table (newest first, Δ against the night before),
    the changed cases, the trend chart. ``nights`` oldest first, at least one."""
    latest = nights[-1]
    previous = nights[-2] if len(nights) > 1 else None
    changes = case_changes(previous, latest) if previous else []
    verdicts = verdict(previous, latest, changes)
    against = f" against {previous.night}" if previous else " (no earlier night recorded)"
    lines = [f"# Retrieval history: night {latest.night}{against}", ""]
    lines += [f"- **{STORE_LABELS.get(p, p)}: {v}**" for p, v in verdicts.items()]
    counts = {c: sum(1 for x in changes if x.change == c) for c in CHANGE_ORDER}
    lines += [
        f"- Cases changed since the previous night: {len(changes)} ("
        + ", ".join(f"{n} {c}" for c, n in counts.items())
        + ")",
        "",
    ]
    lines += ["## Nights (newest first; Δ against the night before)", ""]
    rows = []
    shown = list(reversed(nights[-TREND_NIGHTS:]))
    for index, night in enumerate(shown):
        before = shown[index + 1] if index + 1 < len(shown) else None
        for store, p in night.stores.items():
            b = before.stores.get(store) if before else None
            rows.append(
                [
                    night.night,
                    STORE_LABELS.get(store, store),
                    _num(p.recall_at_5) + _signed(_delta(b.recall_at_5, p.recall_at_5) if b else None),
                    _num(p.mrr) + _signed(_delta(b.mrr, p.mrr) if b else None),
                    p.strong,
                    p.medium,
                    p.miss,
                    p.not_run,
                    _num(p.latency_p95_ms, 1),
                    "/".join(f"{x:.1f}" for x in night.load_average) if night.load_average else "-",
                    p.status,
                ]
            )
    lines += [
        md_table(
            [
                "night",
                "store",
                "recall@5",
                "MRR",
                "strong",
                "medium",
                "miss",
                "not run",
                "p95 lookup ms",
                "load 1/5/15 min",
                "status",
            ],
            rows,
        ),
        "",
    ]
    lines += [f"## Cases changed since {previous.night}" if previous else "## Cases changed", ""]
    if not changes:
        lines += ["_None._" if previous else "_Nothing to compare with yet: this is the first night._"]
    else:
        lines += [
            md_table(
                ["change", "store", "case", "before", "after"],
                [
                    [c.change, STORE_LABELS.get(c.store, c.store), f"`{c.case_id}`", case_outcome(c.before)]
                    + [case_outcome(c.after)]
                    for c in changes
                ],
            )
        ]
    if chart_file:
        lines += [
            "",
            f"## Trend over the last {TREND_NIGHTS} nights",
            "",
            f"![recall@5, MRR and p95 lookup latency per night]({chart_file})",
        ]
    return "\n".join(lines) + "\n"


def write_trend_chart(nights: Sequence[NightRecord], png_path: Path) -> Path:
    """PNG: recall@5 and MRR (top, 0-1) and p95 lookup latency in ms (bottom) per night and
    store, over the last ``TREND_NIGHTS`` nights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    shown = list(nights[-TREND_NIGHTS:])
    days = [datetime.fromisoformat(n.night) for n in shown]
    stores = list(dict.fromkeys(p for n in shown for p in n.stores))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=True)
    try:
        for index, store in enumerate(stores):
            label, color = STORE_LABELS.get(store, store), f"C{index}"  # one colour per store
            # Equal values on one night put the stores' markers on one spot: later stores get
            # larger hollow rings drawn below, so every store's marker stays visible.
            style = {"color": color, "markersize": 6 + 5 * index, "zorder": 10 - index}
            if index:
                style["markerfacecolor"] = "none"
            series = [n.stores.get(store) for n in shown]
            recall, mrr = [s.recall_at_5 if s else None for s in series], [s.mrr if s else None for s in series]
            top.plot(days, recall, marker="o", label=f"{label} recall@5", **style)
            top.plot(days, mrr, marker="s", linestyle="--", label=f"{label} MRR", **style)
            bottom.plot(days, [s.latency_p95_ms if s else None for s in series], marker="o", label=label, **style)
        bottom.xaxis.set_major_locator(mdates.DayLocator(interval=max(1, len(shown) // 10)))
        bottom.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d"))
        top.set_ylim(0, 1.05)
        top.set_ylabel("recall@5 / MRR")
        top.grid(True, alpha=0.3)
        top.legend(loc="lower left", fontsize="small")
        top.set_title(f"Golden retrieval, last {len(shown)} night(s)")
        bottom.set_ylabel("p95 lookup (ms)")
        bottom.grid(True, alpha=0.3)
        bottom.legend(loc="upper left", fontsize="small")
        fig.autofmt_xdate()
        fig.tight_layout()
        png_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png_path, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return png_path


def write_history(reports_dir: Path, night: NightRecord) -> tuple[list[NightRecord], Path]:
    """Append ``night`` to ``<reports_dir>/history.jsonl``, write the trend PNG and
    ``history.md``; returns the nights (oldest first) and the Markdown path."""
    nights = append_night(reports_dir / HISTORY_FILE, night)
    write_trend_chart(nights, reports_dir / TREND_PNG)
    md = write_text_atomic(reports_dir / HISTORY_MD, render_history_markdown(nights))
    return nights, md


def summary(nights: Sequence[NightRecord]) -> dict[str, Any]:
    """JSON-ready summary of the latest night against the previous one (for metadata)."""
    latest = nights[-1]
    previous = nights[-2] if len(nights) > 1 else None
    changes = case_changes(previous, latest) if previous else []
    return {
        "night": latest.night,
        "previous_night": previous.night if previous else None,
        "verdict": verdict(previous, latest, changes),
        "changes": {c: [f"{x.store}:{x.case_id}" for x in changes if x.change == c] for c in CHANGE_ORDER},
    }
