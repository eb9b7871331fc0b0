"""One writer per index (issue 44 item 2): an ingest holds the data dir's index lock from plan to
apply; a second one is refused with one line naming the holder, or waits (RAG_INGEST_LOCK_WAIT).
Two concurrent ingests of two different subsets on one data dir (real Milvus, the real model)
leave the stores, the L0 index and the index state in agreement, which ``rag doctor`` checks."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import SAMPLE_KNOWLEDGE_DIR, make_settings
from fakes import HashEmbedder, HoldingStore

from rag_core.health import check_health
from rag_core.ingest.index_lock import IndexBusyError, index_lock
from rag_core.ingest.index_state import read_index_state
from rag_core.ingest.pipeline import ingest
from rag_core.l0 import L0Index
from rag_core.stores.memory import InMemoryStore


def _kb(root: Path, names: list[str]) -> Path:
    for name in names:
        path = root / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\ntitle: {name}\n---\n# {name}\n\n{name} runbook body text.\n")
    return root


def test_a_second_ingest_is_refused_naming_the_holder(tmp_path):
    settings = make_settings(tmp_path / "data", _kb(tmp_path / "kb", ["alpha", "beta"]))
    store = InMemoryStore()
    with index_lock(settings, "rag ingest --knowledge-dir elsewhere"):
        with pytest.raises(IndexBusyError) as info:
            ingest(settings, HashEmbedder(8), [store], progress=False)
    message = str(info.value)
    assert f"pid {os.getpid()}" in message and "rag ingest --knowledge-dir elsewhere" in message
    assert "RAG_INGEST_LOCK_WAIT" in message and "\n" not in message
    assert store.count() == 0 and not settings.l0_index_path.exists()  # refused before any read or write
    ingest(settings, HashEmbedder(8), [store], progress=False)  # free again once the holder is done
    assert store.count() > 0


def test_a_second_ingest_waits_when_told_to(tmp_path, caplog):
    settings = make_settings(tmp_path / "data", _kb(tmp_path / "kb", ["alpha"]), ingest_lock_wait=60)
    held, released = threading.Event(), []

    def holder() -> None:
        with index_lock(settings, "the first ingest"):
            held.set()
            time.sleep(1.0)
            released.append(time.monotonic())

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    ingest(settings, HashEmbedder(8), [InMemoryStore()], progress=False)
    done = time.monotonic()
    thread.join()
    assert released and done >= released[0]  # serialised: it ran after the holder let go
    assert any("waiting up to 60s" in r.getMessage() and "the first ingest" in r.getMessage() for r in caplog.records)


def test_rag_ingest_refused_is_one_line_exit_1(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import rag_core.components as components
    from rag_core.cli import app

    settings = make_settings(tmp_path / "data", _kb(tmp_path / "kb", ["alpha"]))
    monkeypatch.setattr(components, "make_embedder", lambda settings: HashEmbedder(8))
    monkeypatch.setattr(components, "make_stores", lambda settings, sidecar=None: [InMemoryStore()])
    monkeypatch.setenv("RAG_DATA_DIR", str(settings.data_dir))
    with index_lock(settings, "dagster run 1234 step milvus_collection"):
        res = CliRunner().invoke(app, ["ingest", "--knowledge-dir", str(settings.knowledge_dir)])
    assert res.exit_code == 1, res.output
    [line] = [ln for ln in res.output.replace("\n", " ").split("ingest failed:")[1:]]
    assert "dagster run 1234 step milvus_collection" in line and f"pid {os.getpid()}" in line


@pytest.mark.integration  # the real model and the embedded Milvus server
def test_two_concurrent_ingests_of_two_subsets_leave_one_index(tmp_path, embedder):
    from rag_core.stores.milvus import MilvusStore

    subsets = []
    for name, part in (("a", ("cache", "queues")), ("b", ("databases", "services"))):
        root = tmp_path / name
        for folder in part:
            shutil.copytree(SAMPLE_KNOWLEDGE_DIR / folder, root / folder)
        subsets.append(root)
    settings = make_settings(tmp_path / "data", subsets[0])
    first_store, second_store = MilvusStore.from_settings(settings), MilvusStore.from_settings(settings)
    first = HoldingStore(first_store)
    outcome: dict[str, object] = {}

    def run_first() -> None:
        try:
            outcome["first"] = ingest(settings, embedder, [first], knowledge_dir=subsets[0], progress=False)
        except Exception as exc:
            outcome["first"] = exc

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert first.writing.wait(300), "the first ingest never reached its first write"
        try:  # the second ingest starts while the first one is writing
            outcome["second"] = ingest(settings, embedder, [second_store], knowledge_dir=subsets[1], progress=False)
        except Exception as exc:
            outcome["second"] = exc
    finally:
        first.release.set()
        thread.join()
    assert isinstance(outcome["second"], IndexBusyError), outcome["second"]
    assert f"pid {os.getpid()}" in str(outcome["second"])
    assert not isinstance(outcome["first"], Exception), outcome["first"]

    # One index: the stores, the L0 index and the index state hold the first subset's documents.
    expected = {p.relative_to(subsets[0]).as_posix() for p in subsets[0].rglob("*.md")}
    expected -= {d for d in expected if d.endswith("_index.md")}
    held = {doc for doc, _ in second_store.chunk_hashes().values()}
    l0 = set(L0Index.load(settings.l0_index_path).entries)
    state, _ = read_index_state(settings)
    assert held == l0 == expected
    assert state is not None and state["milvus"].documents == len(expected)
    health = check_health(settings, [second_store], embedder.identity(), documents=True)
    assert health.ok, health.summary()
    first_store.close()
    second_store.close()
