"""docs/writing-an-objective.md as a user follows it: the objective written in a file outside the repository trains
from the command line in one process and two, is recorded by name and options, loads back without its code, and
resumes only when named again. The two-process gradient of the same objective is tests/test_distributed.py's
`user_objective` case."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from doc_examples import commands, write_objective

from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.losses import HCLLoss, InfoNCELoss, ReweightingLoss, build_loss
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
    config = json.loads((trained / "simcse_config.json").read_text())
    assert config["loss"] == "focal.py:FocalLoss"  # the file's name, not this machine's folder
    assert config["objective"]["class"] == "focal.py:FocalLoss"
    assert config["loss_kwargs"] == {"temperature": 0.05, "gamma": 1.0}
    record = config["objective"]
    assert (record["name"], record["title"], record["options"]) == ("focal", "Focal InfoNCE", {"gamma": 1.0})
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
    assert (config["world_size"], config["objective"]["options"]) == (2, {"gamma": 2.0})


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
