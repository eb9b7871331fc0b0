"""MilvusStore on the real engine, in file mode and through the embedded server (random unit
vectors: no model needed)."""

import time

import numpy as np
import pytest
from fakes import HOSTILE_NAMES

from rag_core.embedding.base import ModelIdentity
from rag_core.models import Chunk
from rag_core.stores.base import DimensionMismatchError, MissingCentroidsError, StoreError
from rag_core.stores.milvus import MilvusStore, escape_filter_value

DIM = 16


def chunk(i, doc="d.md", category="cat", title="T", text=None):
    return Chunk(
        chunk_id=f"c{i}",
        doc_id=doc,
        title=title,
        breadcrumb=f"{title} > S{i}",
        category=category,
        text=text or f"text number {i} about redis memory",
        start=0,
        end=1,
        ordinal=i,
        content_hash=f"h{i}",
    )


def unit(n, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture(params=["file", "server"])
def store(request, tmp_path):
    """The same tests on the file mode and on the embedded server (reached by URI)."""
    if request.param == "file":
        s = MilvusStore(str(tmp_path / "milvus.db"), "chunks")
    else:
        s = MilvusStore("", "chunks", embedded_dir=tmp_path)
    s.ensure_schema(DIM)
    yield s
    s.close()
    if request.param == "server":
        from rag_core.stores.milvus_server import stop_server

        stop_server(tmp_path)


def test_bulk_load_fills_an_empty_collection_like_upsert_and_refuses_a_filled_one(store):
    vecs = unit(600)
    chunks = [chunk(i, category="rare" if i % 7 == 0 else "cat") for i in range(600)]  # > one insert batch
    chunks[3] = chunk(3, text="etcd leader election")
    done = store.bulk_load(chunks, vecs)
    assert done.rows == 600 and done.write_s > 0 and done.index_s >= 0
    assert store.count() == 600 and store.pending_rows == 0
    assert store.chunk_hashes()["c599"] == ("d.md", "h599")
    assert [h.chunk_id for h in store.search(vecs[42], 1, "rare")] == ["c42"]
    assert store.search_lexical(["etcd", "leader"], vecs[0], 3)[0].chunk_id == "c3"  # lexical column written
    with pytest.raises(StoreError, match="empty"):
        store.bulk_load([chunk(9999)], unit(1))
    bad = unit(1)
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="c5000"):
        store.bulk_load([chunk(5000)], bad)
    assert store.count() == 600


@pytest.mark.integration
def test_upsert_search_count_and_hashes(store):
    vecs = unit(5)
    store.upsert([chunk(i) for i in range(5)], vecs)
    assert store.count() == 5
    hits = store.search(vecs[3], 2)
    assert hits[0].chunk_id == "c3" and hits[0].raw_score == pytest.approx(1.0, abs=1e-4)
    assert hits[0].score_label == "milvus_cosine_similarity[-1,1]" and 0 <= hits[1].similarity <= 1
    assert store.chunk_hashes()["c2"] == ("d.md", "h2")
    store.upsert([chunk(2, text="changed")], vecs[2:3])  # same id: replaced, not duplicated
    assert store.count() == 5


@pytest.mark.integration
def test_delete_by_document_and_chunk(store):
    store.upsert([chunk(0, doc="a.md"), chunk(1, doc="a.md"), chunk(2, doc='b"q\\.md')], unit(3))
    store.delete_documents(['b"q\\.md'])
    assert set(store.chunk_hashes()) == {"c0", "c1"}
    store.delete_chunks(["c0"])
    assert set(store.chunk_hashes()) == {"c1"}


@pytest.mark.integration
def test_document_centroids_are_one_stored_row_per_document(store):
    vecs = unit(3)
    evil = 'b" or doc_id != "'
    store.upsert([chunk(0, doc="a.md"), chunk(1, doc=evil), chunk(2, doc="c.md")], vecs)
    assert store.centroid_doc_ids() == set()
    store.put_centroids({"a.md": vecs[0], evil: vecs[1], "c.md": vecs[2]})
    found = store.document_centroids(["a.md", evil, "missing.md", "a.md"])
    assert set(found) == {"a.md", evil}
    np.testing.assert_array_equal(found["a.md"], vecs[0])  # float32 stored exactly
    store.put_centroids({"a.md": vecs[2]})  # replaced by doc id
    np.testing.assert_array_equal(store.document_centroids(["a.md"])["a.md"], vecs[2])
    store.delete_centroids([evil, "missing.md"])
    assert store.centroid_doc_ids() == {"a.md", "c.md"}
    assert store.document_centroids([]) == {}


@pytest.mark.integration
def test_an_index_built_before_centroids_says_it_needs_an_ingest_until_ensure_schema(store):
    store.upsert([chunk(0)], unit(1))
    store._call("drop", lambda c: c.drop_collection(store.centroid_collection))  # as the previous version left it
    store.close()
    with pytest.raises(MissingCentroidsError, match="run `rag ingest`"):
        store.document_centroids(["d.md"])
    assert store.centroid_doc_ids() == set()
    store.ensure_schema(DIM)  # what the next ingest does first
    assert store.document_centroids(["d.md"]) == {}


@pytest.mark.integration
def test_category_filter_with_quotes_matches_only_itself(store):
    evil = 'x" or category != "'
    cats = ["plain", evil, 'back\\slash"', "x"]
    store.upsert([chunk(i, category=c) for i, c in enumerate(cats)], unit(4))
    q = unit(1, seed=9)[0]
    for c in cats:
        assert {h.category for h in store.search(q, 10, category=c)} == {c}
    assert [h.category for h in store.search_lexical(["redi"], q, 10, category=evil)] == [evil]


@pytest.mark.integration
def test_lexical_search_carries_cosine(store):
    vecs = unit(3)
    store.upsert([chunk(0, text="etcd leader election"), chunk(1), chunk(2)], vecs)
    hits = store.search_lexical(["etcd", "leader"], vecs[0], 5)
    assert hits[0].chunk_id == "c0" and hits[0].channel == "lexical"
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-4) and hits[0].lexical_score > 0


@pytest.mark.integration
def test_dimension_mismatch_fails_before_any_write(store):
    store.upsert([chunk(0)], unit(1))
    with pytest.raises(DimensionMismatchError, match=f"{DIM}.*8|8.*{DIM}"):
        store.ensure_schema(8)
    assert store.count() == 1


@pytest.mark.integration
def test_bad_vectors_are_rejected_naming_the_chunk(store):
    bad = unit(2)
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="c1"):
        store.upsert([chunk(0), chunk(1)], bad)
    with pytest.raises(ValueError, match="c0.*zero"):
        store.upsert([chunk(0)], np.zeros((1, DIM), np.float32))
    assert store.count() == 0


@pytest.mark.integration
def test_varchar_limit_counts_utf8_bytes(store):
    title = "告" * 400  # 400 characters, 1,200 UTF-8 bytes > 1,024
    with pytest.raises(ValueError, match="c7.*title.*1200"):
        store.upsert([chunk(7, title=title)], unit(1))


@pytest.mark.integration
def test_reopened_file_is_loaded_for_search(tmp_path):
    s = MilvusStore(str(tmp_path / "m.db"), "chunks")
    s.ensure_schema(DIM)
    vecs = unit(3)
    s.upsert([chunk(i) for i in range(3)], vecs)
    s.close()
    again = MilvusStore(str(tmp_path / "m.db"), "chunks")
    assert again.search(vecs[1], 1)[0].chunk_id == "c1"
    again.close()


@pytest.mark.integration
def test_missing_collection_is_a_clear_store_error(tmp_path):
    s = MilvusStore(str(tmp_path / "empty.db"), "nothing")
    with pytest.raises(StoreError, match="rag ingest"):
        s.search(unit(1)[0], 3)
    s.close()


def test_unreachable_server_fails_fast_with_redacted_uri():
    s = MilvusStore("http://user:s3cret@127.0.0.1:9", "c", timeout=2)
    t0 = time.monotonic()
    with pytest.raises(StoreError) as err:
        s.count()
    assert "s3cret" not in str(err.value)
    assert time.monotonic() - t0 < 30


def test_escape_filter_value():
    assert escape_filter_value('a"b\\c') == '"a\\"b\\\\c"'
    assert escape_filter_value("a\nb\r\nc\x1b") == '"a\\\nb\\\r\nc\x1b"'  # line breaks behind a backslash
    with pytest.raises(ValueError, match="carriage return"):
        escape_filter_value("a\rb")


@pytest.mark.integration
def test_doc_ids_and_categories_of_every_character_class_filter_exactly(store, capfd):
    """Each name as doc id and category: its centroid rows, its category filter (both channels)
    and its deletion find exactly it, with no error and nothing on stderr."""
    vecs = unit(len(HOSTILE_NAMES), seed=5)
    chunks = [
        chunk(i, doc=name, category=name, text=f"etcd leader election {i}") for i, name in enumerate(HOSTILE_NAMES)
    ]
    for c in chunks:
        store.check_chunk(c)
    store.upsert(chunks, vecs)
    store.put_centroids(dict(zip(HOSTILE_NAMES, vecs, strict=True)))
    store.flush()
    assert sorted(store.document_centroids(HOSTILE_NAMES)) == sorted(HOSTILE_NAMES)
    for i, name in enumerate(HOSTILE_NAMES):
        assert [h.doc_id for h in store.search(vecs[i], 3, category=name)] == [name]
        assert [h.doc_id for h in store.search_lexical(["etcd"], vecs[i], 3, category=name)] == [name]
    store.delete_documents(HOSTILE_NAMES[1:6])
    store.delete_centroids(HOSTILE_NAMES[1:6])
    store.flush()
    kept = sorted(HOSTILE_NAMES[:1] + HOSTILE_NAMES[6:])
    assert sorted(store.document_centroids(HOSTILE_NAMES)) == kept
    assert sorted({doc_id for doc_id, _ in store.chunk_hashes().values()}) == kept
    assert capfd.readouterr().err == ""
    with pytest.raises(ValueError, match="field doc_id: .*carriage return"):
        store.check_chunk(chunk(99, doc="lone\rcr.md"))  # ingest reports it in one line and skips it


@pytest.mark.integration
def test_filtered_search_is_the_exact_top_k_within_the_category(store):
    n = 1500
    vecs = unit(n, seed=3)
    cats = ["rare" if i % 20 == 0 else "common" for i in range(n)]
    store.upsert([chunk(i, category=c) for i, c in enumerate(cats)], vecs)
    store.flush()
    rare = np.array([c == "rare" for c in cats])
    for q in unit(5, seed=11):
        scores = np.where(rare, vecs @ q, -np.inf)
        exact = [f"c{i}" for i in np.argsort(-scores)[:10]]
        assert [h.chunk_id for h in store.search(q, 10, category="rare")] == exact


@pytest.fixture
def fast_switch(monkeypatch):
    from rag_core.stores import milvus as milvus_module

    monkeypatch.setattr(milvus_module, "SWITCH_GRACE_S", 0.0)


def twin(store, name="chunks"):
    """Another client of ``store``'s Milvus (as another process would open it) for ``name``."""
    return MilvusStore(store.uri, name) if store.is_lite else MilvusStore("", name, embedded_dir=store._embedded_dir)


def collections(store):
    return set(store._call("list", lambda c: c.list_collections()))


@pytest.mark.integration
def test_rebuild_switches_a_reader_from_the_old_index_to_the_new_one_whole(store, fast_switch):
    """Issue 26 item 7: a rebuild fills a new collection; another client reads the old one
    until the switch, the new one after it, never an empty or partial index."""
    old = unit(6)
    store.upsert([chunk(i) for i in range(6)], old)
    store.put_centroids({"d.md": old[0]})
    store.flush()
    reader = twin(store)
    assert reader.count() == 6
    np.testing.assert_array_equal(reader.document_centroids(["d.md"])["d.md"], old[0])
    new = unit(4, seed=1)
    with store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(i, text=f"new {i}") for i in range(2)], new[:2])
        fresh.flush()
        assert reader.count() == 6 and reader.search(old[5], 1)[0].chunk_id == "c5"  # the old index, whole
        fresh.upsert([chunk(i, text=f"new {i}") for i in range(2, 4)], new[2:])
        fresh.put_centroids({"d.md": new[1]})
        fresh.flush()
    hits = reader.search(new[3], 1)  # the reader's collection is gone: it follows the switch
    assert hits[0].chunk_id == "c3" and hits[0].text == "new 3"
    assert reader.count() == store.count() == 4
    np.testing.assert_array_equal(reader.document_centroids(["d.md"])["d.md"], new[1])  # the new index's
    # The old collection and its centroids are dropped.
    assert collections(store) == {fresh.collection, fresh.centroid_collection, "chunks__live"}
    reader.close()


@pytest.mark.integration
def test_failed_rebuild_keeps_the_old_index_and_drops_the_partial_one(store, fast_switch):
    store.upsert([chunk(i) for i in range(3)], unit(3))
    store.flush()
    with pytest.raises(RuntimeError, match="embedding died"), store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(9)], unit(1, seed=2))
        raise RuntimeError("embedding died")
    assert set(store.chunk_hashes()) == {"c0", "c1", "c2"}
    assert collections(store) == {"chunks", "chunks__centroids"}
    # A build left by a killed run (no handler ran) is dropped when the next rebuild starts.
    leftover = twin(store, "chunks__build_1_abcdef")
    leftover.ensure_schema(DIM)
    leftover.close()
    with store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(7)], unit(1, seed=3))
    assert set(store.chunk_hashes()) == {"c7"}
    assert collections(store) == {fresh.collection, fresh.centroid_collection, "chunks__live"}


@pytest.mark.integration
def test_drop_removes_every_collection_of_the_index(store, fast_switch):
    with store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(0)], unit(1))
        fresh.record_model(ModelIdentity("b", "m", DIM, "f"))
    assert store.count() == 1 and store.recorded_model() == ModelIdentity("b", "m", DIM, "f")
    store.drop()
    assert collections(store) == set() and not store.exists() and store.count() == 0
