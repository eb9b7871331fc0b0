"""Messy knowledge base (issue 44): lookup p50/p95 and ingest seconds per document shape beside the
clean corpus, on Milvus and on pgvector, in one run.

Generated at run time from the real corpora (``../shared/corpora``, never copied into the repo):
``clean`` is the English runbook corpus as it is; every other shape is the clean corpus plus
documents of one shape, under ``messy/``:

* ``long-1k`` / ``long-10k``: one document of 1,000 / 10,000 headings (an exported wiki page or
  changelog: each section a real runbook heading and the start of its first paragraph);
* ``code-tables``: documents holding a huge code block (log lines) and a huge table;
* ``near-dup``: near-duplicate copies of real runbooks (one line added);
* ``one-paragraph``: documents of one giant paragraph (many runbooks' text, no heading, no break).

Each shape gets its own collection/table on one embedded Milvus server and one embedded PostgreSQL
(the product stores, reached by URI/DSN). Ingest (``rag_core.ingest.pipeline.ingest`` into both
stores at once) uses ``bench.kb_scale.FastFakeEmbedder`` (hash vectors: a 10k-heading ingest in
seconds), so the figures are the pipeline's and the stores', not the model's. Lookups run
``LookupKnowledgeTool.lookup`` (L0, L1 dense + BM25, rerank with document similarity; second model
off) on the golden queries, interleaved query by query over every shape and store
(``bench.harness.measure``): end to end, ``store`` (``bench.common.STORE_MS_MEANS``: the L1
searches) and the document-similarity stage (title + stored centroid). ``among`` is the share of a
shape's lookups whose candidates included one of its messy documents (that stage was asked about it).

Goal (issue 44): lookup p95 with a 10k-heading document among the candidates <= 1.5x the clean
corpus' p95, on each store.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, RUNBOOKS, Scratch, environment, log, make_settings, ratio, summarize
from bench.harness import Target, measure
from bench.kb_scale import FastFakeEmbedder, Source, golden_queries, load_sources
from rag_core.markdown import md_table_lines

SHAPES = ("clean", "long-1k", "long-10k", "code-tables", "near-dup", "one-paragraph")
GOAL_SHAPE, GOAL_LIMIT = "long-10k", 1.5
STORES = ("milvus", "pgvector")


def _lead(section: str, limit: int = 240) -> tuple[str, str]:
    """A section's heading text and the start of its first prose paragraph (at most ``limit``
    characters; no fence or heading marks left, so it cannot swallow or add sections)."""
    heading, _, body = section.partition("\n")
    paragraphs = (p.strip() for p in body.split("\n\n"))
    paragraph = next((p for p in paragraphs if p and not p.startswith(("```", "#", "|"))), "")
    return heading.lstrip("# ").strip(), re.sub(r"(?m)^#+\s*|`{3,}", "", paragraph)[:limit].strip()


def long_document(headings: int, sources: Sequence[Source]) -> str:
    """One document of ``headings`` ``##`` sections, drawn in turn from the real runbooks' sections."""
    sections = [s for src in sources for s in src.sections]
    parts = [f"---\ntitle: Exported wiki page ({headings} sections)\n---\n\n# Exported wiki page"]
    for i in range(headings):
        heading, text = _lead(sections[i % len(sections)])
        parts.append(f"## {i:05d} {heading}\n\n{text}")
    return "\n\n".join(parts) + "\n"


def code_table_document(i: int, sources: Sequence[Source], lines: int = 4000, rows: int = 3000) -> str:
    """A runbook-like document with a ``lines``-line code block of log lines and a ``rows``-row table."""
    sentences = [t for src in sources for s in src.sections if (t := _lead(s, 160)[1])]
    log_lines = [
        f"2026-12-07T10:{n // 60 % 60:02d}:{n % 60:02d}Z level=warn {sentences[(n * 7 + i) % len(sentences)]}"
        for n in range(lines)
    ]
    table = ["| # | alert | category | summary |", "|---|---|---|---|"]
    table += [
        f"| {n} | {sources[(n + i) % len(sources)].name} | {sources[(n + i) % len(sources)].category} | "
        f"{sentences[(n * 3 + i) % len(sentences)][:80].replace('|', '/')} |"
        for n in range(rows)
    ]
    return (
        f"---\ntitle: Incident dump {i}\n---\n\n# Incident dump {i}\n\nRaw logs and the alert inventory.\n\n"
        "## Logs\n\n```text\n" + "\n".join(log_lines) + "\n```\n\n## Inventory\n\n" + "\n".join(table) + "\n"
    )


def one_paragraph_document(i: int, sources: Sequence[Source], runbooks: int = 40) -> str:
    """Many runbooks' text as one paragraph: no heading, no blank line, no list."""
    picked = [sources[(i * runbooks + n) % len(sources)] for n in range(runbooks)]
    text = " ".join(
        re.sub(r"\s+", " ", re.sub(r"(?m)^#+ |^[-*] |```\w*", "", s)) for src in picked for s in src.sections
    )
    return f"---\ntitle: Notes dump {i}\n---\n\n{text.strip()}\n"


def write_shape(root: Path, shape: str, sources: Sequence[Source]) -> list[str]:
    """The clean corpus under ``root`` plus ``shape``'s documents (none for ``clean`` and
    ``warm-up``); returns their doc ids."""
    shutil.copytree(RUNBOOKS, root)
    english = [s for s in sources if s.lang == "en"]
    docs: dict[str, str] = {}
    if shape.startswith("long-"):
        n = int(shape.removeprefix("long-").replace("k", "000"))
        docs[f"messy/{shape}.md"] = long_document(n, english)
    elif shape == "code-tables":
        docs |= {f"messy/incident-dump-{i}.md": code_table_document(i, english) for i in range(3)}
    elif shape == "near-dup":
        originals = sorted(p for p in RUNBOOKS.rglob("*.md") if not p.name.startswith("_"))[:50]
        for i, path in enumerate(originals):
            text = path.read_text(encoding="utf-8").rstrip("\n")
            docs[f"messy/near-dup/{i:02d}-{path.name}"] = f"{text}\n\nCopied from {path.name} for team {i}.\n"
    elif shape == "one-paragraph":
        docs |= {f"messy/notes-dump-{i}.md": one_paragraph_document(i, sources) for i in range(3)}
    for rel, text in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return sorted(docs)


@dataclass
class Index:
    """One shape ingested into both stores."""

    shape: str
    settings: Any
    messy: list[str]
    bytes: int
    ingest: dict[str, Any] = field(default_factory=dict)


def ingest_shape(scratch: Scratch, shape: str, sources: Sequence[Source], milvus_uri: str) -> Index:
    """Generate ``shape`` and ingest it into its own Milvus collection and pgvector table."""
    from rag_core.components import make_sidecar_store
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    kb = scratch.root / "kb" / shape
    messy = write_shape(kb, shape, sources)
    name = "messy_" + shape.replace("-", "_")
    settings = make_settings(
        scratch.dir(f"data-{shape}"),
        kb,
        milvus_uri=milvus_uri,
        pg_dsn=scratch.pg_dsn(),
        collection=name,
        pg_table=name,
        ensemble_backend="none",
    )
    stores = [MilvusStore.from_settings(settings), make_sidecar_store(settings)]
    t0 = time.perf_counter()
    try:
        report = ingest(settings, FastFakeEmbedder(), stores, progress=False)
    finally:
        for store in stores:
            store.close()
    seconds = time.perf_counter() - t0
    stages = report.stage_seconds
    index = Index(shape, settings, messy, sum(p.stat().st_size for p in kb.rglob("*.md")))
    index.ingest = {
        "seconds": round(seconds, 2),
        "chunks": report.chunks_total,
        "documents": report.documents_ingested,
        **{f"{s}_write_s": round(stages.get(f"{s}_write", 0.0), 2) for s in STORES},
    }
    log(f"{shape}: {report.documents_ingested} documents, {report.chunks_total} chunks ingested in {seconds:.1f} s")
    return index


class _Asked:
    """The store, recording the doc ids the document-similarity stage asks about (the candidates)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.asked = inner, list[list[str]]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != "document_centroids":
            return attr

        def spy(doc_ids: Sequence[str]) -> Any:
            self.asked.append(list(doc_ids))
            return attr(doc_ids)

        return spy


def lookups(indexes: Sequence[Index], queries: Sequence[str], rounds: int) -> dict[str, Any]:
    """Every (shape, store) target on every query, interleaved; end to end and document-stage ms."""
    from bench.common import store_ms
    from bench.latency import build_tool
    from rag_core.components import make_sidecar_store
    from rag_core.stores.milvus import MilvusStore
    from rag_core.traces.recorder import MemoryRecorder

    embedder = FastFakeEmbedder()
    openers = {"milvus": MilvusStore.from_settings, "pgvector": make_sidecar_store}

    def target(index: Index, store_name: str) -> Target[Any, str, Any]:
        messy = set(index.messy)

        def open_() -> Any:
            store, recorder = _Asked(openers[store_name](index.settings)), MemoryRecorder()
            return build_tool(index.settings, store, embedder, recorder), store, recorder  # type: ignore[no-untyped-call]

        def after(handle: Any, result: Any) -> dict[str, Any]:
            asked = handle[1].asked[-1] if handle[1].asked else []
            stage = handle[2].rows[-1]["retrieval_details"]["stage_ms"]
            return {
                "store": store_ms(result),
                "documents": stage.get("documents_ms", 0.0),
                "among": bool(messy & set(asked)),
                "ok": result.status,
            }

        return Target(
            f"{index.shape}/{store_name}",
            lambda h, q: h[0].lookup(q, session_id="messy-kb"),
            open=open_,
            close=lambda h: h[1].inner.close(),
            after=after,
        )

    targets = [target(index, s) for index in indexes for s in STORES]
    inputs = [q for _ in range(rounds) for q in queries]
    timings = measure(targets, inputs, warmup=queries[:3])
    return {
        name: {
            "e2e": t.stats.to_dict(),
            **{k: summarize([n[k] for n in t.notes]) for k in ("store", "documents")},
            "among": round(sum(n["among"] for n in t.notes) / max(1, len(t.notes)), 3),
            "statuses": sorted({n["ok"] for n in t.notes}),
        }
        for name, t in timings.items()
    }


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goal per store: p95 of the ``GOAL_SHAPE`` lookups / p95 of the clean ones."""
    rows = []
    for store in STORES:
        messy, clean = results.get(f"{GOAL_SHAPE}/{store}"), results.get(f"clean/{store}")
        value = ratio(messy["e2e"]["p95"], clean["e2e"]["p95"]) if messy and clean else None
        rows.append({"store": store, "ratio": value, "met": None if value is None else value <= GOAL_LIMIT})
    return rows


def report(out: dict[str, Any]) -> str:
    """The Markdown tables: per shape and store, ingest and lookup figures with ratios to clean."""
    lines = [f"# Messy knowledge base ({out['queries']} golden queries x {out['rounds']}, {out['when']})", ""]
    head = ["shape", "docs", "chunks", "MB", "ingest s", "x clean", "store", "p50 ms", "p95 ms", "p95 x clean"]
    head += ["store p95 ms", "documents stage p95 ms", "among"]
    rows = []
    for shape, ing in out["ingest"].items():
        clean_s = out["ingest"]["clean"]["seconds"]
        for store in STORES:
            lk, base = out["lookups"].get(f"{shape}/{store}"), out["lookups"].get(f"clean/{store}")
            if not lk:
                continue
            rows.append(
                [shape, ing["documents"], ing["chunks"], ing["mb"], ing["seconds"], ratio(ing["seconds"], clean_s, 2)]
                + [
                    store,
                    lk["e2e"]["p50"],
                    lk["e2e"]["p95"],
                    ratio(lk["e2e"]["p95"], base["e2e"]["p95"], 2) if base else None,
                ]
                + [lk["store"]["p95"], lk["documents"]["p95"], lk["among"]]
            )
    lines += md_table_lines(head, rows)
    lines += [
        "",
        f"Goal: lookup p95 with a 10k-heading document among the candidates <= {GOAL_LIMIT}x the clean p95",
        "",
    ]
    lines += md_table_lines(
        ["store", f"{GOAL_SHAPE} p95 / clean p95", "met"],
        [[g["store"], g["ratio"], {True: "yes", False: "no", None: "not run"}[g["met"]]] for g in out["goals"]],
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.messy_kb", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, from: " + ", ".join(SHAPES))
    parser.add_argument("--queries", type=int, default=40, help="golden queries used (the first N)")
    parser.add_argument("--rounds", type=int, default=1, help="passes over the queries")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "messy_kb.json")
    args = parser.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if unknown := sorted(set(shapes) - set(SHAPES)):
        parser.error(f"--shapes: unknown shape {unknown[0]!r} (known: {', '.join(SHAPES)})")
    if "clean" not in shapes:
        shapes.insert(0, "clean")  # every ratio is to it
    sources = load_sources()
    if isinstance(sources, str):
        log(f"messy_kb skipped: {sources}")
        return 0
    from rag_core.stores import milvus_server

    scratch = Scratch()
    servers = scratch.dir("milvus")
    try:
        uri = milvus_server.ensure_server(servers).uri
        ingest_shape(scratch, "warm-up", sources, uri)  # imports and first connections, not reported
        indexes = [ingest_shape(scratch, shape, sources, uri) for shape in shapes]
        queries = golden_queries()[: args.queries]
        out: dict[str, Any] = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "environment": environment(),
            "queries": len(queries),
            "rounds": args.rounds,
            "ingest": {
                i.shape: {**i.ingest, "mb": round(i.bytes / 2**20, 1), "messy_docs": len(i.messy)} for i in indexes
            },
            "lookups": lookups(indexes, queries, args.rounds),
        }
        out["goals"] = goals(out["lookups"])
    finally:
        milvus_server.stop_server(servers)
        scratch.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    text = report(out)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
