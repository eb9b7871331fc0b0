"""The chunk-embedding step split into shards: the shards cover the plan once, and the sharded
``chunk_embeddings`` asset on the multiprocess executor (two workers, one step process per
shard) gives exactly the vectors, content hashes and counts of one process.

A small deterministic fake embedder (hash -> unit vector) stands in for the model; the job is
rebuilt in each step process from ``fake_embed_job`` below (``dg.build_reconstructable_job``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from rag_assets.defs.resources import EmbedderResource, RagSettingsResource, build_resources
from rag_assets.io_manager import dump
from rag_core.embedding.base import ModelIdentity
from rag_core.ingest.embed import ChunkEmbeddings, embed_plan
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.plan import IngestPlan, chunk_scan, plan_ingest, read_store_state, scan_knowledge
from rag_core.ingest.shards import merge_embeddings, shard_of, shard_plan
from rag_core.stores.memory import InMemoryStore

ROOT = Path(__file__).resolve().parent.parent
DIM = 8
JOB = "embed_shards_job"


class HashEmbedder:
    """Unit vectors seeded by each text's sha256: the same text gives the same vector in any
    process and any batch. (``fakes.HashEmbedder``'s vectors; a copy, because the step processes
    import this module as ``tests.test_dagster_embed_shards``, where ``fakes`` is not importable.)"""

    backend, model_id, dimension, max_tokens, fingerprint = "fake", "fake-hash", DIM, 512, "f" * 16

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.backend, self.model_id, DIM, self.fingerprint)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.stack(rows)


class HashEmbedderResource(EmbedderResource):
    """``EmbedderResource`` giving the fake (the shard steps' processes build it themselves)."""

    def get(self):
        return HashEmbedder()


def fake_embed_job(data_dir: str, shards: int, executor: str) -> dg.JobDefinition:
    """The ``chunk_embeddings`` asset alone (its plan read from the data dir), ``shards``
    shards, on the ``multiprocess`` (2 workers) or ``in_process`` executor, with the fake."""
    from rag_assets.definitions import defs

    rag = RagSettingsResource(data_dir=data_dir, embed_shards=shards, sidecar_enabled=False)
    resources = {**build_resources(rag), "embedder": HashEmbedderResource(rag=rag)}
    executor_def = (
        dg.multiprocess_executor.configured({"max_concurrent": 2})
        if executor == "multiprocess"
        else dg.in_process_executor
    )
    job = dg.define_asset_job(JOB, selection=dg.AssetSelection.assets("chunk_embeddings"), executor_def=executor_def)
    return dg.Definitions(assets=list(defs.assets), resources=resources, jobs=[job]).resolve_job_def(JOB)


def _kb(root: Path, documents: int = 12) -> Path:
    for i in range(documents):
        doc = root / f"ops/doc{i:02d}.md"
        doc.parent.mkdir(parents=True, exist_ok=True)
        sections = "".join(f"\n## Step {s}\n\nDo thing {s} for service {i}.\n" for s in range(3))
        doc.write_text(f"---\ntitle: Doc {i}\n---\n# Doc {i}\n\nIntro of {i}.\n{sections}")
    # a document whose sections repeat another's: equal content hashes share one vector
    (root / "ops/copy.md").write_text((root / "ops/doc00.md").read_text())
    return root


def _plan(kb: Path) -> IngestPlan:
    scan = scan_knowledge(kb, 1_000_000)
    embedder = HashEmbedder()
    chunked = chunk_scan(scan.documents, embedder.count_tokens, 200)
    store = InMemoryStore()
    return plan_ingest(scan, chunked, [read_store_state(store)], embedder.identity())


def test_shards_cover_the_plan_once_and_merge_to_one_process_result(tmp_path):
    plan = _plan(_kb(tmp_path / "kb"))
    needed = {c.content_hash for c in plan.to_embed()}
    parts = [shard_plan(plan, i, 3) for i in range(3)]
    hashes = [{c.content_hash for c in p.to_embed()} for p in parts]
    assert set().union(*hashes) == needed and sum(map(len, hashes)) == len(needed)  # disjoint cover
    assert all(shard_of(h, 3) == i for i, part in enumerate(hashes) for h in part)
    whole = embed_plan(plan, HashEmbedder(), EmbeddingCache(tmp_path / "one.sqlite3"))
    cache = EmbeddingCache(tmp_path / "sharded.sqlite3")
    merged = merge_embeddings([embed_plan(p, HashEmbedder(), cache) for p in parts])
    assert merged.content_hashes == whole.content_hashes
    assert (merged.embedded, merged.cache_hits) == (whole.embedded, whole.cache_hits)
    assert np.array_equal(merged.vectors_for(plan.to_embed()), whole.vectors_for(plan.to_embed()))
    with pytest.raises(ValueError, match="shards must be at least 1"):
        shard_of("x", 0)


def _run(data_dir: Path, shards: int, executor: str, instance: dg.DagsterInstance) -> dg.JobExecutionResult:
    recon = dg.build_reconstructable_job(
        "tests.test_dagster_embed_shards",
        "fake_embed_job",
        reconstructable_args=(str(data_dir), shards, executor),
        reconstructor_working_directory=str(ROOT),
    )
    return dg.execute_job(recon, instance, raise_on_error=False)


def test_sharded_embedding_on_the_multiprocess_executor_gives_the_one_process_vectors(tmp_path):
    plan = _plan(_kb(tmp_path / "kb"))
    data_dir = tmp_path / "data"
    (data_dir / "dagster").mkdir(parents=True)
    (data_dir / "dagster" / "ingest_plan.json").write_bytes(dump(plan, IngestPlan))
    results = {}
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        for shards, executor in ((1, "in_process"), (2, "multiprocess")):
            (data_dir / "embedding_cache.sqlite3").unlink(missing_ok=True)  # each run embeds everything
            result = _run(data_dir, shards, executor, instance)
            assert result.success, [e.message for e in result.all_events if e.is_failure]
            stored = (data_dir / "dagster" / "chunk_embeddings.json").read_bytes()
            from rag_assets.io_manager import load

            embeddings = load(stored, ChunkEmbeddings, "chunk_embeddings.json")
            steps = {e.step_key for e in result.all_events if e.is_step_success}
            results[executor] = (embeddings, embeddings.vectors_for(plan.to_embed()), steps, result.run_id)
        # a new run removes the op outputs of runs older than a week, and only those
        steps_dir = data_dir / "dagster" / "steps"
        old_run, young_run = results["in_process"][3], results["multiprocess"][3]
        week_ago = time.time() - 8 * 24 * 3600
        os.utime(steps_dir / old_run, (week_ago, week_ago))
        newest = _run(data_dir, 1, "in_process", instance)
        assert newest.success
        assert {d.name for d in steps_dir.iterdir()} == {young_run, newest.run_id}
    one, one_vectors, one_steps, _ = results["in_process"]
    sharded, sharded_vectors, sharded_steps, _ = results["multiprocess"]
    assert {s for s in sharded_steps if s.startswith("chunk_embeddings.embed_shard")} == {
        "chunk_embeddings.embed_shard[shard_0_of_2]",
        "chunk_embeddings.embed_shard[shard_1_of_2]",
    }
    assert len([s for s in one_steps if "embed_shard" in s]) == 1
    assert sharded.content_hashes == one.content_hashes and sharded.embedded == one.embedded == len(plan.to_embed())
    assert np.array_equal(sharded_vectors, one_vectors)
