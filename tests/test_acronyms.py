"""Acronyms of the knowledge base's compound terms (rag_core.acronyms) and their use by the query
transformer: unit cases on small texts, then the real corpora (acronyms derived from the
documents' own compounds, not from golden files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_core.acronyms import AcronymTable, compounds_of
from rag_core.ingest.documents import scan_documents
from rag_core.l0 import L0Entry, L0Index
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"


def test_compounds_come_from_prose_not_code_links_or_phrases():
    text = (
        "Prometheus cannot reach kube-controller-manager; check `kube-state-metrics` too.\n"
        "See [the docs](https://example.com/debug-application-cluster) and "
        "https://example.com/pod-priority-preemption for more.\n"
        "Latency is higher-than-expected on node-problem-detector-abc1; see `kube-proxy-xxxxx`.\n"
        "```shell\nkubectl logs kube-proxy-config-map\n```\n"
    )
    assert compounds_of(text) == ["kube-controller-manager", "kube-state-metrics"]


def test_ambiguous_and_vocabulary_acronyms_are_not_expanded():
    table = AcronymTable(
        {
            "a.md": ["kube-controller-manager", "kube-state-metric"],
            "b.md": ["kube-state-metrics", "node-problem-detector", "new-pod-deployment"],
            "c.md": ["service-monitor-name"],
        },
        vocabulary=["SMN is the name of a team"],
    )
    # kube-state-metric(s) is one compound; npd is claimed by two compounds; smn is a corpus word.
    assert table.table == {"kcm": "kube-controller-manager", "ksm": "kube-state-metrics"}


def test_query_words_expand_only_whole_and_in_one_case():
    table = AcronymTable({"a.md": ["kube-controller-manager"]})
    kcm = "kube-controller-manager"
    assert table.expansions("kcm is down, KCM again") == {"kcm": kcm, "KCM": kcm}
    assert table.expansions("Kcm kcmd xkcm kcm2") == {}
    assert table.expand("kcm 挂了") == ("kcm (kube-controller-manager) 挂了", {"kcm": "kube-controller-manager"})
    assert table.expand("nothing here") == ("nothing here", {})


def _l0() -> L0Index:
    return L0Index(
        [
            L0Entry(
                "k8s/KubeControllerManagerDown.md",
                "KubeControllerManagerDown",
                "k8s",
                ["KubeControllerManagerDown"],
                compounds=["kube-controller-manager"],
            ),
            L0Entry("k8s/KubeSchedulerDown.md", "KubeSchedulerDown", "k8s", ["KubeSchedulerDown"]),
            L0Entry("k8s/KubeProxyDown.md", "KubeProxyDown", "k8s", ["KubeProxyDown"]),
        ]
    )


def test_transformer_writes_the_compound_into_every_channel_and_the_trace():
    tq = KnowledgeQueryTransformer(_l0()).transform("kcm 挂了？")
    assert tq.acronyms == {"kcm": "kube-controller-manager"}
    assert "kube-controller-manager" in tq.rewritten
    assert {"control", "manag"} <= set(tq.lexical_terms)
    assert tq.hints.matched_doc_ids[0] == "k8s/KubeControllerManagerDown.md"
    assert tq.summary().acronyms == {"kcm": "kube-controller-manager"}
    assert KnowledgeQueryTransformer(_l0()).transform("scheduler is down").acronyms == {}


def test_compounds_survive_save_and_an_older_index_without_them_loads(tmp_path):
    path = tmp_path / "l0.json"
    _l0().save(path)
    assert L0Index.load(path).acronyms.table == {"kcm": "kube-controller-manager"}
    L0Index([L0Entry("a.md", "A", "k8s", ["A"])]).save(path)
    text = path.read_text().replace(', "compounds": []', "")
    path.write_text(text)
    assert len(L0Index.load(path).acronyms) == 0


def test_real_corpora_acronyms_name_their_documents_compounds():
    roots = [
        CORPORA / "prometheus-runbooks" / "content" / "runbooks",
        CORPORA / "kubesphere-runbooks-zh" / "content.zh" / "runbooks",
    ]
    if not all(r.is_dir() for r in roots):
        pytest.skip(f"corpora not found under {CORPORA} (../shared/corpora)")
    for root in roots:
        docs = scan_documents(root)[0]
        table = L0Index.build(docs).acronyms
        assert len(table) > 0
        transformer = KnowledgeQueryTransformer(L0Index.build(docs))
        bodies = " ".join(d.body.lower() for d in docs)
        for short, compound in table.table.items():
            assert compound in bodies  # written in some document
            assert [w[0] for w in compound.split("-")] == list(short)
            assert compound in transformer.transform(f"{short} is failing").rewritten
