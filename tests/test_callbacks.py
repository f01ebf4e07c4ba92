"""ClampWarningCallback: one warning, naming the setting, when the debiasing clamp holds for most anchors."""

from __future__ import annotations

import logging

import pytest
from transformers import TrainerControl, TrainerState

from simcse_hn.configuration.parser import parse_args
from simcse_hn.training.callbacks import ClampWarningCallback


def arguments(tmp_path, *flags):
    return parse_args([*flags, "--output_dir", str(tmp_path)])[2]


def log(callback, args, clamp_frac, step=50, main=True):
    state = TrainerState(global_step=step, is_world_process_zero=main)
    callback.on_log(args, state, TrainerControl(), logs={"loss": 0.1, "clamp_frac": clamp_frac})


def warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "simcse_hn.training.callbacks" and r.levelno == logging.WARNING]


def test_warns_once_naming_the_setting(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    callback, args = ClampWarningCallback(), arguments(tmp_path, "--loss", "dcl")
    log(callback, args, 0.4)
    log(callback, args, 0.5)  # not above one half
    assert warnings(caplog) == []
    log(callback, args, 0.72, step=75)
    log(callback, args, 0.95, step=100)
    (message,) = warnings(caplog)
    assert message.startswith("step 75: the debiasing clamp held for 72% of anchors over the last logging window")
    assert "(loss dcl, dcl_tau_plus 0.001, temperature 0.05)" in message


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--loss", "hcl", "--hcl_tau_plus", "0.05"], "loss hcl, hcl_tau_plus 0.05, hcl_beta 0.1, temperature 0.05"),
        (["--loss", "unremix", "--unremix_tau_plus", "0.1", "--temperature", "0.1"],
         "loss unremix, unremix_tau_plus 0.1, unremix_beta 1, temperature 0.1"),
    ],
)
def test_hcl_and_unremix_with_a_prior_warn_too(tmp_path, caplog, flags, named):
    caplog.set_level(logging.WARNING)
    log(ClampWarningCallback(), arguments(tmp_path, *flags), 0.9)
    (message,) = warnings(caplog)
    assert f"({named})" in message


@pytest.mark.parametrize("flags", [["--loss", "hcl"], ["--loss", "unremix"], ["--loss", "infonce"], []])
def test_no_warning_without_a_debiasing_prior(tmp_path, caplog, flags):
    """tau+ = 0 (HCL's and UnReMix's default): the clamp is not the debiasing one, nothing to say."""
    caplog.set_level(logging.WARNING)
    log(ClampWarningCallback(), arguments(tmp_path, *flags), 1.0)
    assert warnings(caplog) == []


def test_only_the_main_process_writes_it_and_evaluation_logs_are_ignored(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    args = arguments(tmp_path, "--loss", "dcl")
    other = ClampWarningCallback()
    log(other, args, 0.9, main=False)
    assert warnings(caplog) == [] and other.warned
    main = ClampWarningCallback()
    main.on_log(args, TrainerState(is_world_process_zero=True), TrainerControl(), logs={"eval_stsb_spearman": 80.0})
    assert warnings(caplog) == [] and not main.warned
