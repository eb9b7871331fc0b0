"""The knowledge sensor's change detection at 1k / 10k / 100k files (issue 23, item 5).

``python -m bench.sensor_scale [--sizes 1000,10000,100000] [--rounds 3]``. The knowledge base is
generated at run time by ``bench.kb_scale.generate`` (the runbooks recombined; skipped with a
message when ``../shared/corpora`` is absent), grown in place from one size to the next.

Per size, median of ``--rounds`` ticks, milliseconds, side by side in one run:

- ``before``: the detection as it was up to this change (``_before_tick``, kept here for the
  comparison): stat every file, and when any size or mtime moved, read and hash every file;
- ``after``: ``rag_assets.fingerprint.fingerprint``: stat every file, hash only the files whose
  size or mtime moved (per-file state in the data dir), content digest from the per-file hashes;
- ``sensor tick``: the real ``knowledge_change_sensor`` evaluated (``evaluate_tick``) after an edit.

Scenarios: ``unchanged`` (nothing moved), ``one edit`` (one file rewritten between ticks),
``first`` (no cursor, no state: both read everything). The files are in the page cache (just
written), so "read every file" is a best case; on a cold disk it costs more.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import load_average, log, parse_command_line, ratio
from bench.kb_scale import generate, load_sources
from rag_core.markdown import md_table


def _before_tick(root: Path, previous_stat: str | None) -> tuple[str, str | None]:
    """The pre-change detection: (stat digest, content digest over every file's bytes, or None
    when the stat digest equals ``previous_stat``)."""
    from rag_assets.fingerprint import stat_digest
    from rag_core.ingest.documents import doc_id_for

    stat, files = stat_digest(root)
    if stat == previous_stat:
        return stat, None
    h = hashlib.sha256()
    for path in files:
        try:
            body = path.read_bytes()
        except OSError as exc:
            body = f"unreadable {exc.errno}".encode()
        h.update(doc_id_for(path, root).encode() + b"\0" + body + b"\0")
    return stat, h.hexdigest()


def _timed(fn, *args):
    """(milliseconds, result) of ``fn(*args)``."""
    start = time.perf_counter()
    result = fn(*args)
    return (time.perf_counter() - start) * 1000, result


def _edit(path: Path, round_: int) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\nEdited in round {round_}.\n", encoding="utf-8")


def measure(root: Path, data_dir: Path, rounds: int) -> dict[str, Any]:
    """The tick times (ms, medians) of one tree; see the module docstring."""
    import dagster as dg

    from rag_assets.definitions import defs
    from rag_assets.defs.resources import RagSettingsResource
    from rag_assets.fingerprint import fingerprint
    from rag_assets.layout import AssetFiles

    state = AssetFiles.under(data_dir).sensor_state
    state.unlink(missing_ok=True)
    files = sorted(root.rglob("*.md"))
    times: dict[str, list[float]] = {k: [] for k in ("before_first", "after_first", "before_unchanged")}
    times |= {k: [] for k in ("after_unchanged", "before_edit", "after_edit", "sensor_edit", "after_hashed")}
    sensor = defs.resolve_sensor_def("knowledge_change_sensor")
    rag = RagSettingsResource(knowledge_dir=str(root), data_dir=str(data_dir))
    for r in range(rounds):
        state.unlink(missing_ok=True)
        times["before_first"].append(_timed(_before_tick, root, None)[0])
        ms, tick = _timed(fingerprint, root, None, state)
        times["after_first"].append(ms)
        stat, now = _before_tick(root, None)[0], tick.fingerprint
        times["before_unchanged"].append(_timed(_before_tick, root, stat)[0])
        times["after_unchanged"].append(_timed(fingerprint, root, now, state)[0])
        _edit(files[(r * 7919) % len(files)], r)
        times["before_edit"].append(_timed(_before_tick, root, stat)[0])
        ms, tick = _timed(fingerprint, root, now, state)
        times["after_edit"].append(ms)
        times["after_hashed"].append(tick.hashed)
        _edit(files[(r * 7919 + 1) % len(files)], r)
        context = dg.build_sensor_context(cursor=tick.fingerprint.cursor(), resources={"rag": rag}, definitions=defs)
        times["sensor_edit"].append(_timed(sensor.evaluate_tick, context)[0])
    out = {k: round(statistics.median(v), 1) for k, v in times.items()}
    out["files"] = len(files)
    for scenario in ("first", "unchanged", "edit"):
        out[f"{scenario}_ratio"] = ratio(out[f"after_{scenario}"], out[f"before_{scenario}"], 3)
    return out


def run(sizes: list[int], rounds: int) -> dict[str, Any] | str:
    """Every size's figures, or why it was skipped."""
    sources = load_sources()
    if isinstance(sources, str):
        return sources
    scratch = Path(tempfile.mkdtemp(prefix="rag-bench-sensor-"))
    root, data_dir = scratch / "kb", scratch / "data"
    results: dict[str, Any] = {"load_before": load_average(), "sizes": {}}
    try:
        made = 0
        for n in sorted(sizes):
            log(f"generating documents {made}..{n - 1}")
            generate(root, n, sources, start=made)
            made = n
            log(f"measuring {n} files")
            results["sizes"][n] = measure(root, data_dir, rounds)
        results["load_after"] = load_average()
        return results
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints the table (exit 0, also when skipped)."""
    options: dict[str, dict[str, Any]] = {
        "--sizes": dict(default="1000,10000,100000", help="comma-separated file counts"),
        "--rounds": dict(type=int, default=3),
    }
    args = parse_command_line(__doc__, options, argv, prog="python -m bench.sensor_scale")
    out = run([int(s) for s in args.sizes.split(",") if s.strip()], max(1, args.rounds))
    if isinstance(out, str):
        print(f"sensor_scale: skipped, {out}")
        return 0
    head = ["files", "unchanged before", "after", "one edit before", "after", "files read", "sensor tick"]
    rows = [
        [r["files"], r["before_unchanged"], r["after_unchanged"], r["before_edit"],
         f"{r['after_edit']} ({r['edit_ratio']}x)", f"{r['after_hashed']:g}", r["sensor_edit"], r["before_first"],
         r["after_first"]]
        for r in out["sizes"].values()
    ]  # fmt: skip
    print("\n## Knowledge sensor: change detection per tick (ms, median), before vs after\n")
    print(md_table([*head, "first before", "after"], rows))
    print(f"\nload average before {out['load_before']}, after {out['load_after']} (pid {os.getpid()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
