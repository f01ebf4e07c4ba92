"""SimCSETrainer on the Trainer's public hooks: the private methods it still overrides are few, listed in one place
(simcse_hn.private_api, with the parser's and every other private member simcse-hn uses), and checked against the
installed libraries; the check fails on a Trainer that lacks one; rotation and the guard are callbacks; the run's
planned length is the Trainer's own."""

from __future__ import annotations

import copy
import importlib
import inspect

import datasets
import pytest
import torch
from transformers import HfArgumentParser, Trainer

from simcse_hn import private_api
from simcse_hn.configuration.parser import _Parser
from simcse_hn.configuration.training_arguments import SimCSETrainingArguments
from simcse_hn.data.collator import SimCSECollator
from simcse_hn.losses import build_loss
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.private_api import (
    PRIVATE_MEMBERS,
    PRIVATE_PARSER_MEMBERS,
    PRIVATE_TRAINER_OVERRIDES,
    problems,
)
from simcse_hn.testing.models import build_tiny_bert
from simcse_hn.training.callbacks import NonFiniteGradientGuard, RotateCheckpoints
from simcse_hn.training.checkpoints import args_for_disk
from simcse_hn.training.trainer import SimCSETrainer
from simcse_hn.training.trainer_internals import check_trainer_internals, planned_steps, trainer_internals_problems


def test_the_installed_transformers_has_every_private_method_simcse_hn_overrides():
    assert trainer_internals_problems(Trainer) == []


def test_at_most_three_private_methods_are_overridden_and_all_are_listed():
    """Every private Trainer method SimCSETrainer overrides is in PRIVATE_TRAINER_OVERRIDES, with the parameters the
    override itself takes: the list is the code's, not a promise."""
    overridden = {name for name in vars(SimCSETrainer) if name.startswith("_") and not name.startswith("__")
                  and hasattr(Trainer, name)}  # fmt: skip
    listed = {internal.name: internal.parameters for internal in PRIVATE_TRAINER_OVERRIDES}
    assert overridden == set(listed) and len(listed) <= 3
    for name, parameters in listed.items():
        assert tuple(inspect.signature(vars(SimCSETrainer)[name]).parameters)[1:] == parameters, name
    for internal in PRIVATE_TRAINER_OVERRIDES:
        assert internal.why, internal.name


def owner(path: str):
    """The class or module at an import path ("transformers.Trainer", "torch"); "argparse.ArgumentParser()": an
    instance, for an attribute each instance sets."""
    if path.endswith("()"):
        return owner(path[:-2])()
    module, _, name = path.rpartition(".")
    try:
        return importlib.import_module(path)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def test_the_installed_libraries_have_every_private_member_simcse_hn_uses():
    found = [problem for member in PRIVATE_MEMBERS for _, problem in problems(owner(member.owner), (member,))]
    assert found == []


def test_the_parsers_private_overrides_are_listed_with_their_parameters():
    """configuration.parser's HfArgumentParser subclass overrides and calls only what PRIVATE_PARSER_MEMBERS lists,
    with the parameters it uses; the check fails on a parser that renamed one."""
    overridden = {name for name in vars(_Parser) if name.startswith("_") and not name.startswith("__")
                  and hasattr(HfArgumentParser, name)}  # fmt: skip
    assert overridden == {m.name for m in PRIVATE_PARSER_MEMBERS if m.use == "overrides"}
    for member in PRIVATE_PARSER_MEMBERS:
        assert private_api.parameters(HfArgumentParser, member.name) == member.parameters, member.name
    assert tuple(inspect.signature(_Parser._add_dataclass_arguments).parameters)[1:] == ("dtype",)

    class Renamed(HfArgumentParser):
        @staticmethod
        def _parse_dataclass_field(parser, item):  # a release renaming the parameter
            return item

    assert [problem for _, problem in problems(Renamed, PRIVATE_PARSER_MEMBERS)] == [
        "Renamed._parse_dataclass_field is (parser, item), simcse-hn calls (parser, field)"
    ]


def without(name: str) -> type:
    """A stand-in for transformers.Trainer with all of its members but `name`."""
    return type("Trainer", (), {key: value for key, value in vars(Trainer).items() if key != name})


def test_the_check_fails_on_a_trainer_that_lacks_or_renamed_one():
    assert trainer_internals_problems(without("__doc__")) == []  # the stand-in itself passes
    gone = trainer_internals_problems(without("_load_best_model"))
    assert len(gone) == 1 and gone[0].startswith("Trainer._load_best_model is gone (load_best_model_at_end")

    class Renamed(Trainer):
        def _get_grad_norm(self, model, norm=None):  # a release renaming the parameter
            return norm

    assert trainer_internals_problems(Renamed) == [
        "Renamed._get_grad_norm is (model, norm), simcse-hn overrides (model, grad_norm)"
    ]
    with pytest.raises(RuntimeError, match=r"relies on: Trainer\._load_from_checkpoint is gone"):
        check_trainer_internals(without("_load_from_checkpoint"))


def test_without_the_norm_hook_a_run_starts_with_a_warning(caplog):
    """_get_grad_norm only spares the gradient guard a pass: a Trainer without it is slower, not wrong."""
    with caplog.at_level("WARNING"):
        check_trainer_internals(without("_get_grad_norm"))
    assert "SimCSETrainer uses: Trainer._get_grad_norm is gone (the step's total gradient norm" in caplog.text


def make_trainer(tmp_path, **overrides) -> tuple[SimCSETrainer, SimCSETrainingArguments]:
    settings = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, eval_strategy="no",
                    load_best_model_at_end=False, metric_for_best_model=None, report_to=[], disable_tqdm=True,
                    hub_token="secret")  # fmt: skip
    args = SimCSETrainingArguments(**{**settings, **overrides})
    tokenizer = build_tiny_bert()[1]
    sentences = datasets.Dataset.from_dict({"text": [f"sentence number {i}" for i in range(22)]})
    trainer = SimCSETrainer(model=SimCSEModel(build_tiny_bert(seed=0)[0]), args=args, loss_fn=build_loss("infonce"),
                            train_dataset=sentences, data_collator=SimCSECollator(tokenizer, 16))  # fmt: skip
    return trainer, args


def test_rotation_and_the_guard_are_the_trainers_callbacks_and_the_trainer_never_sees_the_limit(tmp_path):
    trainer, args = make_trainer(tmp_path, save_total_limit=2)
    callbacks = trainer.callback_handler.callbacks
    assert trainer.rotation in callbacks and trainer.gradient_guard in callbacks
    assert isinstance(trainer.rotation, RotateCheckpoints)
    assert isinstance(trainer.gradient_guard, NonFiniteGradientGuard)
    assert trainer.args.save_total_limit is None and trainer.rotation.limit == 2  # transformers' rotation: off
    assert args.save_total_limit == 2  # the caller's arguments are left as they were
    saved = args_for_disk(trainer.args, trainer.rotation.limit)
    assert saved.save_total_limit == 2 and saved.hub_token is None and trainer.args.hub_token == "secret"


@pytest.mark.parametrize("epochs, accumulation, max_steps", [(1, 1, -1), (2, 2, -1), (2.5, 4, -1), (0.3, 1, -1),
                                                             (1, 3, 7)])  # fmt: skip
def test_planned_steps_are_the_trainers_own_count(tmp_path, epochs, accumulation, max_steps):
    """22 sentences, 4 a batch: 6 batches (the last short), so accumulation 4 leaves a partial step per epoch."""
    trainer, _ = make_trainer(tmp_path, num_train_epochs=epochs, gradient_accumulation_steps=accumulation,
                              max_steps=max_steps)  # fmt: skip
    loader = trainer.get_train_dataloader()
    args = copy.copy(trainer.args)
    assert planned_steps(args, len(loader)) == trainer.set_initial_training_values(args, loader)[-1]


def test_the_loss_is_divided_by_the_accumulation_steps(tmp_path):
    """The loss is a per-batch mean, so with 2 accumulation steps each batch's gradient is half the plain one: the
    model's `accepts_loss_kwargs` False says so to every 5.x Trainer (the class attribute loss_is_scaled_for_ga only
    to newer ones)."""
    grads = []
    for accumulation in (1, 2):
        torch.manual_seed(0)  # the same head
        trainer, _ = make_trainer(tmp_path / str(accumulation), gradient_accumulation_steps=accumulation)
        assert trainer.model.accepts_loss_kwargs is False
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.current_gradient_accumulation_steps = accumulation
        torch.manual_seed(0)
        trainer.training_step(trainer.model, batch)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0] / 2, rtol=1e-5, atol=1e-8)

