"""bench/study.py's reading of the runs against its plan: nothing tested before all 60 runs are in; then each arm
against the baseline by the exact sign-flip test and the paired t-test, Holm over the five arms."""

import pytest

from bench import study


def runs(shift: dict[str, float], seeds=study.SEEDS) -> dict:
    out = {}
    for seed in seeds:
        for arm in study.ARMS:
            noise = 0.05 * ((seed * 7 + len(arm)) % 5 - 2)  # differs by arm and seed, the same every call
            out[f"{arm}-b64-s{seed}"] = {"arm": arm, "seed": seed, "batch_size": 64,
                                         "average": 75.0 + shift.get(arm, 0.0) + noise}  # fmt: skip
    return out


def test_nothing_is_tested_before_every_arm_has_every_seed():
    partial = runs({}, seeds=study.SEEDS[:9])
    result = study.analysis(partial)
    assert not result["complete"] and "tests" not in result
    assert all(v["seeds"] == list(study.SEEDS[:9]) for v in result["arms"].values())
    assert "counts the runs only" in study.markdown({"analysis": result, "runs": len(partial),
                                                     "environment": {"date": "d", "commit": "c"}})  # fmt: skip


def test_an_arm_ten_seeds_ahead_differs_and_the_others_are_bounded():
    result = study.analysis(runs({"hcl": 1.0}))
    tests = result["tests"]
    assert set(tests) == set(study.ARMS) - {study.BASELINE}
    assert tests["hcl"]["p_sign_flip"] == pytest.approx(2 / 1024) and tests["hcl"]["differs"]
    assert tests["hcl"]["p_sign_flip_holm"] == pytest.approx(5 * 2 / 1024)  # the smallest of five
    assert not tests["dcl"]["differs"] and tests["dcl"]["low"] < 0 < tests["dcl"]["high"]
    page = study.markdown({"analysis": result, "runs": 60, "environment": {"date": "d", "commit": "c"}})
    assert "differs: +1.00" in page and "the interval excludes effects above" in page


def test_the_plan_runs_seed_by_seed_with_the_regime_and_the_chosen_settings():
    todo = study.plan_runs({})
    assert len(todo) == 60 and [r[2] for r in todo[:6]] == [42] * 6
    flags = study.flags("hcl")
    assert flags[-len(study.REGIME):] == study.REGIME
    assert flags[len(flags) - 1 - flags[::-1].index("--hcl_beta") + 1] == "0.2"  # the last --hcl_beta wins
    assert study.plan_runs({"infonce-b64-s42": {}})[0][0] == "hcl"
