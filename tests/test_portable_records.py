"""Records name models and files as another machine can read them (issue 39): `files.portable_name`, and no
committed record (bench results, docs, cards, configs) holding a machine's absolute path or a site-packages."""

from __future__ import annotations

import os
import re

import pytest
from conftest import ROOT

from simcse_hn.files import PACKAGED_MODELS, portable_name

# an absolute path of a machine (/work/..., /root/..., /tmp/..., /home/...), at a string's start or after a quote, a
# space, a bracket or a backtick; or any virtual environment's packages
MACHINE_PATH = re.compile(r"(^|[\"'\s(`=])/(work|root|home|tmp|check|usr|opt|mnt|var|Users)/|site-packages")
RECORDS = ("bench/results", "docs", "configs", "README.md")


def test_a_hub_id_a_builtin_and_a_name_are_kept():
    for name in ("sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased", "builtin:tiny-bert", "hub"):
        assert portable_name(name) == name
    assert portable_name(None) is None
    builtin, (_, _, hub_id) = next(iter(PACKAGED_MODELS.items()))
    assert portable_name(builtin) == hub_id


def test_local_paths_are_relative_to_a_root_or_beside_it_else_named(tmp_path, monkeypatch):
    # the working directory is a root too: put it where these paths are neither inside nor beside it (a checkout
    # under /tmp has pytest's temporary folders beside it)
    (tmp_path / "cwd" / "deeper").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd" / "deeper")
    run = tmp_path / "outputs" / "run"
    (run / "final").mkdir(parents=True)
    beside = tmp_path / "shared" / "data"
    beside.mkdir(parents=True)
    root = tmp_path / "repo"
    root.mkdir()
    assert portable_name(str(run), roots=(str(tmp_path),)) == "outputs/run"
    assert portable_name(str(beside), roots=(str(root),)) == "../shared/data"  # the root's sibling
    assert portable_name(str(run / "final")) == "run/final"  # outside every root: named, generic with its parent
    assert portable_name(str(run)) == "run"


def test_a_packaged_model_is_its_hub_id_and_site_packages_never_appear(tmp_path):
    module, _, hub_id = next(iter(PACKAGED_MODELS.values()))
    folder = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / module / "model"
    folder.mkdir(parents=True)
    assert portable_name(str(folder)) == hub_id
    other = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "some_package" / "data"
    other.mkdir(parents=True)
    assert portable_name(str(other)) == "some_package/data"


def record_files():
    for entry in RECORDS:
        path = ROOT / entry
        if path.is_file():
            yield path
        for folder, _, names in os.walk(path):
            for name in names:
                if name.endswith((".json", ".md", ".yaml", ".yml", ".txt", ".csv")):
                    yield ROOT / folder / name


@pytest.mark.parametrize("entry", RECORDS)
def test_committed_records_hold_no_machine_path(entry):
    found = []
    for path in record_files():
        if not str(path.relative_to(ROOT)).startswith(entry):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert found == [], "\n".join(found[:20])
