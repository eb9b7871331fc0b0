"""``rag eval review``: decide mined candidate cases (``rag_core.evaluation.review``), one at a
time at the terminal or one per call from flags (for scripts). Mounted on ``rag eval`` by
``rag_core.cli.commands``.

Exit codes: 0 ok; 2 unusable input (candidate file, unknown case or doc id, missing index).
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from rag_core.cli.common import settings_or_exit
from rag_core.evaluation.mining import CandidateCase, load_candidates
from rag_core.evaluation.review import (
    DEFAULT_DECISION_LOG,
    DEFAULT_SUITE_FILE,
    ReviewError,
    Verdict,
    decide,
    pending,
    record_decision,
)
from rag_core.settings import RagSettings

__all__ = ["register_review"]

console = Console()


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def _candidate_files(settings: RagSettings, given: list[Path]) -> list[Path]:
    if given:
        missing = [p for p in given if not p.is_file()]
        if missing:
            raise _fail(f"--candidates: {missing[0]} not found")
        return given
    # The mined_cases asset's folder (rag_assets AssetFiles.candidates_dir, RAG_REPORTS_DIR aware).
    reports = Path(os.environ.get("RAG_REPORTS_DIR", "").strip() or settings.data_dir / "reports").expanduser()
    return sorted((reports / "candidates").glob("*.yaml"))


def _is_terminal() -> bool:
    """Whether a person can answer prompts (else, without --case, the candidates are listed)."""
    return sys.stdin.isatty()


def _known_doc_ids(settings: RagSettings) -> set[str]:
    from rag_core.l0 import L0Index

    try:
        return set(L0Index.load(settings.l0_index_path).entries)
    except FileNotFoundError:
        raise _fail(f"no index at {settings.l0_index_path} to check doc ids against: run `rag ingest` first") from None


def _show(index: int, total: int, c: CandidateCase) -> None:
    p, a = c.provenance, c.tool_answer
    console.print(f"\n[bold]{index}/{total} {c.id}[/bold]  {c.scenario}  score {c.score:g}", highlight=False)
    console.print(f"query: {c.query}", highlight=False, markup=False)
    console.print(
        f"seen {p.count}x in {p.sessions} session(s) on {', '.join(p.dates)}; signals: {', '.join(p.signals)}; "
        f"tool said {a.relevance}",
        highlight=False,
    )
    for n, doc in enumerate(a.top_doc_ids, start=1):
        console.print(f"  [{n}] {doc}", highlight=False, markup=False)


def _ask(c: CandidateCase) -> tuple[Verdict, list[str]] | None:
    """One decision from the terminal: None to skip; raises typer.Exit on quit."""
    while True:
        answer = typer.prompt("accept [numbers or doc ids] / u(nanswerable) / r(eject) / s(kip) / q(uit)").strip()
        if answer in ("q", "quit"):
            raise typer.Exit(0)
        if answer in ("s", "skip"):
            return None
        if answer in ("u", "unanswerable"):
            return "unanswerable", []
        if answer in ("r", "reject"):
            return "reject", []
        docs = [
            c.tool_answer.top_doc_ids[int(t) - 1] if t.isdigit() and 0 < int(t) <= len(c.tool_answer.top_doc_ids) else t
            for t in answer.replace(",", " ").split()
        ]
        if docs:
            return "accept", docs


def register_review(eval_app: typer.Typer) -> None:
    """Adds ``rag eval review`` to the evaluation CLI."""

    @eval_app.command("review")
    def review(
        candidates: list[Path] = typer.Option(
            [], "--candidates", help="Candidate file(s) (default: every <reports>/candidates/*.yaml)"
        ),
        case: str | None = typer.Option(None, "--case", help="Decide this candidate id (scripts)"),
        accept: list[str] = typer.Option([], "--accept", help="Accept with this doc id (repeatable)"),
        unanswerable: bool = typer.Option(False, "--unanswerable", help="No document answers it"),
        reject: bool = typer.Option(False, "--reject", help="Not a useful case"),
        reason: str = typer.Option("", "--reason", help="Why (kept in the decision log)"),
        reviewer: str | None = typer.Option(None, "--reviewer", help="Who decides (default: the login name)"),
        suite_file: Path = typer.Option(DEFAULT_SUITE_FILE, "--suite-file", help="Production suite case file"),
        log_file: Path = typer.Option(DEFAULT_DECISION_LOG, "--log", help="Decision log (JSONL)"),
        list_only: bool = typer.Option(False, "--list", help="List the undecided candidates and exit"),
        as_json: bool = typer.Option(False, "--json", help="With --list: print JSON"),
    ) -> None:
        """List mined candidate cases and decide them: accept with the right doc id(s), mark
        unanswerable, or reject. Accepted and unanswerable cases go to the production suite."""
        settings = settings_or_exit()
        try:
            todo = pending(load_candidates(_candidate_files(settings, candidates)), log_file)
        except (ValueError, OSError) as exc:
            raise _fail(str(exc)) from None
        who = reviewer or getpass.getuser()
        chosen = [bool(accept), unanswerable, reject]
        if sum(chosen) > 1:
            raise _fail("give one of --accept, --unanswerable, --reject")
        if not todo and case is None and not as_json:
            console.print("no undecided candidates (the mined_cases asset writes them per trace partition)")
            return
        if list_only or (case is None and not _is_terminal()):
            if as_json:
                print(json.dumps([c.model_dump(mode="json") for c in todo], indent=2, ensure_ascii=False))
            else:
                for i, c in enumerate(todo, start=1):
                    _show(i, len(todo), c)
            return
        if case is not None:
            match = [c for c in todo if c.id == case]
            if not match:
                raise _fail(f"--case {case}: no undecided candidate with this id")
            if not any(chosen):
                raise _fail("--case needs --accept DOC, --unanswerable or --reject")
            verdict: Verdict = "accept" if accept else "unanswerable" if unanswerable else "reject"
            _decide(settings, match[0], verdict, accept, who, reason, suite_file, log_file)
            return
        for i, c in enumerate(todo, start=1):
            _show(i, len(todo), c)
            asked = _ask(c)
            if asked is not None:
                why = typer.prompt("reason", default="", show_default=False)
                _decide(settings, c, asked[0], asked[1], who, why, suite_file, log_file)


def _decide(
    settings: RagSettings,
    candidate: CandidateCase,
    verdict: Verdict,
    docs: list[str],
    reviewer: str,
    reason: str,
    suite_file: Path,
    log_file: Path,
) -> None:
    known = _known_doc_ids(settings) if verdict == "accept" else set()
    try:
        decision = decide(candidate, verdict, doc_ids=docs, known_doc_ids=known, reviewer=reviewer, reason=reason)
        record_decision(decision, candidate, suite_file, log_file)
    except (ReviewError, OSError) as exc:
        raise _fail(str(exc)) from None
    where = f" -> {suite_file}" if verdict != "reject" else ""
    console.print(f"{candidate.id}: {verdict} {' '.join(docs)}{where}", highlight=False, markup=False)
