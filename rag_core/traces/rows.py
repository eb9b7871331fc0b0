"""Making trace values storable: JSON-safe copies and text PostgreSQL accepts.

Light module (no database driver): the recorder cleans rows with it before they are spooled or
stored, and the store cleans them again at the boundary it owns.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from pathlib import PurePath
from typing import Any

__all__ = ["json_safe", "safe_text"]


def json_safe(value: Any) -> Any:
    """A JSON-serialisable copy of ``value``: datetimes/dates -> ISO strings, enums -> values,
    dataclasses and pydantic models -> dicts, sets/tuples -> lists, NaN/inf -> None, any other
    object -> ``str``. Dict keys become strings; strings pass through ``safe_text``."""
    if isinstance(value, str):
        return safe_text(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Enum):
        return json_safe(value.value)
    if isinstance(value, Mapping):
        return {safe_text(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if hasattr(value, "model_dump"):
        return json_safe(value.model_dump(mode="json"))
    if isinstance(value, bytes):
        return safe_text(value.decode("utf-8", "replace"))
    if isinstance(value, (PurePath, uuid.UUID)):
        return safe_text(str(value))
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return json_safe(value.item())
    return safe_text(str(value))


def safe_text(text: str) -> str:
    """``text`` PostgreSQL accepts in text and jsonb: no NUL, no lone surrogates."""
    text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text
