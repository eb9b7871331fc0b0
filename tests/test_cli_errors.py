"""Issue 12 row 8: operator errors are one line naming the path or setting, never a traceback;
traces that cannot be spooled are reported once, loudly."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from rag_core.cli import app
from rag_core.traces.recorder import ToolInvocationRecorder


def _one_line_error(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert "Traceback" not in output
    return " ".join(lines)


def test_rag_traces_with_postgres_down_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RAG_PG_DSN", "postgresql://rag:topsecret@127.0.0.1:9/rag")
    res = CliRunner().invoke(app, ["traces"])
    assert res.exit_code == 1
    text = _one_line_error(res.output)
    assert text.startswith("traces unavailable:") and "127.0.0.1:9" in text and "topsecret" not in text


@pytest.mark.integration  # loads the real model before touching the data dir
def test_rag_ingest_into_an_unwritable_data_dir_names_the_path(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    data = blocker / "data"
    monkeypatch.setenv("RAG_DATA_DIR", str(data))
    monkeypatch.setenv("RAG_MILVUS_MODE", "file")
    res = CliRunner().invoke(app, ["ingest"])
    assert res.exit_code == 1
    text = _one_line_error(res.output)
    assert text.startswith("ingest failed:") and str(blocker) in text


@pytest.mark.sentence_transformers
def test_bad_model_path_names_the_setting_and_path(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RAG_EMBEDDING_BACKEND", "sentence-transformers")
    monkeypatch.setenv("RAG_EMBEDDING_MODEL", str(tmp_path / "no-such-model"))
    res = CliRunner().invoke(app, ["ingest"])
    assert res.exit_code == 2
    text = _one_line_error(res.output)
    assert "RAG_EMBEDDING_MODEL" in text and "no-such-model" in text


def test_unspoolable_traces_are_reported_once_and_losses_at_close(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    recorder = ToolInvocationRecorder(None, blocker / "spool.jsonl", poll_interval=0.01)
    with caplog.at_level(logging.WARNING, logger="rag_core.traces.recorder"):
        for i in range(20):
            recorder.record({"id": f"r{i}", "session_id": "s", "tool_name": "t", "input": "q", "status": "ok"})
        recorder.flush(5)
        recorder.close(timeout=5)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("not writable" in m for m in errors) == 1
    lost = [m for m in errors if "LOST" in m]
    assert len(lost) == 1 and "20 trace row(s)" in lost[0] and str(blocker) in lost[0]


def test_rag_help_prints_nothing_on_stderr():
    """Third-party import warnings (jieba's pkg_resources) are silenced where we import them."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from rag_core.cli import main; main()", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "lookup" in done.stdout
    assert done.stderr == ""
