"""Ingest while the agent serves (issue 14 item 4): 8-thread lookups in this process while
another process runs `rag ingest` of the runbook corpus on the same embedded Milvus server."""

import pytest
from conftest import RUNBOOKS, make_settings, need_shared

from bench import serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

QUERIES = [
    "pod keeps restarting with back-off",
    "node is not ready",
    "disk will fill up in 4 hours",
    "prometheus target down",
    "etcd has no leader",
    "KubeAPIErrorBudgetBurn",
    "alertmanager config reload failed",
    "CPU throttling high",
    "persistent volume filling up",
    "kubelet too many pods",
    "deployment replicas mismatch",
    "TargetDown job=node-exporter",
]


def test_lookups_never_fail_while_another_process_ingests(tmp_path, embedder):
    corpus = need_shared(RUNBOOKS)
    settings = make_settings(tmp_path / "data", corpus)
    run = serving.run(settings, embedder, QUERIES, corpus, tmp_path / "work", threads=8, timeout_s=600)
    summary = run.summary()
    assert run.ingest_returncode == 0, run.ingest_output
    assert run.lookups_during_ingest >= 8, summary  # the two really overlapped
    assert run.failures == [], summary
    assert run.foreign_hits == [], summary  # every hit is a chunk of the old or the new index
    assert run.traces == run.lookups, summary
    assert run.new_doc_found_after, summary
