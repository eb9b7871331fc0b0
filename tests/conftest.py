"""Shared pytest fixtures (PostgreSQL ones are defined in conftest_pg.py)."""

import os
import shutil
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest_pg import pg_dsn, pg_scratch_dir, pg_settings, pg_table  # noqa: F401

from rag_core.settings import SAMPLE_KNOWLEDGE_DIR, RagSettings

SHARED = Path(__file__).resolve().parents[2] / "shared"
RUNBOOKS = SHARED / "corpora" / "prometheus-runbooks" / "content" / "runbooks"
RUNBOOKS_ZH = SHARED / "corpora" / "kubesphere-runbooks-zh" / "content.zh" / "runbooks"
VISIBLE_GOLDEN = SHARED / "golden" / "runbooks-visible.yaml"


# The README set-up leaves torch out: tests marked sentence_transformers skip then, and CI runs
# them in a second step after installing the extra (`make test-sentence-transformers`).
# Tests marked faults (tests/test_faults.py, slow) run only when asked: `-m faults` (`make faults`).
def pytest_collection_modifyitems(config, items):
    if "faults" not in (config.option.markexpr or ""):
        skip_faults = pytest.mark.skip(reason="fault injection: run with -m faults (make faults)")
        for item in items:
            if "faults" in item.keywords:
                item.add_marker(skip_faults)
    if find_spec("sentence_transformers") is not None:
        return
    skip = pytest.mark.skip(reason="needs the sentence-transformers extra: pip install '.[sentence-transformers]'")
    for item in items:
        if "sentence_transformers" in item.keywords:
            item.add_marker(skip)


# `make test` runs quiet (-q, a dot per test): a shared fixture that takes minutes (an ingest with
# the real model, a whole Dagster job) says what it is building once it passes this many seconds,
# and how long it took.
SLOW_FIXTURE_S = 20.0


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if fixturedef.scope not in ("session", "module", "package") or reporter is None or capture is None:
        yield
        return
    what = f"set-up of {fixturedef.argname} ({fixturedef.scope} fixture)"

    def say(text: str) -> None:
        with capture.global_and_fixture_disabled():  # past the output capture, onto the terminal
            reporter.write_line(f"{what}: {text}")

    timer = threading.Timer(SLOW_FIXTURE_S, say, args=("still running...",))
    start = time.monotonic()
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if time.monotonic() - start >= SLOW_FIXTURE_S:
            say(f"done in {time.monotonic() - start:.0f} s")


# Embedded servers started by tests (and by CLI subprocesses) go away on their own when a run
# is interrupted; the session fixture below stops the ones this process started.
os.environ.setdefault("RAG_EMBEDDED_IDLE_STOP_SECONDS", "120")


@pytest.fixture(scope="session", autouse=True)
def _stop_embedded_milvus_servers():
    """Stop every embedded Milvus server this test process started, at the end of the session."""
    yield
    from rag_core.stores import milvus_server

    for child in list(milvus_server._children.values()):
        milvus_server.stop_server(Path(child.args[1]).parent)


def need_shared(path: Path) -> Path:
    """Skip (with the reason) when ../shared is not beside the repo."""
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared corpora live in ../shared beside the repo")
    return path


@pytest.fixture(scope="session")
def embedder():
    """The real embedder of the default settings (loaded once per test session)."""
    from rag_core.embedding import make_embedder

    return make_embedder(make_settings(Path(".rag-tests-unused")))


def make_settings(data_dir: Path, knowledge_dir: Path = SAMPLE_KNOWLEDGE_DIR, **kw) -> RagSettings:
    return RagSettings(data_dir=data_dir, knowledge_dir=knowledge_dir, trace_enabled=False, _env_file=None, **kw)


@pytest.fixture(scope="session")
def sample_kb(tmp_path_factory, embedder):
    """The sample knowledge base ingested into Milvus Lite once: returns its settings."""
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    data = tmp_path_factory.mktemp("sample_rag")
    settings = make_settings(data)
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    store.close()
    return settings


@pytest.fixture
def kb_copy(tmp_path):
    """A writable copy of part of the sample knowledge base (two folders: fast to embed)."""
    dst = tmp_path / "kb"
    for folder in ("cache", "queues"):
        shutil.copytree(SAMPLE_KNOWLEDGE_DIR / folder, dst / folder)
    return dst
