"""The study's small file helpers: atomic JSON, text hashes (file hashes: simcse_hn.files), a working folder."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def working_dir(folder: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all (a killed writer leaves the old file or none)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
