"""Provenance: the training data's hash and the code's identity, recorded by train.py and compared by eval/sts.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT
from test_sts_cli import write_data

from simcse_hn.cli import train
from simcse_hn.errors import UserError
from simcse_hn.provenance import check_own_checkout, code_identity, data_sha256, source_sha256


def test_data_hash_changes_with_the_data_and_only_then(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("one\ntwo\n")
    first = data_sha256(str(a))
    assert data_sha256(str(a)) == first
    copy = tmp_path / "copy" / "a.txt"
    copy.parent.mkdir()
    shutil.copy(a, copy)
    assert data_sha256(str(copy)) == first  # same bytes, same name: where it lies does not matter
    a.write_text("one\ntwo!\n")
    assert data_sha256(str(a)) != first
    folder = tmp_path / "copy"
    (folder / "b.txt").write_text("three\n")
    both = data_sha256(str(folder))
    assert both != data_sha256(str(copy)) and data_sha256(str(folder)) == both
    assert data_sha256("owner/dataset") != data_sha256("owner/other")


def test_source_hash_changes_with_the_code(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "simcse_hn", tree / "simcse_hn", ignore=shutil.ignore_patterns("__pycache__"))
    before = source_sha256(str(tree))
    assert before == source_sha256(str(tree))
    (tree / "simcse_hn" / "files.py").write_text((tree / "simcse_hn" / "files.py").read_text() + "\n# changed\n")
    assert source_sha256(str(tree)) != before
    identity = code_identity(str(tree))  # no git repository: no commit, no failure
    assert identity["git_commit"] is None and identity["git_dirty"] is None


def test_a_script_in_another_tree_refuses_this_package(tmp_path):
    (tmp_path / "simcse_hn").mkdir()
    (tmp_path / "eval").mkdir()
    script = tmp_path / "eval" / "sts.py"
    script.write_text("")
    with pytest.raises(UserError, match="imported simcse_hn from"):
        check_own_checkout(str(script))
    assert "imported simcse_hn from" in check_own_checkout(str(script), allow_other=True)
    assert check_own_checkout(str(ROOT / "eval" / "sts.py")) is None


def test_eval_script_copied_to_another_tree_imports_that_trees_package(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "simcse_hn", tree / "simcse_hn", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "eval").mkdir()
    shutil.copy(ROOT / "eval" / "sts.py", tree / "eval" / "sts.py")
    init = tree / "simcse_hn" / "__init__.py"
    init.write_text(init.read_text() + "\nimport sys\nsys.stderr.write('the copied tree\\n')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # another simcse_hn first on the path, as an installed one is
    result = subprocess.run([sys.executable, str(tree / "eval" / "sts.py"), "--help"], capture_output=True,
                            text=True, timeout=120, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-1500:]
    assert "the copied tree" in result.stderr


def test_train_records_data_hash_and_code_and_eval_compares(tiny_args, tmp_path, capsys):
    train.run(tiny_args + ["--max_steps", "2", "--eval_steps", "2", "--save_steps", "2"])
    out = tmp_path / "out"
    saved = json.loads((out / "simcse_config.json").read_text())
    assert saved["data"]["sha256"] == data_sha256(str(FIXTURES / "tiny_corpus.txt"))
    code = saved["provenance"]["code"]
    assert code["source_sha256"] == source_sha256()
    assert str(ROOT) not in json.dumps(saved)  # no path of this machine anywhere in the record

    from simcse_hn.cli import sts

    tasks = ["--data_dir", str(write_data(tmp_path / "sts")), "--device", "cpu", "--no_progress_bar"]
    assert sts.main(["--model", str(out), "--output", str(tmp_path / "r"), "--require_same_code", *tasks]) == 0
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["settings"]["same_code"] is True
    assert results["settings"]["training_code"]["source_sha256"] == code["source_sha256"]

    code["source_sha256"] = "0" * 64
    (out / "simcse_config.json").write_text(json.dumps(saved))
    assert sts.main(["--model", str(out), "--output", str(tmp_path / "r2"), "--require_same_code", *tasks]) == 2
    assert "--require_same_code" in capsys.readouterr().err
    assert sts.main(["--model", str(out), "--output", str(tmp_path / "r3"), *tasks]) == 0
    assert json.loads((tmp_path / "r3" / "results.json").read_text())["settings"]["same_code"] is False
    assert "Code differs" in (tmp_path / "r3" / "results.md").read_text()


def test_the_recorded_command_holds_no_token_and_no_machine_path(tmp_path):
    """train.py and eval/sts.py record the command that made a folder or a report (issue 65); the card goes to the
    Hub, so a token's value is starred and an absolute path said as records say paths."""
    from simcse_hn.provenance import command_line

    args = ["--config", "configs/q.yaml", "--hub_token", "hf_secret1", "--hub_token=hf_secret2"]
    args += ["--output_dir", str(tmp_path / "far" / "out"), "--learning_rate", "3e-5"]
    line = command_line("python train.py", args)
    assert line.startswith("python train.py --config configs/q.yaml --hub_token '***' '--hub_token=***' --output_dir ")
    assert "hf_secret" not in line and str(tmp_path) not in line and line.endswith("--learning_rate 3e-5")
