"""Smoke test of the benchmark suite (bench/): the offline evaluation benchmark and the scale
benchmark at a tiny size (NumPy + the embedded Milvus server, synthetic vectors, no model, no PostgreSQL).
Checks the shape of the results, not timings."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is not an installed package

from bench import evaluation, report, scale  # noqa: E402


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
def test_scale_benchmark_tiny(tmp_path):
    base = scale.BaseData.synthetic(n=200, dim=32, seed=1)
    rng = np.random.default_rng(2)
    queries = base.vectors[:6] + 0.05 * rng.standard_normal((6, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    opts = scale.ScaleOptions(
        sizes=(2000,),
        stores=("numpy", "milvus"),
        milvus_ef=(16,),
        single_queries=3,
        insert_batch=1000,
        keep_milvus_size=None,
        show_progress=False,
        workdir=tmp_path,
    )
    out = scale.run(base, queries, opts)

    assert set(out) >= {"method", "sizes", "skipped", "targets"}
    res = out["sizes"]["2000"]
    assert res["rows"] == 2000 and 0 < res["rare_rows"] < 2000
    assert set(res["stores"]) == {"numpy", "milvus"}
    assert "error" not in res["stores"]["milvus"], res["stores"]["milvus"]
    names = [c["config"] for c in res["stores"]["milvus"]["configs"]]
    assert names == ["FLAT"]  # the embedded engine has no HNSW: skipped with the reason recorded
    assert any(s["what"] == "milvus HNSW" for s in out["skipped"])
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
