"""docs/writing-an-objective.md as a user follows it: the objective written in a file outside the repository trains
from the command line in one process and two, is recorded by name and options, loads back without its code, and
resumes only when named again. The two-process gradient of the same objective is tests/test_distributed.py's
`user_objective` case."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from doc_examples import blocks, commands, write_objective

from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.losses import ContrastiveLoss, HCLLoss, InfoNCELoss, ObjectiveOutput, ReweightingLoss, build_loss
from simcse_hn.losses.targets import ContrastiveTargets, LossContext, build_targets


def doc_command(line: str, objective, output) -> list[str]:
    """A command of the doc with its placeholders (path/to/focal.py, the output folder) made this test's."""
    argv = shlex.split(line.replace("path/to/focal.py", str(objective)))
    index = argv.index("--output_dir")
    argv[index + 1] = str(output)
    return argv


def run(argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    if argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    elif argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def objective(tmp_path_factory):
    """The doc's focal.py, in a folder outside the repository."""
    return write_objective(tmp_path_factory.mktemp("users_code"))


@pytest.fixture(scope="module")
def trained(objective, tmp_path_factory):
    """The doc's one-process command, run as written."""
    output = tmp_path_factory.mktemp("focal") / "out"
    result = run(doc_command(commands()[0], objective, output))
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def test_the_docs_objective_trains_from_the_command_line_and_is_recorded(trained, objective):
    method = json.loads((trained / "simcse_config.json").read_text())["method"]
    assert method["loss"] == "focal.py:FocalLoss"  # the file's name, not this machine's folder
    assert method["objective_class"] == "focal.py:FocalLoss"
    assert method["objective_file"] == f"{objective.parent.name}/focal.py"  # its folder, not this machine's path
    assert method["objective_sha256"] == hashlib.sha256(objective.read_bytes()).hexdigest()
    state = json.loads((trained / "checkpoint-20" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "loss" in entry]  # each step's record counts dropped rows
    assert logged and all(entry["nonfinite_grad_rows"] == 0 for entry in logged)
    assert (method["temperature"], method["options"]) == (0.05, {"gamma": 1.0})
    assert (method["objective_name"], method["objective_title"]) == ("focal", "Focal InfoNCE")
    card = (trained / "README.md").read_text()
    assert "Focal InfoNCE: InfoNCE with each anchor's loss scaled by (1 - p)^gamma" in card
    assert "| gamma | `1.0` |" in card
    assert str(objective.parent) not in card  # the card names the objective, not this machine's folder


def test_the_saved_folder_loads_without_the_objectives_code(trained, objective, tmp_path):
    """An objective is training-only: with focal.py gone, sentence-transformers and simcse-hn load the folder."""
    hidden = tmp_path / "moved.py"
    objective.rename(hidden)
    try:
        folder = str(trained)
        code = ("import sys; from sentence_transformers import SentenceTransformer; "
                "from simcse_hn.modeling.model import "
                f"SimCSEModel; m = SentenceTransformer({folder!r}); SimCSEModel.from_pretrained({folder!r}); "
                "print(m.encode(['a sentence']).shape, "
                "any(k.startswith('simcse_hn_objective_') for k in sys.modules))")  # fmt: skip
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    finally:
        hidden.rename(objective)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "False"


def test_a_resume_must_name_the_objective_again(trained, objective):
    argv = doc_command(commands()[0], objective, trained) + ["--resume_from_checkpoint", "true"]
    index = argv.index("--loss")
    argv[index + 1] = "infonce"
    index = argv.index("--loss_options")
    del argv[index : index + 2]
    result = run(argv)
    assert result.returncode == 2
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: loss: checkpoint-20 was trained with --loss focal.py:FocalLoss; name it again")


@pytest.mark.multiprocess
def test_the_docs_objective_trains_in_two_processes(objective, tmp_path):
    output = tmp_path / "out"
    result = run(doc_command(commands()[1], objective, output))
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads((output / "simcse_config.json").read_text())
    assert (config["optimisation"]["processes"], config["method"]["options"]) == (2, {"gamma": 2.0})


def test_its_options_are_checked_by_its_dataclass(objective, tmp_path):
    base = ["--loss", f"{objective}:FocalLoss", "--output_dir", str(tmp_path)]
    for options, message in [('{"gamma": -1}', "loss_options: gamma: must be >= 0, got -1.0"),
                             ('{"gama": 1}', "loss_options: gama: not an option of this objective"),
                             ('{"gamma": "x"}', "loss_options: gamma: must be float, got 'x'"),
                             ("[1]", "loss_options: must be a mapping")]:  # fmt: skip
        with pytest.raises(ConfigError) as error:
            parse_args(base + ["--loss_options", options])
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
    for loss, message in [(f"{objective}:Nope", "has no class 'Nope'"), ("no_such_module:X", "No module named"),
                          ("json:JSONDecoder", "is not a simcse_hn.losses.ContrastiveLoss subclass")]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            parse_args(["--loss", loss, "--output_dir", str(tmp_path)])


def test_gamma_zero_is_infonce(objective):
    torch.manual_seed(0)
    z = torch.randn(12, 8, requires_grad=True)
    targets = build_targets(12)
    focal = build_loss(f"{objective}:FocalLoss", temperature=0.05, gamma=0.0).compute(z, targets)
    (want,) = torch.autograd.grad(InfoNCELoss(0.05).compute(z, targets).loss, z)
    (got,) = torch.autograd.grad(focal.loss, z)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("weights", [None, 0.7])
def test_hcls_fast_path_equals_the_generic_reweighting_path(detach, weights):
    """The doc's claim: HCL's `log_weights` (beta l) through ReweightingLoss's generic path is HCL, value and
    gradient, with and without explicit negatives' weights (paired data)."""
    torch.manual_seed(1)
    z = torch.randn(12, 8, dtype=torch.float64, requires_grad=True)
    loss_fn = HCLLoss(0.1, beta=0.7, tau_plus=0.05, detach_weights=detach)
    targets = build_targets(12)
    if weights is not None:
        log_weights = torch.zeros(12, 12, dtype=torch.float64).masked_fill_(torch.rand(12, 12) < 0.3, weights)
        targets = ContrastiveTargets(targets.positive_index, targets.negative_mask, anchor_index=targets.anchor_index,
                                     negative_log_weights=log_weights)  # fmt: skip
    fast = loss_fn.compute(z, targets, LossContext())
    generic_fn = HCLLoss(0.1, beta=0.7, tau_plus=0.05, detach_weights=detach)
    generic_fn.per_anchor = lambda batch: ReweightingLoss.per_anchor(generic_fn, batch)
    generic = generic_fn.compute(z, targets, LossContext())
    torch.testing.assert_close(fast.loss, generic.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(fast.loss, z)[0], torch.autograd.grad(generic.loss, z)[0])
    torch.testing.assert_close(fast.weights, generic.weights)


def test_a_class_without_its_method_is_refused_when_named(tmp_path):
    """A ReweightingLoss without log_weights (or a ContrastiveLoss without per_anchor) fails when --loss names it,
    not at the first training step."""
    (tmp_path / "half.py").write_text(
        "from simcse_hn.losses import ContrastiveLoss, ReweightingLoss\n"
        "class NoWeights(ReweightingLoss):\n    name = 'no_weights'\n"
        "class NoLoss(ContrastiveLoss):\n    name = 'no_loss'\n",
        encoding="utf-8",
    )
    for cls in ("NoWeights", "NoLoss"):
        with pytest.raises(ConfigError, match="defines neither per_anchor nor log_weights"):
            parse_args(["--loss", f"{tmp_path / 'half.py'}:{cls}", "--output_dir", str(tmp_path)])


def test_the_docs_calls_run_in_every_data_shape(objective, monkeypatch, capsys):
    """The doc's "Calling it yourself" block, run beside focal.py: sentences, pairs and a queue."""
    monkeypatch.chdir(objective.parent)
    exec(blocks("python")[2], {})
    loss, fallback, grad_norm = map(float, capsys.readouterr().out.split())
    assert torch.isfinite(torch.tensor(loss)) and fallback == 0 and grad_norm > 0


def test_a_file_import_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import torch\n\nvalue = undefined_name\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        parse_args(["--loss", f"{bad}:Focal", "--output_dir", str(tmp_path)])
    assert f"importing {bad}:3 failed: NameError: name 'undefined_name' is not defined" in str(error.value)
    with pytest.raises(ConfigError) as error:
        parse_args(["--loss", "no_such_package.focal:Focal", "--output_dir", str(tmp_path)])
    assert "path/to/file.py:Class" in str(error.value) and "package.module:Class" in str(error.value)


def _one_anchor_at_zero_loss(loss_fn):
    """The loss and gradient of 8 rows [a, a', ...] where anchor 0 has no negatives: its loss is exactly 0."""
    torch.manual_seed(0)
    z = torch.randn(8, 16, requires_grad=True)
    positive = torch.arange(8) ^ 1
    mask = (torch.arange(8)[None] != torch.arange(8)[:, None]) & (torch.arange(8)[None] != positive[:, None])
    mask[0] = False
    out = loss_fn(z, z, positive, negative_mask=mask, context=LossContext(step=3))
    out.loss.backward()
    return out, z.grad


@pytest.mark.parametrize("gamma", [0.25, 0.5, 1.0, 2.0])
def test_the_docs_focal_objective_is_safe_where_an_anchors_loss_is_zero(objective, gamma):
    loss_fn = build_loss(f"{objective}:FocalLoss", temperature=0.05, gamma=gamma)
    out, grad = _one_anchor_at_zero_loss(loss_fn)
    assert torch.isfinite(grad).all() and grad.norm() > 0 and out.metrics["nonfinite_fallback"] == 0
    assert loss_fn.nonfinite_grads.take() == ({}, None)  # no row lost its gradient


class UnsafeFocal(ContrastiveLoss):
    """The focal objective without the clamp: an infinite derivative at a zero loss when gamma < 1."""

    def per_anchor(self, batch):
        nll = batch.plain.loss()
        return ObjectiveOutput(loss=(1 - (-nll).exp()) ** 0.5 * nll)


def test_a_nonfinite_gradient_costs_its_rows_only_and_is_counted_and_reported(caplog):
    from simcse_hn.training.step import take_nonfinite_grads

    loss_fn = UnsafeFocal(0.05)
    out, grad = _one_anchor_at_zero_loss(loss_fn)
    assert torch.isfinite(out.loss) and out.metrics["nonfinite_fallback"] == 0
    assert torch.isfinite(grad).all() and grad.norm() > 0  # not a zero step: the other anchors train
    with caplog.at_level("WARNING"):
        logged = take_nonfinite_grads(loss_fn, step=5)
    assert logged["nonfinite_grad_rows"] > 0
    assert "step 3: the loss's gradient was not finite in" in caplog.text and "plain." in caplog.text
    assert take_nonfinite_grads(loss_fn, step=6) == {"nonfinite_grad_rows": 0.0}  # read once, then counted afresh
