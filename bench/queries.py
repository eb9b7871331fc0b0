"""Benchmark queries for the English runbooks corpus: the visible golden queries plus
paraphrases written for the benchmark (alert names, chat phrasings, long alert texts), so the
mix exercises the L0 category filter, the unfiltered retry and plain semantic queries."""

from __future__ import annotations

from pathlib import Path

from bench.common import SHARED

PARAPHRASES: list[str] = [
    # chat phrasings
    "pod keeps restarting with back-off",
    "my container is stuck in CrashLoopBackOff, what should I check",
    "the scheduler is not running so new pods stay pending",
    "how do I find out why a node went NotReady",
    "disk on the node is almost full, what can I delete",
    "filesystem will run out of inodes soon",
    "clocks on the hosts are drifting apart",
    "network interface on a node keeps going up and down",
    "etcd cluster has no leader",
    "etcd database is close to its space quota",
    "fsync on the etcd disk takes too long",
    "alertmanager could not send notifications to slack",
    "alertmanager configuration reload failed",
    "prometheus is writing to remote storage too slowly",
    "prometheus stopped ingesting samples",
    "prometheus config is invalid after the last change",
    "samples with out of order timestamps are being dropped",
    "deployment does not have the expected number of replicas",
    "statefulset update never finished rolling out",
    "daemonset pods are not scheduled on some nodes",
    "horizontal pod autoscaler is stuck at max replicas",
    "cpu requests in the cluster exceed the capacity",
    "namespace resource quota is almost used up",
    "persistent volume is filling up",
    "kubelet client certificate expires soon",
    "containers are being throttled on cpu",
    "kube-state-metrics cannot list objects",
    "prometheus operator fails to reconcile resources",
    "the watchdog alert is always firing, is that normal",
    # alert names and long alert texts
    "KubePodCrashLooping",
    "NodeFilesystemSpaceFillingUp",
    "PrometheusRemoteWriteBehind",
    "alert KubeAPIErrorBudgetBurn firing: the API server is burning too much error budget "
    "for the last hour, severity critical, cluster prod-eu-1",
    "TargetDown: 10% of the node-exporter targets in namespace monitoring are down",
]


def golden_queries(path: Path = SHARED / "golden" / "runbooks-visible.yaml") -> list[str]:
    """The queries of the visible runbook golden cases (empty when ../shared is absent)."""
    if not path.exists():
        return []
    from rag_core.evaluation.cases import load_cases

    return [c.query for c in load_cases(path)]


def benchmark_queries(limit: int | None = None) -> list[str]:
    """Golden queries first, then the paraphrases; ``limit`` keeps the first ones."""
    queries = list(dict.fromkeys(golden_queries() + PARAPHRASES))
    return queries[:limit] if limit else queries
