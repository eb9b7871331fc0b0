"""Targets, the Markdown report (tables first), the printed summary and the scale chart.

The Markdown report is ``SECTIONS``: one row per results section (title, what it needs, its body);
``markdown`` draws them all the same way. Sections show figures only: no advice text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench.cold_lookup import COLD_GOAL_S
from bench.engine import GOALS as ENGINE_GOALS
from bench.evaluation import TARGET_CASES_PER_S
from bench.harness import Column, Goal, Missing, Reading, Results, as_percent, as_times, evaluate, render, section
from bench.ingestion import TARGET_RATIO, TARGET_REINGEST
from bench.latency import SINGLE_MODEL, TARGET_OVERHEAD
from bench.scale import MIN_RECALL, TARGET_MILVUS_VS_NUMPY, TARGET_PG_VS_NUMPY
from rag_core.markdown import md_table

STAGE_LABELS = {  # the latency benchmark's ``STAGES``, in table order
    "e2e": "end to end (`lookup` call)",
    "l0": "L0 hints (query transform)",
    "embed": "query embedding",
    "ensemble": "second model (query + chunks on first sight)",
    "documents": "document similarity (title + centroid)",
    "search": "L1 retrieval (attempts, store calls + fusion)",
    "store": "&nbsp;&nbsp;store calls (wall time: the longest L1 attempt)",
    "fusion": "&nbsp;&nbsp;RRF fusion + attempt logic",
    "postprocess": "post-processing + rerank",
    "pack": "context packing",
    "assemble": "result assembly (relevance, session, trace object)",
    "trace_handoff": "trace hand-off (row build + recorder)",
    "pipeline_overhead": "**pipeline overhead** (all but embedding, second model, store search and document vectors)",
}


# --- formatting ----------------------------------------------------------------------------------


def _f(v: Any, digits: int = 1) -> str:
    """``v`` with thousands separators (floats to ``digits``); "–" for None."""
    if v is None:
        return "–"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def _pct(v: float | None) -> str:
    return "–" if v is None else as_percent(v)


def _ok(r: Any) -> bool:
    return isinstance(r, dict) and "error" not in r


def _p(stats: dict[str, Any], digits: int = 2, keys: Sequence[str] = ("p50", "p95", "p99")) -> list[str]:
    return [_f(stats[k], digits) for k in keys]


def _profile(rows: list[dict[str, Any]] | None, caption: str) -> list[str]:
    """A cProfile table (``bench.common.profile_top`` rows) under ``caption``; nothing without rows."""
    if not rows:
        return []
    cells = [[f"`{r['function']}`", r["ncalls"], _f(r["tottime_ms"], 3), _f(r["cumtime_ms"], 3)] for r in rows]
    return [caption, md_table(["function", "calls", "self ms", "cumulative ms"], cells)]


def _by_path(first: str, rows: Iterable[tuple[Any, Any]], paths: Sequence[str], cells: dict[str, Any]) -> str:
    """A table with one column group per path: ``rows`` are (label, key), ``cells[name](path, key)``."""
    header = [first] + [f"{p} {name}" for p in paths for name in cells]
    return md_table(header, [[label] + [fn(p, key) for p in paths for fn in cells.values()] for label, key in rows])


# --- targets: a table of goals -----------------------------------------------------------------------------


def _overhead(path: str) -> Goal:
    def read(p: dict[str, Any]) -> Reading:
        s = p["stages_ms"]
        return Reading(
            f"overhead p50 {_f(s['pipeline_overhead']['p50'], 2)} ms vs end-to-end p50 {_f(s['e2e']['p50'], 2)} ms "
            f"(embedding p50 {_f(s['embed']['p50'], 2)} ms, store p50 {_f(s['store']['p50'], 2)} ms)",
            p["overhead_share_p50"],
        )

    pct = f"{100 * TARGET_OVERHEAD:.0f} %"
    target = f"Pipeline overhead <= {pct} of end-to-end p50 ({path} path)"
    return Goal(
        f"overhead_{path}", target, f"<= {pct}", "<=", TARGET_OVERHEAD, ("latency", "paths", path), read, as_percent
    )


def _search_100k(store: str, limit: float, label: str) -> Goal:
    def read(st: dict[str, Any]) -> Reading | Missing:
        e = st.get(store)
        if not e or e.get("ratio_x") is None:  # ran without a configuration reaching the recall
            return Missing((e or {}).get("note") or st.get("note") or "not run", met=False if e else None)
        return Reading(
            f"{label.removesuffix(' HNSW')} {e['config']}: p50 {_f(e['p50_ms'], 2)} ms "
            f"(recall@10 {e['recall@10']:.3f}) vs NumPy exact p50 {_f(e['numpy_p50_ms'], 2)} ms",
            e["ratio_x"],
        )

    target = (
        f"Store search at 100k, {label} at its best index (recall@10 >= {MIN_RECALL}) "
        f"within {limit:g}x of exact NumPy top-k"
    )
    return Goal(f"search_100k_{store}", target, f"<= {limit:g}x", "<=", limit, ("scale", "targets"), read, as_times)


def _ingest_vs_raw(ing: dict[str, Any]) -> Reading:
    return Reading(
        f"ingest {_f(ing['ingest_chunks_per_s'])} chunks/s vs raw encode {_f(ing['raw_encode_chunks_per_s'])} "
        f"chunks/s ({ing['chunks_embedded']} chunks)",
        ing["ingest_vs_raw"],
    )


def _reingest(ing: dict[str, Any]) -> Reading:
    measured = f"re-ingest {_f(ing['reingest_s'], 2)} s vs first ingest {_f(ing['ingest_s'], 2)} s"
    return Reading(measured, ing["reingest_fraction"])


def _evaluation(ev: dict[str, Any]) -> Reading:
    return Reading(
        f"{ev['cases']:,} cases in {_f(ev['total_s'], 3)} s (load_fixtures {_f(ev['load_s'], 3)} s "
        f"+ evaluate {_f(ev['evaluate_s'], 3)} s)",
        ev["cases_per_s"],
    )


def _cold_lookup(c: dict[str, Any]) -> Reading:
    return Reading(
        f"fresh `rag lookup` p50 {_f(c['cold_s']['p50'], 2)} s over {c['cold_s']['n']} processes beside warm "
        f"in-process p50 {_f(c['warm_ms']['p50'], 1)} ms ({_f(c['cold_over_warm_p50'])}x)",
        c["cold_s"]["p50"],
    )


def _goal(id: str, target: str, op: Literal["<=", ">="], limit: float, limit_text: str, **kw: Any) -> Goal:
    """A goal on the section named like its ``id`` (``source`` to override)."""
    return Goal(id, target, limit_text, op, limit, kw.pop("source", (id,)), kw.pop("read"), kw.pop("show"), **kw)


_RAW, _RE, _CASES = f"{100 * TARGET_RATIO:.0f} %", f"{100 * TARGET_REINGEST:.0f} %", f"{TARGET_CASES_PER_S:,.0f}"
GOALS: tuple[Goal, ...] = (
    _overhead("milvus"),
    _overhead("pgvector"),
    _search_100k("pgvector", TARGET_PG_VS_NUMPY, "pgvector HNSW"),
    _search_100k("milvus", TARGET_MILVUS_VS_NUMPY, "Milvus (embedded server)"),
    _goal("ingest_vs_raw", f"Ingestion >= {_RAW} of raw embedding throughput", ">=", TARGET_RATIO, f">= {_RAW}",
          source=("ingestion",), read=_ingest_vs_raw, show=as_percent),
    _goal("reingest", f"Unchanged re-ingest <= {_RE} of the first ingest", "<=", TARGET_REINGEST, f"<= {_RE}",
          source=("ingestion",), read=_reingest, show=as_percent),
    _goal("evaluation", f"Offline evaluation >= {_CASES} cases/s", ">=", TARGET_CASES_PER_S, f">= {_CASES} cases/s",
          read=_evaluation, show=lambda v: f"{v:,.0f} cases/s"),
    _goal("cold_lookup", f"A one-shot `rag lookup` (fresh process) <= {COLD_GOAL_S:g} s", "<=", COLD_GOAL_S,
          f"<= {COLD_GOAL_S:g} s", read=_cold_lookup, show=lambda v: f"{v:.2f} s"),
    *ENGINE_GOALS,
)  # fmt: skip


def evaluate_targets(r: Results) -> list[dict[str, Any]]:
    """One row per target (``GOALS``): what was measured (side-by-side figures), the ratio, met or not."""
    return evaluate(GOALS, r)


def _status(met: bool | None) -> str:
    return "not run" if met is None else ("**met**" if met else "**NOT met**")


def borderline(r: dict[str, Any], margin: float = 0.15) -> list[dict[str, Any]]:
    """Targets whose measured value lies within ``margin`` (relative) of the limit, either side."""
    close = []
    for t in r.get("targets", []):
        v, lim = t.get("value"), t.get("limit_value")
        if v is not None and lim and abs(v - lim) / lim <= margin:
            close.append(t)
    return close


TARGET_COLUMNS: tuple[Column[dict[str, Any]], ...] = (
    Column("target", lambda t: t["target"]),
    Column("measured (same run)", lambda t: t.get("measured", "–")),
    Column("ratio", lambda t: t.get("ratio", "–")),
    Column("limit", lambda t: t["limit"]),
    Column("status", lambda t: _status(t.get("met"))),
)


# --- chart ------------------------------------------------------------------------------------------


def chart(r: dict[str, Any], path: Path) -> Path | None:
    """Search latency p50 vs size per store (best configuration; dashed: filtered), log-log."""
    sizes = (r.get("scale") or {}).get("sizes") or {}
    if not sizes:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float, float | None]]] = {}
    for n, res in sizes.items():
        for store, s in res["stores"].items():
            best = s.get("best") if isinstance(s, dict) else None
            if best and best["single_ms"]["p50"] is not None:
                point = (int(n), best["single_ms"]["p50"], best["filtered_single_ms"]["p50"])
                series.setdefault(store, []).append(point)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    styles = {
        "numpy": ("NumPy exact", "tab:gray"),
        "milvus": ("Milvus", "tab:blue"),
        "pgvector": ("pgvector", "tab:orange"),
    }
    for store, pts in sorted(series.items(), key=lambda kv: styles[kv[0]][0]):
        label, color = styles[store]
        xs, single, filtered = zip(*sorted(pts), strict=True)
        ax.plot(xs, single, marker="o", color=color, label=f"{label} (best config)")
        if None not in filtered:
            ax.plot(xs, filtered, marker="x", linestyle="--", color=color, label=f"{label}, filtered (~3 %)")
    ax.set(xscale="log", yscale="log", xlabel="chunks in the store", ylabel="single-query search latency p50 (ms)")
    ax.set_title("Store search latency vs size (top-10, 384-d, cosine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --- Markdown sections ------------------------------------------------------------------------------


def _latency(lat: dict[str, Any], _r: Results) -> list[str]:
    paths = [p for p in ("milvus", f"milvus{SINGLE_MODEL}", "pgvector") if _ok(lat["paths"].get(p))]
    shown = lat["paths"][paths[0]]["stages_ms"] if paths else {}
    stages = [(label, k) for k, label in STAGE_LABELS.items() if k in shown]

    def ms(key: str) -> Callable[[str, str], str]:
        return lambda p, stage: _f(lat["paths"][p]["stages_ms"][stage][key], 2)

    notes, profiles = [], []
    for p in paths:
        d = lat["paths"][p]
        notes.append(
            f"**{p}** ({d['store']}): {d['lookups']} lookups ({d['queries']} queries x {d['rounds']} rounds after "
            f"one warm-up pass); pipeline overhead {_pct(d['overhead_share_p50'])} of end-to-end p50 "
            f"({_pct(d['overhead_share_mean'])} of the mean), embedding {_pct(d['embed_share_p50'])}, store search "
            f"{_pct(d['store_share_p50'])}; {d['lookups_filtered']} lookups ran a category-filtered attempt 1, "
            f"{d['lookups_with_retry']} needed the unfiltered attempt 2; layers {d['layers']}; errors {d['errors']}."
        )
    notes += [f"**{p}**: failed: {d.get('error')}" for p, d in lat["paths"].items() if not _ok(d)]
    for p in paths:
        prof, share = lat["paths"][p].get("overhead_profile"), lat["paths"][p]["overhead_share_p50"]
        if prof:
            notes.append(
                f"Where the overhead goes on the {p} path (cProfile of one more round, rag_core functions outside "
                "embedding and store calls, cumulative ms per lookup, profiler overhead included): "
                + ", ".join(f"`{x['function']}` {x['cumtime_ms']:.2f}" for x in prof[:6])
                + "."
            )
        if share is not None and share > TARGET_OVERHEAD:  # the whole profile when the target is missed
            profiles += _profile(prof, f"### Overhead profile, {p} path (ms per lookup, by cumulative time)")
    if lat.get("store_means"):
        notes.append(f"Store: {lat['store_means']}.")
    notes.append(
        f"Queries: {len(lat.get('queries', []))} (the visible golden queries, then paraphrases / alert texts from "
        "`bench/queries.py`); the paths' lookups are interleaved query by query, so both see the same machine load."
    )
    if th := lat.get("query_embedding_threads"):
        parts = [
            f"{k.removeprefix('torch_threads_')} thread(s): p50 {_f(v['p50'], 2)} ms, p95 {_f(v['p95'], 2)} ms"
            for k, v in th.items()
            if k.startswith("torch_threads_")
        ]
        default = th.get("default_threads")
        notes.append(
            f"Query embedding alone (diagnostic, torch default = {default} threads): " + "; ".join(parts) + "."
        )
    cells = {f"{k} ms": ms(k) for k in ("p50", "p95", "p99")}
    return [_by_path("stage", stages, paths, cells), "\n".join(f"- {n}" for n in notes), *profiles]


@dataclass(frozen=True)
class _CfgLine:
    """One row of a scale table: store configuration ``c`` at ``size`` (None: ``note`` says why)."""

    size: int
    store: str
    c: dict[str, Any] | None
    numpy_p50: float | None = None
    best: bool = False
    note: str = ""


def _cfg(fn: Callable[[dict[str, Any]], Any]) -> Callable[[_CfgLine], Any]:
    return lambda line: "–" if line.c is None else fn(line.c)


def _config_name(line: _CfgLine) -> str:
    if (c := line.c) is None:
        return line.note
    planner = c.get("plan_uses_hnsw") is False and c["config"].startswith("HNSW")
    name = c["config"] + (" (planner chose no HNSW scan)" if planner else "")
    return f"**{name}**" if line.best else name


def _vs_numpy(line: _CfgLine) -> str:
    p50 = None if line.c is None else line.c["single_ms"]["p50"]
    return "–" if not line.numpy_p50 or p50 is None else as_times(p50 / line.numpy_p50)


SCALE_COLUMNS: tuple[Column[_CfgLine], ...] = (
    Column("size", lambda x: f"{x.size:,}"),
    Column("store", lambda x: x.store),
    Column("config", _config_name),
    Column("single p50 ms", _cfg(lambda c: _f(c["single_ms"]["p50"], 2))),
    Column("single p95 ms", _cfg(lambda c: _f(c["single_ms"]["p95"], 2))),
    Column("batch q/s", _cfg(lambda c: _f(c["batch_qps"]))),
    Column("recall@10", _cfg(lambda c: _f(c["recall@10"], 3))),
    Column("filtered p50 ms", _cfg(lambda c: _f(c["filtered_single_ms"]["p50"], 2))),
    Column("filtered recall@10", _cfg(lambda c: _f(c["filtered_recall@10"], 3))),
    Column("p50 vs NumPy", _vs_numpy),
)


def _scale_lines(sc: dict[str, Any]) -> tuple[list[_CfgLine], list[_CfgLine]]:
    """(best configuration per store and size, every configuration) as table rows."""
    best_rows: list[_CfgLine] = []
    all_rows: list[_CfgLine] = []
    for n, res in sc["sizes"].items():
        numpy_p50 = ((res["stores"].get("numpy") or {}).get("best") or {}).get("single_ms", {}).get("p50")
        for store, s in res["stores"].items():
            if not _ok(s):
                best_rows.append(_CfgLine(int(n), store, None, note=f"failed: {s.get('error')}"))
                continue
            b, note = s.get("best"), f"no config reached recall@10 >= {MIN_RECALL}"
            best_rows.append(_CfgLine(int(n), store, b, numpy_p50, best=True, note=note))
            all_rows += [_CfgLine(int(n), store, c, numpy_p50, best=c == b) for c in s["configs"]]
    return best_rows, all_rows


def _rate(d: dict[str, Any], seconds: str, per_s: str) -> str:
    return f"{_f(d.get(seconds), 1)} ({_f(d.get(per_s), 0)} rows/s)" if d else "–"


def _setup(key: str, fn: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
    return lambda res: fn(res["setup"].get(key) or {})


SETUP_COLUMNS: tuple[Column[dict[str, Any]], ...] = (
    Column("size", lambda res: f"{int(res['rows']):,}"),
    Column("generate + exact ground truth", lambda res: _f(res["setup"].get("generate_and_exact_gt_s"), 2)),
    Column("Milvus insert", _setup("milvus", lambda d: _rate(d, "insert_s", "insert_rows_per_s"))),
    Column("Milvus flush + settle", _setup("milvus", lambda d: _f(d.get("flush_s"), 1))),
    Column("Milvus HNSW build", _setup("milvus", lambda d: _f(d.get("hnsw_build_s"), 1))),
    Column("pgvector COPY", _setup("pgvector", lambda d: _rate(d, "copy_s", "copy_rows_per_s"))),
    Column("pgvector HNSW build", _setup("pgvector", lambda d: _f(d.get("hnsw_build_s"), 1))),
    Column("HNSW index MB", _setup("pgvector", lambda d: _f(d.get("hnsw_index_mb"), 1))),
    Column(
        "pg build overlapped Milvus insert",
        _setup("pgvector", lambda d: ("yes" if d.get("overlapped_with_milvus_insert") else "no") if d else "–"),
    ),
)


def _api_cell(api: dict[str, Any] | None) -> str:
    if not api:
        return "–"
    text = (
        f"{_f(api['single_ms']['p50'], 2)} / {_f(api['filtered_single_ms']['p50'], 2)} "
        f"(recall {_f(api.get('recall@10'), 3)} / {_f(api.get('filtered_recall@10'), 3)}"
    )
    return text + (f"; {api['index']})" if api.get("index") else ")")


def _scale(sc: dict[str, Any], r: Results) -> list[str]:
    meth = sc["method"]
    intro = (
        f"Top-{meth['k']} cosine search, {meth['dim']}-d, {meth['queries']} real query embeddings. "
        f"**Vectors are synthetic above {meth['base_rows']} rows**: {meth['synthetic_note']} (expected cosine to the "
        f"source chunk about {meth['expected_cosine_to_source']}). Filtered = category `{meth['rare_category']}` "
        f"holding ~{100 * meth['rare_fraction']:.0f} % of the rows. Recall@10 is against the exact NumPy result "
        f"(tie-tolerant). Single = one query per call; batch = all queries in one call (NumPy matrix product, one "
        f"Milvus `search` with {meth['queries']} vectors, a psycopg pipeline for PostgreSQL). Best = fastest "
        f"single-query p50 with recall@10 >= {meth['min_recall']}."
    )
    best_rows, all_rows = _scale_lines(sc)
    out = [intro, "### Best configuration per store and size", render(SCALE_COLUMNS, best_rows)]
    out += [f"![search latency vs size]({r['chart']})"] if r.get("chart") else []
    out += ["### All configurations", render(SCALE_COLUMNS, all_rows)]
    out += ["### Setup times (seconds)", render(SETUP_COLUMNS, sc["sizes"].values())]
    api_rows = []
    for n, res in sc["sizes"].items():
        apis = [(res["stores"].get(s) or {}).get("store_api") for s in ("milvus", "pgvector")]
        if any(apis):
            api_rows.append([f"{int(n):,}", *map(_api_cell, apis)])
    if api_rows:
        plan = meth.get("pg_store_plan") or {}
        out += [
            "### Product store calls on the same data (p50 ms, unfiltered / filtered)",
            "`MilvusStore.search` returns the payload fields (text etc.; Milvus Lite's default HNSW ef is 64); "
            "`PgVectorStore.search` uses its own plan (exact scan when at most "
            f"{_f(plan.get('exact_scan_max_rows'))} rows can match, else HNSW ef_search={_f(plan.get('ef_search'))} "
            "with iterative scans). Recall is over the timed queries.",
            md_table(["size", "MilvusStore.search", "PgVectorStore.search"], api_rows),
        ]
    if sc.get("skipped"):
        lines = [f"- {s['size']:,}: {s['what']}: {s['reason']}." + _extrapolation(sc, s) for s in sc["skipped"]]
        out += ["### Skipped", "\n".join(lines)]
    return out


def _extrapolation(sc: dict[str, Any], skip: dict[str, Any]) -> str:
    """For a skipped Milvus size: what the largest measured size's rates imply (linear)."""
    if not skip["what"].startswith("milvus"):
        return ""
    measured = [
        (int(n), res)
        for n, res in sc["sizes"].items()
        if int(n) < skip["size"] and _ok(res["stores"].get("milvus")) and (res["setup"].get("milvus") or {})
    ]
    if not measured:
        return ""
    n0, res = max(measured, key=lambda t: t[0])
    setup, scale = res["setup"]["milvus"], skip["size"] / n0
    flat = next((c for c in res["stores"]["milvus"]["configs"] if c["config"] == "FLAT"), None)
    text = (
        f" At the rates measured at {n0:,} it would take about {skip['size'] / setup['insert_rows_per_s']:.0f} s "
        f"to insert ({setup['insert_rows_per_s']:,.0f} rows/s)"
    )
    if setup.get("hnsw_build_s"):
        text += f" plus about {setup['hnsw_build_s'] * scale:.0f} s of HNSW build"
    if flat and flat["single_ms"]["p50"]:
        text += f"; a FLAT search would take about {flat['single_ms']['p50'] * scale:,.0f} ms if linear in size"
    return text + " (extrapolated, not measured)."


def _kv(rows: list[list[str]]) -> str:
    return md_table(["measure", "value"], rows)


def _ingestion(ing: dict[str, Any], _r: Results) -> list[str]:
    first, again = ing["stage_seconds"], ing["reingest_stage_seconds"]
    rows = [
        ["corpus", f"{ing['documents']} documents ({ing['documents_skipped']} skipped as bad), {ing['chunks']} chunks"],
        [
            f"raw `encode` (same texts, batch {ing['batch_size']}, normalised)",
            f"{_f(ing['raw_encode_chunks_per_s'])} chunks/s ({_f(ing['raw_encode_s'], 2)} s; "
            f"runs {ing['raw_encode_runs_s']} s)",
        ],
        [
            "full ingest into a fresh Milvus Lite",
            f"{_f(ing['ingest_chunks_per_s'])} chunks/s ({_f(ing['ingest_s'], 2)} s)",
        ],
        ["ingest / raw", _pct(ing["ingest_vs_raw"])],
        [
            "embedding inside ingest",
            f"{_f(ing['embed_stage_chunks_per_s'])} chunks/s; everything else {_f(ing['non_embed_s'], 2)} s",
        ],
        [
            "same texts encoded in the pipeline's 256-chunk steps (diagnostic)",
            f"{_f(ing.get('stepped_encode_s'), 2)} s = {_f(ing.get('stepped_vs_raw_time'), 2)}x the raw encode time",
        ],
        [
            "unchanged re-ingest",
            f"{_f(ing['reingest_s'], 3)} s = {_pct(ing['reingest_fraction'])} of the first "
            f"({ing['reingest_chunks_embedded']} chunks embedded, {ing['reingest_unchanged']} unchanged)",
        ],
    ]
    stages = [[s, _f(first.get(s), 3), _f(again.get(s), 3)] for s in sorted(set(first) | set(again))]
    return [
        _kv(rows),
        "Per-stage seconds (`report.stage_seconds`):",
        md_table(["stage", "first ingest s", "unchanged re-ingest s"], stages),
        *_profile(ing.get("reingest_profile"), "cProfile of an unchanged re-ingest (ms, by cumulative time):"),
    ]


def _evaluation(ev: dict[str, Any], _r: Results) -> list[str]:
    rows = [
        [
            "cases (generated with `rag_core.evaluation.testing` helpers)",
            f"{ev['cases']:,} ({ev['fixture_bytes'] / 2**20:.1f} MB of fixtures)",
        ],
        ["load_fixtures", f"{_f(ev['load_s'], 3)} s ({_f(ev['load_cases_per_s'], 0)} cases/s)"],
        ["evaluate", f"{_f(ev['evaluate_s'], 3)} s ({_f(ev['evaluate_cases_per_s'], 0)} cases/s)"],
        [
            "load + evaluate",
            f"**{_f(ev['cases_per_s'], 0)} cases/s** ({_f(ev['total_s'], 3)} s, median of {ev['repeats']})",
        ],
        ["result mix", str(ev["summary"])],
    ]
    return [_kv(rows), *_profile(ev.get("profile"), "cProfile of load_fixtures + evaluate (ms, by self time):")]


def _when_ok(fn: Callable[[dict[str, Any]], Any]) -> Callable[[tuple[str, Any]], Any]:
    """A cell of a ``(label, entry)`` row: ``fn(entry)``, or "–" for a failed entry."""
    return lambda row: fn(row[1]) if _ok(row[1]) else "–"


def _label(row: tuple[str, Any]) -> str:
    return row[0] if _ok(row[1]) else f"{row[0]}: failed: {(row[1] or {}).get('error', 'not run')}"


def _vs_minilm(key: str, digits: int) -> Callable[[tuple[str, Any]], Any]:
    return _when_ok(lambda d: f"{_f(d[key], digits)} ({d.get(key.removesuffix('_ms') + '_vs_minilm', '–')}x)")


EMBEDDING_COLUMNS: tuple[Column[tuple[str, Any]], ...] = (
    Column(
        "backend",
        lambda x: f"{x[0]} ({x[1]['model']['model_id']}, {x[1]['model']['dimension']}-d)" if _ok(x[1]) else _label(x),
    ),
    Column("query p50 ms (vs MiniLM)", _vs_minilm("query_p50_ms", 2)),
    Column("query p95 ms", _when_ok(lambda d: _f(d["query_p95_ms"], 2))),
    Column("chunks/s (vs MiniLM)", _vs_minilm("chunks_per_s", 1)),
    Column("lookup RSS MiB", _when_ok(lambda d: _f(d.get("lookup_process", {}).get("peak_rss_mb_vmhwm")))),
    Column("torch", _when_ok(lambda d: "yes" if d.get("lookup_process", {}).get("torch_loaded") else "no")),
)


def _embedding(emb: dict[str, Any], _r: Results) -> list[str]:
    intro = (
        f"Query embedding over {emb['queries']} benchmark queries (one at a time, warm), passage throughput "
        f"over the same {emb['chunks']} runbook chunk texts, peak RSS of a fresh lookup process (model "
        "loaded, 20 lookups on a small index). Ratios against MiniLM in the same run. Retrieval quality "
        "per backend: `python -m bench.embedding_backends`."
    )
    return [intro, render(EMBEDDING_COLUMNS, emb["backends"].items())]


def _embed_throughput(et: dict[str, Any], _r: Results) -> list[str]:
    from bench.embed_throughput import summary_lines

    return ["\n".join(["```", *summary_lines(et), "```"])]


MEMORY_COLUMNS: tuple[Column[tuple[str, Any]], ...] = (
    Column("collection", _label),
    Column("chunks", _when_ok(lambda d: f"{d['rows']:,}")),
    Column("peak RSS MB (ru_maxrss)", _when_ok(lambda d: f"**{_f(d.get('peak_rss_mb_ru_maxrss'))}**")),
    Column("peak RSS MB (VmHWM)", _when_ok(lambda d: _f(d.get("peak_rss_mb_vmhwm")))),
    Column("peak RSS MB (20 ms samples)", _when_ok(lambda d: _f(d["peak_rss_mb_sampled"]))),
    Column("RSS after model load MB", _when_ok(lambda d: _f(d["rss_mb"].get("after_model_load")))),
    Column("after collection load MB", _when_ok(lambda d: _f(d["rss_mb"].get("after_collection_load")))),
    Column("after lookups MB", _when_ok(lambda d: _f(d["rss_mb"].get("after_lookups")))),
    Column("open collection s", _when_ok(lambda d: _f(d["open_collection_s"], 2))),
    Column("lookup p50 ms", _when_ok(lambda d: _f(d["lookup_ms"]["p50"], 1))),
)


def _memory(mem: dict[str, Any], _r: Results) -> list[str]:
    base, large = mem.get("baseline") or {}, mem.get("large") or {}
    out = [
        render(MEMORY_COLUMNS, [("runbook collection (baseline)", base or None), ("large collection", large or None)])
    ]
    if cost := mem.get("collection_cost_mb"):
        out.append(
            f"Against the baseline the large collection adds {_f(cost['peak_ru_maxrss'])} MB of peak RSS "
            f"(ru_maxrss; {_f(cost.get('peak_vmhwm'))} MB by VmHWM) and {_f(cost['after_lookups'])} MB of RSS after "
            f"the lookups. The embedded Milvus server is its own process: {_f(large.get('server_rss_mb'))} MB RSS "
            f"with the large collection vs {_f(base.get('server_rss_mb'))} MB with the runbook one (index "
            f"{large.get('index')}). Each child is a fresh process that loads the model, opens the collection and "
            f"runs {mem['lookups']} lookups (the lookup p50 includes the first, cold ones)."
        )
    return out


def _concurrency(conc: dict[str, Any], _r: Results) -> list[str]:
    paths = [p for p, rows in conc["paths"].items() if isinstance(rows, list)]
    cells: dict[str, Callable[[str, int], str]] = {
        "lookups/s": lambda p, i: _f(conc["paths"][p][i]["lookups_per_s"], 2),
        "speedup": lambda p, i: f"{conc['paths'][p][i]['speedup_vs_1']:.2f}x",
        "latency p50 ms": lambda p, i: _f(conc["paths"][p][i]["latency_ms"]["p50"], 1),
        "CPU s per wall s": lambda p, i: _f(conc["paths"][p][i]["cpu_per_wall"], 2),
    }
    failed = [f"- {p}: failed: {d.get('error')}" for p, d in conc["paths"].items() if not isinstance(d, list)]
    table = _by_path("threads", [(t, i) for i, t in enumerate(conc["threads"])], paths, cells)
    return [table, "\n".join([f"{conc['lookups_per_config']} lookups per configuration.", *failed])]


def _engine(eng: dict[str, Any], r: Results) -> list[str]:
    """Issue 14: lookup p50 Milvus vs pgvector vs floor (the latency benchmark's ``vs_floor``), the flush
    effect, ingest while serving."""
    lk, out = section(r, "latency", "vs_floor"), []
    if "milvus" in lk:
        ne, st = lk["without_embedding"], lk.get("store") or {}
        paths = ("milvus", "pgvector", "floor")
        rows = [[p, _f(lk[p]["p50"]), _f(ne[p]["p50"]), _f((st.get(p) or {}).get("p50"))] for p in paths]
        out += [md_table(["path", "lookup p50 ms", "without query embedding p50 ms", "store p50 ms"], rows)]
        out += [f"Store: {lk['store_means']}."]
    if "flushed_ms" in (fl := section(eng, "flush")):
        out.append(
            f"Store search (dense + BM25) on {fl['rows']} rows written in this process: unflushed p50 "
            f"{_f(fl['unflushed_ms']['p50'])} ms, flushed p50 {_f(fl['flushed_ms']['p50'])} ms."
        )
    if "failures" in (sv := section(eng, "serving")):
        out.append(
            f"Ingest while serving: {sv['lookups']} lookups on 8 threads ({sv['lookups_during_ingest']} during "
            f"a {_f(sv['ingest_s'])} s `rag ingest` in another process): p50 {_f(sv['latency_ms']['p50'])} ms, "
            f"p95 {_f(sv['latency_ms']['p95'])} ms, {sv['failures']} failed, "
            f"{sv['hits_outside_old_and_new_index']} hits outside the old and new index, traces {sv['traces']}."
        )
    return out


_SCALE_NOTES = (
    "The pgvector HNSW index is built while Milvus inserts (both need CPU), to fit the time budget: build and "
    "insert seconds are inflated by each other; no search is timed while either runs.",
    "Milvus HNSW and pgvector HNSW use M=16, efConstruction=64 (pgvector's defaults, which the product uses; the "
    "product's Milvus HNSW option uses efConstruction=200).",
    "NumPy exact is measured with the BLAS default threads and with one thread; the faster is the reference. Its "
    "filtered variant multiplies a pre-extracted matrix of the category's rows.",
)


def _caveats(_m: dict[str, Any], r: Results) -> list[str]:
    m, sc, ing = r["meta"], r.get("scale") or {}, r.get("ingestion") or {}
    notes = []
    if close := borderline(r):
        notes.append(
            "Within 15 % of their limit in this run, so they can come out either way on a rerun on this shared "
            "machine: " + "; ".join(f"{t['target']} ({t['ratio']}, {_status(t.get('met'))})" for t in close) + "."
        )
    notes.append(
        f"The machine is shared: load average {m.get('load_average_start')} at the start and "
        f"{m.get('load_average_end')} at the end on {m['environment'].get('cpu_count')} CPUs. Absolute timings, "
        "and ratios between steps that ran at different moments, move with that load; each ratio in the targets "
        "table compares figures from this run."
    )
    if base := (sc.get("method") or {}).get("base_rows"):
        notes.append(
            f"Scale data is synthetic beyond the {base} real chunks (perturbed copies, see above). Each real chunk "
            f"has about rows / {base} noisy copies ({100_000 // base} at 100k), and such clusters are probably "
            "harder for HNSW than a real corpus of that size: the ef needed for recall@10 >= 0.95 (and so the HNSW "
            "latency) is likely higher here than it would be on real data."
        )
        notes += _SCALE_NOTES
    if sc.get("skipped"):
        notes.append(
            "Skipped in this run (reasons and extrapolations under *Store search at scale -> Skipped*): "
            + "; ".join(f"{s['what'].split(' (')[0]} at {s['size']:,}" for s in sc["skipped"])
            + "."
        )
    notes.append(
        "Latency excludes model loading (done before timing); the trace hand-off is measured against an in-memory "
        "recorder that does the real recorder's caller-side work (`trace_row`) but no PostgreSQL write."
    )
    if _ok(ing) and len(ing.get("raw_encode_runs_s", [])) > 1:
        notes.append("Raw encode throughput is the mean of a run before and a run after the ingest.")
    return ["\n".join(f"- {n}" for n in notes)]


@dataclass(frozen=True)
class _Section:
    """One ``##`` section: ``body(results[key], results)`` gives its blocks when ``ready(results)``;
    otherwise a "Not run or failed" line, or nothing when ``optional``. ``markdown`` adds ``chart``
    (the chart's file name or None) to the results it passes."""

    key: str
    title: str
    body: Callable[[Any, Results], list[str]]
    ready: Callable[[Results], bool]
    optional: bool = False


def _has(key: str, *need: str) -> Callable[[Results], bool]:
    """Ready when ``results[key]`` is a dict holding any of ``need`` (any key when empty) and no error."""
    return lambda r: _ok(r.get(key)) and (not need or any(k in r[key] for k in need))


SECTIONS: tuple[_Section, ...] = (
    _Section("latency", "Lookup latency (runbook corpus, warm)", _latency, _has("latency", "paths")),
    _Section("scale", "Store search at scale", _scale, _has("scale", "sizes")),
    _Section("ingestion", "Ingestion", _ingestion, _has("ingestion")),
    _Section("evaluation", "Offline evaluation", _evaluation, _has("evaluation")),
    _Section("memory", "Memory (peak RSS of a lookup process)", _memory, _has("memory", "baseline", "large")),
    _Section("embedding", "Embedding backends", _embedding, _has("embedding", "backends")),
    _Section(
        "embed_throughput",
        "Embedding throughput (issue 23: before vs after, side by side)",
        _embed_throughput,
        _has("embed_throughput"),
        optional=True,
    ),
    _Section(
        "concurrency", "Concurrency (one tool object shared by N threads)", _concurrency, _has("concurrency", "paths")
    ),
    _Section(
        "engine",
        "Main path engine (embedded Milvus server)",
        lambda eng, r: _engine(eng or {}, r),
        lambda r: bool(r.get("engine") or section(r, "latency", "vs_floor")),
        optional=True,
    ),
    _Section("meta", "Method notes and caveats", _caveats, lambda r: True),
)


def _section_md(s: _Section, r: Results) -> list[str]:
    if not s.ready(r):
        error = f"Not run or failed: {(r.get(s.key) or {}).get('error', 'not run')}"
        return [] if s.optional else ["", f"## {s.title.split(' (')[0]}", "", error]
    out = ["", f"## {s.title}"]
    for block in s.body(r.get(s.key), r):
        out += ["", block]
    return out


def markdown(r: dict[str, Any], chart_name: str | None) -> str:
    m = r["meta"]
    env = m.get("environment", {})
    seconds = ", ".join(
        f"{k} {v} s ({(m.get('load_average_after', {}).get(k) or ['–'])[0]})" for k, v in m.get("seconds", {}).items()
    )
    model = f"; embedding model load {m['model_load_s']} s (not in any figure)" if m.get("model_load_s") else ""
    out = [
        "# rag_core benchmark results",
        "",
        f"Run {m.get('started_at')} ({m.get('mode')} mode, commit {env.get('git_commit') or '–'}), "
        f"{env.get('cpu_count')} CPUs, {env.get('memory_gb')} GB RAM, Python {env.get('python')}; "
        f"total runtime **{_f(m.get('total_seconds'))} s** (budget {_f(m.get('budget_s'), 0)} s); load average "
        f"(1/5/15 min) {m.get('load_average_start')} at start, {m.get('load_average_end')} at the end. "
        "Regenerate with `make bench` (`python -m bench.run`; `--help` for sizes and caps).",
        "",
        "## Targets",
        "",
        render(TARGET_COLUMNS, r.get("targets", [])),
        "",
        f"Seconds per benchmark (1-min load average at its end): {seconds}{model}.",
    ]
    view = r | {"chart": chart_name}  # the scale section links the chart
    for s in SECTIONS:
        out += _section_md(s, view)
    return "\n".join(out) + "\n"


# --- printed summary -------------------------------------------------------------------------------------


def summary_text(r: dict[str, Any]) -> str:
    lines = ["", "=" * 100, "rag_core benchmark summary", "=" * 100]
    close = {t["id"] for t in borderline(r)}
    for t in r.get("targets", []):
        status = {None: "not run", True: "MET", False: "NOT MET"}[t.get("met")]
        flag = " - borderline (within 15 % of the limit)" if t["id"] in close else ""
        lines.append(f"[{status:>7}] {t['target']}: {t.get('ratio', '–')} (limit {t['limit']}){flag}")
        lines.append(f"          {t.get('measured', '')}")
    for p, d in section(r, "latency", "paths").items():
        if _ok(d):
            s = d["stages_ms"]
            e2e = "/".join(f"{s['e2e'][k]:.1f}" for k in ("p50", "p95", "p99"))
            lines.append(
                f"latency {p}: e2e p50/p95/p99 {e2e} ms; "
                f"embed p50 {s['embed']['p50']:.1f} ms, store p50 {s['store']['p50']:.1f} ms (wall time of the "
                f"store calls), overhead p50 {s['pipeline_overhead']['p50']:.2f} ms"
            )
    for n, res in section(r, "scale", "sizes").items():
        bests = [(store, s.get("best") if isinstance(s, dict) else None) for store, s in res["stores"].items()]
        parts = [
            f"{store} {b['config']} p50 {b['single_ms']['p50']:.2f} ms R@10 {b['recall@10']:.3f}" if b else f"{store} –"
            for store, b in bests
        ]
        lines.append(f"scale {int(n):>7,}: " + "; ".join(parts))
    mem = r.get("memory") or {}
    if _ok(mem.get("large")):
        lines.append(
            f"memory: peak RSS {mem['large']['peak_rss_mb_ru_maxrss']:.0f} MB at {mem['large']['rows']:,} chunks "
            f"(baseline {(mem.get('baseline') or {}).get('peak_rss_mb_ru_maxrss', '–')} MB)"
        )
    for p, rows in section(r, "concurrency", "paths").items():
        if isinstance(rows, list):
            lines.append(f"concurrency {p}: " + ", ".join(f"{c['threads']}t {c['lookups_per_s']:.1f}/s" for c in rows))
    if _ok(r.get("embed_throughput")):
        from bench.embed_throughput import summary_lines

        lines += summary_lines(r["embed_throughput"])
    m = r["meta"]
    lines.append(
        f"total runtime {m.get('total_seconds')} s (budget {m.get('budget_s')} s); "
        f"load average {m.get('load_average_start')} -> {m.get('load_average_end')}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Re-render results.md and the chart from a results.json: ``python -m bench.report [DIR]``."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else Path(__file__).resolve().parent / "results"
    results = json.loads((directory / "results.json").read_text())
    results["targets"] = evaluate_targets(results)
    (directory / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    drawn = chart(results, directory / "scale_latency.png")
    (directory / "results.md").write_text(markdown(results, drawn.name if drawn else None))
    print(summary_text(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
