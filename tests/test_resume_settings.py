"""A resume repeats every setting that shapes the batches or the loss (topic batches, the queue, the corpus, the
objective and its options, the batch layout), or it is refused in one line that names the setting and both values,
before any model loads: nothing is switched silently, no traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import FIXTURES
from doc_examples import write_objective
from test_hub import train_args

from simcse_hn.cli import train
from simcse_hn.modeling.model import SimCSEModel

TOPIC = ["--topic_batches", "true", "--topic_clusters", "4"]
QUEUE = ["--queue_size", "16", "--momentum", "0.5"]
LOSS = ["--loss", "hcl"]


def _argv(out, topic=TOPIC, queue=QUEUE, loss=LOSS, *extra):
    return train_args(out, *topic, *queue, *loss, *extra)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run with topic batches, a queue and HCL: checkpoint-2."""
    out = tmp_path_factory.mktemp("run") / "out"
    assert train.main(_argv(out)) == 0
    return out


def _other_corpus(tmp_path):
    lines = (FIXTURES / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()
    other = tmp_path / "other.txt"
    other.write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")  # as many sentences, another corpus
    return other


CASES = {  # how the resume differs -> (its arguments, the line's start after "error: ")
    "topic_clusters": (lambda t: _argv(t, TOPIC[:3] + ["3"]), "topic_clusters: checkpoint-2 was trained with 4; "
                       "this run has 3"),
    "topic_share": (lambda t: _argv(t, TOPIC + ["--topic_share", "0.5"]), "topic_share: checkpoint-2 was trained "
                    "with 1; this run has 0.5"),
    "no topic flags": (lambda t: _argv(t, []), "topic_batches: checkpoint-2 was trained with topic_clusters 4, "
                       "topic_share 1, topic_encoder the model being trained, topic_recluster_steps 0; this run has "
                       "no topic_batches"),
    "queue_size": (lambda t: _argv(t, TOPIC, ["--queue_size", "8", "--momentum", "0.5"]), "queue_size: checkpoint-2 "
                   "was trained with 16; this run has 8"),
    "momentum": (lambda t: _argv(t, TOPIC, ["--queue_size", "16"]), "momentum: checkpoint-2 was trained with 0.5; "
                 "this run has 0"),
    "no queue": (lambda t: _argv(t, TOPIC, []), "queue_size: checkpoint-2 was trained with queue_size 16, momentum "
                 "0.5; this run has no queue"),
    "objective option": (lambda t: _argv(t, TOPIC, QUEUE, LOSS + ["--hcl_beta", "0.5"]), "hcl_beta: checkpoint-2 "
                         "was trained with 0.1; this run has 0.5"),
    "temperature": (lambda t: _argv(t, TOPIC, QUEUE, LOSS + ["--temperature", "0.1"]), "temperature: checkpoint-2 "
                    "was trained with 0.05; this run has 0.1"),
    "objective": (lambda t: _argv(t, TOPIC, QUEUE, ["--loss", "infonce"]), "loss: checkpoint-2 was trained with "
                  "--loss hcl; name it again to resume (this run names --loss infonce)"),
    "corpus": (lambda t: _argv(t, TOPIC, QUEUE, LOSS, "--train_file", str(_other_corpus(t))), "train_file: "
               "checkpoint-2 was trained on tiny_corpus.txt (sha256 "),
    "max_train_samples": (lambda t: _argv(t, TOPIC, QUEUE, LOSS, "--max_train_samples", "300"),
                          "max_train_samples (training examples read): checkpoint-2 was trained with 400; this run "
                          "has 300"),
    "seed": (lambda t: _argv(t, TOPIC, QUEUE, LOSS, "--seed", "1"), "seed: checkpoint-2 was trained with 42; this "
             "run has 1"),
    "batch size": (lambda t: _argv(t, TOPIC, QUEUE, LOSS, "--per_device_train_batch_size", "8"),
                   "per_device_train_batch_size: checkpoint-2 was trained with 16; this run has 8"),
    "max_seq_length": (lambda t: _argv(t, TOPIC, QUEUE, LOSS, "--max_seq_length", "16"), "max_seq_length: "
                       "checkpoint-2 was trained with 32; this run has 16"),
}
# every other setting that changes a number: the model, its pooler and tokenizer, the optimisation, the length
OTHERS = {
    "learning_rate": (["--learning_rate", "0.002"], "learning_rate: checkpoint-2 was trained with 0.001; this run has "
                      "0.002"),
    "lr_scheduler_type": (["--lr_scheduler_type", "constant"], "lr_scheduler_type: checkpoint-2 was trained with "
                          "linear; this run has constant"),
    "warmup_steps": (["--warmup_steps", "1"], "warmup_steps: checkpoint-2 was trained with 0; this run has 1"),
    "weight_decay": (["--weight_decay", "0.01"], "weight_decay: checkpoint-2 was trained with 0; this run has 0.01"),
    "adam_beta2": (["--adam_beta2", "0.99"], "adam_beta2: checkpoint-2 was trained with 0.999; this run has 0.99"),
    "max_grad_norm": (["--max_grad_norm", "0.5"], "max_grad_norm: checkpoint-2 was trained with 1; this run has 0.5"),
    "accumulation": (["--gradient_accumulation_steps", "2"], "gradient_accumulation_steps: checkpoint-2 was trained "
                     "with 1; this run has 2"),
    "dropout": (["--dropout", "0.2"], "dropout: checkpoint-2 was trained with none; this run has 0.2"),
    "pooler cls -> avg": (["--pooler", "avg"], "pooler: checkpoint-2 was trained with cls; this run has avg"),
    "pooler cls -> last": (["--pooler", "last"], "pooler: checkpoint-2 was trained with cls; this run has last"),
    "mlp_only_train": (["--mlp_only_train", "false"], "mlp_only_train: checkpoint-2 was trained with true; this run "
                       "has false"),
    "tokenizer": (["--tokenizer_name_or_path", "builtin:tiny-bert"], "tokenizer_name_or_path: checkpoint-2 was "
                  "trained with the model's own; this run has builtin:tiny-bert"),
    "another architecture": (["--model_name_or_path", "builtin:tiny-llama", "--pooler", "last"], "model_name_or_path:"
                             " checkpoint-2 was trained with builtin:tiny-bert; this run has builtin:tiny-llama"),
    "data_seed": (["--data_seed", "7"], "data_seed: checkpoint-2 was trained with none; this run has 7"),
    "max_steps raised": (["--max_steps", "4"], "max_steps: checkpoint-2 was trained with 2; this run has 4: the "
                         "learning-rate schedule would change mid-run; pass --extend_schedule true to extend it"),
    "max_steps lowered": (["--max_steps", "1", "--extend_schedule", "true"], "max_steps: checkpoint-2 was trained "
                          "with 2; this run has 1: the learning-rate schedule would change mid-run; a shorter run has "
                          "another schedule"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resume_that_changes_a_setting_is_refused_in_one_line(trained, tmp_path, capsys, case):
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    argv_of, start = CASES[case]
    argv = argv_of(tmp_path)
    argv[argv.index("--output_dir") + 1] = str(out)
    assert train.main(argv + ["--resume_from_checkpoint", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {start}") and err.count("\n") == 1, err


@pytest.mark.parametrize("case", list(OTHERS))
def test_a_resume_that_changes_anything_else_that_counts_is_refused_in_one_line(trained, tmp_path, capsys, monkeypatch,
                                                                               case):
    """Before any model loads: SimCSEModel.from_pretrained would fail the test."""
    monkeypatch.setattr(SimCSEModel, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    extra, start = OTHERS[case]
    assert train.main(_argv(out, TOPIC, QUEUE, LOSS, *extra, "--resume_from_checkpoint", "true")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {start}") and err.count("\n") == 1, err


def test_the_same_settings_resume(trained, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    argv = _argv(out) + ["--resume_from_checkpoint", "true"]
    assert train.main(argv) == 0  # already at its last step: the save is finished


@pytest.fixture(scope="module")
def user_objective_run(tmp_path_factory):
    code = write_objective(tmp_path_factory.mktemp("users_code"))
    out = tmp_path_factory.mktemp("focal") / "out"
    assert train.main(train_args(out, "--loss", f"{code}:FocalLoss")) == 0
    return code, out


def test_a_users_objective_resumes_from_its_file_moved_not_changed(user_objective_run, tmp_path, capsys):
    code, trained = user_objective_run
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    record = json.loads((out / "simcse_config.json").read_text())["method"]
    assert record["objective_file"] == f"{code.parent.name}/focal.py" and len(record["objective_sha256"]) == 64
    moved = tmp_path / "elsewhere" / "focal.py"
    moved.parent.mkdir()
    shutil.copy(code, moved)
    assert train.main(train_args(out, "--loss", f"{moved}:FocalLoss", "--resume_from_checkpoint", "true")) == 0
    moved.write_text(moved.read_text() + "# changed\n")
    assert train.main(train_args(out, "--loss", f"{moved}:FocalLoss", "--resume_from_checkpoint", "true")) == 2
    err = capsys.readouterr().err
    sha = record["objective_sha256"][:12]
    assert err.startswith(f"error: loss: checkpoint-2 was trained with --loss focal.py:FocalLoss (file "
                          f"{code.parent.name}/focal.py, sha256 {sha}); this run's file has sha256 ")
    assert err.count("\n") == 1
