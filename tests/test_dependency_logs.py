"""A failing store call shows an in-process caller our one-line error; pymilvus' traceback stays
at DEBUG. The caller is a handler on the root logger, as ``logging.basicConfig`` installs (pytest's
caplog also hooks non-propagating loggers, so it would not show what a caller sees)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rag_core.stores.base import StoreError
from rag_core.stores.milvus import MilvusStore
from rag_core.stores.milvus_server import stop_server

pytestmark = pytest.mark.integration


class _Caller(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def store(tmp_path) -> Iterator[MilvusStore]:
    s = MilvusStore("", "chunks", embedded_dir=tmp_path)
    s.ensure_schema(4)
    yield s
    s.close()
    stop_server(tmp_path)


def _fail_at(store: MilvusStore, level: int) -> tuple[str, list[logging.LogRecord]]:
    """A query the server refuses (a raw line break in a filter literal: pymilvus logs the RPC
    error with its traceback at ERROR) run with the root logger at ``level``; our StoreError's
    text and the dependency records the caller's handler got."""
    root, caller = logging.getLogger(), _Caller()
    old = root.level
    root.addHandler(caller)
    root.setLevel(level)
    try:
        with pytest.raises(StoreError) as err:
            store._call("query", lambda c: c.query(store._name, filter='doc_id == "a\nb"', output_fields=["doc_id"]))
    finally:
        root.removeHandler(caller)
        root.setLevel(old)
    return str(err.value), [r for r in caller.records if r.name.startswith("pymilvus")]


_CALLER = """
import logging, sys
from rag_core.stores.base import StoreError
from rag_core.stores.milvus import MilvusStore
from rag_core.stores.milvus_server import stop_server
logging.basicConfig(level=logging.WARNING)
store = MilvusStore("", "chunks", embedded_dir=sys.argv[1])
store.ensure_schema(4)
try:
    store._call("query", lambda c: c.query(store._name, filter='doc_id == "a\\nb"', output_fields=["doc_id"]))
except StoreError as exc:
    print(exc)
finally:
    store.close()
    stop_server(sys.argv[1])
"""


def test_an_in_process_caller_sees_our_one_line_and_no_traceback(tmp_path):
    """A process that calls the library with ``logging.basicConfig`` at WARNING."""
    done = subprocess.run(
        [sys.executable, "-c", _CALLER, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.startswith("Milvus query failed on 'chunks'") and "Invalid expr" in done.stdout
    assert "Traceback" not in done.stderr and "pymilvus" not in done.stderr, done.stderr


def test_the_dependencys_detail_stays_available_at_debug(store, capfd):
    _, records = _fail_at(store, logging.DEBUG)
    assert records and all(r.levelno == logging.DEBUG for r in records)
    assert "Traceback" in records[0].getMessage()
    assert "Traceback" not in capfd.readouterr().err
