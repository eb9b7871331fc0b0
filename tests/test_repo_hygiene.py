"""What is committed reads the same on every checkout: no path of this machine in it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing committed to check")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_committed_file_names_this_checkout_s_absolute_path():
    # The checkout's parent too: a report that names ../shared as /abs/shared is just as local.
    local = str(ROOT.parent) + "/"
    found = []
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (charts) or removed in the working tree
        if local in text:
            found.append(str(path.relative_to(ROOT)))
    assert not found, f"absolute paths of {local} in committed files: {found}"
