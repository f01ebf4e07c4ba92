"""Every objective trains end to end from the tiny config, its diagnostics reach the logs (TensorBoard too), and
the paper configs differ only in the loss keys and names."""

from __future__ import annotations

import glob

import pytest
import torch
import yaml
from conftest import ROOT

import train
from simcse_hn.losses import LOSSES

LOSS_FLAGS = {
    "infonce": ["--loss", "infonce", "--contrast_form", "simcse"],
    "dcl": ["--loss", "dcl"],
    "hcl": ["--loss", "hcl", "--hcl_beta", "0.5"],
    "progcl-weight": ["--loss", "progcl", "--progcl_warmup_ratio", "0.25"],
    "progcl-mix": ["--loss", "progcl", "--progcl_mode", "mix", "--progcl_warmup_ratio", "0.25"],
    "unremix": ["--loss", "unremix", "--unremix_learn_mixture", "true"],
}


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


LOSS_KEYS = {"loss", "contrast_form", "temperature"}
NAME_KEYS = {"output_dir", "hub_model_id"}


def test_paper_configs_differ_only_in_loss_keys_and_names():
    configs = {
        path: yaml.safe_load(open(path, encoding="utf-8"))
        for path in sorted(glob.glob(str(ROOT / "configs" / "unsup_bert_base_*.yaml")))
    }
    assert len(configs) == 5
    shared = None
    for path, config in configs.items():
        loss = config["loss"]
        rest = {k: v for k, v in config.items() if k not in LOSS_KEYS | NAME_KEYS and not k.startswith(f"{loss}_")}
        if loss == "dcl":  # DCL is HCL with beta = 0: its prior is the hcl_tau_plus field
            rest = {k: v for k, v in rest.items() if k != "hcl_tau_plus"}
        shared = shared or rest
        assert rest == shared, path
        assert config["output_dir"].endswith(path.rsplit("unsup_bert_base_", 1)[1][:-5])
    assert shared["per_device_train_batch_size"] == 64 and shared["learning_rate"] == 3e-5


@pytest.mark.parametrize("form", ["symmetric", "simcse"])
def test_trainer_tells_the_loss_what_its_targets_are(form):
    """simcse_hn.trainer.contrastive_loss on one process: in the symmetric form the targets' checked facts say that
    the anchors are the candidates (ProGCL's triangle fit, UnReMix's shared products) and that the negatives are the
    standard ones (UnReMix's R without a product); they must then be exactly every row but the anchor and its
    positive. In the simcse form neither holds."""
    from types import SimpleNamespace

    from simcse_hn.trainer import contrastive_loss

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
