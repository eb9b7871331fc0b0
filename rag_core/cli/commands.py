"""The ``rag`` command line: ingest, lookup, traces, compare, eval and server (status/stop)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer

from rag_core.cli.common import console, embedder_or_exit, settings_or_exit
from rag_core.settings import RagSettings
from rag_core.text import escape_controls

app = typer.Typer(help="Knowledge retrieval for agents (lookup_knowledge).", no_args_is_help=True)


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level")) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Say where an embedded server is started (they outlive the command).
    for name in ("rag_core.stores.milvus_server", "rag_core.stores.pgserver"):
        logging.getLogger(name).setLevel(logging.INFO)


@app.command()
def ingest(
    knowledge_dir: Path | None = typer.Option(None, help="Knowledge root (default RAG_KNOWLEDGE_DIR)"),
    rebuild: bool = typer.Option(False, help="Drop and rebuild the indexes"),
    prune: bool = typer.Option(
        False,
        help="Allow removing most (or all) of the index: no documents "
        "found, or more than RAG_INGEST_MAX_REMOVE_SHARE of them gone",
    ),
    sidecar: bool | None = typer.Option(None, help="Also index into pgvector (default RAG_SIDECAR_ENABLED)"),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON"),
) -> None:
    """Ingest Markdown knowledge into Milvus (and pgvector) incrementally; print a report."""
    from rag_core.components import make_stores
    from rag_core.embedding import EmbedderLoadError
    from rag_core.embedding.openai_compat import EmbeddingEndpointError
    from rag_core.ingest.index_lock import IndexBusyError
    from rag_core.ingest.pipeline import IngestRefusedError, StalePlanError
    from rag_core.ingest.pipeline import ingest as run_ingest
    from rag_core.ingest.plan import is_failure
    from rag_core.stores.base import StoreError

    settings = settings_or_exit(knowledge_dir=knowledge_dir)
    embedder = embedder_or_exit(settings)
    stores = make_stores(settings, sidecar)
    try:
        report = run_ingest(settings, embedder, stores, rebuild=rebuild, progress=sys.stderr.isatty(), prune=prune)
    except (
        FileNotFoundError,
        NotADirectoryError,
        StoreError,
        EmbedderLoadError,
        EmbeddingEndpointError,
        IngestRefusedError,
        IndexBusyError,
        StalePlanError,
    ) as exc:
        console.print(f"[red]ingest failed: {exc}{_left_behind(settings)}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except OSError as exc:  # a read-only or full data dir: one line naming the path, no traceback
        where = exc.filename or settings.data_dir
        console.print(
            f"[red]ingest failed: cannot write {where}: {exc.strerror or exc} (RAG_DATA_DIR={settings.data_dir})"
            f"{_left_behind(settings)}[/red]",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    except KeyboardInterrupt as exc:  # Ctrl-C: one line; the next run resumes from the cache
        console.print(
            f"[yellow]{exc or 'ingest interrupted: run it again to resume'}[/yellow]", highlight=False, soft_wrap=True
        )
        raise typer.Exit(130) from None
    finally:
        for s in stores:
            s.close()
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        from rag_core.cli.views import print_ingest_report

        print_ingest_report(console, report)
    if report.partial:  # exit 3: the index is usable, but some documents are missing from it
        failed = [i for i in report.skipped if is_failure(i)]
        names = sorted({escape_controls(i.path) for i in failed})
        more = f" and {len(names) - 10} more (listed above)" if len(names) > 10 else ""
        console.print(
            f"[yellow]partial ingest: {len(failed)} document(s) skipped: {', '.join(names[:10])}{more}[/yellow]",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(3)


def _left_behind(settings: RagSettings) -> str:
    """The end of a failed ingest's line: which served index it changed (none: nothing visible)."""
    from rag_core.ingest.index_state import part_written

    stores = part_written(settings)
    if not stores:
        return ""
    return (
        f"; the served index of {', '.join(stores)} now holds part of this run's changes until the next "
        "`rag ingest`, which rewrites it whole from the embedding cache"
    )


@app.command()
def lookup(
    query: str = typer.Argument(..., help="Question or alert text"),
    session: str | None = typer.Option(None, help="Session id"),
    as_json: bool = typer.Option(False, "--json", help="Print the exact JSON contract"),
    wide: bool | None = typer.Option(
        None, "--wide/--stacked", help="Evidence as one table / one stanza per block (default: by terminal width)"
    ),
    explain: bool = typer.Option(
        False, "--explain", help="Also show the attempts, hit reasons, rerank arithmetic and the context pack"
    ),
) -> None:
    """Run lookup_knowledge and print the verdict and the evidence per document (or the JSON contract)."""
    from rag_core.cli.views import print_lookup
    from rag_core.lookup.tool import LookupKnowledgeTool

    tool = LookupKnowledgeTool(settings_or_exit())
    try:
        result = tool.lookup(query, session_id=session, transport="cli")
    finally:
        tool.close()
    if as_json:
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        print_lookup(console, result, wide, explain)


@app.command()
def serve(
    stdio: bool = typer.Option(False, "--stdio", help="MCP over stdin/stdout (for a local agent) instead of HTTP"),
    host: str | None = typer.Option(None, help="Bind address (default RAG_SERVE_HOST, 127.0.0.1)"),
    port: int | None = typer.Option(None, help="Port (default RAG_SERVE_PORT, 8765)"),
) -> None:
    """Serve lookup_knowledge: MCP (stdio, or streamable HTTP at /mcp) and POST /v1/lookup."""
    try:
        from rag_core.serve.runner import ServeConfigError, serve_http, serve_stdio
    except ModuleNotFoundError as exc:
        console.print(f"[red]rag serve needs the serve extra: pip install 'rag-retrieval[serve]' ({exc})[/red]")
        raise typer.Exit(2) from None
    settings = settings_or_exit(serve_host=host, serve_port=port)
    try:
        if stdio:
            serve_stdio(settings)
        else:
            serve_http(settings)
    except ServeConfigError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command()
def traces(
    last: int = typer.Option(10, "--last", min=1, help="How many recent invocations"),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON (whole, not truncated)"),
) -> None:
    """Show the most recent tool_invocation rows."""
    from rag_core.stores.base import StoreError
    from rag_core.stores.pgserver import resolve_dsn
    from rag_core.traces.store import TraceStore

    settings = settings_or_exit()
    try:
        store = TraceStore(resolve_dsn(settings), connect_timeout=settings.pg_connect_timeout_s)
        store.ensure_schema()
        rows = store.recent(last)
    except StoreError as exc:  # PostgreSQL down: one line (the DSN's password redacted)
        console.print(f"[red]traces unavailable: {exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2, ensure_ascii=False))
        return
    from rag_core.cli.views import print_traces

    print_traces(console, rows)


@app.command()
def compare(
    query: str = typer.Argument(..., help="Question or alert text"),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON"),
) -> None:
    """Query the Milvus main store and the pgvector sidecar side by side."""
    from rag_core.cli.views import print_compare
    from rag_core.compare import compare_stores

    comparison = compare_stores(settings_or_exit(), query)
    if as_json:
        print(comparison.model_dump_json(indent=2))
    else:
        print_compare(console, comparison)


@app.command()
def doctor(
    sidecar: bool | None = typer.Option(
        None, help="Also check pgvector (default: when the last ingest wrote it, or RAG_SIDECAR_ENABLED)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON"),
) -> None:
    """Verify each store the last ingest wrote: row counts, model, a sample of chunks (content
    hashes, vectors, self-search), and that the stores, the L0 index and the index state hold the
    same documents. Exit 0 when healthy, 1 when something is wrong."""
    from rag_core.components import make_stores
    from rag_core.health import check_health, written_stores

    settings = settings_or_exit()
    if sidecar is None:
        sidecar = settings.sidecar_enabled or "pgvector" in written_stores(settings)
    stores = make_stores(settings, sidecar)
    try:
        active = None
        try:
            active = embedder_or_exit(settings).identity()
        except typer.Exit:
            console.print(
                "[yellow]model not loaded: the stores' model records are checked against the index state only[/yellow]"
            )
        report = check_health(settings, stores, active, documents=True)
    finally:
        for s in stores:
            s.close()
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        if report.state_problem:
            console.print(f"[red]{report.state_problem}[/red]", highlight=False, soft_wrap=True)
        for h in report.stores:
            if h.ok:
                console.print(f"{h.store}: ok ({h.rows} rows, {h.checked_chunks} sampled chunks verified)")
            for problem in h.problems:
                console.print(f"[red]{h.store}: {problem}[/red]", highlight=False, soft_wrap=True)
        for problem in report.document_problems:  # doc ids may hold "[": no markup
            console.print(problem, style="red", markup=False, highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


server_app = typer.Typer(help="The embedded Milvus and PostgreSQL servers of the data dir.", no_args_is_help=True)
app.add_typer(server_app, name="server")


def _server_rows(settings: RagSettings) -> list[dict[str, Any]]:
    from rag_core.stores import milvus_server
    from rag_core.stores.pgserver import embedded_status

    milvus = milvus_server.server_status(settings.data_dir)
    rows = [
        {
            "server": "milvus",
            "running": milvus is not None,
            **(milvus.to_dict() if milvus else {"data_dir": str(settings.milvus_db_path)}),
            "in_use": settings.milvus_embedded,
        },
        {
            "server": "postgres",
            "running": False,
            "data_dir": str(settings.pg_data_dir.resolve()),
            "in_use": settings.pg_dsn is None,
        },
    ]
    pg = embedded_status(settings.pg_data_dir)
    if pg is not None:
        rows[1].update(pg, running=True)
    return rows


@server_app.command("status")
def server_status(as_json: bool = typer.Option(False, "--json", help="Print JSON")) -> None:
    """Show the embedded servers of the data dir (pid, URI, engine, uptime, data)."""
    rows = _server_rows(settings_or_exit())
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        from rag_core.cli.views import print_servers

        print_servers(console, rows, "embedded servers")


@server_app.command("stop")
def server_stop(as_json: bool = typer.Option(False, "--json", help="Print JSON")) -> None:
    """Stop the embedded Milvus and PostgreSQL servers of the data dir (data is kept)."""
    from rag_core.stores import milvus_server
    from rag_core.stores.base import StoreError
    from rag_core.stores.pgserver import embedded_status, stop_embedded

    settings = settings_or_exit()
    rows = _server_rows(settings)
    try:
        milvus_server.stop_server(settings.data_dir)
        if embedded_status(settings.pg_data_dir) is not None:
            stop_embedded(settings.pg_data_dir)
    except StoreError as exc:
        console.print(f"[red]stop failed: {exc}[/red]")
        raise typer.Exit(1) from None
    for r in rows:
        r["stopped"] = r["running"]
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            console.print(f"{r['server']}: " + (f"stopped (pid {r['pid']})" if r["stopped"] else "was not running"))


def _mount_eval() -> None:
    try:
        from rag_core.cli.evaluation import eval_app
    except ImportError:  # evaluation package not importable: the rest of the CLI still works
        return
    from rag_core.cli.recording import register_record, register_suites
    from rag_core.cli.review import register_review

    register_record(eval_app)
    register_suites(eval_app)
    register_review(eval_app)
    app.add_typer(eval_app, name="eval", help="Golden retrieval evaluation")


_mount_eval()
