"""The Dagster ``chunk_embeddings`` step, sharded on the multiprocess executor vs one process (issue 23, 4a).

``python -m bench.dagster_embed [--shards 2] [--workers 2]`` (in ``make bench``). The
``ingest_plan`` is made once on the runbook corpus (sidecar off), then ``chunk_embeddings`` runs
through ``dg.execute_job`` twice, each on an empty embedding cache: one shard in process, and
``--shards`` shards on ``--workers`` step processes. Prints wall s (step starts and model loads
included), chunks/s, the speed-up, the vectors' max difference and min cosine, the load average.
Skipped with a message when the corpus is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest.mock import patch

import dagster as dg
import numpy as np

from bench.common import RUNBOOKS, load_average, log, parse_command_line, ratio, timed
from rag_core.markdown import md_table
from rag_core.settings import PROJECT_ROOT

JOB = "bench_chunk_embeddings"


def _assets_and_resources(data_dir: str, **rag: Any) -> tuple[list[Any], dict[str, Any]]:
    """The code location's assets and its resources on ``data_dir`` (sidecar off, ``rag`` settings)."""
    from rag_assets.definitions import defs
    from rag_assets.defs.resources import RagSettingsResource, build_resources

    return list(defs.assets), build_resources(RagSettingsResource(data_dir=data_dir, sidecar_enabled=False, **rag))


def embed_job(data_dir: str, shards: int, workers: int) -> dg.JobDefinition:
    """``chunk_embeddings`` alone (its plan read back from ``data_dir``) in ``shards`` shards on the
    multiprocess executor (``workers`` step processes), or on the in-process one when ``workers`` is 0."""
    assets, resources = _assets_and_resources(data_dir, embed_shards=shards)
    executor = dg.multiprocess_executor.configured({"max_concurrent": workers}) if workers else dg.in_process_executor
    job = dg.define_asset_job(JOB, selection=dg.AssetSelection.assets("chunk_embeddings"), executor_def=executor)
    return dg.Definitions(assets=assets, resources=resources, jobs=[job]).resolve_job_def(JOB)


def _run(data_dir: Path, shards: int, workers: int, instance: dg.DagsterInstance, plan: Any) -> dict[str, Any]:
    """One timed ``embed_job`` run on an empty embedding cache: wall s, the plan's vectors, what it embedded."""
    from rag_assets.io_manager import load
    from rag_core.ingest.embed import ChunkEmbeddings

    (data_dir / "embedding_cache.sqlite3").unlink(missing_ok=True)  # every run embeds everything
    recon = dg.build_reconstructable_job(
        __name__,
        "embed_job",
        reconstructable_args=(str(data_dir), shards, workers),
        reconstructor_working_directory=str(PROJECT_ROOT),
    )
    result, wall = timed(lambda: dg.execute_job(recon, instance, raise_on_error=False))
    if not result.success:
        raise RuntimeError(f"{shards}-shard run failed: {[e.message for e in result.all_events if e.is_failure][:3]}")
    stored = data_dir / "dagster" / "chunk_embeddings.json"
    embeddings = load(stored.read_bytes(), ChunkEmbeddings, str(stored))
    return {"wall_s": wall, "vectors": embeddings.vectors_for(plan.to_embed()), "embedded": embeddings.embedded}


def run(corpus: Path, shards: int, workers: int) -> dict[str, Any]:
    """Both runs on ``corpus``; the figures (see the module docstring)."""
    scratch = Path(tempfile.mkdtemp(prefix="rag-bench-dagster-embed-"))
    data_dir, home = scratch / "data", scratch / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {"DAGSTER_HOME": str(home), "RAG_KNOWLEDGE_DIR": str(corpus), "RAG_SIDECAR_ENABLED": "false"}
    try:
        with patch.dict(os.environ, env), dg.DagsterInstance.get() as instance:
            log("planning (documents -> chunks -> plan)")
            assets, resources = _assets_and_resources(str(data_dir))
            selection = dg.AssetSelection.assets("knowledge_documents", "chunks", "ingest_plan")
            result = dg.materialize(assets, selection=selection, resources=resources, instance=instance)
            plan = result.output_for_node("ingest_plan")
            out: dict[str, Any] = {"chunks": len(plan.to_embed()), "shards": shards, "workers": workers}
            out["load_before"] = load_average()
            log(f"one process: {out['chunks']} chunks")
            runs = {"one_process": _run(data_dir, 1, 0, instance, plan)}
            log(f"sharded: {shards} shards on {workers} workers")
            runs["sharded"] = _run(data_dir, shards, workers, instance, plan)
            out["load_after"] = load_average()
        for name, r in runs.items():
            out[f"{name}_s"] = round(r["wall_s"], 1)
            out[f"{name}_chunks_per_s"] = round(out["chunks"] / r["wall_s"], 2)
        one, sharded = runs.values()
        a, b = one["vectors"], sharded["vectors"]
        cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        out |= {
            "speedup": ratio(one["wall_s"], sharded["wall_s"], 2),
            "embedded_equal": one["embedded"] == sharded["embedded"],
            "max_abs_diff": float(np.max(np.abs(a - b))) if a.size else 0.0,
            "min_cosine": float(np.min(cos)) if a.size else 1.0,
        }
        return out
    finally:
        from rag_core.stores.milvus_server import stop_server

        with contextlib.suppress(Exception):  # nothing was started
            stop_server(data_dir)
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the table. Exit 0 (also when skipped), 1 when a run failed."""
    options: dict[str, dict[str, Any]] = {
        "--shards": dict(type=int, default=2),
        "--workers": dict(type=int, default=2, help="multiprocess executor max_concurrent"),
    }
    args = parse_command_line(__doc__, options, argv, prog="python -m bench.dagster_embed")
    if not RUNBOOKS.is_dir():
        print(f"dagster_embed: skipped, corpus {RUNBOOKS} not found")
        return 0
    try:
        out = run(RUNBOOKS, args.shards, args.workers)
    except RuntimeError as exc:
        print(f"dagster_embed: FAILED: {exc}", file=sys.stderr)
        return 1
    rows = [
        ["one process (1 shard, in-process executor)", out["one_process_s"], out["one_process_chunks_per_s"]],
        [f"{out['shards']} shards, multiprocess executor ({out['workers']} workers)", out["sharded_s"],
         out["sharded_chunks_per_s"]],
    ]  # fmt: skip
    print("\n## Dagster chunk_embeddings: sharded on the multiprocess executor vs one process\n")
    print(md_table(["run", "wall s", "chunks/s"], rows))
    print(
        f"\n{out['chunks']} chunks; speed-up {out['speedup']}x; vectors: max |diff| {out['max_abs_diff']:.2e}, "
        f"min cosine {out['min_cosine']:.6f}, passages embedded equal: {out['embedded_equal']}; "
        f"load average before {out['load_before']}, after {out['load_after']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
