"""bench/pilot.py's regimes: what each asks of train.py and the uniform share its threshold doubles."""

import pytest

from bench import pilot


def test_a_queue_regime_is_a_queue_of_its_size_and_momentum():
    assert pilot.regime_flags("queue-k4096-m0.995") == ["--queue_size", "4096", "--momentum", "0.995"]
    assert pilot.negatives_per_anchor(64, "queue-k4096-m0.995") == 126 + 4096
    assert pilot.uniform_top_share(64, "queue-k4096-m0") == 43 / 4222  # ceil(1 % of 4222) of 4222
    assert pilot.uniform_top_share(64, "random") == 2 / 126
    for bad in ("queue-4096-m0.9", "queue-k4096", "queue-kx-m0.9"):
        with pytest.raises(SystemExit, match="queue-k<size>-m<momentum>"):
            pilot.regime_flags(bad)


def test_an_arm_may_override_its_configs_keys():
    flags = pilot.objective_flags("dcl@dcl_tau_plus=1e-4")
    assert flags[flags.index("--loss") + 1] == "dcl"
    assert flags[-2:] == ["--dcl_tau_plus", "1e-4"]  # after the config's own value: the parser keeps the last
    assert "--dcl_tau_plus" in flags[:-2]
