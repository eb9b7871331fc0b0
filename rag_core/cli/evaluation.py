"""``rag eval``: evaluate recorded fixtures, compare stores, gate against the baseline, calibrate a
model's thresholds (``rag_core.evaluation.calibrate``).

Exit codes: 0 ok; 1 the gate failed; 2 unusable input (case file, fixtures dir, report).
Fixtures are recorded by ``rag eval record`` (mounted by ``rag_core.cli``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rag_core.model_profiles import PROFILES_PATH, model_profile, profile_key, write_profile

if TYPE_CHECKING:  # the evaluation modules load when a command runs, not for `rag --help`
    from rag_core.evaluation.calibrate import CaseScore
    from rag_core.evaluation.cases import GoldenCase
    from rag_core.evaluation.evaluator import EvaluationReport
    from rag_core.evaluation.fixtures import FixtureSet
    from rag_core.evaluation.reports import ReportFiles

__all__ = ["eval_app"]

eval_app = typer.Typer(
    help="Golden retrieval evaluation over recorded fixtures (no stores, no model).",
    no_args_is_help=True,
)
console = Console()
err_console = Console(stderr=True)

CasesOpt = Annotated[Path, typer.Option("--cases", help="Golden case file (YAML or JSONL).", show_default=False)]
OutOpt = Annotated[Path, typer.Option("--out", help="Directory for the reports.")]
KOpt = Annotated[str, typer.Option("--k", help="Comma-separated cut-offs for recall@K.")]
StrongKOpt = Annotated[int, typer.Option("--strong-k", min=1, help="Depth for strong/medium hits.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts) instead of tables.")]


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)  # one line, also when piped
    return typer.Exit(code=2)


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise _fail(f"--k must be comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise _fail(f"--k must list positive integers, got {text!r}")
    return ks


def _cases(path: Path) -> list[GoldenCase]:
    from rag_core.evaluation.cases import CaseFileError, load_cases

    try:
        return load_cases(path)
    except CaseFileError as exc:
        raise _fail(str(exc)) from None


def _fixtures(directory: Path, cases: list[GoldenCase], *, required: bool) -> FixtureSet:
    from rag_core.evaluation.fixtures import load_fixtures
    from rag_core.evaluation.formats import FormatVersionError

    if required and not directory.is_dir():
        raise _fail(f"fixtures directory {directory} not found (record it with `rag eval record`)")
    try:
        return load_fixtures(directory, [c.id for c in cases])
    except FormatVersionError as exc:
        raise _fail(str(exc)) from None


def _print_warnings(report: EvaluationReport) -> None:
    for warning in report.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


def _file_list(files: ReportFiles) -> list[str]:
    """The JSON and Markdown files of a report, as ``--json`` lists them."""
    return [str(files.json_path), str(files.markdown_path)]


def _print_summary(columns: list[tuple[str, EvaluationReport]]) -> None:
    from rag_core.evaluation.reports import summary_rows

    first = columns[0][1]
    table = Table(title="Golden retrieval evaluation")
    table.add_column("metric")
    for name, _ in columns:
        table.add_column(name, justify="right")
    table.add_column("what it means", style="dim")
    for row in summary_rows([r.summary for _, r in columns], first.ks, first.strong_k):
        table.add_row(*row)
    console.print(table)


@eval_app.command("run")
def run(
    cases: CasesOpt,
    fixtures: Annotated[Path, typer.Option("--fixtures", help="Fixture directory of one store.")],
    out: OutOpt,
    k: KOpt = "1,3,5,10",
    name: Annotated[str, typer.Option("--name", help="Report file stem.")] = "baseline",
    strong_k: StrongKOpt = 5,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate one store's fixtures; write <name>.json, <name>.md and a recall@K chart."""
    from rag_core.evaluation.evaluator import evaluate
    from rag_core.evaluation.reports import write_baseline_report

    golden = _cases(cases)
    report = evaluate(golden, _fixtures(fixtures, golden, required=True), _parse_ks(k), strong_k)
    files = write_baseline_report(report, out, name).files
    _print_warnings(report)
    if as_json:
        _print_json({"report": report.model_dump(mode="json"), "files": _file_list(files)})
        return
    _print_summary([(report.store or "value", report)])
    console.print(f"Reports: {', '.join(_file_list(files))}", highlight=False)


@eval_app.command("compare")
def compare(
    cases: CasesOpt,
    main: Annotated[Path, typer.Option("--main", help="Fixture directory of the main store.")],
    sidecar: Annotated[Path, typer.Option("--sidecar", help="Fixture directory of the sidecar.")],
    out: OutOpt,
    k: KOpt = "1,3,5,10",
    strong_k: StrongKOpt = 5,
    as_json: JsonOpt = False,
) -> None:
    """Main store and sidecar side by side; works when the sidecar is missing or unavailable."""
    from rag_core.evaluation.evaluator import evaluate
    from rag_core.evaluation.reports import write_comparison_report

    golden = _cases(cases)
    ks = _parse_ks(k)
    main_fx = _fixtures(main, golden, required=True)
    side_fx = _fixtures(sidecar, golden, required=False)
    written = write_comparison_report(
        evaluate(golden, main_fx, ks, strong_k),
        evaluate(golden, side_fx, ks, strong_k),
        main_fx,
        side_fx,
        side_fx.store_status,
        out,
    )
    comparison, files = written.report, written.files
    status = comparison.sidecar_status
    side_report = comparison.sidecar if status.available else None
    _print_warnings(comparison.main)
    if as_json:
        _print_json(
            {
                "main": comparison.main.model_dump(mode="json"),
                "sidecar": side_report.model_dump(mode="json") if side_report else None,
                "sidecar_status": status.model_dump(),
                "files": _file_list(files),
            }
        )
        return
    columns = [(f"main {comparison.main_store or ''}".strip(), comparison.main)]
    if side_report is not None:
        columns.append((f"sidecar {comparison.sidecar_store or ''}".strip(), side_report))
    else:
        err_console.print(f"[yellow]sidecar unavailable:[/yellow] {status.reason}", highlight=False)
    _print_summary(columns)
    console.print(f"Reports: {', '.join(_file_list(files))}", highlight=False)


@eval_app.command("gate")
def gate(
    baseline: Annotated[Path, typer.Option("--baseline", help="Baseline report JSON.")],
    current: Annotated[Path, typer.Option("--current", help="Current report JSON.")],
    recall_tolerance: Annotated[
        float, typer.Option("--recall-tolerance", help="Allowed absolute recall@5 drop.")
    ] = 0.02,
    mrr_tolerance: Annotated[float, typer.Option("--mrr-tolerance", help="Allowed absolute MRR drop.")] = 0.02,
    as_json: JsonOpt = False,
) -> None:
    """Compare a current report with the baseline; exit 1 when the gate fails."""
    from rag_core.evaluation.gate import compare as gate_compare
    from rag_core.evaluation.reports import load_report

    reports = []
    for path in (baseline, current):
        try:
            reports.append(load_report(path))
        except (OSError, ValueError) as exc:
            raise _fail(f"cannot read report {path}: {exc}") from None
    result = gate_compare(reports[0], reports[1], recall_tolerance, mrr_tolerance)
    if as_json:
        _print_json(result.model_dump(mode="json"))
    else:
        console.print(result.to_markdown(), highlight=False, markup=False)
    if not result.passed:
        raise typer.Exit(code=1)


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


@eval_app.command("calibrate")
def calibrate_cmd(
    cases: Annotated[list[Path], typer.Option("--cases", help="Golden case file (repeat, paired with --fixtures)")],
    fixtures: Annotated[list[Path], typer.Option("--fixtures", help="Fixture directory recorded with the model")],
    backend: Annotated[str | None, typer.Option(help="Embedding backend (default: from the manifests)")] = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: from the manifests)")] = None,
    profiles: Annotated[Path, typer.Option(help="Model profile file to update")] = PROFILES_PATH,
    write: Annotated[bool, typer.Option("--write/--dry-run", help="Write the profile")] = True,
    objective: Annotated[str, typer.Option(help="youden (balanced separation) or agreement (accuracy)")] = "youden",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document (result, previous, file)")] = False,
) -> None:
    """Pick the thresholds that best separate answered from unanswered cases; write the profile."""
    from rag_core.evaluation.calibrate import calibrate, case_scores, model_of_fixtures
    from rag_core.evaluation.cases import load_cases
    from rag_core.evaluation.fixtures import load_fixtures

    if len(cases) != len(fixtures):
        raise typer.BadParameter("give one --fixtures directory per --cases file", param_hint="--fixtures")
    scores: list[CaseScore] = []
    sets = []
    for case_file, fx_dir in zip(cases, fixtures, strict=True):
        golden = load_cases(case_file)
        if not fx_dir.is_dir():
            raise typer.BadParameter(f"{fx_dir} is not a directory", param_hint="--fixtures")
        fs = load_fixtures(fx_dir, [c.id for c in golden])
        sets.append(fs)
        scores += case_scores(golden, fs)
    try:
        if backend is None or model is None:
            found = model_of_fixtures(sets)
            backend, model = backend or found[0], model or found[1]
        if objective not in ("youden", "agreement"):
            raise ValueError(f"--objective must be youden or agreement, got {objective!r}")
        result = calibrate(scores, objective)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    previous = model_profile(backend, model, profiles)
    written = None
    if not as_json:
        typer.echo(json.dumps({"profile": f"{backend}:{model}", **result.to_dict()}, indent=2))
        typer.echo(f"previous profile: {previous or 'none'}")
    if write:
        path = write_profile(
            backend,
            model,
            {
                **result.thresholds,
                "source": f"rag eval calibrate on {', '.join(p.name for p in cases)} ({result.cases} cases, "
                f"{result.method}; relevanceLevel agreement {result.agreement_calibrated})",
                "calibrated_at": datetime.now(UTC).strftime("%Y-%m-%d"),
            },
            profiles,
        )
        written = str(path)
        if not as_json:
            typer.echo(f"wrote {backend}:{model} to {path}")
    if as_json:
        payload = {"profile": f"{backend}:{model}", **result.to_dict(), "previous": previous, "written": written}
        typer.echo(json.dumps(payload, indent=2))


@eval_app.command("cv")
def cv_cmd(
    corpus: Annotated[
        list[str],
        typer.Option(
            "--corpus", help="LANG=DIR (en, zh; repeatable). Default: the runbooks-en / runbooks-zh suites' corpora."
        ),
    ] = [],  # noqa: B006 (typer reads the default)
    cache: Annotated[
        Path | None,
        typer.Option("--cache", help="Features, embedding caches, held-out copies (default <data_dir>/cv)."),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Report dir (default <data_dir>/reports/cv).")] = None,
    folds: Annotated[int, typer.Option("--folds", min=2, help="GroupKFold splits (by document).")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Known-item generator and fold seed.")] = 25,
    c: Annotated[float, typer.Option("--c", min=1e-6, help="Inverse L2 strength of the logistic regression.")] = 1.0,
    pairs: Annotated[str, typer.Option("--pairs", help="Pair weighting: all or delta-rr.")] = "all",
    split: Annotated[
        str,
        typer.Option(
            "--split", help="Weight sets: crosslingual (same-script + cross-lingual) or script (also per query script)."
        ),
    ] = "crosslingual",
    shrink: Annotated[
        float,
        typer.Option("--shrink", min=0.0, max=1.0, help="Share of the way from the hand weights to the fitted ones."),
    ] = 1.0,
    suites: Annotated[
        bool, typer.Option("--suites/--no-suites", help="Also score the visible golden suites (check only).")
    ] = True,
    fit: Annotated[bool, typer.Option("--fit", help="Write the ranker fitted on every known item.")] = False,
    ranker_out: Annotated[
        Path | None, typer.Option("--ranker-out", help="Ranker file (default: the shipped one for the models in use).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Cross-validate the rerank: hand weights vs a learned ranker on known-item queries from the corpora.

    Writes rerank_cv.json and rerank_cv.md (CV table per language pair with a Wilcoxon test, the visible
    suites, per fold, per kind, weights). The first run captures features through the real pipeline
    (minutes); later runs read them from --cache. Exit 2 on unusable input or without the cv extra.
    """
    from rag_core.cli.common import settings_or_exit

    if pairs not in ("all", "delta-rr"):
        raise _fail(f"--pairs must be all or delta-rr, got {pairs!r}")
    if split not in ("crosslingual", "script"):
        raise _fail(f"--split must be crosslingual or script, got {split!r}")
    try:
        import scipy  # noqa: F401
        import sklearn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise _fail(f"rag eval cv needs the cv extra: pip install 'rag-retrieval[cv]' ({exc})") from None
    from rag_core import components
    from rag_core.evaluation import cv
    from rag_core.evaluation.known_items import default_corpora, generate
    from rag_core.lookup.ranker import shipped_ranker_path

    corpora: dict[str, Path] = {}
    for spec in corpus:
        lang, sep, directory = spec.partition("=")
        if not sep or not Path(directory).is_dir():
            raise _fail(f"--corpus must be LANG=DIR with an existing DIR, got {spec!r}")
        corpora[lang.strip()] = Path(directory)
    corpora = corpora or default_corpora()
    if not corpora:
        raise _fail("no corpus: give --corpus LANG=DIR (the runbook suites' corpora in ../shared are missing)")
    settings = settings_or_exit()
    root = cache or settings.data_dir / "cv"
    try:
        items = generate(corpora, seed)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if len({i.doc_id for i in items}) < folds:
        raise _fail(f"{len(items)} known items over fewer than {folds} documents: too few for {folds} folds")
    shared: dict[str, Any] = {}
    records = cv.all_records(items, corpora, settings, root, shared)
    checks = cv.suite_records(corpora, settings, root, shared) if suites else []
    config = cv.CvConfig(c=c, pairs=pairs, split=split, shrink=shrink)
    result = cv.run_cv(items, records, folds, config, seed, checks)
    files = cv.write_report(result, out or settings.data_dir / "reports" / "cv")
    written = None
    if fit:
        embedder = shared.get("embedder") or components.make_embedder(settings)
        second = components.make_ensemble_embedder(settings)
        models = {"main": embedder.fingerprint, "second": second.fingerprint if second else ""}
        keys = {
            "main": f"{embedder.backend}:{embedder.model_id}",
            "second": f"{second.backend}:{second.model_id}" if second else "",
        }
        path = ranker_out or shipped_ranker_path(keys["main"], keys["second"])
        path.parent.mkdir(parents=True, exist_ok=True)
        data = cv.ranker_file(result, models, keys, len(items))
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written = str(path)
    if as_json:
        _print_json({"result": result.to_json(), "files": [str(p) for p in files], "ranker": written})
        return
    typer.echo(cv.markdown(result).split("\nMRR per fold")[0])  # plain: Markdown tables must not wrap
    console.print(
        f"Reports: {', '.join(str(p) for p in files)}" + (f"; ranker: {written}" if written else ""), highlight=False
    )


@eval_app.command("confidence")
def confidence_cmd(
    cache: Annotated[
        Path | None,
        typer.Option("--cache", help="Samples, embedding caches, held-out copies (default <data_dir>/cv)."),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Report dir (default <data_dir>/reports/cv).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Known-item generator, hold-out and fold seed.")] = 25,
    fit: Annotated[bool, typer.Option("--fit", help="Write the confidence model fitted on every sample.")] = False,
    suites: Annotated[
        bool, typer.Option("--suites/--no-suites", help="Also score the golden suites with the fitted model (check).")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Fit and cross-validate the calibrated confidence (rag_core.lookup.confidence) on known items,
    held-out documents and the unanswerable golden cases of the runbook corpora.

    Writes confidence_cv.json / .md (before/after per query language: top-1 precision per level,
    unanswerable labelled PRECISE/RELEVANT and found, ECE, reliability bins) and a reliability chart;
    --fit writes rag_core/lookup/calibration/<profile>.json. The first run captures the samples
    through the real pipeline (minutes); later runs read them from --cache. Exit 2 on unusable input.
    """
    from rag_core.cli.common import settings_or_exit

    try:
        import sklearn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise _fail(f"rag eval confidence needs the cv extra: pip install 'rag-retrieval[cv]' ({exc})") from None
    from rag_core.evaluation import confidence_cv as ccv
    from rag_core.evaluation.cases import load_cases
    from rag_core.evaluation.known_items import DEFAULT_SUITE_CORPORA, default_corpora, generate
    from rag_core.evaluation.suites import load_suites
    from rag_core.lookup.confidence import calibration_path

    corpora = default_corpora()
    if not corpora:
        raise _fail("no corpus: the runbook suites' corpora in ../shared are missing")
    settings = settings_or_exit()
    root = cache or settings.data_dir / "cv"
    items = ccv.subsample(generate(corpora, seed), seed=seed)
    by_dir = {s.knowledge_dir.resolve(): s for s in load_suites() if s.name.endswith("-unanswerable")}
    written = {
        lang: [c for c in load_cases(by_dir[p.resolve()].cases) if c.unanswerable]
        for lang, p in corpora.items()
        if p.resolve() in by_dir
    }
    samples = ccv.capture_samples(items, written, corpora, settings, root)
    confidence = ccv.cross_validate(samples, seed=seed)
    rows = ccv.figures(samples, confidence)
    meta = {
        "profile": profile_key(settings.embedding_backend, settings.embedding_model),
        "ensemble_backend": settings.ensemble_backend,
        "fitted": datetime.now(UTC).strftime("%Y-%m-%d"),
        "by": "rag eval confidence --fit",
        "data": f"{sum(s.answerable for s in samples)} answerable known items (seed {seed}), "
        f"{sum(s.source == 'held-out' for s in samples)} held-out-document queries, "
        f"{sum(s.source == 'written' for s in samples)} written unanswerable cases over "
        f"{', '.join(DEFAULT_SUITE_CORPORA[lang] for lang in corpora)}",
        "cv": {r["language"]: {"ece": round(r["ece"], 4), **r["after"]} for r in rows},
    }
    model = ccv.fit(samples, meta)
    checks = ccv.suite_rows(ccv.suite_samples(corpora, settings, root), model) if suites else []
    files = ccv.write_report(rows, checks, meta, out or settings.data_dir / "reports" / "cv")
    path = None
    if fit:
        path = calibration_path(settings.embedding_backend, settings.embedding_model)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(model.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if as_json:
        payload = {"figures": rows, "suites": checks, "files": [str(p) for p in files]}
        _print_json({**payload, "model": str(path) if path else None})
        return
    typer.echo(ccv.markdown(rows, checks, meta))
    console.print(
        f"Reports: {', '.join(str(p) for p in files)}" + (f"; model: {path}" if path else ""), highlight=False
    )
