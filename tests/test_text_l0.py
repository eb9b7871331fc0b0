"""Tokenisation and the L0 hint index (unit: plain inputs, no services)."""

from rag_core.l0 import L0Index, compact
from rag_core.models import KnowledgeDocument
from rag_core.text import acronym, lexical_string, lexical_terms, lexical_tokens, tokenize


def doc(doc_id, title, category="", h1=None, keywords=(), entities=(), aliases=(), body="text"):
    return KnowledgeDocument(
        doc_id=doc_id,
        title=title,
        category=category,
        body=body,
        h1=h1,
        keywords=tuple(keywords),
        entities=tuple(entities),
        aliases=tuple(aliases),
    )


def test_camel_case_alert_name_splits_and_keeps_joined_form():
    toks = tokenize("KubePodCrashLooping")
    assert toks[:4] == ["kube", "pod", "crash", "loop"]
    assert "kubepodcrashlooping" in toks


def test_full_width_and_case_are_folded():
    assert tokenize("ＲＥＤＩＳ Memory") == tokenize("redis memory")


def test_chinese_is_segmented_without_spaces():
    toks = tokenize("订单数据库复制延迟")
    assert "订单" in toks and "数据库" in toks and "延迟" in toks


def test_lexical_terms_are_ascii_and_stable():
    terms = lexical_terms(tokenize("告警 KubeAPIDown"))
    assert all(t.isascii() for t in terms)
    assert lexical_terms(tokenize("告警")) == [terms[0]]


def test_lexical_tokens_index_chinese_as_bigrams_and_long_words():
    # Bigrams let BM25 match a paraphrase that jieba segments differently.
    words = set(tokenize("客户端证书续签失败"))
    lexical = set(lexical_tokens("客户端证书续签失败"))
    assert lexical_terms(["证书"])[0] in lexical and lexical_terms(["端证"])[0] in lexical
    assert lexical_terms(["客户端"])[0] in lexical  # jieba's 3+ character words are kept
    assert "端证" not in words  # the L0 index keeps jieba's words
    assert lexical_string("告警 KubeAPIDown").split() == lexical_tokens("告警 KubeAPIDown")


def test_lexical_tokens_of_one_character_run_and_stopword_bigrams():
    assert lexical_tokens("卷") == lexical_terms(["卷"])
    assert lexical_terms(["怎么"])[0] not in lexical_tokens("怎么")


def test_lexical_tokens_add_the_acronym_of_a_name_of_three_or_more_words():
    chunk = set(lexical_tokens("Check the kube-controller-manager pods and the HorizontalPodAutoscaler."))
    assert {"kcm", "hpa"} <= chunk
    assert "kcm" in lexical_tokens("kcm 挂了")  # the query side: the abbreviation as typed
    assert "kp" not in lexical_tokens("kube-proxy")  # two words: too ambiguous to abbreviate
    assert acronym(["kube", "state", "metrics"]) == ["ksm"]
    assert acronym(["node", "2", "pool"]) == [] and acronym(["ab", "cd"]) == []
    assert "kcm" not in tokenize("kube-controller-manager")  # L0 matches names, not acronyms


def test_lexical_tokens_leave_urls_out_but_keep_the_link_text():
    text = "See [the authentication filter](https://github.com/kubernetes/apiserver/pkg/endpoints/request.go#L73)."
    tokens = lexical_tokens(text)
    assert {"authent", "filter"} <= set(tokens)
    assert not {"github", "apiserv", "endpoint", "request"} & set(tokens)
    assert lexical_tokens("curl http://10.0.0.1:9090/api/v1/alerts fails") == lexical_tokens("curl fails")


def test_content_hash_changes_with_the_lexical_analyzer(monkeypatch):
    from rag_core import text
    from rag_core.models import content_hash

    before = content_hash("t", "t", "c", "text")
    monkeypatch.setattr(text, "LEXICAL_ANALYZER_VERSION", 999)
    assert content_hash("t", "t", "c", "text") != before


def _runbook_index():
    return L0Index.build(
        [
            doc("kubernetes/KubePodCrashLooping.md", "Kube Pod Crash Looping", "kubernetes", h1="KubePodCrashLooping"),
            doc("kubernetes/KubeControllerManagerDown.md", "KubeControllerManagerDown", "kubernetes"),
            doc("kubernetes/KubeSchedulerDown.md", "KubeSchedulerDown", "kubernetes"),
            doc("kubernetes/KubeAPIDown.md", "KubeAPIDown", "kubernetes"),
            doc("etcd/etcdMembersDown.md", "etcdMembersDown", "etcd"),
            doc(
                "cache/RedisMemoryHigh.md",
                "Redis memory high",
                "cache",
                keywords=["redis", "内存"],
                entities=["redis-main"],
                aliases=["Redis 内存告警"],
            ),
            doc("policy/zh-RefundPolicy.md", "退款政策", "policy", keywords=["退款"]),
        ]
    )


def test_camel_case_name_matches_spaced_words_and_the_joined_name():
    idx = _runbook_index()
    for q in ("kube pod crash looping in prod", "KubePodCrashLooping firing", "kube-pod-crash-looping"):
        hints = idx.analyze_query(q)
        assert hints.matched_doc_ids[0] == "kubernetes/KubePodCrashLooping.md", q
        assert "Kube Pod Crash Looping" in hints.matched_titles


def test_common_name_parts_weigh_little():
    hints = _runbook_index().analyze_query("controller manager is down")
    assert hints.matched_doc_ids == ["kubernetes/KubeControllerManagerDown.md"]
    assert hints.domains == ["kubernetes"]


def test_no_match_for_unrelated_query():
    hints = _runbook_index().analyze_query("how do I bake bread")
    assert not hints.matched and hints.domains == []


def test_keywords_entities_and_chinese_aliases():
    idx = _runbook_index()
    hints = idx.analyze_query("redis-main 内存 快满了")
    assert "cache/RedisMemoryHigh.md" in hints.matched_doc_ids
    assert "内存" in hints.matched_keywords and "redis-main" in hints.entities
    zh = idx.analyze_query("客户想要退款怎么办")
    assert zh.matched_doc_ids == ["policy/zh-RefundPolicy.md"] and zh.domains == ["policy"]
    alias = idx.analyze_query("Redis内存告警又响了")
    assert "cache/RedisMemoryHigh.md" in alias.matched_doc_ids


def test_several_domains_are_all_reported():
    hints = _runbook_index().analyze_query("etcdMembersDown and KubeAPIDown at once")
    assert hints.domains == ["etcd", "kubernetes"]


def test_save_and_load_round_trip(tmp_path):
    idx = _runbook_index()
    idx.save(tmp_path / "l0.json")
    again = L0Index.load(tmp_path / "l0.json")
    q = "kube pod crash looping"
    assert again.analyze_query(q).matched_doc_ids == idx.analyze_query(q).matched_doc_ids


def test_compact_removes_punctuation_and_width():
    assert compact("Kube-Pod Crash_Looping！") == "kubepodcrashlooping"


def test_tool_reloads_l0_index_after_reingest(tmp_path):
    import os

    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.settings import RagSettings

    settings = RagSettings(data_dir=tmp_path, trace_enabled=False, _env_file=None)
    tool = LookupKnowledgeTool(settings)
    assert tool.l0 is None  # nothing ingested yet: no hints, no error
    L0Index.build([doc("a.md", "Alpha Beta Gamma")]).save(settings.l0_index_path)
    assert set(tool.l0.entries) == {"a.md"}
    L0Index.build([doc("b.md", "Delta Epsilon")]).save(settings.l0_index_path)
    os.utime(settings.l0_index_path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert set(tool.l0.entries) == {"b.md"}
