"""Secret scrubbing: the one place passwords are taken out of DSNs, URIs and error text, and
secrets and personal data out of what agents paste (``scrub_pasted``).

Light module (no database driver needed): the lookup path, the trace recorder, the stores,
the mined cases and the Dagster code location all scrub through it.
"""

from __future__ import annotations

import contextlib
import re

from rag_core.settings import redact_dsn

__all__ = ["redacted", "scrub_pasted", "scrub_secrets"]

_URI = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)

# What agents paste (alert payloads, headers, logs, config): a key naming a secret, then its value
# (quoted or up to a separator); exact key words, so "tokens: 12" (query tokens) is kept.
_KV_SECRET = re.compile(
    r"""(["']?\b(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|secret[_-]?key"""
    r"""|client[_-]?secret|auth[_-]?token|access[_-]?token|refresh[_-]?token|private[_-]?key|x-api-key)"""
    r"""["']?\s*[:=]\s*)("[^"]*"|'[^']*'|[^\s,;&}\]]+)""",
    re.IGNORECASE,
)
_AUTH_HEADER = re.compile(r"(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:(bearer|basic|token)\s+)?[^\s\"',;}]+", re.I)
_BEARER = re.compile(r"\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
# Token shapes that are secrets wherever they appear (GitHub, AWS access key id, Slack, OpenAI-style,
# JWT) and PEM private keys.
_TOKEN_SHAPES = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{16,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    re.DOTALL,
)
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_IPV4 = re.compile(r"\b(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3}\b")
# Cheap pre-check (scrubbing runs on every traced string; a case-insensitive regex costs 1 ms on
# 3 kB): every pattern below needs one of these in the lower-cased text.
_TRIGGERS = (
    ":",
    "=",
    "@",
    "bearer",
    "eyj",
    "akia",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "xox",
    "sk-",
    "private key",
)


def redacted(dsn: str) -> str:
    """``dsn`` with any password replaced (``rag_core.settings.redact_dsn``); safe to log."""
    return redact_dsn(dsn)


def scrub_secrets(text: str, dsn: str | None = None) -> str:
    """``text`` with passwords removed: URIs are redacted, ``password=...`` pairs masked, and
    the password of ``dsn`` (when given) replaced wherever it appears verbatim."""
    if not text:
        return text
    for secret in _dsn_passwords(dsn):
        text = text.replace(secret, "***")
    text = _URI.sub(lambda m: redact_dsn(m.group(0)), text)
    return _KV_PASSWORD.sub(r"\1***", text)


def scrub_pasted(text: str, ips: bool = False) -> str:
    """``text`` an agent pasted, safe to store and show: ``scrub_secrets`` plus values of secret
    keys (``token: ...``, ``"api_key": "..."``), ``Authorization`` headers and bearer tokens,
    well-known token shapes (GitHub, AWS key id, Slack, ``sk-``, JWT, PEM private keys) as
    ``***``; e-mail addresses as ``<email>``; IPv4 addresses as ``<ip>`` when ``ips``
    (``RAG_TRACE_SCRUB_IPS``: they identify hosts, yet are often what the question is about)."""
    lowered = text.lower()
    if not text or not (any(t in lowered for t in _TRIGGERS) or (ips and _IPV4.search(text))):
        return text
    text = scrub_secrets(text)
    text = _TOKEN_SHAPES.sub("***", text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + (f"{m.group(2)} " if m.group(2) else "") + "***", text)
    text = _BEARER.sub(r"\1***", text)
    text = _KV_SECRET.sub(r"\1***", text)
    text = _EMAIL.sub("<email>", text)
    return _IPV4.sub("<ip>", text) if ips else text


def _dsn_passwords(dsn: str | None) -> list[str]:
    if not dsn:
        return []
    found = [m.group(2).strip("'") for m in _KV_PASSWORD.finditer(dsn)]
    # psycopg may be absent (core install) or reject the DSN (psycopg.Error): the regexes still run.
    with contextlib.suppress(Exception):
        from psycopg.conninfo import conninfo_to_dict

        found.append(conninfo_to_dict(dsn).get("password") or "")
    match = re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*:([^@/]*)@", dsn)
    if match:
        found.append(match.group(1))
    # Very short "passwords" would mangle unrelated text; the regexes cover those cases.
    return [p for p in {str(p) for p in found} if len(p) >= 3]
