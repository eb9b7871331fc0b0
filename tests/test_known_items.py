"""The known-item query generator of the learned rerank (rag_core.evaluation.known_items): seeded
variants, names removed; the generated sets from the shared corpora (skipped when ../shared is absent)."""

from __future__ import annotations

import pytest

from rag_core.evaluation import known_items as ki

CORPORA = ki.default_corpora()


def test_variants_are_seeded_and_change_the_query():
    query = "Half or more of the Alertmanager instances within the same cluster are crashlooping"
    a = ki.word_drop(query, "en", ki.rng_for(25, "doc.md", "Meaning", "drop"))
    b = ki.word_drop(query, "en", ki.rng_for(25, "doc.md", "Meaning", "drop"))
    c = ki.word_drop(query, "en", ki.rng_for(26, "doc.md", "Meaning", "drop"))
    assert a == b and a != query and set(a.split()) <= set(query.split())
    assert a != c
    typo = ki.with_typos(query, "en", ki.rng_for(25, "doc.md", "typo"))
    changed = [(x, y) for x, y in zip(query.split(), typo.split(), strict=True) if x != y]
    assert len(changed) == ki.TYPOS
    assert ki.truncated(query, "en") == " ".join(query.split()[: ki.TRUNCATE_WORDS])
    zh = "节点上运行的 Pods 总数超过所设置容量的 95%。持续时间超过15分钟时触发告警。"
    assert len(ki.with_typos(zh, "zh", ki.rng_for(1, "x"))) == len(zh) - ki.TYPOS
    dropped = ki.word_drop(zh, "zh", ki.rng_for(3, "x"))
    assert dropped and all(part in zh for part in ki._CLAUSE.split(dropped) if part)


def test_alert_name_and_title_are_removed(tmp_path):
    path = tmp_path / "KubeletTooManyPods.md"
    path.write_text("---\ntitle: Kubelet Too Many Pods\n---\n# KubeletTooManyPods\n", encoding="utf-8")
    assert ki.title_of(path) == "Kubelet Too Many Pods"
    text = "KubeletTooManyPods fires when kubelet too many pods run on a node"
    assert ki.without_names(text, path) == "fires when run on a node"


@pytest.mark.skipif(set(CORPORA) != {"en", "zh"}, reason="shared runbook corpora absent (../shared)")
def test_generated_sets_cover_both_languages_and_never_contain_their_alert_name():
    items = ki.generate(CORPORA)
    assert items == ki.generate(CORPORA)  # same seed, same queries
    assert len({i.id for i in items}) == len(items)
    groups = {f"{i.language}->{i.corpus}" for i in items}
    assert {"en->en", "zh->zh", "zh->en", "en->zh"} <= groups
    for item in items:
        stem = item.doc_id.rsplit("/", 1)[-1].removesuffix(".md")
        if item.kind != "title":
            assert stem.lower() not in item.query.lower(), item.id
        if item.kind in ("section", "truncated", "word-drop", "typo"):
            assert item.index == f"{item.corpus}-without-{item.heading}"
    table = ki.size_table(items)
    assert "zh->zh" in table and "en->en" in table
