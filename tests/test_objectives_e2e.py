"""Every objective trains end to end from the tiny config, its diagnostics reach the logs (TensorBoard too), and
the paper configs differ only in the loss keys and names."""

from __future__ import annotations

import dataclasses
import glob
import json

import pytest
import torch
from conftest import ROOT

from simcse_hn.cli import train
from simcse_hn.configuration.parser import ARGUMENT_CLASSES, parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.losses import LOSSES, benchmark_settings, build_loss

# options that make an objective act within 4 steps of the tiny model (the registry's variants otherwise)
ACTING = {"hcl": {"beta": 0.5}, "progcl": {"warmup_ratio": 0.25}, "unremix": {"learn_mixture": True}}


def loss_flags(name: str, options: dict) -> list[str]:
    flags = ["--loss", name, "--contrast_form", LOSSES[name].forms[0]]  # InfoNCE: the paper's simcse form
    options = {**ACTING.get(name, {}), **options}
    return flags + (["--loss_options", json.dumps(options)] if options else [])


LOSS_FLAGS = {setting: loss_flags(name, options) for setting, (name, options) in benchmark_settings().items()}


def test_every_registered_loss_is_covered():
    assert {flags[1] for flags in LOSS_FLAGS.values()} == set(LOSSES)


@pytest.mark.parametrize("name", LOSS_FLAGS)
def test_tiny_config_trains_with_each_loss(tiny_args, tmp_path, name, monkeypatch):
    logdir = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logdir))
    trainer = train.run(
        tiny_args
        + LOSS_FLAGS[name]
        + [
            "--max_steps",
            "4",
            "--logging_steps",
            "2",
            "--eval_steps",
            "4",
            "--save_steps",
            "4",
            "--report_to",
            "tensorboard",
        ]
    )
    assert trainer.state.global_step == 4
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logged)
    for parameter in trainer.model.parameters():
        assert torch.isfinite(parameter).all()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for path in glob.glob(str(logdir / "**" / "events.out.tfevents.*"), recursive=True):
        events = EventAccumulator(path).Reload()
        tags |= set(events.Tags()["scalars"])
        if "train/bmm_alpha_1" in events.Tags()["scalars"]:
            last_alpha_1 = events.Scalars("train/bmm_alpha_1")[-1].value
    assert {
        "train/loss",
        "train/pos_sim",
        "train/neg_weight_max",
        "train/nonfinite_fallback",
        "eval/stsb_spearman",
    } <= tags
    if name.startswith("progcl"):
        assert {"train/bmm_alpha_0", "train/bmm_beta_1", "train/bmm_pi_0", "train/est_false_neg_frac"} <= tags
        # after the warm-up the mixture was fitted: the last logged parameters are not the initial Beta(1,2)/(2,1)
        assert last_alpha_1 != pytest.approx(2.0)
    if name in ("dcl", "hcl"):
        assert "train/clamp_frac" in tags
    if name == "dcl":  # debiased, not symmetric InfoNCE under another name
        assert trainer.model.loss_fn.options.tau_plus > 0


NAME_FIELDS = {"output_dir", "hub_model_id"}
BASELINE = "unsup_bert_base_infonce.yaml"


def objective_fields(loss: str) -> set[str]:
    """The fields a config of `loss` may set differently from the baseline: the loss, the target form (InfoNCE has
    two; the others are defined on the symmetric one only, which config.py enforces) and the loss's own prefix."""
    return {"loss", "contrast_form"} | {name for name in CONFIG_FIELDS if name.startswith(f"{loss}_")}


CONFIG_FIELDS = {f.name for cls in ARGUMENT_CLASSES for f in dataclasses.fields(cls) if f.init}


def parsed(path) -> dict:
    """Every field of the three argument dataclasses, as train.py would see them."""
    return {f.name: getattr(args, f.name) for args in parse_args(["--config", str(path)]) for f in
            dataclasses.fields(args) if f.init}


def test_paper_configs_differ_from_the_baseline_only_in_their_objective_and_names():
    """The sweep is fair by construction: each unsup_bert_base_*.yaml, parsed as train.py parses it, equals the
    symmetric-InfoNCE baseline in every field (recipe, data, schedule, seed, temperature) except its own loss's keys
    and the output names; objective keys of other losses keep their defaults; the paper's simcse-form InfoNCE is its
    own config; every config builds its loss."""
    paths = sorted((ROOT / "configs").glob("unsup_bert_base_*.yaml"))
    names = {path.name for path in paths}
    assert {BASELINE, "unsup_bert_base_infonce_simcse.yaml"} <= names and len(names) >= 6
    baseline = parsed(ROOT / "configs" / BASELINE)
    assert (baseline["loss"], baseline["contrast_form"]) == ("infonce", "symmetric")
    defaults = parsed(ROOT / "configs" / "debug_tiny.yaml")  # for the loss fields no config of its loss sets
    other_objectives = {name for name in CONFIG_FIELDS if name.split("_")[0] in LOSSES}
    losses = set()
    for path in paths:
        config = parsed(path)
        own = objective_fields(config["loss"])
        differing = {name for name in CONFIG_FIELDS if config[name] != baseline[name]}
        assert differing <= own | NAME_FIELDS, f"{path.name}: {sorted(differing - own - NAME_FIELDS)}"
        for name in other_objectives - own:
            assert config[name] == defaults[name], f"{path.name} sets {name}, a key of another loss"
        slug = path.stem.removeprefix("unsup_bert_base_").replace("_", "-")
        assert config["output_dir"] == f"outputs/unsup-bert-base-{slug}", path.name
        assert config["hub_model_id"] == f"simcse-hn/unsup-bert-base-{slug}", path.name
        args = parse_args(["--config", str(path)])[2]
        build_loss(args.loss, **args.loss_kwargs())
        losses.add((config["loss"], config["contrast_form"]))
    assert ("infonce", "simcse") in losses and {loss for loss, _ in losses} == set(LOSSES)
    assert baseline["per_device_train_batch_size"] == 64 and baseline["learning_rate"] == 3e-5
    assert baseline["temperature"] == 0.05


def test_config_check_catches_a_config_that_changes_the_recipe(tmp_path):
    """The check above must be able to fail: a DCL config with another learning rate, or with HCL's beta, breaks it."""
    baseline = parsed(ROOT / "configs" / BASELINE)
    path = tmp_path / "unsup_bert_base_dcl.yaml"
    path.write_text((ROOT / "configs" / "unsup_bert_base_dcl.yaml").read_text() + "learning_rate: 1.0e-4\n",
                    encoding="utf-8")  # fmt: skip
    config = parsed(path)
    differing = {name for name in CONFIG_FIELDS if config[name] != baseline[name]}
    assert "learning_rate" in differing - objective_fields("dcl") - NAME_FIELDS
    # another objective's key is refused when the config is parsed, before any check of the recipe
    path.write_text((ROOT / "configs" / "unsup_bert_base_dcl.yaml").read_text() + "hcl_beta: 0.5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^hcl_beta: not used by --loss dcl"):
        parsed(path)


def test_supervised_configs_differ_from_their_baseline_only_in_their_objective_and_names():
    """The same check for the paired family: each sup_bert_base_*.yaml equals sup_bert_base_infonce.yaml (SimCSE's
    supervised recipe) in every field but its own loss's keys and the names; its loss keys are those of the unsup
    config of the same loss, so both families train the same objectives; one config per objective."""
    paths = sorted((ROOT / "configs").glob("sup_bert_base_*.yaml"))
    baseline = parsed(ROOT / "configs" / "sup_bert_base_infonce.yaml")
    defaults = parsed(ROOT / "configs" / "debug_tiny.yaml")
    other_objectives = {name for name in CONFIG_FIELDS if name.split("_")[0] in LOSSES}
    losses = []
    for path in paths:
        config = parsed(path)
        own = objective_fields(config["loss"])
        differing = {name for name in CONFIG_FIELDS if config[name] != baseline[name]}
        assert differing <= own | NAME_FIELDS, f"{path.name}: {sorted(differing - own - NAME_FIELDS)}"
        for name in other_objectives - own:
            assert config[name] == defaults[name], f"{path.name} sets {name}, a key of another loss"
        unsup = parsed(ROOT / "configs" / path.name.replace("sup_", "unsup_", 1))
        assert {k: config[k] for k in own - {"contrast_form"}} == {k: unsup[k] for k in own - {"contrast_form"}}
        slug = path.stem.removeprefix("sup_bert_base_")
        assert config["output_dir"] == f"outputs/sup-bert-base-{slug}", path.name
        assert config["hub_model_id"] == f"simcse-hn/sup-bert-base-{slug}", path.name
        args = parse_args(["--config", str(path)])[2]
        build_loss(args.loss, **args.loss_kwargs())
        losses.append(config["loss"])
    assert sorted(losses) == sorted(LOSSES)
    recipe = {key: baseline[key] for key in ("per_device_train_batch_size", "learning_rate", "num_train_epochs",
              "max_seq_length", "temperature", "pooler", "mlp_only_train", "data_format", "train_data_files",
              "hard_negative_weight")}  # fmt: skip
    assert recipe == {"per_device_train_batch_size": 512, "learning_rate": 5e-5, "num_train_epochs": 3.0,
                      "max_seq_length": 32, "temperature": 0.05, "pooler": "cls", "mlp_only_train": False,
                      "data_format": "pairs", "train_data_files": "nli_for_simcse.csv", "hard_negative_weight": 0.0}


@pytest.mark.parametrize("form", ["symmetric", "simcse"])
def test_trainer_tells_the_loss_what_its_targets_are(form):
    """simcse_hn.training.step.contrastive_loss on one process: in the symmetric form the targets' checked facts
    say that the anchors are the candidates (ProGCL's triangle fit, UnReMix's shared products) and that the negatives
    are the standard ones (UnReMix's R without a product); they must then be exactly every row but the anchor and its
    positive. In the simcse form neither holds."""
    from types import SimpleNamespace

    from simcse_hn.training.step import contrastive_loss

    seen = {}

    def compute(candidates, targets, context):
        seen.update(candidates=candidates, targets=targets, context=context)

    embeddings = torch.randn(8, 4)
    contrastive_loss(SimpleNamespace(compute=compute), embeddings, form=form, step=3, max_steps=10)
    targets = seen["targets"]
    symmetric = form == "symmetric"
    assert seen["candidates"] is embeddings
    assert targets.anchors_are_candidates == symmetric and targets.standard_negatives == symmetric
    assert (seen["context"].step, seen["context"].max_steps, seen["context"].all_reduce) == (3, 10, None)
    rows = torch.arange(8)
    anchors = rows if symmetric else rows[0::2]
    assert torch.equal(targets.anchor_index, anchors) and torch.equal(targets.positive_index, anchors ^ 1)
    standard = (rows[None] != anchors[:, None]) & (rows[None] != (anchors ^ 1)[:, None])
    assert torch.equal(targets.negative_mask, standard if symmetric else standard & (rows % 2 == 1)[None])


def test_a_run_whose_debiasing_clamp_holds_warns_once_naming_the_setting(tiny_args, caplog):
    """SimCSETrainer registers the clamp warning: DCL with a large prior and identical views (dropout 0, so s_ip = 1)
    clamps nearly every anchor (mean pooling: the tiny model's CLS vectors are all alike)."""
    from simcse_hn.cli import train

    extra = ["--loss", "dcl", "--dcl_tau_plus", "0.5", "--dropout", "0", "--pooler", "avg", "--max_steps", "4",
             "--logging_steps", "2",
             "--eval_strategy", "no", "--load_best_model_at_end", "false", "--save_strategy", "no"]  # fmt: skip
    with caplog.at_level("WARNING"):
        trainer = train.run(tiny_args + extra)
    logged = [e["clamp_frac"] for e in trainer.state.log_history if "clamp_frac" in e]
    assert len(logged) == 2 and logged[0] < 0.5 < logged[1]  # the clamp takes over in the second window
    warnings = [r.getMessage() for r in caplog.records if "dcl_tau_plus 0.5" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("step 4:"), warnings
