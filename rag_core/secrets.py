"""Secret scrubbing: the one place passwords are taken out of DSNs, URIs and error text.

Light module (no database driver needed): the lookup path, the trace recorder, the stores and
the Dagster code location all scrub through it.
"""

from __future__ import annotations

import contextlib
import re

from rag_core.settings import redact_dsn

__all__ = ["redacted", "scrub_secrets"]

_URI = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


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
