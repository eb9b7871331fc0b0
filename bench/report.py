"""Targets, the Markdown report (tables first), the printed summary and the scale chart: figures
only, no advice. Figures fill templates (:func:`_fill`), tables are specs (:func:`_table`) and the
report is ``SECTIONS``, one spec per results section."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

from bench.cold_lookup import COLD_GOAL_S, HELP_GOAL_S, STDIO_INITIALIZE_GOAL_MS
from bench.common import RESULTS_DIR
from bench.embed_throughput import summary_lines
from bench.engine import BM25_P50_MAX_MS, LOOKUP_VS_FLOOR_MAX, LOOKUP_VS_PG_MAX
from bench.evaluation import TARGET_CASES_PER_S
from bench.harness import Goal, Missing, Reading, Results, as_percent, as_times, ok, section
from bench.ingestion import TARGET_RATIO, TARGET_REINGEST
from bench.latency import PATHS, STAGES, TARGET_OVERHEAD, TARGET_RERANK_COST
from bench.scale import MIN_RECALL, TARGET_MILVUS_VS_NUMPY, TARGET_PG_VS_NUMPY
from rag_core.fileio import write_text_atomic
from rag_core.markdown import md_table

# --- templates and tables ----------------------------------------------------------------------------


def _f(v: Any, digits: int = 1) -> str:
    """``v`` with thousands separators (floats to ``digits``); "–" for None."""
    if v is None:
        return "–"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


class _V:
    """A results value inside ``str.format``: ``[key]`` reads deeper (None when missing); the format
    spec is ``_f``'s digits ("2"), "%" for a percentage, or a Python format spec; None shows "–"."""

    def __init__(self, v: Any) -> None:
        self.v = v

    def __getitem__(self, key: Any) -> _V:
        v = self.v  # format turns "[100000]" into an int key
        return _V(v.get(key, v.get(str(key))) if isinstance(v, dict) else None)

    def __format__(self, spec: str) -> str:
        if self.v is None:
            return "–"
        return _f(self.v, int(spec)) if spec.isdigit() else as_percent(self.v) if spec == "%" else format(self.v, spec)


def _fill(template: str, data: Any) -> str:
    return template.format_map(_V(data))


Cell = str | Callable[[Any], Any]  # a template filled on the row, or a function of the row


def _table(spec: Mapping[str, Cell], rows: Iterable[Any]) -> str:
    """A Markdown table: one column per ``spec`` entry (header -> cell), one line per row; a ``failed``
    row (see ``_entries``) shows its first cell and "–" for the others."""

    def line(row: Any) -> list[Any]:
        cells = [_fill(c, row) if isinstance(c, str) else c(row) for c in spec.values()]
        return cells[:1] + ["–"] * (len(cells) - 1) if isinstance(row, dict) and row.get("failed") else cells

    return md_table(list(spec), map(line, rows))


def _kv(rows: dict[str, str], data: Any) -> str:
    """A measure/value table: label and value templates filled on ``data``."""
    return md_table(["measure", "value"], [[_fill(k, data), _fill(v, data)] for k, v in rows.items()])


def _bullets(lines: Iterable[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)


PROFILE: dict[str, Cell] = {
    "function": "`{function}`",
    "calls": "{ncalls}",
    "self ms": "{tottime_ms:3}",
    "cumulative ms": "{cumtime_ms:3}",
}


def _profile(rows: list[dict[str, Any]] | None, caption: str) -> list[str]:
    """A cProfile table (``bench.common.profile_top`` rows) under ``caption``; nothing without rows."""
    return [caption, _table(PROFILE, rows)] if rows else []


# --- targets: a table of goals -----------------------------------------------------------------------------


def _read(
    template: str, value: str, also: Callable[[dict[str, Any]], bool] = lambda _d: True
) -> Callable[[dict[str, Any]], Reading]:
    """A goal's reading: ``template`` filled on its section, compared value at ``value`` (a dotted key
    path), ``also``: the goal's further condition on the section."""
    return lambda d: Reading(_fill(template, d), reduce(lambda v, k: v[k], value.split("."), _V(d)).v, also(d))


_OVERHEAD = (
    "overhead p50 {stages_ms[pipeline_overhead][p50]:2} ms vs end-to-end p50 {stages_ms[e2e][p50]:2} ms "
    "(embedding p50 {stages_ms[embed][p50]:2} ms, store p50 {stages_ms[store][p50]:2} ms)"
)


def _search_100k(store: str, limit: float, label: str) -> Goal:
    template = " {config}: p50 {p50_ms:2} ms (recall@10 {recall@10:.3f}) vs NumPy exact p50 {numpy_p50_ms:2} ms"
    template = label.removesuffix(" HNSW") + template

    def read(st: dict[str, Any]) -> Reading | Missing:
        e = st.get(store)
        if not e or e.get("ratio_x") is None:  # ran without a configuration reaching the recall
            return Missing((e or {}).get("note") or st.get("note") or "not run", met=False if e else None)
        return Reading(_fill(template, e), e["ratio_x"])

    target = f"Store search at 100k, {label} at its best index (recall@10 >= {MIN_RECALL}) within {limit:g}x of exact "
    target += "NumPy top-k"
    return Goal(f"search_100k_{store}", target, f"<= {limit:g}x", "<=", limit, ("scale", "targets"), read, as_times)


def _filtered_100k(milvus: dict[str, Any]) -> Reading:
    flat = milvus["configs"][0]  # FLAT, measured first
    return Reading(_fill("filtered p50 {filtered_single_ms[p50]} ms", flat), flat["filtered_recall@10"])


def _rerank_cost(rc: dict[str, Any]) -> Reading | Missing:
    """The learned ranker's post-processing p50 over the hand weights'; Missing when ``auto`` found
    no learned ranker for the embedding models in use (both paths ran the hand weights)."""
    if rc.get("ranker") == "hand":
        return Missing("RAG_RERANK_MODEL=auto has no learned ranker for these embedding models")
    template = "{ranker}: post-processing p50 {postprocess_ms[learned][p50]:2} ms vs hand "
    template += "{postprocess_ms[hand][p50]:2} ms; lookup p50 {e2e_ms[learned][p50]:1} ms vs {e2e_ms[hand][p50]:1} ms"
    return Reading(_fill(template, rc), rc["postprocess_learned_vs_hand_p50"])


_SERVING_GOAL = (
    "{lookups} lookups ({lookups_during_ingest} during ingest), p50 {latency_ms[p50]} ms, p95 {latency_ms[p95]} ms, "
    "{failures} failed, traces {traces}"
)
_100K = ("scale", "sizes", "100000")
_OH, _RAW, _RE = (f"{100 * x:.0f} %" for x in (TARGET_OVERHEAD, TARGET_RATIO, TARGET_REINGEST))
_CASES = f"{TARGET_CASES_PER_S:,.0f}"
GOALS: tuple[Goal, ...] = (
    *(Goal(f"overhead_{p}", f"Pipeline overhead <= {_OH} of end-to-end p50 ({p} path)", f"<= {_OH}", "<=",
           TARGET_OVERHEAD, ("latency", "paths", p), _read(_OVERHEAD, "overhead_share_p50"), as_percent)
      for p in ("milvus", "pgvector")),
    _search_100k("pgvector", TARGET_PG_VS_NUMPY, "pgvector HNSW"),
    _search_100k("milvus", TARGET_MILVUS_VS_NUMPY, "Milvus (embedded server)"),
    Goal("rerank_cost", "Rerank p50, the learned ranker vs the hand weights (issue 25, Milvus path, interleaved)",
         f"<= {TARGET_RERANK_COST}x", "<=", TARGET_RERANK_COST, ("latency", "rerank_cost"),
         _rerank_cost, as_times),
    Goal("ingest_vs_raw", f"Ingestion >= {_RAW} of raw embedding throughput", f">= {_RAW}", ">=", TARGET_RATIO,
         ("ingestion",), _read("ingest {ingest_chunks_per_s:1} chunks/s vs raw encode {raw_encode_chunks_per_s:1} "
                               "chunks/s ({chunks_embedded} chunks)", "ingest_vs_raw"), as_percent),
    Goal("reingest", f"Unchanged re-ingest <= {_RE} of the first ingest", f"<= {_RE}", "<=", TARGET_REINGEST,
         ("ingestion",), _read("re-ingest {reingest_s:2} s vs first ingest {ingest_s:2} s", "reingest_fraction"),
         as_percent),
    Goal("evaluation", f"Offline evaluation >= {_CASES} cases/s", f">= {_CASES} cases/s", ">=", TARGET_CASES_PER_S,
         ("evaluation",), _read("{cases:,} cases in {total_s:3} s (load_fixtures {load_s:3} s + evaluate "
                                "{evaluate_s:3} s)", "cases_per_s"), lambda v: f"{v:,.0f} cases/s"),
    Goal("cold_lookup", f"A one-shot `rag lookup` (fresh process) <= {COLD_GOAL_S:g} s", f"<= {COLD_GOAL_S:g} s",
         "<=", COLD_GOAL_S, ("cold_lookup",),
         _read("fresh `rag lookup` p50 {cold_s[p50]:2} s over {cold_s[n]} processes beside warm in-process p50 "
               "{warm_ms[p50]:1} ms ({cold_over_warm_p50:1}x)", "cold_s.p50"), lambda v: f"{v:.2f} s"),
    Goal("cold_help", f"`rag --help` (fresh process) <= {HELP_GOAL_S:g} s", f"<= {HELP_GOAL_S:g} s", "<=", HELP_GOAL_S,
         ("cold_lookup",), _read("fresh `rag --help` p50 {help_s[p50]:2} s over {help_s[n]} processes", "help_s.p50"),
         lambda v: f"{v:.2f} s"),
    Goal("stdio_initialize", f"`rag serve --stdio` answers initialize <= {STDIO_INITIALIZE_GOAL_MS:g} ms after start",
         f"<= {STDIO_INITIALIZE_GOAL_MS:g} ms", "<=", STDIO_INITIALIZE_GOAL_MS, ("cold_lookup",),
         _read("initialize p50 {stdio_initialize_ms[p50]:0} ms after process start, the first tools/call (warm-up "
               "done) at {stdio_first_call_ms[p50]:0} ms", "stdio_initialize_ms.p50"), lambda v: f"{v:.0f} ms"),
    # issue 14 (bench/engine.py)
    *(Goal(f"engine_lookup_vs_{other}", f"Runbook lookup p50, Milvus path vs {label}", f"<= {limit}x", "<=", limit,
           ("latency", "vs_floor"), _read(f"Milvus {{milvus[p50]}} ms, {other} {{{other}[p50]}} ms",
                                          f"milvus_vs_{other}_p50"),
           as_times, False, ("latency", "vs_floor", "milvus"))
      for other, limit, label in (("pgvector", LOOKUP_VS_PG_MAX, "pgvector path (warm, after ingest in-process)"),
                                  ("floor", LOOKUP_VS_FLOOR_MAX, "floor (embedding + exact NumPy + BM25 in memory)"))),
    # recall is at most 1: >= 1.0 is = 1.0
    Goal("engine_100k_filtered", "100k chunks: filtered recall@10 (one category)", "= 1.0", ">=", 1.0,
         (*_100K, "stores", "milvus"), _filtered_100k, lambda v: f"{v:.3f}", borderline=False, when=_100K),
    Goal("engine_100k_bm25", "100k chunks: BM25 search p50", f"<= {BM25_P50_MAX_MS} ms", "<=", BM25_P50_MAX_MS,
         (*_100K, "stores", "milvus"), _read("BM25 p50 {bm25_ms[p50]} ms", "bm25_ms.p50"), lambda v: f"{v:.2f} ms",
         when=_100K),
    Goal("engine_ingest_while_serving", "8-thread lookups while another process runs `rag ingest`", "0 failures",
         "<=", 0, ("engine", "serving"), _read(_SERVING_GOAL, "failures", lambda sv: sv["traces_equal_lookups"] and
                                               sv["hits_outside_old_and_new_index"] == 0),
         lambda v: f"{v:g} failed", borderline=False, when=("engine", "serving", "latency_ms")),
)  # fmt: skip


def evaluate_targets(r: Results) -> list[dict[str, Any]]:
    """One row per target (``GOALS``): what was measured (side-by-side figures), the ratio, met or not."""
    return [g.row(r) for g in GOALS if section(r, *g.when)]


def borderline(r: dict[str, Any], margin: float = 0.15) -> list[dict[str, Any]]:
    """Targets whose measured value lies within ``margin`` (relative) of the limit, either side."""
    rows = [(t, t.get("value"), t.get("limit_value")) for t in r.get("targets", [])]
    return [t for t, v, limit in rows if v is not None and limit and abs(v - limit) / limit <= margin]


_STATUS = {None: "not run", True: "**met**", False: "**NOT met**"}
TARGETS: dict[str, Cell] = {
    "target": "{target}",
    "measured (same run)": "{measured}",
    "ratio": "{ratio}",
    "limit": "{limit}",
    "status": lambda t: _STATUS[t.get("met")],
}

# --- chart ------------------------------------------------------------------------------------------

_STYLES = {
    "milvus": ("Milvus", "tab:blue"),
    "numpy": ("NumPy exact", "tab:gray"),
    "pgvector": ("pgvector", "tab:orange"),
}


def chart(r: dict[str, Any], path: Path) -> Path | None:
    """Search latency p50 vs size per store (best configuration; dashed: filtered), log-log."""
    sizes = section(r, "scale", "sizes")
    if not sizes:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for store, (label, color) in _STYLES.items():
        bests = [(int(n), section(res, "stores", store, "best")) for n, res in sizes.items()]
        pts = sorted((n, b["single_ms"]["p50"], b["filtered_single_ms"]["p50"]) for n, b in bests if b)
        if not (pts := [p for p in pts if p[1] is not None]):
            continue
        xs, single, filtered = zip(*pts, strict=True)
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


# --- Markdown sections: each returns its blocks ----------------------------------------------------------

_PATH_NOTE = (
    "**{name}** ({store}): {lookups} lookups ({queries} queries x {rounds} rounds after one warm-up pass); pipeline "
    "overhead {overhead_share_p50:%} of end-to-end p50 ({overhead_share_mean:%} of the mean), embedding "
    "{embed_share_p50:%}, store search {store_share_p50:%}; {lookups_filtered} lookups ran a category-filtered "
    "attempt 1, {lookups_with_retry} needed the unfiltered attempt 2; layers {layers}; errors {errors}."
)


def _latency(lat: dict[str, Any], _r: Results) -> list[str]:
    every = lat["paths"]
    paths = [p for p in PATHS if ok(every.get(p))]
    shown = every[paths[0]]["stages_ms"] if paths else {}
    columns = [(p, k) for p in paths for k in ("p50", "p95", "p99")]
    rows = [[STAGES[s], *(_f(every[p]["stages_ms"][s][k], 2) for p, k in columns)] for s in STAGES if s in shown]
    table = md_table(["stage", *(f"{p} {k} ms" for p, k in columns)], rows)
    notes = [_fill(_PATH_NOTE, every[p] | {"name": p}) for p in paths]
    notes += [f"**{p}**: failed: {d.get('error')}" for p, d in every.items() if not ok(d)]
    profiles = []
    for p in paths:
        if prof := every[p].get("overhead_profile"):
            top = ", ".join(f"`{x['function']}` {x['cumtime_ms']:.2f}" for x in prof[:6])
            notes.append(
                f"Where the overhead goes on the {p} path (cProfile of one more round, rag_core functions outside "
                f"embedding and store calls, cumulative ms per lookup, profiler overhead included): {top}."
            )
        if (every[p]["overhead_share_p50"] or 0) > TARGET_OVERHEAD:  # the target missed: the whole profile
            profiles += _profile(prof, f"Overhead profile, {p} path (ms per lookup, by cumulative time):")
    notes += [f"Store: {lat['store_means']}."] if lat.get("store_means") else []
    notes.append(
        f"Queries: {len(lat.get('queries', []))} (the visible golden queries, then paraphrases / alert texts from "
        "`bench/queries.py`); the paths' lookups are interleaved query by query, so both see the same machine load."
    )
    if th := lat.get("query_embedding_threads"):
        runs = [(k.removeprefix("torch_threads_"), v) for k, v in th.items() if k.startswith("torch_threads_")]
        parts = "; ".join(f"{n} thread(s): " + _fill("p50 {p50:2} ms, p95 {p95:2} ms", v) for n, v in runs)
        default = th.get("default_threads")
        notes.append(f"Query embedding alone (diagnostic, torch default = {default} threads): {parts}.")
    return [table, _bullets(notes), *profiles]


SCALE: dict[str, Cell] = {
    "size": "{size:,}",
    "store": "{store}",
    "config": "{name}",
    "single p50 ms": "{single_ms[p50]:2}",
    "single p95 ms": "{single_ms[p95]:2}",
    "batch q/s": "{batch_qps:1}",
    "recall@10": "{recall@10:3}",
    "filtered p50 ms": "{filtered_single_ms[p50]:2}",
    "filtered recall@10": "{filtered_recall@10:3}",
    "p50 vs NumPy": "{vs_numpy}",
}


def _scale_row(size: int, store: str, c: dict[str, Any], best: bool, numpy_p50: float | None) -> dict[str, Any]:
    p50, planner = c["single_ms"]["p50"], c.get("plan_uses_hnsw") is False and c["config"].startswith("HNSW")
    name = c["config"] + (" (planner chose no HNSW scan)" if planner else "")
    vs = as_times(p50 / numpy_p50) if numpy_p50 and p50 is not None else None
    return c | {"size": size, "store": store, "name": f"**{name}**" if best else name, "vs_numpy": vs}


def _scale_rows(sc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(best configuration per store and size, every configuration) as rows of ``SCALE``."""
    best_rows, all_rows = [], []
    for n, res in sc["sizes"].items():
        size, numpy_p50 = int(n), section(res, "stores", "numpy", "best", "single_ms").get("p50")
        for store, s in res["stores"].items():
            if not ok(s):
                best_rows.append({"size": size, "store": store, "name": f"failed: {s.get('error')}"})
                continue
            b = s.get("best")
            no_best = {"size": size, "store": store, "name": f"no config reached recall@10 >= {MIN_RECALL}"}
            best_rows.append(_scale_row(size, store, b, True, numpy_p50) if b else no_best)
            all_rows += [_scale_row(size, store, c, c == b, numpy_p50) for c in s["configs"]]
    return best_rows, all_rows


def _rate(store: str, seconds: str, per_s: str) -> Callable[[dict[str, Any]], str]:
    template = f"{{{store}[{seconds}]:1}} ({{{store}[{per_s}]:0}} rows/s)"
    return lambda res: _fill(template, res["setup"]) if res["setup"].get(store) else "–"


SETUP: dict[str, Cell] = {
    "size": "{rows:,}",
    "generate + exact ground truth": "{setup[generate_and_exact_gt_s]:2}",
    "Milvus insert": _rate("milvus", "insert_s", "insert_rows_per_s"),
    "Milvus flush + settle": "{setup[milvus][flush_s]:1}",
    "pgvector COPY": _rate("pgvector", "copy_s", "copy_rows_per_s"),
    "pgvector HNSW build": "{setup[pgvector][hnsw_build_s]:1}",
    "HNSW index MB": "{setup[pgvector][hnsw_index_mb]:1}",
    "pg build overlapped Milvus insert": lambda res: (
        "–" if not (pg := res["setup"].get("pgvector")) else "yes" if pg.get("overlapped_with_milvus_insert") else "no"
    ),
}
_API = {"milvus": "MilvusStore", "pgvector": "PgVectorStore"}  # the product store class per scale store


def _api(store: str) -> Callable[[dict[str, Any]], str]:
    template = "{single_ms[p50]:2} / {filtered_single_ms[p50]:2} (recall {recall@10:3} / {filtered_recall@10:3}"
    return lambda res: (
        _fill(template + ("; {index})" if store == "milvus" else ")"), api)
        if (api := section(res, "stores", store, "store_api"))
        else "–"
    )


_SCALE_INTRO = (
    "Top-{k} cosine search, {dim}-d, {queries} real query embeddings. **Vectors are synthetic above {base_rows} "
    "rows**: {synthetic_note} (expected cosine to the source chunk about {expected_cosine_to_source}). Filtered = "
    "category `{rare_category}` holding ~{rare_pct:.0f} % of the rows. Recall@10 is against the exact NumPy result "
    "(tie-tolerant). Single = one query per call; batch = all queries in one call (NumPy matrix product, one Milvus "
    "`search` with {queries} vectors, a psycopg pipeline for PostgreSQL). Best = fastest single-query p50 with "
    "recall@10 >= {min_recall}."
)
_API_NOTE = (
    "`MilvusStore.search` returns the payload fields (text etc.; Milvus Lite's default HNSW ef is 64); "
    "`PgVectorStore.search` uses its own plan (exact scan when at most {exact_scan_max_rows:1} rows can match, else "
    "HNSW ef_search={ef_search:1} with iterative scans). Recall is over the timed queries."
)


def _scale(sc: dict[str, Any], r: Results) -> list[str]:
    meth = sc["method"]
    best_rows, all_rows = _scale_rows(sc)
    out = [_fill(_SCALE_INTRO, meth | {"rare_pct": 100 * meth["rare_fraction"]})]
    out += ["### Best configuration per store and size", _table(SCALE, best_rows)]
    out += [f"![search latency vs size]({r['chart']})"] if r.get("chart") else []
    out += ["### All configurations", _table(SCALE, all_rows)]
    out += ["### Setup times (seconds)", _table(SETUP, sc["sizes"].values())]
    apis = [res for res in sc["sizes"].values() if any(section(res, "stores", s, "store_api") for s in _API)]
    if apis:
        api: dict[str, Cell] = {"size": "{rows:,}"} | {f"{c}.search": _api(s) for s, c in _API.items()}
        out += ["### Product store calls on the same data (p50 ms, unfiltered / filtered)"]
        out += [_fill(_API_NOTE, meth.get("pg_store_plan") or {}), _table(api, apis)]
    if sc.get("skipped"):
        lines = [f"{s['size']:,}: {s['what']}: {s['reason']}." + _extrapolation(sc, s) for s in sc["skipped"]]
        out += ["### Skipped", _bullets(lines)]
    return out


def _extrapolation(sc: dict[str, Any], skip: dict[str, Any]) -> str:
    """For a skipped Milvus size: what the largest measured size's rates imply (linear)."""
    milvus = skip["what"].startswith("milvus")
    measured = [
        (int(n), res)
        for n, res in sc["sizes"].items()
        if milvus and int(n) < skip["size"] and ok(res["stores"].get("milvus")) and res["setup"].get("milvus")
    ]
    if not measured:
        return ""
    n0, res = max(measured, key=lambda t: t[0])
    setup, scale = res["setup"]["milvus"], skip["size"] / n0
    flat = next((c for c in res["stores"]["milvus"]["configs"] if c["config"] == "FLAT"), None)
    rate = setup["insert_rows_per_s"]
    text = f" At the rates measured at {n0:,} it would take about {skip['size'] / rate:.0f} s to insert "
    text += f"({rate:,.0f} rows/s)"
    if flat and flat["single_ms"]["p50"]:
        text += f"; a FLAT search would take about {flat['single_ms']['p50'] * scale:,.0f} ms if linear in size"
    return text + " (extrapolated, not measured)."


INGESTION = {
    "corpus": "{documents} documents ({documents_skipped} skipped as bad), {chunks} chunks",
    "raw `encode` (same texts, batch {batch_size}, normalised)":
        "{raw_encode_chunks_per_s:1} chunks/s ({raw_encode_s:2} s; runs {raw_encode_runs_s} s)",
    "full ingest into a fresh Milvus Lite": "{ingest_chunks_per_s:1} chunks/s ({ingest_s:2} s)",
    "ingest / raw": "{ingest_vs_raw:%}",
    "embedding inside ingest": "{embed_stage_chunks_per_s:1} chunks/s; everything else {non_embed_s:2} s",
    "same texts encoded in the pipeline's 256-chunk steps (diagnostic)":
        "{stepped_encode_s:2} s = {stepped_vs_raw_time:2}x the raw encode time",
    "unchanged re-ingest": "{reingest_s:3} s = {reingest_fraction:%} of the first ({reingest_chunks_embedded} chunks "
        "embedded, {reingest_unchanged} unchanged)",
}  # fmt: skip


def _ingestion(ing: dict[str, Any], _r: Results) -> list[str]:
    first, again = ing["stage_seconds"], ing["reingest_stage_seconds"]
    stages = [[s, _f(first.get(s), 3), _f(again.get(s), 3)] for s in sorted(set(first) | set(again))]
    return [
        _kv(INGESTION, ing),
        "Per-stage seconds (`report.stage_seconds`):",
        md_table(["stage", "first ingest s", "unchanged re-ingest s"], stages),
        *_profile(ing.get("reingest_profile"), "cProfile of an unchanged re-ingest (ms, by cumulative time):"),
    ]


EVALUATION = {
    "cases (generated with `rag_core.evaluation.testing` helpers)": "{cases:,} ({fixture_mb:.1f} MB of fixtures)",
    "load_fixtures": "{load_s:3} s ({load_cases_per_s:0} cases/s)",
    "evaluate": "{evaluate_s:3} s ({evaluate_cases_per_s:0} cases/s)",
    "load + evaluate": "**{cases_per_s:0} cases/s** ({total_s:3} s, median of {repeats})",
    "result mix": "{summary}",
}


def _entries(pairs: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Rows of (label, benchmark entry): a failed entry keeps only its label, with the error."""
    failed = "{}: failed: {}"
    return [
        e | {"label": k} if ok(e) else {"label": failed.format(k, (e or {}).get("error", "not run")), "failed": 1}
        for k, e in pairs
    ]


EMBEDDING: dict[str, Cell] = {
    "backend": lambda e: (
        e["label"] if e.get("failed") else _fill("{label} ({model[model_id]}, {model[dimension]}-d)", e)
    ),
    "query p50 ms (vs MiniLM)": "{query_p50_ms:2} ({query_p50_vs_minilm}x)",
    "query p95 ms": "{query_p95_ms:2}",
    "chunks/s (vs MiniLM)": "{chunks_per_s:1} ({chunks_per_s_vs_minilm}x)",
    "lookup RSS MiB": "{lookup_process[peak_rss_mb_vmhwm]:1}",
    "torch": lambda e: "yes" if section(e, "lookup_process").get("torch_loaded") else "no",
}
_EMBEDDING_INTRO = (
    "Query embedding over {queries} benchmark queries (one at a time, warm), passage throughput over the same "
    "{chunks} runbook chunk texts, peak RSS of a fresh lookup process (model loaded, 20 lookups on a small index). "
    "Ratios against MiniLM in the same run. Retrieval quality per backend: "
    "`RAG_EMBEDDING_BACKEND=<backend> RAG_DATA_DIR=<dir per backend> rag eval suites`."
)
MEMORY: dict[str, Cell] = {
    "collection": "{label}",
    "chunks": "{rows:,}",
    "peak RSS MB (ru_maxrss)": "**{peak_rss_mb_ru_maxrss:1}**",
    "peak RSS MB (VmHWM)": "{peak_rss_mb_vmhwm:1}",
    "peak RSS MB (20 ms samples)": "{peak_rss_mb_sampled:1}",
    "RSS after model load MB": "{rss_mb[after_model_load]:1}",
    "after collection load MB": "{rss_mb[after_collection_load]:1}",
    "after lookups MB": "{rss_mb[after_lookups]:1}",
    "open collection s": "{open_collection_s:2}",
    "lookup p50 ms": "{lookup_ms[p50]:1}",
}
_MEMORY_COST = (
    "Against the baseline the large collection adds {collection_cost_mb[peak_ru_maxrss]:1} MB of peak RSS (ru_maxrss; "
    "{collection_cost_mb[peak_vmhwm]:1} MB by VmHWM) and {collection_cost_mb[after_lookups]:1} MB of RSS after the "
    "lookups. The embedded Milvus server is its own process: {large[server_rss_mb]:1} MB RSS with the large "
    "collection vs {baseline[server_rss_mb]:1} MB with the runbook one (index {large[index]}). Each child is a fresh "
    "process that loads the model, opens the collection and runs {lookups} lookups (the lookup p50 includes the "
    "first, cold ones)."
)


def _memory(mem: dict[str, Any], _r: Results) -> list[str]:
    rows = _entries([("runbook collection (baseline)", mem.get("baseline")), ("large collection", mem.get("large"))])
    return [_table(MEMORY, rows)] + ([_fill(_MEMORY_COST, mem)] if mem.get("collection_cost_mb") else [])


CONCURRENCY = {  # per path, one row per thread count
    "lookups/s": "{lookups_per_s:2}",
    "speedup": "{speedup_vs_1:.2f}x",
    "latency p50 ms": "{latency_ms[p50]:1}",
    "CPU s per wall s": "{cpu_per_wall:2}",
}


def _concurrency(conc: dict[str, Any], _r: Results) -> list[str]:
    by_path = conc["paths"]
    paths = [p for p, rows in by_path.items() if isinstance(rows, list)]
    header = ["threads", *(f"{p} {name}" for p in paths for name in CONCURRENCY)]
    rows = [
        [n, *(_fill(t, by_path[p][i]) for p in paths for t in CONCURRENCY.values())]
        for i, n in enumerate(conc["threads"])
    ]
    failed = [f"- {p}: failed: {d.get('error')}" for p, d in by_path.items() if not isinstance(d, list)]
    lines = [f"{conc['lookups_per_config']} lookups per configuration.", *failed]
    return [md_table(header, rows), "\n".join(lines)]


ENGINE: dict[str, Cell] = {
    "path": "{path}",
    "lookup p50 ms": "{lookup[p50]:1}",
    "without query embedding p50 ms": "{without[p50]:1}",
    "store p50 ms": "{store[p50]:1}",
}
_FLUSH = (
    "Store search (dense + BM25) on {rows} rows written in this process: unflushed p50 {unflushed_ms[p50]:1} ms, "
    "flushed p50 {flushed_ms[p50]:1} ms."
)
_SERVING = (
    "Ingest while serving: {lookups} lookups on 8 threads ({lookups_during_ingest} during a {ingest_s:1} s `rag "
    "ingest` in another process): p50 {latency_ms[p50]:1} ms, p95 {latency_ms[p95]:1} ms, {failures} failed, "
    "{hits_outside_old_and_new_index} hits outside the old and new index, traces {traces}."
)


def _engine(eng: dict[str, Any] | None, r: Results) -> list[str]:
    """Issue 14: lookup p50 per path (the latency benchmark's ``vs_floor``), flush effect, ingest while serving."""
    lk, out = section(r, "latency", "vs_floor"), []
    if "milvus" in lk:
        rows = [
            {"path": p, "lookup": lk[p], "without": lk["without_embedding"][p], "store": section(lk, "store", p)}
            for p in ("milvus", "pgvector", "floor")
        ]
        out += [_table(ENGINE, rows), f"Store: {lk['store_means']}."]
    out += [_fill(_FLUSH, fl)] if "flushed_ms" in (fl := section(eng or {}, "flush")) else []
    out += [_fill(_SERVING, sv)] if "failures" in (sv := section(eng or {}, "serving")) else []
    return out


_MACHINE = (
    "The machine is shared: load average {meta[load_average_start]} at the start and {meta[load_average_end]} at the "
    "end on {meta[environment][cpu_count]} CPUs. Absolute timings, and ratios between steps that ran at different "
    "moments, move with that load; each ratio in the targets table compares figures from this run."
)
_SYNTHETIC = (
    "Scale data is synthetic beyond the {base} real chunks (perturbed copies, see above). Each real chunk has about "
    "rows / {base} noisy copies ({copies} at 100k), and such clusters are probably harder for HNSW than a real corpus "
    "of that size: the ef needed for recall@10 >= 0.95 (and so the HNSW latency) is likely higher here than it would "
    "be on real data."
)
_OVERLAP = (
    "The pgvector HNSW index is built while Milvus inserts (both need CPU), to fit the time budget: build and "
    "insert seconds are inflated by each other; no search is timed while either runs."
)
_SCALE_NOTES = (
    "pgvector HNSW uses m=16, ef_construction=64 (pgvector's defaults, as the product creates it); the embedded "
    "Milvus engine has no HNSW (the product's Milvus HNSW option, for a Milvus server, uses efConstruction=200).",
    "NumPy exact is measured with the BLAS default threads and with one thread; the faster is the reference. Its "
    "filtered variant multiplies a pre-extracted matrix of the category's rows.",
)


def _caveats(_m: Any, r: Results) -> list[str]:
    sc, ing = r.get("scale") or {}, r.get("ingestion") or {}
    notes = []
    if close := borderline(r):
        near = "; ".join(f"{t['target']} ({t['ratio']}, {_STATUS[t.get('met')]})" for t in close)
        notes.append(f"Within 15 % of their limit in this run, so they can come out either way on a rerun: {near}.")
    notes.append(_fill(_MACHINE, r))
    if base := section(sc, "method").get("base_rows"):
        notes.append(_SYNTHETIC.format(base=base, copies=100_000 // base))
        setups = [section(res, "setup", "pgvector") for res in section(sc, "sizes").values()]
        if any(s.get("overlapped_with_milvus_insert") for s in setups):  # not with --no-overlap
            notes.append(_OVERLAP)
        notes += _SCALE_NOTES
    if sc.get("skipped"):
        skipped = "; ".join(f"{s['what'].split(' (')[0]} at {s['size']:,}" for s in sc["skipped"])
        notes.append(f"Skipped in this run (reasons and extrapolations under *Skipped* above): {skipped}.")
    notes.append(
        "Latency excludes model loading (done before timing); the trace hand-off is measured against an in-memory "
        "recorder that does the real recorder's caller-side work (`trace_row`) but no PostgreSQL write."
    )
    if ok(ing) and len(ing.get("raw_encode_runs_s", [])) > 1:
        notes.append("Raw encode throughput is the mean of a run before and a run after the ingest.")
    return [_bullets(notes)]


@dataclass(frozen=True)
class _Section:
    """One ``##`` section: ``body(results[key], results)`` gives its blocks when the section is ready
    (no error and one of ``need`` present, or ``ready(results)``), else "Not run or failed" (nothing
    when ``optional``). The results passed carry ``chart``: the chart's file name or None."""

    key: str
    title: str
    body: Callable[[Any, Results], list[str]]
    need: tuple[str, ...] = ()
    ready: Callable[[Results], bool] | None = None
    optional: bool = False

    def markdown(self, r: Results) -> list[str]:
        data = r.get(self.key)
        has = ok(data) and (not self.need or any(k in data for k in self.need))
        if not (self.ready(r) if self.ready else has):
            error = f"Not run or failed: {(data or {}).get('error', 'not run')}"
            return [] if self.optional else ["", f"## {self.title.split(' (')[0]}", "", error]
        return ["", f"## {self.title}"] + [line for block in self.body(data, r) for line in ("", block)]


SECTIONS: tuple[_Section, ...] = (
    _Section("latency", "Lookup latency (runbook corpus, warm)", _latency, ("paths",)),
    _Section("scale", "Store search at scale", _scale, ("sizes",)),
    _Section("ingestion", "Ingestion", _ingestion),
    _Section("evaluation", "Offline evaluation", lambda ev, _r: [
        _kv(EVALUATION, ev | {"fixture_mb": ev["fixture_bytes"] / 2**20}),
        *_profile(ev.get("profile"), "cProfile of load_fixtures + evaluate (ms, by self time):")]),
    _Section("memory", "Memory (peak RSS of a lookup process)", _memory, ("baseline", "large")),
    _Section("embedding", "Embedding backends", lambda emb, _r: [_fill(_EMBEDDING_INTRO, emb),
             _table(EMBEDDING, _entries(emb["backends"].items()))], ("backends",)),
    _Section("embed_throughput", "Embedding throughput (issue 23: before vs after, side by side)",
             lambda et, _r: ["\n".join(["```", *summary_lines(et), "```"])], optional=True),
    _Section("concurrency", "Concurrency (one tool object shared by N threads)", _concurrency, ("paths",)),
    _Section("engine", "Main path engine (embedded Milvus server)", _engine,
             ready=lambda r: bool(r.get("engine") or section(r, "latency", "vs_floor")), optional=True),
    _Section("meta", "Method notes and caveats", _caveats, ready=lambda r: True),
)  # fmt: skip

_HEADER = (
    "Run {meta[started_at]} ({meta[mode]} mode, commit {meta[environment][git_commit]}), "
    "{meta[environment][cpu_count]} CPUs, {meta[environment][memory_gb]} GB RAM, Python {meta[environment][python]}; "
    "total runtime **{meta[total_seconds]:1} s** (budget {meta[budget_s]:0} s); load average (1/5/15 min) "
    "{meta[load_average_start]} at start, {meta[load_average_end]} at the end. Regenerate with `make bench` "
    "(`python -m bench.run`; `--help` for sizes and caps)."
)


def markdown(r: dict[str, Any], chart_name: str | None) -> str:
    m = r["meta"]
    after = m.get("load_average_after", {})
    seconds = ", ".join(f"{k} {v} s ({(after.get(k) or ['–'])[0]})" for k, v in m.get("seconds", {}).items())
    model = f"; embedding model load {m['model_load_s']} s (not in any figure)" if m.get("model_load_s") else ""
    out = ["# rag_core benchmark results", "", _fill(_HEADER, r), "", "## Targets", ""]
    out += [_table(TARGETS, r.get("targets", [])), ""]
    out += [f"Seconds per benchmark (1-min load average at its end): {seconds}{model}."]
    view = r | {"chart": chart_name}
    return "\n".join(out + [line for s in SECTIONS for line in s.markdown(view)]) + "\n"


# --- printed summary -------------------------------------------------------------------------------------

_LATENCY_LINE = (
    "latency {name}: e2e p50/p95/p99 {e2e[p50]:.1f}/{e2e[p95]:.1f}/{e2e[p99]:.1f} ms; embed p50 {embed[p50]:.1f} ms, "
    "store p50 {store[p50]:.1f} ms (wall time of the store calls), overhead p50 {pipeline_overhead[p50]:.2f} ms"
)
_MEMORY_LINE = (
    "memory: peak RSS {large[peak_rss_mb_ru_maxrss]:.0f} MB at {large[rows]:,} chunks "
    "(baseline {baseline[peak_rss_mb_ru_maxrss]} MB)"
)


def summary_text(r: dict[str, Any]) -> str:
    lines = ["", "=" * 100, "rag_core benchmark summary", "=" * 100]
    close = {t["id"] for t in borderline(r)}
    for t in r.get("targets", []):
        status = {None: "not run", True: "MET", False: "NOT MET"}[t.get("met")]
        flag = " - borderline (within 15 % of the limit)" if t["id"] in close else ""
        lines += [f"[{status:>7}] {t['target']}: {t.get('ratio', '–')} (limit {t['limit']}){flag}"]
        lines += [f"          {t.get('measured', '')}"]
    paths = section(r, "latency", "paths")
    lines += [_fill(_LATENCY_LINE, d["stages_ms"] | {"name": p}) for p, d in paths.items() if ok(d)]
    for n, res in section(r, "scale", "sizes").items():
        bests = [(store, s.get("best") if isinstance(s, dict) else None) for store, s in res["stores"].items()]
        best = "{config} p50 {single_ms[p50]:.2f} ms R@10 {recall@10:.3f}"
        lines.append(f"scale {int(n):>7,}: " + "; ".join(f"{s} {_fill(best, b) if b else '–'}" for s, b in bests))
    if (large := section(r, "memory", "large")) and "error" not in large:
        lines.append(_fill(_MEMORY_LINE, r["memory"]))
    for p, rows in section(r, "concurrency", "paths").items():
        if isinstance(rows, list):
            lines.append(f"concurrency {p}: " + ", ".join(f"{c['threads']}t {c['lookups_per_s']:.1f}/s" for c in rows))
    if ok(r.get("embed_throughput")):
        lines += summary_lines(r["embed_throughput"])
    tail = "total runtime {total_seconds} s (budget {budget_s} s); load average {load_average_start} -> "
    tail += "{load_average_end}"
    return "\n".join([*lines, _fill(tail, r["meta"])])


def write(directory: Path, results: dict[str, Any], final: bool = True) -> None:
    """Evaluate the targets into ``results`` and write results.json; when ``final`` also the chart
    (scale_latency.png) and results.md."""
    results["targets"] = evaluate_targets(results)
    write_text_atomic(directory / "results.json", json.dumps(results, indent=2, default=str) + "\n")
    if final:
        drawn = chart(results, directory / "scale_latency.png")
        (directory / "results.md").write_text(markdown(results, drawn.name if drawn else None))


def main(argv: list[str] | None = None) -> int:
    """Re-render results.md and the chart from a results.json: ``python -m bench.report [DIR]``."""
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else RESULTS_DIR
    results = json.loads((directory / "results.json").read_text())
    write(directory, results)
    print(summary_text(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
