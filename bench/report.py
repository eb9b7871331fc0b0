"""Targets, the Markdown report (tables first), the printed summary and the scale chart."""

from __future__ import annotations

from collections.abc import Callable
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

STAGE_LABELS = {
    "e2e": "end to end (`lookup` call)",
    "l0": "L0 hints (query transform)",
    "embed": "query embedding",
    "ensemble": "second model (query + chunks on first sight)",
    "documents": "document similarity (title + centroid)",
    "search": "L1 retrieval (attempts, store calls + fusion)",
    "store": "  store calls (wall time: the longest L1 attempt)",
    "store_dense": "  store: dense search",  # results before the wall-time store figure
    "store_lexical": "  store: lexical search",
    "fusion": "  RRF fusion + attempt logic",
    "postprocess": "post-processing + rerank",
    "pack": "context packing",
    "assemble": "result assembly (relevance, session, trace object)",
    "trace_handoff": "trace hand-off (row build + recorder)",
    "pipeline_overhead": "**pipeline overhead** (all but embedding, second model, store search and document vectors)",
}


# --- formatting ----------------------------------------------------------------------------------


def _f(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        text = f"{v:,.{digits}f}"
    elif isinstance(v, int):
        text = f"{v:,}"
    else:
        text = str(v)
    return f"{text} {unit}".strip() if unit else text


def _pct(v: float | None) -> str:
    return "–" if v is None else as_percent(v)


def _ok(r: dict | None) -> bool:
    return isinstance(r, dict) and "error" not in r


# --- targets: a table of goals -----------------------------------------------------------------------------


def _overhead(path: str) -> Goal:
    def read(p: dict[str, Any]) -> Reading:
        s = p["stages_ms"]
        store = s["store"]["p50"]
        return Reading(
            f"overhead p50 {_f(s['pipeline_overhead']['p50'], 2)} ms vs end-to-end p50 {_f(s['e2e']['p50'], 2)} ms "
            f"(embedding p50 {_f(s['embed']['p50'], 2)} ms, store p50 {_f(store, 2)} ms)",
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
    styles = {"numpy": ("NumPy exact", "tab:gray"), "milvus": ("Milvus", "tab:blue")}
    styles["pgvector"] = ("pgvector", "tab:orange")
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


# --- Markdown --------------------------------------------------------------------------------------


def markdown(r: dict[str, Any], chart_name: str | None) -> str:
    m = r["meta"]
    env = m.get("environment", {})
    out = ["# rag_core benchmark results", ""]
    out.append(
        f"Run {m.get('started_at')} ({m.get('mode')} mode, commit {env.get('git_commit') or '–'}), "
        f"{env.get('cpu_count')} CPUs, {env.get('memory_gb')} GB RAM, Python {env.get('python')}; "
        f"total runtime **{_f(m.get('total_seconds'))} s** (budget {_f(m.get('budget_s'), 0)} s); load average "
        f"(1/5/15 min) {m.get('load_average_start')} at start, {m.get('load_average_end')} at the end. "
        f"Regenerate with `make bench` (`python -m bench.run`; `--help` for sizes and caps)."
    )
    out += ["", "## Targets", ""]
    out.append(render(TARGET_COLUMNS, r.get("targets", [])))
    out += [
        "",
        "Seconds per benchmark (1-min load average at its end): "
        + ", ".join(
            f"{k} {v} s ({(m.get('load_average_after', {}).get(k) or ['–'])[0]})"
            for k, v in m.get("seconds", {}).items()
        )
        + (f"; embedding model load {m['model_load_s']} s (not in any figure)" if m.get("model_load_s") else "")
        + ".",
    ]
    out += _latency_md(r.get("latency"))
    out += _scale_md(r.get("scale"), chart_name)
    out += _ingestion_md(r.get("ingestion"))
    out += _evaluation_md(r.get("evaluation"))
    out += _memory_md(r.get("memory"))
    out += _embedding_md(r.get("embedding"))
    if _ok(r.get("embed_throughput")):
        from bench.embed_throughput import summary_lines

        out += ["", "## Embedding throughput (issue 23: before vs after, side by side)", "", "```"]
        out += [*summary_lines(r["embed_throughput"]), "```"]
    out += _concurrency_md(r.get("concurrency"))
    out += _engine_md(r.get("engine"), (r.get("latency") or {}).get("vs_floor"))
    out += _where_time_goes_md(r)
    out += _caveats_md(r)
    return "\n".join(out) + "\n"


def _error_md(title: str, section: dict | None) -> list[str]:
    return ["", f"## {title}", "", f"Not run or failed: {(section or {}).get('error', 'not run')}"]


def _latency_md(lat: dict | None) -> list[str]:
    if not lat or "paths" not in lat:
        return _error_md("Lookup latency", lat)
    paths = [p for p in ("milvus", f"milvus{SINGLE_MODEL}", "pgvector") if _ok(lat["paths"].get(p))]
    out = ["", "## Lookup latency (runbook corpus, warm)", ""]
    header = ["stage"]
    for p in paths:
        header += [f"{p} p50 ms", f"{p} p95 ms", f"{p} p99 ms"]
    rows = []
    shown = lat["paths"][paths[0]]["stages_ms"] if paths else {}
    for stage, label in ((k, v) for k, v in STAGE_LABELS.items() if k in shown):
        row = [label.replace("  ", "&nbsp;&nbsp;")]
        for p in paths:
            s = lat["paths"][p]["stages_ms"][stage]
            row += [_f(s["p50"], 2), _f(s["p95"], 2), _f(s["p99"], 2)]
        rows.append(row)
    out.append(md_table(header, rows))
    out.append("")
    for p in paths:
        d = lat["paths"][p]
        out.append(
            f"- **{p}** ({d['store']}): {d['lookups']} lookups ({d['queries']} queries x {d['rounds']} rounds after "
            f"one warm-up pass); pipeline overhead {_pct(d['overhead_share_p50'])} of end-to-end p50 "
            f"({_pct(d['overhead_share_mean'])} of the mean), embedding {_pct(d['embed_share_p50'])}, store search "
            f"{_pct(d['store_share_p50'])}; {d['lookups_filtered']} lookups ran a category-filtered attempt 1, "
            f"{d['lookups_with_retry']} needed the unfiltered attempt 2; layers {d['layers']}; errors {d['errors']}."
        )
    for p, d in lat["paths"].items():
        if not _ok(d):
            out.append(f"- **{p}**: failed: {d.get('error')}")
    for p in paths:
        prof = lat["paths"][p].get("overhead_profile")
        if prof:
            out.append(
                f"- Where the overhead goes on the {p} path (cProfile of one more round, rag_core functions outside "
                "embedding and store calls, cumulative ms per lookup, profiler overhead included): "
                + ", ".join(f"`{r['function']}` {r['cumtime_ms']:.2f}" for r in prof[:6])
                + "."
            )
    if lat.get("store_means"):
        out.append(f"- Store: {lat['store_means']}.")
    out.append(
        f"- Queries: {len(lat.get('queries', []))} (the visible golden queries, then paraphrases / alert texts from "
        "`bench/queries.py`); the paths' lookups are interleaved query by query, so both see the same machine load."
    )
    th = lat.get("query_embedding_threads")
    if th:
        d = th.get("default_threads")
        parts = [
            f"{k.removeprefix('torch_threads_')} thread(s): p50 {_f(v['p50'], 2)} ms, p95 {_f(v['p95'], 2)} ms"
            for k, v in th.items()
            if k.startswith("torch_threads_")
        ]
        out.append(f"- Query embedding alone (diagnostic, torch default = {d} threads): " + "; ".join(parts) + ".")
    return out


@dataclass(frozen=True)
class _CfgLine:
    """One row of a scale table: store configuration ``c`` at ``size`` (None: ``note`` says why)."""

    size: int
    store: str
    c: dict[str, Any] | None
    numpy_p50: float | None = None
    best: bool = False
    note: str = ""


def _of_config(fn: Callable[[dict[str, Any]], Any]) -> Callable[[_CfgLine], Any]:
    return lambda line: "–" if line.c is None else fn(line.c)


def _config_name(line: _CfgLine) -> str:
    c = line.c
    if c is None:
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
    Column("single p50 ms", _of_config(lambda c: _f(c["single_ms"]["p50"], 2))),
    Column("single p95 ms", _of_config(lambda c: _f(c["single_ms"]["p95"], 2))),
    Column("batch q/s", _of_config(lambda c: _f(c["batch_qps"]))),
    Column("recall@10", _of_config(lambda c: _f(c["recall@10"], 3))),
    Column("filtered p50 ms", _of_config(lambda c: _f(c["filtered_single_ms"]["p50"], 2))),
    Column("filtered recall@10", _of_config(lambda c: _f(c["filtered_recall@10"], 3))),
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
            b = s.get("best")
            note = f"no config reached recall@10 >= {MIN_RECALL}"
            best_rows.append(_CfgLine(int(n), store, b, numpy_p50, best=True, note=note))
            all_rows += [_CfgLine(int(n), store, c, numpy_p50, best=c == b) for c in s["configs"]]
    return best_rows, all_rows


def _rate(d: dict[str, Any], seconds: str, per_s: str) -> str:
    return f"{_f(d.get(seconds), 1)} ({_f(d.get(per_s), 0)} rows/s)" if d else "–"


def _setup(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda res: res["setup"].get(key) or {}


_MV, _PG = _setup("milvus"), _setup("pgvector")
SETUP_COLUMNS: tuple[Column[dict[str, Any]], ...] = (
    Column("size", lambda res: f"{int(res['rows']):,}"),
    Column("generate + exact ground truth", lambda res: _f(res["setup"].get("generate_and_exact_gt_s"), 2)),
    Column("Milvus insert", lambda res: _rate(_MV(res), "insert_s", "insert_rows_per_s")),
    Column("Milvus flush + settle", lambda res: _f(_MV(res).get("flush_s"), 1)),
    Column("Milvus HNSW build", lambda res: _f(_MV(res).get("hnsw_build_s"), 1)),
    Column("pgvector COPY", lambda res: _rate(_PG(res), "copy_s", "copy_rows_per_s")),
    Column("pgvector HNSW build", lambda res: _f(_PG(res).get("hnsw_build_s"), 1)),
    Column("HNSW index MB", lambda res: _f(_PG(res).get("hnsw_index_mb"), 1)),
    Column(
        "pg build overlapped Milvus insert",
        lambda res: ("yes" if _PG(res).get("overlapped_with_milvus_insert") else "no") if _PG(res) else "–",
    ),
)


def _api_cell(api: dict[str, Any] | None, index: bool) -> str:
    if not api:
        return "–"
    text = (
        f"{_f(api['single_ms']['p50'], 2)} / {_f(api['filtered_single_ms']['p50'], 2)} "
        f"(recall {_f(api.get('recall@10'), 3)} / {_f(api.get('filtered_recall@10'), 3)}"
    )
    return text + (f"; {api.get('index')})" if index else ")")


def _scale_md(sc: dict | None, chart_name: str | None) -> list[str]:
    if not sc or "sizes" not in sc:
        return _error_md("Store search at scale", sc)
    meth = sc["method"]
    out = [
        "",
        "## Store search at scale",
        "",
        f"Top-{meth['k']} cosine search, {meth['dim']}-d, {meth['queries']} real query embeddings. "
        f"**Vectors are synthetic above {meth['base_rows']} rows**: {meth['synthetic_note']} (expected cosine to the "
        f"source chunk about {meth['expected_cosine_to_source']}). Filtered = category `{meth['rare_category']}` "
        f"holding ~{100 * meth['rare_fraction']:.0f} % of the rows. Recall@10 is against the exact NumPy result "
        f"(tie-tolerant). Single = one query per call; batch = all queries in one call (NumPy matrix product, one "
        f"Milvus `search` with {meth['queries']} vectors, a psycopg pipeline for PostgreSQL). "
        "Best = fastest single-query "
        f"p50 with recall@10 >= {meth['min_recall']}.",
        "",
    ]
    best_rows, all_rows = _scale_lines(sc)
    out += ["### Best configuration per store and size", "", render(SCALE_COLUMNS, best_rows), ""]
    if chart_name:
        out += [f"![search latency vs size]({chart_name})", ""]
    out += ["### All configurations", "", render(SCALE_COLUMNS, all_rows), ""]
    out += ["### Setup times (seconds)", "", render(SETUP_COLUMNS, sc["sizes"].values()), ""]
    api_rows = []
    for n, res in sc["sizes"].items():
        mapi = (res["stores"].get("milvus") or {}).get("store_api")
        papi = (res["stores"].get("pgvector") or {}).get("store_api")
        if mapi or papi:
            api_rows.append([f"{int(n):,}", _api_cell(mapi, index=True), _api_cell(papi, index=False)])
    if api_rows:
        plan = meth.get("pg_store_plan") or {}
        out += [
            "### Product store calls on the same data (p50 ms, unfiltered / filtered)",
            "",
            "`MilvusStore.search` returns the payload fields (text etc.; Milvus Lite's default HNSW ef is 64); "
            "`PgVectorStore.search` uses its own plan (exact scan when at most "
            f"{_f(plan.get('exact_scan_max_rows'))} rows can match, else HNSW ef_search={_f(plan.get('ef_search'))} "
            "with iterative scans). Recall is over the timed queries.",
            "",
            md_table(["size", "MilvusStore.search", "PgVectorStore.search"], api_rows),
            "",
        ]
    if sc.get("skipped"):
        out += ["### Skipped", ""]
        for s in sc["skipped"]:
            out.append(f"- {s['size']:,}: {s['what']}: {s['reason']}." + _extrapolation(sc, s))
        out.append("")
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
    setup = res["setup"]["milvus"]
    flat = next((c for c in res["stores"]["milvus"]["configs"] if c["config"] == "FLAT"), None)
    scale = skip["size"] / n0
    text = (
        f" At the rates measured at {n0:,} it would take about {skip['size'] / setup['insert_rows_per_s']:.0f} s "
        f"to insert ({setup['insert_rows_per_s']:,.0f} rows/s)"
    )
    if setup.get("hnsw_build_s"):
        text += f" plus about {setup['hnsw_build_s'] * scale:.0f} s of HNSW build"
    if flat and flat["single_ms"]["p50"]:
        text += f"; a FLAT search would take about {flat['single_ms']['p50'] * scale:,.0f} ms if linear in size"
    return text + " (extrapolated, not measured)."


def _ingestion_md(ing: dict | None) -> list[str]:
    if not _ok(ing):
        return _error_md("Ingestion", ing)
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
    stages = sorted(set(ing["stage_seconds"]) | set(ing["reingest_stage_seconds"]))
    st_rows = [[s, _f(ing["stage_seconds"].get(s), 3), _f(ing["reingest_stage_seconds"].get(s), 3)] for s in stages]
    return [
        "",
        "## Ingestion",
        "",
        md_table(["measure", "value"], rows),
        "",
        "Per-stage seconds (`report.stage_seconds`):",
        "",
        md_table(["stage", "first ingest s", "unchanged re-ingest s"], st_rows),
    ]


def _evaluation_md(ev: dict | None) -> list[str]:
    if not _ok(ev):
        return _error_md("Offline evaluation", ev)
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
    return ["", "## Offline evaluation", "", md_table(["measure", "value"], rows)]


def _when_ok(fn: Callable[[dict[str, Any]], Any]) -> Callable[[tuple[str, dict[str, Any]]], Any]:
    """A cell of a ``(label, entry)`` row: ``fn(entry)``, or "–" for a failed entry."""
    return lambda row: fn(row[1]) if _ok(row[1]) else "–"


def _label(row: tuple[str, dict[str, Any] | None]) -> str:
    return row[0] if _ok(row[1]) else f"{row[0]}: failed: {(row[1] or {}).get('error', 'not run')}"


def _vs_minilm(d: dict[str, Any], key: str, digits: int) -> str:
    ratio = d.get(key.removesuffix("_ms") + "_vs_minilm", "–")
    return f"{_f(d[key], digits)} ({ratio}x)"


EMBEDDING_COLUMNS: tuple[Column[tuple[str, dict[str, Any]]], ...] = (
    Column(
        "backend",
        lambda x: f"{x[0]} ({x[1]['model']['model_id']}, {x[1]['model']['dimension']}-d)" if _ok(x[1]) else _label(x),
    ),
    Column("query p50 ms (vs MiniLM)", _when_ok(lambda d: _vs_minilm(d, "query_p50_ms", 2))),
    Column("query p95 ms", _when_ok(lambda d: _f(d["query_p95_ms"], 2))),
    Column("chunks/s (vs MiniLM)", _when_ok(lambda d: _vs_minilm(d, "chunks_per_s", 1))),
    Column("lookup RSS MiB", _when_ok(lambda d: _f(d.get("lookup_process", {}).get("peak_rss_mb_vmhwm")))),
    Column("torch", _when_ok(lambda d: "yes" if d.get("lookup_process", {}).get("torch_loaded") else "no")),
)


def _embedding_md(emb: dict | None) -> list[str]:
    if not emb or "backends" not in emb:
        return _error_md("Embedding backends", emb)
    return [
        "",
        "## Embedding backends",
        "",
        f"Query embedding over {emb['queries']} benchmark queries (one at a time, warm), passage throughput "
        f"over the same {emb['chunks']} runbook chunk texts, peak RSS of a fresh lookup process (model "
        "loaded, 20 lookups on a small index). Ratios against MiniLM in the same run. Retrieval quality "
        "per backend: `python -m bench.embedding_backends`.",
        "",
        render(EMBEDDING_COLUMNS, emb["backends"].items()),
    ]


MEMORY_COLUMNS: tuple[Column[tuple[str, dict[str, Any]]], ...] = (
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


def _memory_md(mem: dict | None) -> list[str]:
    if not mem or ("baseline" not in mem and "large" not in mem):
        return _error_md("Memory", mem)
    rows = [("runbook collection (baseline)", mem.get("baseline")), ("large collection", mem.get("large"))]
    out = ["", "## Memory (peak RSS of a lookup process)", "", render(MEMORY_COLUMNS, rows)]
    cost = mem.get("collection_cost_mb")
    if cost:
        out += [
            "",
            f"Against the baseline the large collection adds {_f(cost['peak_ru_maxrss'])} MB of peak RSS "
            f"(ru_maxrss; {_f(cost.get('peak_vmhwm'))} MB by VmHWM) and {_f(cost['after_lookups'])} MB of RSS after "
            f"the lookups. The embedded Milvus server is its own process: "
            f"{_f((mem.get('large') or {}).get('server_rss_mb'))} MB RSS with the large collection vs "
            f"{_f((mem.get('baseline') or {}).get('server_rss_mb'))} MB with the runbook one "
            f"(index {(mem.get('large') or {}).get('index')}). Each child is a fresh process that "
            f"loads the model, opens the collection and runs {mem['lookups']} lookups (the lookup p50 includes "
            "the first, cold ones).",
        ]
    return out


def _engine_md(eng: dict | None, lk: dict | None) -> list[str]:
    """Issue 14 section: lookup p50 Milvus vs pgvector vs floor (``lk``: the latency benchmark's
    ``vs_floor``), flush effect, ingest while serving."""
    if not eng and not lk:
        return []
    eng, lk = eng or {}, lk or {}
    out = ["## Main path engine (embedded Milvus server)", ""]
    if "milvus" in lk:
        ne, st = lk["without_embedding"], lk.get("store") or {}
        head = ["path", "lookup p50 ms", "without query embedding p50 ms", "store p50 ms"]
        rows = [
            [name, _f(lk[name]["p50"]), _f(ne[name]["p50"]), _f((st.get(name) or {}).get("p50"))]
            for name in ("milvus", "pgvector", "floor")
        ]
        out += [md_table(head, rows), ""]
        out += [f"Store: {lk['store_means']}.", ""]
    fl = eng.get("flush") or {}
    if "flushed_ms" in fl:
        out += [
            f"Store search (dense + BM25) on {fl['rows']} rows written in this process: unflushed p50 "
            f"{_f(fl['unflushed_ms']['p50'])} ms, flushed p50 {_f(fl['flushed_ms']['p50'])} ms.",
            "",
        ]
    sv = eng.get("serving") or {}
    if "failures" in sv:
        out += [
            f"Ingest while serving: {sv['lookups']} lookups on 8 threads ({sv['lookups_during_ingest']} during "
            f"a {_f(sv['ingest_s'])} s `rag ingest` in another process): p50 {_f(sv['latency_ms']['p50'])} ms, "
            f"p95 {_f(sv['latency_ms']['p95'])} ms, {sv['failures']} failed, "
            f"{sv['hits_outside_old_and_new_index']} hits outside the old and new index, traces {sv['traces']}.",
            "",
        ]
    return out


def _concurrency_md(conc: dict | None) -> list[str]:
    if not conc or "paths" not in conc:
        return _error_md("Concurrency", conc)
    paths = [p for p, rows in conc["paths"].items() if isinstance(rows, list)]
    header = ["threads"]
    for p in paths:
        header += [f"{p} lookups/s", f"{p} speedup", f"{p} latency p50 ms", f"{p} CPU s per wall s"]
    rows = []
    for i, t in enumerate(conc["threads"]):
        row = [t]
        for p in paths:
            c = conc["paths"][p][i]
            row += [
                _f(c["lookups_per_s"], 2),
                f"{c['speedup_vs_1']:.2f}x",
                _f(c["latency_ms"]["p50"], 1),
                _f(c["cpu_per_wall"], 2),
            ]
        rows.append(row)
    out = [
        "",
        "## Concurrency (one tool object shared by N threads)",
        "",
        md_table(header, rows),
        "",
        f"{conc['lookups_per_config']} lookups per configuration.",
    ]
    for p, d in conc["paths"].items():
        if not isinstance(d, list):
            out.append(f"- {p}: failed: {d.get('error')}")
    return out


def _profile_table(rows: list[dict]) -> str:
    return md_table(
        ["function", "calls", "self ms", "cumulative ms"],
        [[f"`{r['function']}`", r["ncalls"], _f(r["tottime_ms"], 3), _f(r["cumtime_ms"], 3)] for r in rows],
    )


def _largest_first(parts: dict[str, float], label: str, unit: str, digits: int) -> str:
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    return f"{label}: " + ", ".join(f"{k} {v:.{digits}f} {unit}" for k, v in ranked) + "."


def _overhead_stages(path: str) -> Callable[[Results], str]:
    def read(r: Results) -> str:
        s = section(r, "latency", "paths", path, "stages_ms")
        keys = ("l0", "fusion", "postprocess", "pack", "assemble", "trace_handoff")
        return _largest_first({k: s[k]["p50"] for k in keys if k in s}, "Overhead stages by p50", "ms", 2)

    return read


def _stage_seconds(key: str, label: str, digits: int) -> Callable[[Results], str]:
    return lambda r: _largest_first(section(r, "ingestion", key), label, "s", digits)


@dataclass(frozen=True)
class _Why:
    """Where the time of a missed target goes: a breakdown read from the results, a cProfile table
    (``profile``: its key path), and what would fix it."""

    title: str
    fix: str
    breakdown: Callable[[Results], str] = lambda _r: ""
    profile: tuple[str, ...] = ()
    caption: str = ""


# One row per target that gets a "where the time goes" section when missed (by goal id).
WHY: dict[str, _Why] = {
    **{
        f"overhead_{p}": _Why(
            f"Pipeline overhead, {p} path",
            "What would fix it: L0 query analysis dominates (`L0Index.analyze_query` normalises and tokenises every "
            "document's names per query): precompute them when the index loads and look candidates up through an "
            "inverted token -> document map.",
            _overhead_stages(p),
            ("latency", "paths", p, "overhead_profile"),
            "cProfile of one round of lookups, rag_core functions outside embedding and stores, ms per lookup "
            "(by cumulative time):",
        )
        for p in ("milvus", "pgvector")
    },
    "search_100k_milvus": _Why(
        "Milvus search at 100k",
        "What would fix it: the embedded engine searches every row (milvus-lite 2.5: FLAT only; Milvus Lite 3: in "
        "Python): beyond about 100k chunks use a Milvus server (`RAG_MILVUS_URI`) with HNSW, or smaller collections.",
    ),
    "search_100k_pgvector": _Why(
        "pgvector search at 100k",
        "What would fix it: raise `hnsw.ef_search` only as far as recall needs, keep the HNSW index in memory, or "
        "use the exact scan for small candidate sets.",
    ),
    "ingest_vs_raw": _Why(
        "Ingestion vs raw encoding",
        "What would fix it: sort the chunks to embed by length before cutting them into the pipeline's 256-chunk "
        "steps (see the stepped-encode row of the Ingestion table), and prepare the store while embedding.",
        _stage_seconds("stage_seconds", "First-ingest stages by seconds", 2),
    ),
    "reingest": _Why(
        "Unchanged re-ingest",
        "What would fix it: skip unchanged documents before chunking (a per-document content hash in "
        "`settings.ingest_state_path`) and rebuild L0 only when a document changed.",
        _stage_seconds("reingest_stage_seconds", "Re-ingest stages by seconds", 3),
        ("ingestion", "reingest_profile"),
        "cProfile of an unchanged re-ingest (ms, by cumulative time; rag_core, markdown-it, tokenizers, "
        "pymilvus, Milvus Lite):",
    ),
    "evaluation": _Why(
        "Offline evaluation",
        "What would fix it: validate fixtures lazily or with a faster JSON parser, and avoid re-normalising the "
        "same evidence text per keyword.",
        profile=("evaluation", "profile"),
        caption="cProfile of load_fixtures + evaluate (ms, by self time):",
    ),
}


def _where_time_goes_md(r: Results) -> list[str]:
    missed = [t["id"] for t in r.get("targets", []) if t.get("met") is False and t["id"] in WHY]
    out = ["", "## Where the time goes (missed targets)", ""] if missed else []
    for goal in missed:
        why = WHY[goal]
        text, prof = why.breakdown(r), _value(r, why.profile)
        out += [f"### {why.title}", ""] + ([text, ""] if text else [])
        out += [why.caption, "", _profile_table(prof), ""] if prof else []
        out += [why.fix, ""]
    return out


def _value(r: Results, path: tuple[str, ...]) -> Any:
    """``r[path[0]]...[path[-1]]`` (None when missing)."""
    return section(r, *path[:-1]).get(path[-1]) if path else None


def borderline(r: dict[str, Any], margin: float = 0.15) -> list[dict[str, Any]]:
    """Targets whose measured value lies within ``margin`` (relative) of the limit, either side."""
    out = []
    for t in r.get("targets", []):
        v, lim = t.get("value"), t.get("limit_value")
        if v is not None and lim and abs(v - lim) / lim <= margin:
            out.append(t)
    return out


_SCALE_NOTES = (
    "The pgvector HNSW index is built while Milvus inserts (both need CPU), to fit the time budget: build and "
    "insert seconds are inflated by each other; no search is timed while either runs.",
    "Milvus HNSW and pgvector HNSW use M=16, efConstruction=64 (pgvector's defaults, which the product uses; the "
    "product's Milvus HNSW option uses efConstruction=200).",
    "NumPy exact is measured with the BLAS default threads and with one thread; the faster is the reference. Its "
    "filtered variant multiplies a pre-extracted matrix of the category's rows.",
)


def _caveats_md(r: dict[str, Any]) -> list[str]:
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
    return ["", "## Method notes and caveats", ""] + [f"- {n}" for n in notes]


# --- printed summary -------------------------------------------------------------------------------------


def summary_text(r: dict[str, Any]) -> str:
    lines = ["", "=" * 100, "rag_core benchmark summary", "=" * 100]
    close = {t["id"] for t in borderline(r)}
    for t in r.get("targets", []):
        status = {None: "not run", True: "MET", False: "NOT MET"}[t.get("met")]
        flag = " - borderline (within 15 % of the limit)" if t["id"] in close else ""
        lines.append(f"[{status:>7}] {t['target']}: {t.get('ratio', '–')} (limit {t['limit']}){flag}")
        lines.append(f"          {t.get('measured', '')}")
    lat = (r.get("latency") or {}).get("paths", {})
    for p, d in lat.items():
        if _ok(d):
            s = d["stages_ms"]
            lines.append(
                f"latency {p}: e2e p50/p95/p99 {s['e2e']['p50']:.1f}/{s['e2e']['p95']:.1f}/{s['e2e']['p99']:.1f} ms; "
                f"embed p50 {s['embed']['p50']:.1f} ms, "
                f"store p50 {s['store']['p50']:.1f} ms (wall time of the store calls), "
                f"overhead p50 {s['pipeline_overhead']['p50']:.2f} ms"
            )
    for n, res in ((r.get("scale") or {}).get("sizes") or {}).items():
        parts = []
        for store, s in res["stores"].items():
            b = s.get("best") if isinstance(s, dict) else None
            parts.append(
                f"{store} {b['config']} p50 {b['single_ms']['p50']:.2f} ms R@10 {b['recall@10']:.3f}"
                if b
                else f"{store} –"
            )
        lines.append(f"scale {int(n):>7,}: " + "; ".join(parts))
    mem = r.get("memory") or {}
    if _ok(mem.get("large")):
        lines.append(
            f"memory: peak RSS {mem['large']['peak_rss_mb_ru_maxrss']:.0f} MB at {mem['large']['rows']:,} chunks "
            f"(baseline {(mem.get('baseline') or {}).get('peak_rss_mb_ru_maxrss', '–')} MB)"
        )
    for p, rows in ((r.get("concurrency") or {}).get("paths") or {}).items():
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
