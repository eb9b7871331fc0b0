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
    write_history,
)
from rag_core.evaluation.testing import make_fixture, make_manifest, write_fixture_dir

CASES = {"c1": "ops/A.md", "c2": "ops/B.md", "c3": "ops/C.md", "c4": "ops/D.md"}


def _store_night(cases: dict[str, tuple[str, int | None]], recall: float, mrr: float, p95_ms: float) -> StoreNight:
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
        cases={c: CaseState(hit_level=level, first_hit_rank=rank) for c, (level, rank) in cases.items()},
    )


def _night(day: str, main: StoreNight, side: StoreNight) -> NightRecord:
    return NightRecord(
        night=day, recorded_at=f"{day}T02:10:00+00:00", run_id=f"run-{day}", stores={"milvus": main, "pgvector": side}
    )


NIGHT_1 = _night(
    "2026-11-30",
    _store_night({"a": ("strong", 1), "b": ("strong", 2), "c": ("miss", None), "d": ("medium", 1)}, 0.75, 0.625, 12.0),
    _store_night({"a": ("strong", 1), "b": ("strong", 1), "c": ("miss", None), "d": ("strong", 1)}, 0.75, 0.75, 20.0),
)
NIGHT_2 = _night(
    "2026-12-01",
    _store_night({"a": ("miss", None), "b": ("strong", 1), "c": ("strong", 3), "d": ("medium", 1)}, 0.75, 0.583, 14.5),
    _store_night({"a": ("strong", 1), "b": ("strong", 1), "c": ("miss", None), "d": ("strong", 1)}, 0.75, 0.75, 19.0),
)


def test_changes_between_two_nights_regressions_first():
    changes = [(c.store, c.case_id, c.change) for c in case_changes(NIGHT_1, NIGHT_2)]
    assert changes == [("milvus", "a", "newly missed"), ("milvus", "c", "newly found"), ("milvus", "b", "rank better")]


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
    assert "**sidecar (pgvector): unchanged**" in md
    assert "| 2026-12-01 | main (Milvus) | 0.750 (+0.000) | 0.583 (-0.042) | 2 | 1 | 1 | 0 | 14.5 | 2.0/1.5/1.0 |" in md
    assert "| 2026-11-30 | main (Milvus) | 0.750 | 0.625 | 2 | 1 | 1 | 0 | 12.0 | - |" in md  # load not kept
    assert "| newly missed | main (Milvus) | `a` | strong, rank 1 | miss |" in md
    assert "| newly found | main (Milvus) | `c` | miss | strong, rank 3 |" in md
    assert "| rank better | main (Milvus) | `b` | strong, rank 2 | strong, rank 1 |" in md
    assert "<br>" not in md
    # A re-run the same night replaces that night instead of adding one.
    nights, _ = write_history(tmp_path, NIGHT_2)
    assert len(nights) == 2 and len(load_history(tmp_path / HISTORY_FILE)) == 2


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
    assert meta["newly_missed"] == 2 and meta["newly_found"] == 2  # c1 lost, c4 found, on both stores
    assert meta["milvus/recall@5"] == 0.75 and meta["pgvector/latency_p95_ms"] == 30.0
    assert meta["milvus/strong_medium_miss"].endswith("/1")
    assert "data:image/png;base64," in meta["history"] and "data:image/png;base64," in meta["trend_chart"]
    assert meta["summary"]["changes"]["newly missed"] == ["milvus:c1", "pgvector:c1"]
    # the numbers are table values the page shows, not Markdown behind a link
    nights = [r.data for r in meta["nights"].records]
    assert [(r["night"], r["store"]) for r in nights][:2] == [
        ("2026-12-01", "main (Milvus)"),
        ("2026-12-01", "sidecar (pgvector)"),
    ]
    assert nights[0]["recall@5"] == 0.75 and nights[1]["p95 lookup ms"] == 30.0 and len(nights) == 4
    changed = {(r.data["change"], r.data["case"]) for r in meta["changed_cases"].records}
    assert changed == {("newly missed", "c1"), ("newly found", "c4")}
    assert list(meta).index("milvus/recall@5") < list(meta).index("history")
    reports = data / "reports"
    assert len((reports / HISTORY_FILE).read_text().splitlines()) == 2
    assert json.loads((reports / HISTORY_FILE).read_text().splitlines()[0])["night"] == "2026-11-30"
