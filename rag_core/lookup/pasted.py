"""Pasted-query analysis: what an on-call agent pastes, split into signal and noise.

Agents paste an Alertmanager notification, a label set, a ``kubectl describe`` event, a log line
(logfmt or JSON) or a PromQL expression instead of a question. Embedding and BM25 then spend most
of their weight on timestamps, IPs, hashes and pod suffixes. ``analyze_pasted`` parses those
formats and returns:

- ``alert_names``: values of ``alertname``-style labels and the alert in an Alertmanager title
  (``[FIRING:1] KubePodCrashLooping ...``);
- ``metric_names``: PromQL metric names (``node_filefd_allocated``), never label or function names;
- ``text``: the informative part for the dense query and the lexical terms: message-like values
  (``msg``, ``err``, ``summary``, ``description``, event reason and message), alert and metric
  names split into words, and the free text around the structures, with noise removed
  (timestamps, IPs and ports, hashes and UUIDs, pod and job suffixes, durations, ``file.go:123``
  callers, paths, URLs);
- ``label_values``: the remaining label values, cleaned (lexical channel only: a namespace or
  job name may occur in a runbook, but it would only blur the embedding).

Key names recognised here are the formats' own field conventions (go-kit/logfmt and zap JSON
loggers, Kubernetes events, Alertmanager labels and annotations, PromQL grammar), not words
taken from any evaluation case. Plain questions pass through unchanged (``formats`` empty).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel

from rag_core.text import split_camel_words

# --- format vocabularies (field conventions of the formats, see the module docstring) ----------

# Values that are the message of a log line / notification: they carry the meaning.
MESSAGE_KEYS = frozenset(
    {
        "msg",
        "message",
        "err",
        "error",
        "errors",
        "summary",
        "description",
        "reason",
        "detail",
        "details",
        "title",
        "note",
        "cause",
    }
)
ALERT_NAME_KEYS = frozenset({"alertname", "alert_name", "alert"})
# Keys that mark a notification on their own (Alertmanager labels and annotations).
NOTIFICATION_KEYS = frozenset({"alertname", "alert_name", "summary", "description", "labels", "annotations"})
# Log and notification metadata: never informative for retrieval.
META_KEYS = frozenset(
    {
        "ts",
        "time",
        "timestamp",
        "@timestamp",
        "t",
        "caller",
        "level",
        "lvl",
        "severity",
        "func",
        "file",
        "line",
        "source",
        "logger",
        "stacktrace",
        "trace_id",
        "traceid",
        "span_id",
        "spanid",
        "request_id",
        "requestid",
        "runbook_url",
        "generatorurl",
        "fingerprint",
        "startsat",
        "endsat",
        "dashboard",
        "panel",
        "id",
        "uid",
        "pid",
        "tid",
        "index",
        "count",
        "instance",
        "endpoint",
        "metrics_path",
        "prometheus",
        "receiver",
        "status",
        "labels",
        "annotations",
        "value",
        "values",
    }
)
PROMQL_FUNCTIONS = frozenset(
    """abs absent absent_over_time avg avg_over_time bottomk ceil changes
    clamp clamp_max clamp_min count count_over_time count_values day_of_month day_of_week delta
    deriv exp floor group histogram_quantile holt_winters idelta increase irate label_join
    label_replace last_over_time ln log2 log10 max max_over_time min min_over_time predict_linear
    present_over_time quantile quantile_over_time rate resets round scalar sgn sort sort_desc
    sqrt stddev stddev_over_time stdvar stdvar_over_time sum sum_over_time time timestamp topk
    vector""".split()
)
PROMQL_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
)

# --- noise (removed from the informative text) ---------------------------------------------------

_NOISE = [
    re.compile(p)
    for p in (
        r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+",  # URLs
        r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b",  # ISO dates
        r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b",  # times
        r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b",  # IPv4[:port]
        r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",  # UUIDs
        r"(?<=[a-z])-(?=[a-z0-9]{0,9}\d)[a-z0-9]{6,10}-[a-z0-9]{5}\b",  # deploy pod suffix
        r"(?<=[a-z])-(?=[a-z0-9]{0,4}\d)[a-z0-9]{5}\b",  # pod/ds suffix
        r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b",  # hex hashes/ids
        r"\b[\w.-]+\.(?:go|py|java|rs|js|ts|c|cc|cpp|rb|kt|scala):\d+\b",  # file.go:123
        r"(?<![\w.])(?:/[\w.@-]+){2,}/?",  # absolute paths
        r"(?<=[a-z])-\d+\b",  # ordinal/job suffix
        r"\b\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h|d|w|y)(?:\d+(?:ms|s|m|h))*\b",  # durations
        r"\bx\d+\b",  # (x20 over 10m)
        r":\d{2,5}\b",  # :port
    )
]

_SPACE = re.compile(r"\s+")
_JSON_START = re.compile(r"\{\s*\"")
_QUOTED_PAIR = re.compile(r"\b([A-Za-z_][\w.]*)\s*(=~|!~|!=|=)\s*\"((?:[^\"\\]|\\.)*)\"")
_BARE_PAIR = re.compile(r"(?<![\w\"])([A-Za-z_][\w.]*)=([^\s\"',;|{}()]+)")
_COLON_PAIR = re.compile(r"(?:^|(?<=[\n|,;:{(]))\s*([a-z_][a-z0-9_]*)\s*:\s+")
_AM_TITLE = re.compile(r"\[(?:FIRING|RESOLVED)(?::\d+)?\]\s*(?:([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*))?")
_EVENT = re.compile(r"^\s*(?:\S+\s+)?(Normal|Warning)\s+([A-Z][A-Za-z]+)\s+(.*)$", re.MULTILINE)
_EVENT_COUNT = re.compile(r"\(x\d+ over [^)]*\)")
_EVENT_HEADER = re.compile(r"^\s*(?:Events:|Type\s+Reason\s+Age\s+From\s+Message|[-\s]+)\s*$", re.MULTILINE)
_METRIC = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
_PROMQL_MARKERS = [
    re.compile(p)
    for p in (
        r"\b[a-z_][a-z0-9_:]*\{[^{}]*(?:=~|!~|!=|=)[^{}]*\}",  # metric{label="x"}
        r"\[\d+[smhdwy](?::\d*[smhdwy]?)?\]",  # [5m] range
        rf"\b(?:{'|'.join(sorted(PROMQL_FUNCTIONS))})\s*\(",  # rate( sum(
        r"\b(?:by|without)\s*\([\w\s,]*\)",  # by (a, b)
    )
]
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([\w\s,]*\)")
_MATCHERS = re.compile(r"(?<=[\w:])\{[^{}]*\}")
_RANGE = re.compile(r"\[\d+[smhdwy](?::\d*[smhdwy]?)?\]")
_COMPARISON = re.compile(r"(?:[<>]=?|==|!=)\s*-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_OPERATORS = re.compile(r"[(){}\[\]*/+^%]|(?<![\w-])-(?![\w-])")


@dataclass(frozen=True)
class PastedQuery:
    """The analysis of one query (see the module docstring for each field).

    ``formats`` lists what was recognised, in the order found: ``json_log``, ``logfmt``,
    ``labels``, ``alertmanager``, ``k8s_event``, ``promql``; empty for a plain question, and
    then ``text`` is the input unchanged. ``noise_removed`` counts removed noise spans.
    """

    original: str
    text: str
    formats: tuple[str, ...] = ()
    alert_names: tuple[str, ...] = ()
    metric_names: tuple[str, ...] = ()
    label_values: tuple[str, ...] = ()
    noise_removed: int = 0
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def pasted(self) -> bool:
        return bool(self.formats)

    def summary(self) -> PastedSummary:
        """Compact view for the retrieval trace."""
        return PastedSummary(
            formats=list(self.formats),
            alert_names=list(self.alert_names),
            metric_names=list(self.metric_names),
            label_values=list(self.label_values)[:10],
            noise_removed=self.noise_removed,
            informative_text=self.text[:300],
        )


class PastedSummary(BaseModel):
    """What the trace keeps of a pasted query (``PastedQuery.summary``): the formats recognised, the
    names and (first 10) label values lifted, the noise spans removed, the informative text (first
    300 characters)."""

    formats: list[str] = []
    alert_names: list[str] = []
    metric_names: list[str] = []
    label_values: list[str] = []
    noise_removed: int = 0
    informative_text: str = ""


def strip_noise(text: str) -> tuple[str, int]:
    """``text`` without timestamps, IPs, ports, hashes, pod suffixes, durations, callers,
    paths and URLs; returns (clean text, number of spans removed)."""
    removed = 0
    for pattern in _NOISE:
        text, n = pattern.subn(" ", text)
        removed += n
    return _SPACE.sub(" ", text).strip(), removed


class _Collector:
    """Accumulates the parts found while the parsers consume the text."""

    def __init__(self) -> None:
        self.formats: list[str] = []
        self.alerts: list[str] = []
        self.metrics: list[str] = []
        self.messages: list[str] = []
        self.labels: list[str] = []
        self.fields: dict[str, str] = {}

    def fmt(self, name: str) -> None:
        if name not in self.formats:
            self.formats.append(name)

    def pair(self, key: str, value: str) -> None:
        """Route one ``key=value`` by the key's role."""
        k = key.lower().rsplit(".", 1)[-1]
        value = value.strip().strip("\"'")
        if not value:
            return
        self.fields.setdefault(k, value[:200])
        if k in ALERT_NAME_KEYS and re.fullmatch(r"[A-Za-z][\w:.-]*", value):
            self.alerts.append(value)
        elif k in MESSAGE_KEYS:
            self.messages.append(value)
        elif k not in META_KEYS and k != "__name__":
            self.labels.append(value)
        elif k == "__name__":
            self.metrics.append(value)


def _take_json(text: str, out: _Collector) -> str:
    """Remove JSON objects (JSON log lines, label maps) from ``text``, routing their pairs."""
    decoder = json.JSONDecoder()
    pieces, pos = [], 0
    for m in _JSON_START.finditer(text):
        if m.start() < pos:
            continue
        try:
            obj, end = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        pieces.append(text[pos : m.start()])
        pos = end
        out.fmt("json_log" if {"msg", "message", "level", "ts", "time"} & set(obj) else "labels")
        for key, value in _flatten(obj):
            out.pair(key, value)
    pieces.append(text[pos:])
    return " ".join(pieces)


def _flatten(obj: dict[str, object], prefix: str = "") -> Iterable[tuple[str, str]]:
    for key, value in obj.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            yield f"{prefix}{key}", str(value)


def _take_pairs(text: str, out: _Collector) -> str:
    """Remove ``key="value"`` / ``key=value`` pairs (label sets, logfmt) when one names an
    alert or a message, or when two or more are quoted or use log/label keys. Prose such as
    "set replicas=3 and maxSurge=1" stays text: there the keys are the information."""
    quoted = list(_QUOTED_PAIR.finditer(text))
    bare = list(_BARE_PAIR.finditer(_QUOTED_PAIR.sub(" ", text)))
    keys = {m.group(1).lower() for m in quoted + bare}
    known = keys & (ALERT_NAME_KEYS | MESSAGE_KEYS | META_KEYS)
    if not keys & (ALERT_NAME_KEYS | MESSAGE_KEYS) and (len(quoted) + len(bare) < 2 or (len(quoted) < 2 and not known)):
        return text
    out.fmt("logfmt" if keys & {"msg", "message", "level", "ts", "caller"} else "labels")
    for m in quoted:
        if m.group(2) == "=":
            out.pair(m.group(1), m.group(3).replace('\\"', '"'))
    text = _QUOTED_PAIR.sub(" ", text)
    for m in bare:
        out.pair(m.group(1), m.group(2))
    return _BARE_PAIR.sub(" ", text)


def _take_colon_pairs(text: str, out: _Collector) -> str:
    """``summary: ...`` / ``labels: ...`` lines and ``a: x, b: y | summary: ...`` runs.

    A message key's value runs to the end of the line or the next `` | ``; any other key's
    value is one token. Recognised only when a message/alert key or two pairs occur.
    """
    matches = list(_COLON_PAIR.finditer(text))
    keys = {m.group(1) for m in matches}
    if len(matches) < 2 and not keys & NOTIFICATION_KEYS:
        return text  # one "note: ..." in a question is prose, not a notification
    out.fmt("alertmanager")
    pieces, pos = [], 0
    for m in matches:
        if m.start() < pos:
            continue
        key = m.group(1)
        rest = text[m.end() :]
        if key in MESSAGE_KEYS:
            stop = re.search(r"\n|\s\|\s", rest)
        else:
            stop = re.search(r"[\s,;|]", rest)
        value = rest[: stop.start()] if stop else rest
        pieces.append(text[pos : m.start()])
        pos = m.end() + len(value)
        out.pair(key, value)
        if key not in MESSAGE_KEYS | ALERT_NAME_KEYS | META_KEYS:
            pieces.append(" ")
    pieces.append(text[pos:])
    return " ".join(pieces)


def _take_am_title(text: str, out: _Collector) -> str:
    def repl(m: re.Match[str]) -> str:
        out.fmt("alertmanager")
        if m.group(1):
            out.alerts.append(m.group(1))
        return " "

    return _AM_TITLE.sub(repl, text)


def _take_events(text: str, out: _Collector) -> str:
    """``kubectl describe``/``get events`` lines: ``Warning BackOff 3m (x20 over 10m) kubelet
    Back-off restarting failed container``: reason written out as words, message kept."""

    def repl(m: re.Match[str]) -> str:
        out.fmt("k8s_event")
        out.messages.append(split_camel_words(m.group(2)))
        return " " + _EVENT_COUNT.sub(" ", m.group(3))

    text = _EVENT.sub(repl, text)
    return _EVENT_HEADER.sub(" ", text) if "k8s_event" in out.formats else text


def _take_promql(text: str, out: _Collector) -> str:
    """Metric names out of PromQL; syntax (matchers, ranges, grouping, functions, operators,
    thresholds) removed; metric names left in the text as words."""
    if not any(p.search(text) for p in _PROMQL_MARKERS):
        return text
    out.fmt("promql")
    for m in _QUOTED_PAIR.finditer(text):  # label matchers: values are lexical-only labels
        if m.group(2) == "=" and m.group(1).lower() not in META_KEYS:
            out.labels.append(m.group(3))
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _COMPARISON.sub(" ", text)

    def metric(m: re.Match[str]) -> str:
        word = m.group(0)
        if word in PROMQL_FUNCTIONS or word in PROMQL_KEYWORDS:
            return " "
        out.metrics.append(word)
        return word.replace("_", " ")

    text = _METRIC.sub(metric, text)
    text = re.sub(rf"\b(?:{'|'.join(sorted(PROMQL_FUNCTIONS))})\s*(?=\()", " ", text)
    return _OPERATORS.sub(" ", text)


def analyze_pasted(query: str) -> PastedQuery:
    """Parse ``query`` (already NFKC-normalised) into signal and noise; see the module docstring.

    Never raises on odd input: what no parser recognises stays free text.
    """
    out = _Collector()
    text = _take_json(query, out)
    text = _take_am_title(text, out)
    text = _take_events(text, out)
    text = _take_promql(text, out)
    text = _take_pairs(text, out)
    text = _take_colon_pairs(text, out)
    if not out.formats:
        return PastedQuery(original=query, text=query)
    parts = [*(_words(a) for a in _unique(out.alerts)), *out.messages, text]
    clean, removed = strip_noise(" ".join(p for p in parts if p))
    # Separators left behind by removed pairs and syntax ("{ , , }", ": |") collapse to one.
    clean = re.sub(r"(?:\s*[^\w\s]+\s*){2,}", " ; ", clean).strip(" |,;:")
    labels = []
    for value in _unique(out.labels):
        v, _ = strip_noise(value.replace("_", " "))
        if re.search(r"[^\W\d_]{2,}", v):
            labels.append(v)
    return PastedQuery(
        original=query,
        text=clean or query,
        formats=tuple(out.formats),
        alert_names=tuple(_unique(out.alerts)),
        metric_names=tuple(_unique(out.metrics)),
        label_values=tuple(labels),
        noise_removed=removed,
        fields=out.fields,
    )


def _words(name: str) -> str:
    return split_camel_words(name).replace("_", " ")


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))
