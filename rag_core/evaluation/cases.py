"""Golden retrieval cases: the model and a loader for YAML and JSONL case files.

A case file is YAML (a top-level ``cases:`` list, or a top-level list) or JSONL (one case
object per line). Shape of one case (DESIGN.md, "Evaluation")::

    {id: v-en-001, scenario: aiops_alert, query: "...",
     expected_docs: [kubernetes/KubeSchedulerDown.md],   # doc ids; any one is a hit
     expected_keywords: [scheduler],                      # optional
     expected_breadcrumbs: ["Kube Scheduler Down"]}       # optional

    {id: u-en-001, scenario: chat, query: "...", unanswerable: true}   # no document answers it

An unanswerable case has no ``expected_docs`` (and no keywords or breadcrumbs); it passes when
the tool does not claim support (DESIGN.md "Unanswerable cases"). Every other case needs at
least one expected doc.

Unknown keys are ignored so that case files may carry notes for people.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["KNOWN_SCENARIOS", "CaseFileError", "GoldenCase", "load_cases"]

#: Scenario types the agent service uses today; others are allowed when snake_case.
KNOWN_SCENARIOS: tuple[str, ...] = ("chat", "aiops_alert")
_SCENARIO_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class CaseFileError(ValueError):
    """A case file cannot be used. ``str()`` names the file and every problem found.

    ``problems`` holds one line per problem (case id or index, field, reason).
    """

    def __init__(self, path: str | Path, problems: list[str]):
        self.path = str(path)
        self.problems = problems
        if len(problems) == 1:
            message = f"{self.path}: {problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in problems)
            message = f"{self.path}: {len(problems)} problems:\n{lines}"
        super().__init__(message)


def _as_list(value: Any) -> Any:
    # A lone string in YAML (`expected_docs: a.md`) means a one-item list.
    return [value] if isinstance(value, str) else value


def _non_blank_items(values: list[str]) -> list[str]:
    stripped = [v.strip() for v in values]
    if any(not v for v in stripped):
        raise ValueError("items must not be blank")
    return stripped


class GoldenCase(BaseModel):
    """One golden retrieval case (DESIGN.md "Evaluation").

    ``expected_docs`` are doc ids (paths relative to the knowledge root); any one retrieved
    counts as a hit. ``expected_keywords`` must all appear (case-insensitive) in the top
    evidence text, and one of ``expected_breadcrumbs`` (if given) in a top breadcrumb, for a
    *strong* hit. ``unanswerable: true`` declares that no document answers the query
    (``expected_docs`` empty). ``scenario`` is ``chat``, ``aiops_alert`` or another snake_case type name.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    scenario: str
    query: str
    expected_docs: list[str] = Field(default_factory=list)
    expected_keywords: list[str] = Field(default_factory=list)
    expected_breadcrumbs: list[str] = Field(default_factory=list)
    unanswerable: bool = False

    @field_validator("id", mode="before")
    @classmethod
    def _id_text(cls, value: Any) -> Any:
        # YAML reads `id: 17` as an int; ids are labels, so keep them as text.
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("id")
    @classmethod
    def _id_usable(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("id must not be blank")
        # The id names the case's fixture file (<id>.json).
        if "/" in value or "\\" in value or value in {".", "..", "manifest"}:
            raise ValueError("id must be usable as a file name (no '/' or '\\', not 'manifest')")
        return value

    @field_validator("scenario")
    @classmethod
    def _scenario_known(cls, value: str) -> str:
        value = value.strip()
        if value in KNOWN_SCENARIOS or _SCENARIO_NAME.match(value):
            return value
        raise ValueError(
            f"unknown scenario type {value!r}: use {', '.join(KNOWN_SCENARIOS)} "
            "or a snake_case type name (^[a-z][a-z0-9_]*$)"
        )

    @field_validator("query")
    @classmethod
    def _query_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be blank")
        return value.strip()

    @field_validator("expected_docs", "expected_keywords", "expected_breadcrumbs", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [] if value is None else _as_list(value)

    @field_validator("expected_docs", "expected_keywords", "expected_breadcrumbs")
    @classmethod
    def _items_not_blank(cls, value: list[str]) -> list[str]:
        return _non_blank_items(value)

    @model_validator(mode="after")
    def _answerable_or_not(self) -> GoldenCase:
        if self.unanswerable and (self.expected_docs or self.expected_keywords or self.expected_breadcrumbs):
            raise ValueError("an unanswerable case has no expected_docs, expected_keywords or expected_breadcrumbs")
        if not self.unanswerable and not self.expected_docs:
            raise ValueError("expected_docs: at least one doc id is required (or set unanswerable: true)")
        return self


def load_cases(path: str | Path) -> list[GoldenCase]:
    """Load and validate every case in a YAML (``.yaml``/``.yml``) or JSONL (``.jsonl``) file.

    Other suffixes are read as YAML (which also accepts JSON). Returns cases in file order.
    Raises ``CaseFileError`` naming the file and, per problem, the case id (or index / line)
    and the field: unreadable or malformed file (with the line), no cases, invalid cases
    (all reported at once), duplicate ids (both positions named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseFileError(path, [f"cannot read file: {exc}"]) from exc
    if path.suffix.lower() == ".jsonl":
        raw = _parse_jsonl(path, text)
    else:
        raw = _parse_yaml(path, text)
    if not raw:
        raise CaseFileError(path, ["no cases found (the file or its 'cases:' list is empty)"])
    return _validate(path, raw)


def _parse_yaml(path: Path, text: str) -> list[tuple[str, Any]]:
    """Returns ``(position label, raw case)`` pairs."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CaseFileError(path, [f"malformed YAML at {where}{problem}"]) from exc
    if data is None:
        return []
    if isinstance(data, dict):
        if "cases" not in data:
            raise CaseFileError(path, ["expected a top-level 'cases:' list or a list of cases"])
        data = data["cases"] or []
    if not isinstance(data, list):
        raise CaseFileError(path, ["'cases' must be a list of case mappings"])
    return [(f"index {i}", item) for i, item in enumerate(data)]


def _parse_jsonl(path: Path, text: str) -> list[tuple[str, Any]]:
    raw: list[tuple[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw.append((f"line {number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: malformed JSON: {exc.msg} (column {exc.colno})")
    if problems:
        raise CaseFileError(path, problems)
    return raw


def _validate(path: Path, raw: list[tuple[str, Any]]) -> list[GoldenCase]:
    cases: list[GoldenCase] = []
    problems: list[str] = []
    first_seen: dict[str, str] = {}
    for where, item in raw:
        if not isinstance(item, dict):
            problems.append(f"{where}: a case must be a mapping, got {type(item).__name__}")
            continue
        label = f"case {item['id']!r} ({where})" if item.get("id") is not None else where
        try:
            case = GoldenCase.model_validate(item)
        except ValidationError as exc:
            problems.extend(f"{label}: {_field_error(err)}" for err in exc.errors())
            continue
        if case.id in first_seen:
            problems.append(f"duplicate case id {case.id!r} at {first_seen[case.id]} and {where}")
            continue
        first_seen[case.id] = where
        cases.append(case)
    if problems:
        raise CaseFileError(path, problems)
    return cases


def _field_error(err: Any) -> str:
    field = ".".join(str(part) for part in err["loc"]) or "case"
    message = err["msg"].removeprefix("Value error, ")
    return f"field '{field}': {message}"
