"""The morning view (rag_assets.history and the retrieval_history asset) over two fake nights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import pytest

from rag_assets.definitions import defs
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource, build_resources
from rag_assets.history import (
    HISTORY_FILE,
    TREND_PNG,
    CaseState,
    HistoryError,
    NightRecord,
    StoreNight,
    case_changes,
    load_history,
    p95,
    previous_of,
    trend_limits,
    worse_nights,
    write_history,
)
from rag_core.evaluation.testing import make_fixture, make_manifest, write_fixture_dir

CASES = {"c1": "ops/A.md", "c2": "ops/B.md", "c3": "ops/C.md", "c4": "ops/D.md"}


def _store_night(
    cases: dict[str, tuple[str, int | None]], recall: float, mrr: float, p95_ms: float, checks: dict | None = None
) -> StoreNight:
    levels = [level for level, _ in cases.values()]
    return StoreNight(
        status="available",
        case_count=len(cases),
        run_count=len(cases),
        recall_at_5=recall,
        mrr=mrr,
        strong=levels.count("strong"),
        medium=levels.count("medium"),
        miss=levels.count("miss"),
        not_run=0,
        latency_p95_ms=p95_ms,
        cases={
            c: CaseState(
                hit_level=level,
                first_hit_rank=rank,
                query=f"about {c}",
                expected_docs=[f"ops/{c.upper()}.md"],
                failed_checks=(checks or {}).get(c, []),
            )
            for c, (level, rank) in cases.items()
        },
    )


def _night(day: str, main: StoreNight, side: StoreNight, documents: dict[str, str]) -> NightRecord:
    return NightRecord(
        night=day,
        recorded_at=f"{day}T02:10:00+00:00",
        run_id=f"run-{day}",
        stores={"milvus": main, "pgvector": side},
        documents=documents,
    )


NIGHT_1 = _night(
    "2026-11-30",
    _store_night({"a": ("strong", 1), "b": ("strong", 2), "c": ("miss", None), "d": ("medium", 1)}, 0.75, 0.625, 12.0),
    _store_night({"a": ("strong", 1), "b": ("strong", 1), "c": ("miss", None), "d": ("strong", 1)}, 0.75, 0.75, 20.0),
    {"ops/A.md": "1", "ops/B.md": "1", "ops/C.md": "1", "ops/D.md": "1"},
)
NIGHT_2 = _night(
    "2026-12-01",
    _store_night({"a": ("miss", None), "b": ("strong", 1), "c": ("strong", 3), "d": ("medium", 1)}, 0.75, 0.583, 14.5),
    # d still ranks first on the sidecar, but its answer section is gone: strong -> medium.
    _store_night(
        {"a": ("strong", 1), "b": ("strong", 1), "c": ("miss", None), "d": ("medium", 1)},
        0.75,
        0.75,
        19.0,
        {"d": ["expected keywords missing from the top 5: mitigation"]},
    ),
    # A was deleted on main's night (its case newly missed); D lost its Mitigation section.
    {"ops/B.md": "1", "ops/C.md": "1", "ops/D.md": "2", "ops/E.md": "1"},
)


def test_changes_between_two_nights_regressions_first():
    changes = [(c.store, c.case_id, c.change) for c in case_changes(NIGHT_1, NIGHT_2)]
    assert changes == [
        ("milvus", "a", "newly missed"),
        ("pgvector", "d", "strong to medium"),
        ("milvus", "c", "newly found"),
        ("milvus", "b", "rank better"),
    ]


def test_two_nights_make_the_morning_page(tmp_path: Path):
    write_history(tmp_path, NIGHT_1)
    nights, md_path = write_history(tmp_path, NIGHT_2.model_copy(update={"load_average": [2.04, 1.5, 1.0]}))
    assert [n.night for n in nights] == ["2026-11-30", "2026-12-01"]
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == 2
    assert (tmp_path / TREND_PNG).read_bytes()[:4] == b"\x89PNG"
    md = md_path.read_text()
    order = [
        "# Retrieval history: night 2026-12-01 against 2026-11-30",
        "## Nights",
        "## Cases changed since",
        "## Trend over the last 30 nights",
    ]
    assert [md.index(h) for h in order] == sorted(md.index(h) for h in order)  # tables first, chart last
    assert "**main (Milvus): worse**" in md  # MRR 0.625 -> 0.583, recall@5 equal, one case newly missed
    assert "**sidecar (pgvector): mixed**" in md  # same recall@5 and MRR, yet a strong hit turned medium
    assert "- Cases changed since the previous night: 4 (1 newly missed, 1 strong to medium," in md
    assert "| 2026-12-01 | main (Milvus) | 0.750 (+0.000) | 0.583 (-0.042) | 2 | 1 | 1 | 0 | 14.5 | 2.0/1.5/1.0 |" in md
    assert "| 2026-11-30 | main (Milvus) | 0.750 | 0.625 | 2 | 1 | 1 | 0 | 12.0 | - |" in md  # load not kept
    assert "- added: `ops/E.md`\n- changed: `ops/D.md`\n- removed: `ops/A.md`" in md
    assert (
        "| newly missed | `a` | about a | ops/A.md | main (Milvus) | strong, rank 1 | miss "
        "| document deleted: ops/A.md |" in md
    )
    assert (
        "| strong to medium | `d` | about d | ops/D.md | sidecar (pgvector) | strong, rank 1 | medium, rank 1 "
        "| document changed: ops/D.md; expected keywords missing from the top 5: mitigation |"
    ) in md
    assert "| newly found | `c` | about c | ops/C.md | main (Milvus) | miss | strong, rank 3 | — |" in md
    assert (
        "| rank better | `b` | about b | ops/B.md | main (Milvus) | strong, rank 2 | strong, rank 1 "
        "| first hit at rank 2 -> 1 |" in md
    )
    assert "<br>" not in md
    # A re-run the same night replaces that night instead of adding one.
    nights, _ = write_history(tmp_path, NIGHT_2)
    assert len(nights) == 2 and len(load_history(tmp_path / HISTORY_FILE)) == 2


def test_the_page_gives_the_gate_verdict_and_whether_publishing_was_blocked(tmp_path: Path):
    write_history(tmp_path, NIGHT_1)
    failed = NIGHT_2.model_copy(update={"gate": "FAIL: strong hits dropped 1.000 -> 0.750", "publishing_blocked": True})
    _, md_path = write_history(tmp_path, failed)
    line = "- Gate against the stored baseline: **FAIL: strong hits dropped 1.000 -> 0.750**; publishing **blocked**"
    assert line in md_path.read_text()


def test_production_signals_and_knowledge_gaps_follow_the_golden_trend(tmp_path: Path):
    signals = "# Production signals 2026-12-01\n\n## production: 12 lookups\n"
    _, md_path = write_history(tmp_path, NIGHT_2, [signals, "# Knowledge gaps\n"])
    md = md_path.read_text()
    assert md.index("## Trend over") < md.index("## Production signals 2026-12-01") < md.index("## Knowledge gaps")
    assert "### production: 12 lookups" in md


def test_a_daytime_run_is_kept_apart_and_never_replaces_a_night(tmp_path: Path):
    write_history(tmp_path, NIGHT_1)
    daytime = NIGHT_2.model_copy(
        update={"kind": "daytime", "night": "2026-11-30", "recorded_at": "2026-11-30T14:05:00+00:00"}
    )
    nights, md_path = write_history(tmp_path, daytime)
    assert [(n.night, n.kind) for n in nights] == [("2026-11-30", "nightly"), ("2026-11-30", "daytime")]
    assert "# Retrieval history: night 2026-11-30 daytime 14:05 against 2026-11-30\n" in md_path.read_text()
    nights, md_path = write_history(tmp_path, NIGHT_2)
    assert len(nights) == 3 and previous_of(nights) == NIGHT_1  # the night before, not the daytime run
    assert "| 2026-11-30 daytime 14:05 | main (Milvus) |" in md_path.read_text()


def test_the_chart_scales_to_the_data_and_marks_worse_nights():
    low, high = trend_limits([0.93, 0.896, 0.95, None])
    assert 0.85 < low < 0.896 and 0.95 < high < 1.0  # a 0.034 drop spans a third of the axis, not 3%
    assert trend_limits([1.0, 1.0]) == (0.98, 1.02)
    assert worse_nights([NIGHT_1, NIGHT_2]) == ["2026-12-01"]  # main's MRR fell
    assert worse_nights([NIGHT_1, NIGHT_1.model_copy(update={"night": "2026-12-01"})]) == []


def test_a_bad_history_line_is_named_and_the_file_kept(tmp_path: Path):
    history = tmp_path / HISTORY_FILE
    history.write_text(NIGHT_1.model_dump_json() + '\n{"night": 3}\n')
    before = history.read_text()
    with pytest.raises(HistoryError, match=r"history.jsonl:2: not a night record"):
        write_history(tmp_path, NIGHT_2)
    assert history.read_text() == before


def test_p95():
    assert p95([]) is None and p95([5.0]) == 5.0
    assert p95([float(v) for v in range(1, 101)]) == pytest.approx(95.05)


def _write(data: Path, store: str, hits: set[str], recorded_at: str, latency: float) -> None:
    out = data / "fixtures" / store
    for old in out.glob("*.json") if out.exists() else []:
        old.unlink()
    fixtures = []
    for cid, doc in CASES.items():
        fixture = make_fixture(cid, [doc] if cid in hits else ["ops/Other.md"], store=store)
        fixtures.append(fixture.model_copy(update={"latency_ms": latency}))
    manifest = make_manifest(store, case_count=len(CASES)).model_copy(update={"recorded_at": recorded_at})
    write_fixture_dir(out, fixtures, manifest)


def test_retrieval_history_asset_over_two_nights(tmp_path: Path):
    cases = tmp_path / "cases.yaml"
    lines = [
        f"- {{id: {cid}, scenario: chat, query: 'about {doc}', expected_docs: [{doc}]}}" for cid, doc in CASES.items()
    ]
    cases.write_text("cases:\n" + "\n".join(lines) + "\n")
    data = tmp_path / "data"
    resources = build_resources(
        RagSettingsResource(data_dir=str(data), golden_cases=str(cases)),
        EvaluationConfigResource(baseline_path=str(tmp_path / "none.json")),
    )
    selection = dg.AssetSelection.assets(
        "golden_cases", "golden_evaluation_milvus", "golden_evaluation_pgvector", "retrieval_history"
    )
    instance = dg.DagsterInstance.ephemeral()
    for day, hits, latency in (("2026-11-30", {"c1", "c2", "c3"}, 10.0), ("2026-12-01", {"c2", "c3", "c4"}, 30.0)):
        for store in ("milvus", "pgvector"):
            _write(data, store, hits, f"{day}T02:05:00Z", latency)
        result = dg.materialize(
            [*defs.assets, *defs.asset_checks],
            resources=resources,
            instance=instance,
            selection=selection,
            raise_on_error=False,
            tags={"dagster/partition": day},  # as the nightly job runs it
        )
        assert result.success
    meta = {
        k: getattr(v, "value", v)
        for k, v in instance.get_latest_materialization_event(
            dg.AssetKey("retrieval_history")
        ).asset_materialization.metadata.items()
    }
    assert meta["night"] == "2026-12-01" and meta["nights_recorded"] == 2
    assert re.fullmatch(r"[\d.]+, [\d.]+, [\d.]+", meta["load_average"])  # when the latencies were measured
    assert meta["gate"].startswith("not compared: no stored baseline") and meta["publishing_blocked"] is False
    assert meta["newly_missed"] == 1 and meta["newly_found"] == 1  # c1 lost, c4 found: once, on both stores
    assert meta["milvus/recall@5"] == 0.75 and meta["pgvector/latency_p95_ms"] == 30.0
    assert meta["milvus/strong_medium_miss"].endswith("/1")
    assert "data:image/png;base64," in meta["history"] and "data:image/png;base64," in meta["trend_chart"]
    assert meta["summary"]["changes"]["newly missed"] == ["c1 (milvus, pgvector)"]
    # the numbers are table values the page shows, not Markdown behind a link
    nights = [r.data for r in meta["nights"].records]
    assert [(r["night"], r["store"]) for r in nights][:2] == [
        ("2026-12-01", "main (Milvus)"),
        ("2026-12-01", "sidecar (pgvector)"),
    ]
    assert nights[0]["recall@5"] == 0.75 and nights[1]["p95 lookup ms"] == 30.0 and len(nights) == 4
    changed = {(r.data["change"], r.data["case"], r.data["stores"]) for r in meta["changed_cases"].records}
    both = "main (Milvus), sidecar (pgvector)"
    assert changed == {("newly missed", "c1", both), ("newly found", "c4", both)}
    assert list(meta).index("milvus/recall@5") < list(meta).index("history")
    reports = data / "reports"
    assert len((reports / HISTORY_FILE).read_text().splitlines()) == 2
    assert json.loads((reports / HISTORY_FILE).read_text().splitlines()[0])["night"] == "2026-11-30"
