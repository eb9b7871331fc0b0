"""Issue 12 row 10: a healthy first ingest (embedded Milvus server, real model) prints nothing at
ERROR level (no gRPC "Method not implemented" tracebacks, no "failed to get mvccTs"), and
`rag doctor` finds the fresh index healthy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLE_KNOWLEDGE_DIR

pytestmark = pytest.mark.integration

NOISE = ("ERROR", "Traceback", "Method not implemented", "mvccTs")


def _rag(args: list[str], data_dir) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(data_dir),
        "RAG_KNOWLEDGE_DIR": str(SAMPLE_KNOWLEDGE_DIR),
        "RAG_SIDECAR_ENABLED": "false",
        "RAG_TRACE_ENABLED": "false",
    }
    env.pop("RAG_MILVUS_URI", None)
    rag = Path(sys.executable).with_name("rag")
    return subprocess.run([str(rag), *args], env=env, capture_output=True, text=True, timeout=600, check=False)


def test_first_ingest_and_doctor_are_quiet(tmp_path):
    from rag_core.stores.milvus_server import stop_server

    try:
        ingest = _rag(["ingest"], tmp_path)
        assert ingest.returncode == 0, ingest.stderr
        noisy = [ln for ln in ingest.stderr.splitlines() if any(n in ln for n in NOISE)]
        assert not noisy, noisy
        doctor = _rag(["doctor"], tmp_path)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "milvus: ok" in doctor.stdout
        assert not [ln for ln in doctor.stderr.splitlines() if any(n in ln for n in NOISE)]
    finally:
        stop_server(tmp_path)
