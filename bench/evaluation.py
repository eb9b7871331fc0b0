"""Offline evaluation throughput: cases/s of ``load_fixtures`` + ``evaluate`` for 1,000 golden
cases whose fixtures are generated with ``rag_core.evaluation.testing`` helpers in a temp dir.

Fixtures look like recorded ones: five evidence blocks of about 80 words each and five more
candidates, expected docs at varied ranks (or absent), keywords present or not, breadcrumbs on
a third of the cases. Generation is not timed. Needs no store and no model.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from bench.common import profile_top, summarize, timed

TARGET_CASES_PER_S = 1000.0

_CATEGORIES = ("kubernetes", "node", "etcd", "prometheus", "alertmanager", "general")
_WORDS = (
    "pod node etcd scheduler kubelet alert disk memory cpu latency quota volume network "
    "certificate replica deployment daemonset statefulset restart crash backoff leader "
    "member grpc fsync compaction wal target scrape rule evaluation notification receiver "
    "silence inhibit config reload timeout error budget burn throttling limit request "
    "filesystem inode descriptor clock skew drift interface flapping upgrade version "
    "mitigation diagnosis impact meaning runbook check logs describe events metrics"
).split()


def _text(rng: random.Random, words: int, extra: list[str] = ()) -> str:
    out = [rng.choice(_WORDS) for _ in range(words)]
    for kw in extra:
        out.insert(rng.randrange(len(out) + 1), kw)
    return " ".join(out).capitalize() + "."


def generate(directory: Path, n: int = 1000, seed: int = 7) -> list[Any]:
    """Write ``n`` fixtures + a manifest into ``directory``; return the matching golden cases."""
    from rag_core.evaluation.cases import GoldenCase
    from rag_core.evaluation.testing import make_fixture, make_manifest, write_fixture_dir

    rng = random.Random(seed)
    docs = [f"{rng.choice(_CATEGORIES)}/Doc{i:03d}.md" for i in range(300)]
    cases, fixtures = [], []
    for i in range(n):
        expected = rng.choice(docs)
        keywords = rng.sample(_WORDS, 2)
        crumbs = [f"{Path(expected).stem} > Diagnosis"] if i % 3 == 0 else []
        cases.append(
            GoldenCase(
                id=f"bench-{i:04d}",
                scenario=rng.choice(("chat", "aiops_alert")),
                query=_text(rng, 8),
                expected_docs=[expected],
                expected_keywords=keywords,
                expected_breadcrumbs=crumbs,
            )
        )
        others = rng.sample([d for d in docs if d != expected], 9)
        roll = rng.random()
        if roll < 0.7:  # expected doc among the evidence blocks
            evidence = others[:4]
            evidence.insert(rng.randrange(5), expected)
            extra = others[4:9]
        elif roll < 0.8:  # only further down the candidates
            evidence, extra = others[:5], others[5:8] + [expected] + others[8:]
        else:  # not retrieved
            evidence, extra = others[:5], others[5:]
        content = {d: _text(rng, 80, keywords if d == expected and rng.random() < 0.6 else []) for d in evidence}
        breadcrumbs = {d: f"{Path(d).stem} > {rng.choice(('Meaning', 'Impact', 'Diagnosis'))}" for d in evidence}
        fixtures.append(
            make_fixture(cases[-1].id, evidence, content=content, breadcrumbs=breadcrumbs, extra_candidates=extra)
        )
    write_fixture_dir(directory, fixtures, make_manifest("milvus", case_count=n))
    return cases


def run(n_cases: int = 1000, repeats: int = 3, seed: int = 7, workdir: Path | None = None) -> dict[str, Any]:
    from rag_core.evaluation.evaluator import evaluate
    from rag_core.evaluation.fixtures import load_fixtures

    with tempfile.TemporaryDirectory(prefix="rag-bench-eval-", dir=workdir) as tmp:
        directory = Path(tmp) / "fixtures"
        cases, generate_s = timed(lambda: generate(directory, n_cases, seed))
        ids = [c.id for c in cases]
        runs = []
        for _ in range(repeats):
            fixtures, load_s = timed(lambda: load_fixtures(directory, ids))
            report, evaluate_s = timed(lambda: evaluate(cases, fixtures))  # noqa: B023 (called at once)
            runs.append((load_s + evaluate_s, load_s, evaluate_s))
        total_s, load_s, evaluate_s = sorted(runs)[len(runs) // 2]  # the median run
        cases_per_s = n_cases / total_s
        out: dict[str, Any] = {
            "cases": n_cases,
            "repeats": repeats,
            "generate_s": round(generate_s, 3),
            "fixture_bytes": sum(p.stat().st_size for p in directory.glob("*.json")),
            "load_s": round(load_s, 4),
            "evaluate_s": round(evaluate_s, 4),
            "total_s": round(total_s, 4),
            "cases_per_s": round(cases_per_s, 1),
            "load_cases_per_s": round(n_cases / load_s, 1),
            "evaluate_cases_per_s": round(n_cases / evaluate_s, 1),
            "runs_total_s": summarize([r[0] for r in runs], 4),
            "summary": {k: getattr(report.summary, k) for k in ("strong", "medium", "miss", "not_run")}
            | {"mrr": round(report.summary.mrr or 0.0, 4)},
            "target_cases_per_s_min": TARGET_CASES_PER_S,
        }
        if cases_per_s < TARGET_CASES_PER_S:
            out["profile"] = profile_top(lambda: evaluate(cases, load_fixtures(directory, ids)), sort="tottime", top=15)
    return out
