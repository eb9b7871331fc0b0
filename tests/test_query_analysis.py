"""Pasted-query analysis, fuzzy alert names, the L0 filter policy and the concurrent retriever.

Unit level: a small L0 index built from in-memory documents and a fake store that records its
calls (the real-store behaviour is covered in test_lookup.py and test_query_runbooks.py).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rag_core.l0 import L0Entry, L0Index
from rag_core.lookup.pasted import analyze_pasted, split_camel_words, strip_noise
from rag_core.lookup.postprocessor import keep_named
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer, choose_filter
from rag_core.lookup.retriever import KnowledgeDocumentRetriever, fuse_lists
from rag_core.models import StoreHit
from rag_core.settings import RagSettings

# --- pasted-query analysis ----------------------------------------------------------------


def test_plain_question_passes_through_unchanged():
    q = "pod keeps restarting with back-off, what should I check?"
    p = analyze_pasted(q)
    assert not p.pasted and p.text == q and p.alert_names == () and p.metric_names == ()


def test_alertmanager_notification_lifts_alert_name_and_keeps_summary():
    q = (
        '[FIRING:2] payments\nlabels: {alertname="KubePodCrashLooping", namespace="shop", '
        'pod="api-7d9f8b6c5d-x2kqz", severity="critical"}\n'
        "summary: container api is restarting every 5m, last state OOMKilled"
    )
    p = analyze_pasted(q)
    assert "alertmanager" in p.formats and "labels" in p.formats
    assert p.alert_names == ("KubePodCrashLooping",)
    assert "Kube Pod Crash Looping" in p.text
    assert "container api is restarting" in p.text and "OOMKilled" in p.text
    # noise: pod hash suffix, duration, severity and the FIRING marker are gone
    for noise in ("7d9f8b6c5d", "x2kqz", "5m", "critical", "FIRING"):
        assert noise not in p.text
    assert "shop" in p.label_values and "api" in p.label_values


def test_one_colon_in_a_question_is_not_a_notification():
    q = "Hi, note: the pod keeps restarting, what should I check?"
    assert not analyze_pasted(q).pasted


def test_config_assignments_in_prose_stay_text():
    q = "after I set replicas=3 and maxSurge=1 the rollout hangs"
    p = analyze_pasted(q)
    assert not p.pasted and p.text == q


def test_firing_title_names_the_alert():
    p = analyze_pasted("[FIRING:1] TargetDown (job=node-exporter namespace=monitoring)")
    assert p.alert_names == ("TargetDown",)


def test_logfmt_line_keeps_msg_and_err_drops_metadata():
    q = (
        'level=warn ts=2024-09-02T11:04:55.812Z caller=manager.go:703 component="rule manager" '
        'msg="Evaluating rule failed" err="query timed out in expression evaluation"'
    )
    p = analyze_pasted(q)
    assert p.formats == ("logfmt",)
    assert "Evaluating rule failed" in p.text and "query timed out" in p.text
    for noise in ("2024", "manager.go", "703", "warn"):
        assert noise not in p.text
    assert "rule manager" in p.label_values


def test_json_log_line_keeps_message_fields_and_strips_ip_port():
    q = (
        '{"level":"error","ts":"2024-10-21T07:55:03.114Z","caller":"notifier.go:532",'
        '"msg":"Error sending alert","err":"Post \\"http://10.0.5.3:9093/api/v2/alerts\\": '
        'context deadline exceeded","count":64}'
    )
    p = analyze_pasted(q)
    assert p.formats == ("json_log",)
    assert "Error sending alert" in p.text and "context deadline exceeded" in p.text
    assert "10.0.5.3" not in p.text and "9093" not in p.text and "notifier.go" not in p.text


def test_kubernetes_event_line_writes_reason_as_words():
    q = "Warning  BackOff  3m (x20 over 10m)  kubelet  Back-off restarting failed container"
    p = analyze_pasted(q)
    assert "k8s_event" in p.formats
    assert "Back Off" in p.text and "restarting failed container" in p.text
    assert "x20" not in p.text and "10m" not in p.text


def test_promql_lifts_metric_names_not_labels_or_functions():
    q = (
        'sum by (namespace, job_name) (rate(kube_job_status_failed{namespace="batch", '
        'job_name=~"nightly-.*"}[5m])) / sum(kube_job_spec_completions) > 0.1'
    )
    p = analyze_pasted(q)
    assert p.formats == ("promql",)
    assert p.metric_names == ("kube_job_status_failed", "kube_job_spec_completions")
    assert "kube job status failed" in p.text
    for syntax in ("rate", "sum", "namespace", "[5m]", "0.1", "{"):
        assert syntax not in p.text
    assert "batch" in p.label_values


def test_kubectl_describe_events_table():
    q = (
        "Events:\n  Type     Reason            Age                From               Message\n"
        "  ----     ------            ----               ----               -------\n"
        "  Warning  FailedScheduling  2m (x5 over 10m)   default-scheduler  0/3 nodes are available: "
        "3 Insufficient cpu."
    )
    p = analyze_pasted(q)
    assert p.formats == ("k8s_event",)
    assert p.text.startswith("Failed Scheduling") and "Insufficient cpu" in p.text
    assert "Reason" not in p.text and "----" not in p.text and "over" not in p.text


@pytest.mark.parametrize(
    ("text", "gone", "kept"),
    [
        ("etcd-0 at 10.0.0.13:2380 since 2024-03-18T02:11:40Z", ["10.0.0.13", "2380", "2024"], ["etcd"]),
        ("pod checkout-6d5f9c8b7-kq4zt in ns shop", ["6d5f9c8b7", "kq4zt"], ["checkout", "shop"]),
        ("commit 3f9a8b7c6d5e4f3a uuid 123e4567-e89b-12d3-a456-426614174000", ["3f9a8b7c", "123e4567"], ["commit"]),
        ("took 2h40m at rafthttp/probing_status.go:68", ["2h40m", "probing_status.go"], ["took"]),
    ],
)
def test_noise_is_removed_words_are_kept(text, gone, kept):
    clean, removed = strip_noise(text)
    assert removed >= 1
    assert all(g not in clean for g in gone) and all(k in clean for k in kept)


def test_split_camel_words():
    assert split_camel_words("KubeAPIErrorBudgetBurn fired") == "Kube API Error Budget Burn fired"
    assert split_camel_words("plain words stay") == "plain words stay"


def test_odd_input_never_raises():
    for q in ["{", '{"a": ', "a=", "summary:", "[FIRING:x]", "rate(", "{{{}}}", '=""', "\x00"]:
        analyze_pasted(q)


# --- L0: exact, fuzzy and partial names; named categories ---------------------------------


def _index() -> L0Index:
    names = {
        "kubernetes/KubeSchedulerDown.md": ("kubernetes", "Kube Scheduler Down", "KubeSchedulerDown"),
        "kubernetes/KubePodNotReady.md": ("kubernetes", "Kube Pod Not Ready", "KubePodNotReady"),
        "kubernetes/KubeNodeNotReady.md": ("kubernetes", "Kube Node Not Ready", "KubeNodeNotReady"),
        "kubernetes/KubeQuotaExceeded.md": ("kubernetes", "Kube Quota Exceeded", "KubeQuotaExceeded"),
        "kubernetes/KubePodCrashLooping.md": ("kubernetes", "Kube Pod Crash Looping", "KubePodCrashLooping"),
        "etcd/etcdDatabaseQuotaLowSpace.md": ("etcd", "etcd Database Quota Low Space", "etcdDatabaseQuotaLowSpace"),
        "etcd/etcdHighNumberOfFailedGRPCRequests.md": (
            "etcd",
            "etcd High Number Of Failed GRPC Requests",
            "etcdHighNumberOfFailedGRPCRequests",
        ),
        "node/NodeClockNotSynchronising.md": ("node", "Node Clock Not Synchronising", "NodeClockNotSynchronising"),
    }
    return L0Index(L0Entry(doc, title, cat, [title, stem]) for doc, (cat, title, stem) in names.items())


@pytest.fixture(scope="module")
def l0() -> L0Index:
    return _index()


@pytest.mark.parametrize(
    ("query", "doc", "reason"),
    [
        ("kubeshedulerdown firing on prod-2", "kubernetes/KubeSchedulerDown.md", "title~fuzzy:0.97"),
        (
            "etcdhighnumberoffailedgrpcrequest on etcd-1",
            "etcd/etcdHighNumberOfFailedGRPCRequests.md",
            "title~fuzzy:0.98",
        ),
        ("kube pod crash looping in shop", "kubernetes/KubePodCrashLooping.md", "title"),
        ("KUBEPODCRASHLOOPING", "kubernetes/KubePodCrashLooping.md", "title"),
    ],
)
def test_names_match_through_case_spacing_and_typos(l0, query, doc, reason):
    m = l0.analyze_query(query).match_for(doc)
    assert m is not None and reason in m.reasons


def test_fuzzy_correction_is_reported(l0):
    hints = l0.analyze_query("kubeshedulerdown firing")
    assert hints.corrections == {"kubeshedulerdown": "KubeSchedulerDown"}


def test_typo_between_two_similar_names_matches_neither():
    idx = L0Index(
        [
            L0Entry("a/AlphaServiceDown.md", "AlphaServiceDown", "a", ["AlphaServiceDown"]),
            L0Entry("a/AlphaServiceDawn.md", "AlphaServiceDawn", "a", ["AlphaServiceDawn"]),
        ]
    )
    # one letter off both names: ambiguous, so neither is matched
    assert not [m for m in idx.analyze_query("alphaservicedxwn").matches if m.name_kind == "fuzzy"]
    # one letter off one name only: matched
    (m,) = idx.analyze_query("alphasevicedown").matches
    assert m.doc_id == "a/AlphaServiceDown.md" and m.name_kind == "fuzzy"


@pytest.mark.parametrize("query", ["node clock", "quota exceeded", "kubernetes", "crashloop", "schedule the pods"])
def test_short_or_common_words_do_not_fuzzy_match(l0, query):
    assert not [m for m in l0.analyze_query(query).matches if m.name_kind == "fuzzy"]


def test_prefix_of_a_name_is_not_a_typo(l0):
    hints = l0.analyze_query("etcd database quota members")
    assert not [m for m in hints.matches if m.name_kind == "fuzzy"]


def test_named_categories_prefer_the_longer_name():
    idx = L0Index(
        [
            L0Entry("prometheus/A.md", "A", "prometheus", ["A"]),
            L0Entry("prometheus-operator/B.md", "B", "prometheus-operator", ["B"]),
        ]
    )
    assert idx.analyze_query("prometheus-operator pod restarts").named_categories == ["prometheus-operator"]
    assert idx.analyze_query("prometheus is slow").named_categories == ["prometheus"]


def test_alert_and_metric_names_are_hints(l0):
    hints = l0.analyze_query("something", alert_names=["KubeSchedulerDown"], metric_names=["node_timex_offset_seconds"])
    assert hints.alert_names == ["KubeSchedulerDown"] and hints.metric_names == ["node_timex_offset_seconds"]
    assert hints.match_for("kubernetes/KubeSchedulerDown.md").reasons[0] == "title"


# --- the filter policy --------------------------------------------------------------------


def test_named_category_wins_over_a_partial_name_match(l0):
    # the example: "quota ... exceeds" matches Kube Quota Exceeded partly; etcd is named
    tq = KnowledgeQueryTransformer(l0).transform("etcd database size exceeds 95 percent of the backend quota")
    m = tq.hints.match_for("kubernetes/KubeQuotaExceeded.md")
    assert m is not None and m.name_kind == "partial"
    assert tq.category_filter == "etcd" and tq.filter_reason == "named_category"


def test_partial_name_match_alone_gives_no_filter(l0):
    tq = KnowledgeQueryTransformer(l0).transform("the quota was exceeded in namespace shop")
    assert tq.hints.matches and tq.category_filter is None
    assert "kubernetes" in tq.hints.domains  # still a hint for the rerank


def test_whole_name_match_filters_on_its_category(l0):
    tq = KnowledgeQueryTransformer(l0).transform("kubeshedulerdown firing on prod-2")
    assert tq.category_filter == "kubernetes" and tq.filter_reason == "name_match"
    assert "Kube Scheduler Down" in tq.rewritten  # the typo written correctly for the embedding
    assert "kubeschedulerdown" in tq.lexical_terms  # and the joined name for BM25
    assert tq.original == "kubeshedulerdown firing on prod-2"


def test_named_category_against_a_name_in_another_category_is_ambiguous(l0):
    tq = KnowledgeQueryTransformer(l0).transform("KubePodCrashLooping on the etcd backup job")
    assert tq.category_filter is None and tq.filter_reason.startswith("ambiguous")


def test_filter_can_be_disabled_and_the_choice_is_kept(l0):
    tq = KnowledgeQueryTransformer(l0).transform("one etcd member is down", use_l0_filter=False)
    assert tq.category_filter is None and tq.proposed_filter == "etcd" and tq.filter_reason == "disabled"


def test_choose_filter_without_hints():
    from rag_core.l0 import L0Hints

    assert choose_filter(L0Hints()) == (None, "no_signal")


def test_pasted_query_rewrites_dense_text_and_lexical_terms(l0):
    q = 'level=error ts=2024-01-01T00:00:00Z caller=main.go:10 msg="clock not synchronising" instance="10.1.2.3:9100"'
    tq = KnowledgeQueryTransformer(l0).transform(q)
    assert tq.rewritten == "clock not synchronising"
    assert "2024" not in tq.lexical_terms and "clock" in tq.lexical_terms
    assert tq.summary().pasted.formats == ["logfmt"]


# --- post-processing: a named document keeps a place -------------------------------------


def test_keep_named_moves_a_cut_off_named_document_into_the_last_slot():
    ranked = ["a", "b", "c", "d", "named"]
    assert keep_named(ranked, {"named"}, 3, key=lambda s: s) == ["a", "b", "named"]
    assert keep_named(ranked, set(), 3, key=lambda s: s) == ["a", "b", "c"]
    # at most limit // 2 named documents are pulled up
    assert keep_named(["a", "b", "c", "d", "n1", "n2"], {"n1", "n2"}, 4, key=lambda s: s) == ["a", "b", "n1", "n2"]


# --- retriever: concurrency, fusion, failing channels ---------------------------------------


def _hit(doc: str, cos: float, channel: str) -> StoreHit:
    return StoreHit(
        chunk_id=f"{doc}#0",
        doc_id=doc,
        title=doc,
        breadcrumb=doc,
        category=doc.split("/")[0],
        text=doc,
        raw_score=cos,
        similarity=cos,
        score_label="cos",
        channel=channel,
        lexical_score=1.0 if channel == "lexical" else None,
    )


class SlowStore:
    """A fake store whose every call sleeps ``delay`` s; records calls and peak concurrency."""

    name, score_label = "fake", "cos"

    def __init__(self, delay: float = 0.2, fail: set[str] | None = None):
        self.delay, self.fail = delay, fail or set()
        self.calls: list[tuple[str, str | None]] = []
        self.active = self.peak = 0
        self._lock = threading.Lock()

    def _run(self, channel: str, category: str | None) -> list[StoreHit]:
        with self._lock:
            self.calls.append((channel, category))
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(self.delay)
        with self._lock:
            self.active -= 1
        if channel in self.fail:
            raise RuntimeError(f"{channel} channel down")
        if category == "etcd":
            return [_hit("etcd/A.md", 0.5, channel)]
        return [_hit("kubernetes/B.md", 0.7, channel), _hit("etcd/A.md", 0.5, channel)]

    def search(self, vector, top_k, category=None):
        return self._run("dense", category)

    def search_lexical(self, terms, vector, top_k, category=None):
        return self._run("lexical", category)


def _tq(l0: L0Index, query: str):
    return KnowledgeQueryTransformer(l0).transform(query)


def test_filtered_and_unfiltered_attempts_run_concurrently_and_are_fused(l0):
    store = SlowStore(delay=0.2)
    retriever = KnowledgeDocumentRetriever(
        store, RagSettings(_env_file=None, embedding_backend="sentence-transformers")
    )
    retriever.search_once(_tq(l0, "warm"), np.ones(4), None, 1)  # first use runs serially
    store.calls.clear()
    store.peak = 0
    out = retriever.retrieve(_tq(l0, "one etcd member is down"), np.ones(4))
    assert sorted(store.calls, key=str) == sorted(
        [("dense", "etcd"), ("lexical", "etcd"), ("dense", None), ("lexical", None)], key=str
    )
    assert store.peak == 4  # four 0.2 s calls side by side (how long that takes is the benchmark's)
    assert [(a.attempt, a.filter) for a in out.attempts] == [(1, "etcd"), (2, None)]
    assert all(a.duration_ms / 1000 >= 0.15 for a in out.attempts)  # each attempt timed over its calls
    # the unfiltered hit is not hidden by the filter; the in-category one is marked filtered
    by_doc = {c.hit.doc_id: c for c in out.candidates}
    assert set(by_doc) == {"kubernetes/B.md", "etcd/A.md"}
    assert by_doc["etcd/A.md"].filtered and not by_doc["kubernetes/B.md"].filtered
    assert by_doc["etcd/A.md"].attempts == {1, 2}
    assert out.fallback_reason is None and out.error is None


def test_a_failing_channel_is_recorded_and_the_other_still_counts(l0):
    store = SlowStore(delay=0.0, fail={"lexical"})
    out = KnowledgeDocumentRetriever(store, RagSettings(_env_file=None)).retrieve(_tq(l0, "pods"), np.ones(4))
    (attempt,) = out.attempts
    assert attempt.error and attempt.error.startswith("lexical: RuntimeError: lexical channel down")
    assert attempt.candidate_count == 2 and out.error is None
    assert all(c.channels == {"dense"} for c in out.candidates)


def test_all_channels_failing_is_an_outcome_error_not_an_exception(l0):
    store = SlowStore(delay=0.0, fail={"dense", "lexical"})
    out = KnowledgeDocumentRetriever(store, RagSettings(_env_file=None)).retrieve(
        _tq(l0, "one etcd member is down"), np.ones(4)
    )
    assert out.candidates == [] and out.error and len(out.attempts) == 2
    assert out.fallback_reason == "attempt_1_failed"


def test_fuse_lists_is_reciprocal_rank_fusion_over_every_list():
    a, b = _hit("x/A.md", 0.5, "dense"), _hit("x/B.md", 0.6, "dense")
    fused = fuse_lists([(1, "dense", True, [a, b]), (2, "dense", False, [b])], k=60)
    assert fused["x/A.md#0"].rrf == pytest.approx(1 / 61)
    assert fused["x/B.md#0"].rrf == pytest.approx(1 / 62 + 1 / 61)
    assert fused["x/B.md#0"].filtered and fused["x/B.md#0"].dense_rank == 1
