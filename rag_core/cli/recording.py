"""``rag eval record`` and ``rag eval suites``: the commands of ``rag_core.recording`` (the online
stack run per golden case), mounted on the ``rag eval`` app by ``rag_core.cli.commands``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from rag_core.cli.common import settings_or_exit
from rag_core.text import escape_controls

if TYPE_CHECKING:  # the recording stack (L0, stores, models) loads when a command runs, not for --help
    from rag_core.recording.suites import SuiteOutcome

__all__ = ["register_record", "register_suites"]


def register_record(eval_app: typer.Typer) -> None:
    """Adds ``rag eval record`` to the evaluation CLI."""

    @eval_app.command("record")
    def record(
        store: str = typer.Option("milvus", "--store", help="milvus or pgvector"),
        old_store: str | None = typer.Option(None, "--path", hidden=True, help="Deprecated name of --store"),
        cases: Path = typer.Option(..., "--cases", help="Golden case file"),
        out: Path = typer.Option(..., "--out", help="Fixture directory to (re)write"),
        as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON"),
    ) -> None:
        """Run the real lookup pipeline per case on one store and write JSON fixtures."""
        from rag_core.recording.record import STORE_NAMES, record_fixtures

        if old_store is not None:
            typer.echo("warning: --path is deprecated, use --store", err=True)
            store = old_store
        if store not in STORE_NAMES:
            raise typer.BadParameter("must be milvus or pgvector", param_hint="--store")
        manifest = record_fixtures(settings_or_exit(), store, cases, out, progress=sys.stderr.isatty())  # type: ignore[arg-type]
        if as_json:
            typer.echo(manifest.model_dump_json(indent=2))
            return
        status = manifest.store_status
        typer.echo(
            f"{store}: {status.status}" + (f" ({status.reason})" if status.reason else "") + f"; fixtures in {out}"
        )


def _print_outcomes(outcomes: list[SuiteOutcome], console: Console) -> None:
    """One row per suite and store in under 80 columns (no borders, short headers with a
    legend below); a suite that did not run gets its status in the store column and its reason
    on a line below the table."""
    table = Table(title="Golden suites (main store = Milvus, sidecar = pgvector)", box=None, pad_edge=False)
    table.add_column("suite", no_wrap=True)
    table.add_column("store", no_wrap=True)
    for column in ("cases", "s/m/miss", "R@5", "MRR", "filter", "gate"):
        table.add_column(column, justify="right", no_wrap=True)
    reasons = []
    for o in outcomes:
        if o.status != "ok":
            table.add_row(o.suite, o.status, "", "", "", "", "", "")
            reasons.append(f"{o.suite}: {o.status}: {escape_controls(o.reason or '')}")
            continue
        for store, r in o.reports.items():
            s, cost = r.summary, r.filter_cost
            effects = (
                "/".join(str(cost.counts[e]) for e in ("hurt", "rescued", "helped", "no_difference")) if cost else ""
            )
            gate = "" if store != "milvus" or o.gate is None else ("pass" if o.gate.passed else "FAIL")
            status = "" if r.store_status.status == "available" else f" ({r.store_status.status})"
            table.add_row(
                o.suite,
                store + status,
                str(s.case_count),
                f"{s.strong}/{s.medium}/{s.miss}",
                _fmt(s.recall_at_k.get(5)),
                _fmt(s.mrr),
                effects,
                gate,
            )
    console.print(table)
    console.print(
        "s/m/miss: strong/medium/miss cases; R@5: recall@5; filter: L0 category filter hurt/rescued/helped/same",
        style="dim",
        highlight=False,
    )
    for reason in reasons:
        console.print(reason, highlight=False, markup=False, soft_wrap=True)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def register_suites(eval_app: typer.Typer) -> None:
    """Adds ``rag eval suites`` to the evaluation CLI."""

    @eval_app.command("suites")
    def suites(
        suite: list[str] = typer.Option([], "--suite", help="Suite name (repeatable); default all"),
        suites_file: Path = typer.Option(None, "--suites-file", help="Suites YAML (default golden/suites.yaml)"),
        out: Path = typer.Option(None, "--out", help="Report dir (default <data_dir>/reports/suites)"),
        sidecar: bool = typer.Option(True, "--sidecar/--no-sidecar", help="Also evaluate the pgvector sidecar"),
        as_json: bool = typer.Option(False, "--json", help="Print the outcomes as JSON"),
    ) -> None:
        """Ingest each suite's corpus into its own index, record both stores, evaluate, gate.

        Exit 1 when a suite's gate fails or a suite failed, 2 on an unusable suites file.
        """
        from rag_core.components import make_embedder
        from rag_core.evaluation.suites import DEFAULT_SUITES_FILE, SuiteFileError, load_suites
        from rag_core.recording.suites import run_suite

        settings = settings_or_exit()
        try:
            chosen = load_suites(suites_file or DEFAULT_SUITES_FILE)
        except SuiteFileError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        unknown = sorted(set(suite) - {s.name for s in chosen})
        if unknown:
            typer.echo(f"error: --suite: unknown suite(s) {', '.join(unknown)}", err=True)
            raise typer.Exit(2)
        embedder = make_embedder(settings)
        out_dir = out or settings.data_dir / "reports" / "suites"
        progress = sys.stderr.isatty() and not as_json  # bars on a terminal only, never in redirected output
        outcomes = [
            run_suite(settings, s, embedder, out_dir, with_sidecar=sidecar, progress=progress)
            for s in chosen
            if not suite or s.name in suite
        ]
        if as_json:
            typer.echo("[" + ",".join(o.model_dump_json(exclude={"reports"}) for o in outcomes) + "]")
        else:
            _print_outcomes(outcomes, Console())
            typer.echo(f"Reports: {out_dir}")
        if any(o.status == "failed" or (o.gate is not None and not o.gate.passed) for o in outcomes):
            raise typer.Exit(1)
