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

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
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

Change = Literal["newly missed", "newly found", "strong to medium", "medium to strong", "rank worse", "rank better"]
#: Order of the changed-cases table: regressions first.
CHANGE_ORDER: tuple[Change, ...] = (
    "newly missed",
    "strong to medium",
    "rank worse",
    "newly found",
    "medium to strong",
    "rank better",
)
#: Changes that make a store's verdict at least "mixed" whatever its metrics did.
_LOSSES = ("newly missed", "strong to medium")


class HistoryError(ValueError):
    """``history.jsonl`` has a line that is not a night record (names the file and line)."""


class CaseState(BaseModel):
    """One case on one night: hit level (strong/medium/miss/not_run), first-hit rank (1 = top),
    and what the morning view needs to say why it changed: the query, the expected docs and the
    evaluator's failed checks (e.g. the expected keywords missing from the top evidence)."""

    hit_level: str
    first_hit_rank: int | None = None
    query: str = ""
    expected_docs: list[str] = Field(default_factory=list)
    failed_checks: list[str] = Field(default_factory=list)


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
    the Dagster run, and each store's results (``stores``: store name -> its night).

    ``kind``: ``nightly`` for a run of a daily partition (``night`` = the partition key; a re-run
    of that partition replaces it), ``daytime`` for any other run (``night`` = the day it ran;
    kept beside the nights, never replacing one). ``documents``: doc id -> fingerprint of its
    chunks (``document_fingerprints``; empty when unknown), for what changed since the night before.
    ``gate``: the regression gate's verdict on the main store (``PASS``, ``FAIL: <reasons>`` or
    ``not compared: <why>``; None when unknown), ``publishing_blocked`` whether it kept the
    reports from being published (the gate is a blocking check). ``load_average``: the machine's
    1/5/15-minute load when recorded (``os.getloadavg``; the p95 latencies were measured under
    it; None in lines written before it was kept)."""

    V1_NAMES = {"paths": "stores"}
    night: str
    recorded_at: str
    run_id: str | None = None
    kind: Literal["nightly", "daytime"] = "nightly"
    stores: dict[str, StoreNight]
    load_average: list[float] | None = None
    documents: dict[str, str] = Field(default_factory=dict)
    gate: str | None = None
    publishing_blocked: bool = False

    @property
    def label(self) -> str:
        """``2026-12-01``, or ``2026-12-01 daytime 14:05`` for a daytime run."""
        return self.night if self.kind == "nightly" else f"{self.night} daytime {self.recorded_at[11:16]}"


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
        cases={
            c.case_id: CaseState(
                hit_level=c.hit_level,
                first_hit_rank=c.first_hit_rank,
                query=c.query,
                expected_docs=c.expected_docs,
                failed_checks=c.failed_checks,
            )
            for c in report.cases
        },
    )


def document_fingerprints(chunks: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Doc id -> a fingerprint of its chunks' content hashes, from ``(doc_id, content_hash)``
    pairs (the ``chunks`` table): equal when the document's indexed content is equal."""
    hashes: dict[str, list[str]] = {}
    for doc_id, content_hash in chunks:
        hashes.setdefault(doc_id, []).append(content_hash)
    return {d: hashlib.sha256("\n".join(sorted(h)).encode()).hexdigest()[:16] for d, h in sorted(hashes.items())}


def document_changes(before: NightRecord, after: NightRecord) -> dict[str, list[str]]:
    """Doc ids ``added``, ``changed`` and ``removed`` from ``before`` to ``after`` (all empty
    when either night did not record its documents)."""
    old, new = before.documents, after.documents
    if not old or not new:
        return {"added": [], "changed": [], "removed": []}
    return {
        "added": sorted(new.keys() - old.keys()),
        "changed": sorted(d for d in new.keys() & old.keys() if new[d] != old[d]),
        "removed": sorted(old.keys() - new.keys()),
    }


def why(change: CaseChange, documents: Mapping[str, list[str]]) -> str:
    """What happened to the case, in words: its expected document deleted or changed (from
    ``documents``, ``document_changes``), and what the evaluator found (the failed checks of a
    strong hit turned medium, the missing document of a miss, the rank move)."""
    expected = change.after.expected_docs or change.before.expected_docs
    parts = [f"document deleted: {d}" for d in expected if d in documents.get("removed", [])]
    parts += [f"document changed: {d}" for d in expected if d in documents.get("changed", [])]
    if change.change in ("strong to medium", "newly missed"):
        parts += change.after.failed_checks
    elif change.change.startswith("rank"):
        parts.append(f"first hit at rank {change.before.first_hit_rank} -> {change.after.first_hit_rank}")
    return "; ".join(parts)


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
    return sorted(nights, key=_order)


def _order(night: NightRecord) -> tuple[str, int, str]:
    return night.night, night.kind != "nightly", night.recorded_at


def append_night(path: Path, night: NightRecord) -> list[NightRecord]:
    """Add ``night`` to the history file (a nightly record replaces the nightly record of the
    same night; a daytime one is added); returns the records, oldest first (a day's nightly
    record before its daytime runs). The file is rewritten atomically."""
    kept = load_history(path)
    if night.kind == "nightly":
        kept = [n for n in kept if (n.night, n.kind) != (night.night, "nightly")]
    nights = sorted([*kept, night], key=_order)
    write_text_atomic(path, "".join(n.model_dump_json() + "\n" for n in nights))
    return nights


# --- comparing nights ------------------------------------------------------------------------


def previous_of(nights: Sequence[NightRecord]) -> NightRecord | None:
    """The record the latest one is compared with: for a nightly record the night before it
    (daytime runs in between are skipped), for a daytime run the record before it."""
    if len(nights) < 2:
        return None
    if nights[-1].kind == "daytime":
        return nights[-2]
    return next((n for n in reversed(nights[:-1]) if n.kind == "nightly"), None)


def _found(state: CaseState) -> bool:
    return state.hit_level in ("strong", "medium")


def case_changes(before: NightRecord, after: NightRecord) -> list[CaseChange]:
    """Cases whose outcome changed from ``before`` to ``after`` on each store both nights ran.

    newly missed: found (strong/medium) -> miss; newly found: miss -> found; strong to medium
    (the document still ranks, the expected keywords or breadcrumb are gone) and back; rank
    worse / better: found both nights with a different first-hit rank. not_run cases are left out.
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
            elif (old.hit_level, new.hit_level) == ("strong", "medium"):
                change = "strong to medium"
            elif (old.hit_level, new.hit_level) == ("medium", "strong"):
                change = "medium to strong"
            elif _found(old) and _found(new) and old.first_hit_rank != new.first_hit_rank:
                worse = (new.first_hit_rank or 10**6) > (old.first_hit_rank or 10**6)
                change = "rank worse" if worse else "rank better"
            if change:
                changes.append(CaseChange(store=store, case_id=case_id, change=change, before=old, after=new))
    store_order = list(after.stores)
    changes.sort(key=lambda c: (CHANGE_ORDER.index(c.change), store_order.index(c.store), c.case_id))
    return changes


def grouped_changes(changes: Sequence[CaseChange]) -> list[tuple[Change, str, list[CaseChange]]]:
    """``changes`` once per case and kind of change, with the store(s) it happened on, in
    ``case_changes``' order: "2 newly missed" means two cases, whichever stores they are on."""
    groups: dict[tuple[Change, str], list[CaseChange]] = {}
    for c in changes:
        groups.setdefault((c.change, c.case_id), []).append(c)
    return [(change, case_id, group) for (change, case_id), group in groups.items()]


def stores_named(group: Sequence[CaseChange]) -> str:
    """The stores of one grouped change, as the report labels them (``main (Milvus), sidecar (pgvector)``)."""
    return ", ".join(STORE_LABELS.get(c.store, c.store) for c in group)


def outcomes(group: Sequence[CaseChange], when: Literal["before", "after"]) -> str:
    """The case's outcome before or after, once when every store agrees, else per store."""
    texts = {c.store: case_outcome(getattr(c, when)) for c in group}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"{STORE_LABELS.get(store, store)}: {text}" for store, text in texts.items())


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def verdict(before: NightRecord | None, after: NightRecord, changes: Sequence[CaseChange]) -> dict[str, str]:
    """Per store: ``better``, ``worse``, ``mixed``, ``unchanged`` or ``first night`` (recall@5 and
    MRR against the previous night; a newly missed case or a strong hit turned medium alone
    makes a store at least mixed)."""
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
        missed = any(c.store == store and c.change in _LOSSES for c in changes)
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
    previous = previous_of(nights)
    changes = case_changes(previous, latest) if previous else []
    verdicts = verdict(previous, latest, changes)
    against = f" against {previous.label}" if previous else " (no earlier night recorded)"
    lines = [f"# Retrieval history: night {latest.label}{against}", ""]
    lines += [f"- **{STORE_LABELS.get(p, p)}: {v}**" for p, v in verdicts.items()]
    if latest.gate is not None:
        published = "publishing **blocked**" if latest.publishing_blocked else "reports published"
        lines.append(f"- Gate against the stored baseline: **{latest.gate}**; {published}")
    grouped = grouped_changes(changes)
    counts = {c: sum(1 for change, _, _ in grouped if change == c) for c in CHANGE_ORDER}
    lines += [
        f"- Cases changed since the previous night: {len({case for _, case, _ in grouped})} ("
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
                    night.label,
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
    documents = document_changes(previous, latest) if previous else {}
    if any(documents.values()):
        lines += [f"## Documents since {previous.label if previous else ''}", ""]
        lines += [f"- {kind}: {', '.join(f'`{d}`' for d in docs)}" for kind, docs in documents.items() if docs]
        lines += [""]
    lines += [f"## Cases changed since {previous.label}" if previous else "## Cases changed", ""]
    if not changes:
        lines += ["_None._" if previous else "_Nothing to compare with yet: this is the first night._"]
    else:
        lines += [
            md_table(
                ["change", "case", "query", "expected doc", "store(s)", "before", "after", "why"],
                [
                    [change, f"`{case_id}`", group[0].after.query, ", ".join(group[0].after.expected_docs)]
                    + [stores_named(group), outcomes(group, "before"), outcomes(group, "after")]
                    + ["; ".join(dict.fromkeys(why(c, documents) for c in group))]
                    for change, case_id, group in grouped
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


def trend_limits(values: Sequence[float | None]) -> tuple[float, float]:
    """The recall@5 / MRR axis range: the data's range with 15% margin (at least 0.02), inside
    [0, 1.05], so a drop of a few hundredths is visible instead of flattened on 0-1."""
    present = [v for v in values if v is not None]
    if not present:
        return 0.0, 1.05
    low, high = min(present), max(present)
    pad = max(0.02, 0.15 * (high - low))
    return max(0.0, low - pad), min(1.05, high + pad)


def worse_nights(nights: Sequence[NightRecord]) -> list[str]:
    """The nights (``night`` keys) whose verdict against the night before was ``worse`` on
    some store, or where a store did not run: the ones the trend chart marks."""
    out = []
    for before, after in zip(nights, nights[1:], strict=False):
        verdicts = verdict(before, after, case_changes(before, after))
        if "worse" in verdicts.values() or any(p.status != "available" for p in after.stores.values()):
            out.append(after.night)
    return out


def write_trend_chart(nights: Sequence[NightRecord], png_path: Path) -> Path:
    """PNG: recall@5 and MRR (top, axis scaled to the data by ``trend_limits``) and p95 lookup
    latency in ms (bottom) per night and store, over the last ``TREND_NIGHTS`` nights; nights of
    ``worse_nights`` shaded red; legends beside the plots, never over a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    # One point per night: daytime runs are kept apart (the table lists them), unless there is nothing else.
    shown = [n for n in nights if n.kind == "nightly"][-TREND_NIGHTS:] or list(nights[-TREND_NIGHTS:])
    days = [datetime.fromisoformat(n.night) for n in shown]
    stores = list(dict.fromkeys(p for n in shown for p in n.stores))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), dpi=100, sharex=True)
    try:
        rates: list[float | None] = []
        for index, store in enumerate(stores):
            label, color = STORE_LABELS.get(store, store), f"C{index}"  # one colour per store
            # Equal values on one night put the stores' markers on one spot: later stores get
            # larger hollow rings drawn below, so every store's marker stays visible.
            style = {"color": color, "markersize": 6 + 5 * index, "zorder": 10 - index}
            if index:
                style["markerfacecolor"] = "none"
            series = [n.stores.get(store) for n in shown]
            recall, mrr = [s.recall_at_5 if s else None for s in series], [s.mrr if s else None for s in series]
            rates += recall + mrr
            top.plot(days, recall, marker="o", label=f"{label} recall@5", **style)
            top.plot(days, mrr, marker="s", linestyle="--", label=f"{label} MRR", **style)
            bottom.plot(days, [s.latency_p95_ms if s else None for s in series], marker="o", label=label, **style)
        for index, night in enumerate(worse_nights(shown)):
            day = datetime.fromisoformat(night)
            for axis in (top, bottom):
                axis.axvspan(
                    day - timedelta(hours=10),
                    day + timedelta(hours=10),
                    color="red",
                    alpha=0.15,
                    label="worse night" if index == 0 and axis is top else None,
                )
        bottom.xaxis.set_major_locator(mdates.DayLocator(interval=max(1, len(shown) // 10)))
        bottom.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d"))
        top.set_ylim(*trend_limits(rates))
        top.set_ylabel("recall@5 / MRR")
        top.grid(True, alpha=0.3)
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        top.set_title(f"Golden retrieval, last {len(shown)} night(s)")
        bottom.set_ylabel("p95 lookup (ms)")
        bottom.grid(True, alpha=0.3)
        bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        fig.autofmt_xdate()
        fig.tight_layout()
        png_path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png_path, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return png_path


def write_history(
    reports_dir: Path, night: NightRecord, appendix: Sequence[str] = ()
) -> tuple[list[NightRecord], Path]:
    """Append ``night`` to ``<reports_dir>/history.jsonl``, write the trend PNG and
    ``history.md`` (with the Markdown reports of ``appendix`` after it, their headings one level
    down); returns the nights (oldest first) and the Markdown path."""
    nights = append_night(reports_dir / HISTORY_FILE, night)
    write_trend_chart(nights, reports_dir / TREND_PNG)
    sections = ["\n".join("#" + line if line.startswith("#") else line for line in a.splitlines()) for a in appendix]
    md = write_text_atomic(reports_dir / HISTORY_MD, "\n".join([render_history_markdown(nights), *sections]))
    return nights, md


def summary(nights: Sequence[NightRecord]) -> dict[str, Any]:
    """JSON-ready summary of the latest night against the previous one (for metadata)."""
    latest = nights[-1]
    previous = previous_of(nights)
    changes = case_changes(previous, latest) if previous else []
    grouped = grouped_changes(changes)
    return {
        "night": latest.night,
        "previous_night": previous.night if previous else None,
        "verdict": verdict(previous, latest, changes),
        "changes": {
            c: [f"{case_id} ({', '.join(x.store for x in group)})" for change, case_id, group in grouped if change == c]
            for c in CHANGE_ORDER
        },
    }
