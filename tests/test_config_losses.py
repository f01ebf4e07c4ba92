"""The loss fields of the configuration: one-line errors for settings that are not what their name says, and config
defaults that are the loss classes' own."""

from __future__ import annotations

import pytest

from simcse_hn.configuration.parser import parse_args
from simcse_hn.errors import ConfigError
from simcse_hn.losses import build_loss


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--loss", "dcl", "--dcl_tau_plus", "0"], "dcl_tau_plus: 0 makes DCL symmetric InfoNCE"),
        (["--loss", "dcl", "--hcl_tau_plus", "0.1"], "hcl_tau_plus: not used by --loss dcl; set dcl_tau_plus"),
        (["--dcl_tau_plus", "1.0"], "dcl_tau_plus: must be in [0, 1)"),
        (["--loss", "progcl", "--progcl_fit_pairs", "-1"], "progcl_fit_pairs: must be >= 0"),
        (["--unremix_mixture_entropy", "-0.5"], "unremix_mixture_entropy: must be a finite number >= 0"),
    ],
)
def test_loss_settings_that_are_not_what_they_say_fail_on_one_line(argv, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        parse_args(argv + ["--output_dir", str(tmp_path)])
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--loss", "dcl", "--hcl_beta", "0.3"], "hcl_beta: not used by --loss dcl (hcl_beta is an option of --loss "
         "hcl)"),
        (["--loss", "hcl", "--dcl_tau_plus", "0.01"], "dcl_tau_plus: not used by --loss hcl; set hcl_tau_plus"),
        (["--dcl_tau_plus", "0.01"], "dcl_tau_plus: not used by --loss infonce (dcl_tau_plus is an option of "
         "--loss dcl)"),
        (["--loss", "unremix", "--progcl_mode", "mix"], "progcl_mode: not used by --loss unremix"),
    ],
)
def test_an_option_of_another_objective_is_refused_naming_both(argv, message, tmp_path):
    """An option of an objective that is not the selected one would be accepted and ignored: refused, one line."""
    with pytest.raises(ConfigError) as error:
        parse_args(argv + ["--output_dir", str(tmp_path)])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("loss", ["infonce", "dcl", "hcl", "hardness", "progcl", "unremix"])
def test_config_defaults_are_the_loss_classes_defaults(loss, tmp_path):
    """A run configured with defaults trains the loss the class documents (DCL's measured prior, ProGCL's sampled
    fit, UnReMix's entropy bonus): build_loss with loss_kwargs() equals build_loss with nothing but the name."""
    args = parse_args(["--loss", loss, "--output_dir", str(tmp_path)])[2]
    configured, default = build_loss(loss, **args.loss_kwargs()), build_loss(loss)
    assert configured.options == default.options and configured.temperature == default.temperature
    if loss == "dcl":
        assert configured.options.tau_plus == 1e-3
    if loss == "progcl":
        assert configured.options.fit_pairs == 65536
        zero = parse_args(["--loss", loss, "--progcl_fit_pairs", "0", "--output_dir", str(tmp_path)])[2]
        assert build_loss(loss, **zero.loss_kwargs()).options.fit_pairs == 0  # every pair
