"""Memory (MiB): peak RSS of a lookup process and of the embedded Milvus server on a 100k-chunk collection.

A fresh child (``python -m bench.memory '<json spec>'``) opens ``LookupKnowledgeTool`` on the
collection the scale benchmark kept (FLAT, the runbook L0 index copied beside it) and runs lookups:
``ru_maxrss``, ``VmHWM``, the RSS sampled every 20 ms and at each step; ``server_rss_mb``: the Milvus
server's RSS after the lookups. The same child on the runbook collection is the baseline.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench import harness
from bench.common import child_json, guarded, log, make_settings, server_memory, timed
from bench.context import BenchContext

CHILD_TIMEOUT_S = 900


def _child(spec: dict[str, Any]) -> None:
    """Prints the figures of ``measure`` (as JSON) measured in this process."""
    import resource
    import threading

    import psutil

    proc = psutil.Process()
    peak, stop, rss_mb = [proc.memory_info().rss], threading.Event(), {}

    def sample() -> None:
        while not stop.wait(0.02):
            with contextlib.suppress(psutil.Error):
                peak[0] = max(peak[0], proc.memory_info().rss)

    def mark(name: str) -> None:
        rss_mb[name] = round(proc.memory_info().rss / 2**20, 1)

    threading.Thread(target=sample, daemon=True).start()
    mark("start")
    from rag_core.lookup.tool import LookupKnowledgeTool

    kb, data = Path(spec["knowledge_dir"]), Path(spec["data_dir"])
    tool = LookupKnowledgeTool(make_settings(data, kb, collection=spec["collection"], **spec["settings"]))
    mark("after_import")
    load_model_s = timed(lambda: tool.embedder.embed_query("warm-up"))[1]
    mark("after_model_load")
    rows, open_collection_s = timed(tool.store.count)
    mark("after_collection_load")
    queries, lookups = spec["queries"], spec["lookups"]
    lookup = harness.Target("lookup", lambda _h, q: tool.lookup(q, session_id="bench-memory"))
    looked = harness.measure([lookup], [queries[i % len(queries)] for i in range(lookups)])["lookup"]
    if failed := [r.message for r in looked.results if r.status != "ok"]:
        raise SystemExit(f"lookup failed: {failed[0]}")
    mark("after_lookups")
    stop.set()
    ru_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with open("/proc/self/status") as status:  # the kernel's own high-water mark of this process image
        hwm_kb = next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), None)
    out = {
        "rows": rows,
        "lookups": lookups,
        "model_load_s": round(load_model_s, 2),
        "open_collection_s": round(open_collection_s, 2),
        "lookup_ms": looked.stats.to_dict(),
        "rss_mb": rss_mb,
        "peak_rss_mb_ru_maxrss": round(ru_kb / 1024, 1),
        "peak_rss_mb_sampled": round(peak[0] / 2**20, 1),
        "peak_rss_mb_vmhwm": round(hwm_kb / 1024, 1) if hwm_kb else None,
        "torch_loaded": "torch" in sys.modules,
    }
    print(json.dumps(out))
    tool.close()


def measure(
    data_dir: Path,
    collection: str,
    knowledge_dir: Path,
    queries: list[str],
    lookups: int,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fresh child's figures (see the module doc) on ``data_dir``'s ``collection``; ``settings``:
    further ``RagSettings`` fields of the child (e.g. its embedding backend). Raises RuntimeError
    when the child fails."""
    spec = {"data_dir": str(data_dir), "collection": collection, "knowledge_dir": str(knowledge_dir)}
    spec |= {"lookups": lookups, "queries": queries, "settings": settings or {}}
    t0 = time.perf_counter()
    out = child_json("bench.memory", json.dumps(spec), fresh_rss=True, timeout=CHILD_TIMEOUT_S)
    out["process_wall_s"] = round(time.perf_counter() - t0, 2)
    out["server_rss_mb"] = server_memory(data_dir)["milvus_rss_mb"]
    return out


def run(ctx: BenchContext, collection: dict[str, Any] | None) -> dict[str, Any]:
    """The child on the runbook collection and on the scale benchmark's kept ``collection``, and the
    difference (``collection_cost_mb``)."""
    lookups = 5 if ctx.quick else 8
    kb = ctx.kb_settings
    out: dict[str, Any] = {"lookups": lookups}
    log("memory: baseline child on the runbook collection")
    baseline = partial(measure, kb.data_dir, kb.collection, ctx.knowledge_dir, ctx.queries, lookups)
    out["baseline"] = guarded("memory: baseline", baseline, 800)
    if not collection:
        out["large"] = {"error": "no large Milvus collection was kept by the scale benchmark"}
        return out
    data_dir = Path(collection["data_dir"])
    shutil.copy(kb.l0_index_path, data_dir / "l0_index.json")
    log(f"memory: child on the {collection['rows']:,}-chunk collection")
    try:
        large = partial(measure, data_dir, collection["collection"], ctx.knowledge_dir, ctx.queries, lookups)
        out["large"] = guarded("memory: large", lambda: large() | {"index": collection.get("index")}, 800)
    finally:
        from rag_core.stores.milvus_server import stop_server

        stop_server(data_dir)
    base, large = out["baseline"], out["large"]
    if harness.ok(base) and harness.ok(large):
        out["collection_cost_mb"] = {
            "peak_ru_maxrss": round(large["peak_rss_mb_ru_maxrss"] - base["peak_rss_mb_ru_maxrss"], 1),
            "peak_sampled": round(large["peak_rss_mb_sampled"] - base["peak_rss_mb_sampled"], 1),
            "peak_vmhwm": round((large["peak_rss_mb_vmhwm"] or 0) - (base["peak_rss_mb_vmhwm"] or 0), 1),
            "after_lookups": round(large["rss_mb"]["after_lookups"] - base["rss_mb"]["after_lookups"], 1),
        }
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("run the memory benchmark through `python -m bench.run --only memory`")
    _child(json.loads(sys.argv[1]))
