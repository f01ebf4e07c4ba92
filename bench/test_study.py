"""bench/study.py's reading of the runs against its plan: nothing tested before all 60 runs are in; then each arm
against the baseline by the exact sign-flip test and the paired t-test, Holm over the five arms."""

import json

import pytest

from bench import study


def noise(arm: str, seed: int) -> float:
    return 0.05 * ((seed * 7 + len(arm)) % 5 - 2)  # differs by arm and seed, the same every call


def runs(shift: dict[str, float], seeds=study.SEEDS, folder=None) -> dict:
    """Synthetic records; with a folder, each run also keeps a results.json whose STS-B is the average plus 1 and
    whose SICK-R is the arm's name length / 100 plus the noise, and a last window whose loss is the arm's shift."""
    out = {}
    for seed in seeds:
        for arm in study.ARMS:
            key = f"{arm}-b64-s{seed}"
            provenance = {"train_data_sha256": "d", "train_code_sha256": "c", "eval_code_sha256": "c"}
            average = 75.0 + shift.get(arm, 0.0) + noise(arm, seed)
            entry = {"arm": arm, "seed": seed, "batch_size": 64, "average": average, "provenance": provenance}
            if folder is not None:
                (folder / key).mkdir()
                sick = len(arm) / 100 + noise(arm, seed)
                tasks = {"STS-B": {"spearman": entry["average"] + 1}, "SICK-R": {"spearman": sick}}
                (folder / key / "results.json").write_text(json.dumps({"tasks": tasks}))
                entry["results"] = str(folder / key)
                entry["diagnostics"] = {"loss": shift.get(arm, 0.0), "clamp_frac": 0.5}
            out[key] = entry
    return out


def test_nothing_is_tested_before_every_arm_has_every_seed():
    partial = runs({}, seeds=study.SEEDS[:9])
    result = study.analysis(partial)
    assert not result["complete"] and "tests" not in result
    assert all(v["seeds"] == list(study.SEEDS[:9]) for v in result["arms"].values())
    assert "counts the runs only" in study.markdown({"analysis": result, "runs": len(partial),
                                                     "environment": {"date": "d", "commit": "c"}})  # fmt: skip


def test_an_arm_ten_seeds_ahead_differs_and_the_others_are_bounded(tmp_path):
    result = study.analysis(runs({"hcl": 1.0}, folder=tmp_path))
    tests = result["tests"]
    assert set(tests) == set(study.ARMS) - {study.BASELINE}
    assert tests["hcl"]["p_sign_flip"] == pytest.approx(2 / 1024) and tests["hcl"]["differs"]
    assert tests["hcl"]["p_sign_flip_holm"] == pytest.approx(5 * 2 / 1024)  # the smallest of five
    assert not tests["dcl"]["differs"] and tests["dcl"]["low"] < 0 < tests["dcl"]["high"]
    page = study.markdown({"analysis": result, "runs": 60, "environment": {"date": "d", "commit": "c"}})
    assert "differs: +1.00" in page and "the interval excludes effects above" in page
    # secondary, untested: per-task differences over the paired seeds and the last window's diagnostics
    assert result["per_task"]["hcl"]["STS-B"] == pytest.approx(1.0)
    sick = sum(noise("hcl", s) - noise(study.BASELINE, s) for s in study.SEEDS) / len(study.SEEDS) - 0.04
    assert result["per_task"]["hcl"]["SICK-R"] == pytest.approx(sick)
    assert result["diagnostics"]["hcl"] == {"loss": 1.0, "clamp_frac": 0.5} and not result["provenance_problems"]
    assert "| hcl | +1.00 |" in page and "| hcl | 1 | 0.5 |" in page


def test_runs_trained_by_other_code_or_data_than_the_rest_are_named(tmp_path):
    records = runs({}, seeds=study.SEEDS[:2])
    records["unremix-b64-s43"]["provenance"] = {"train_data_sha256": "other", "train_code_sha256": "c"}
    records["dcl-b64-s42"]["provenance"] = {"train_data_sha256": "d", "train_code_sha256": "other"}
    problems = study.analysis(records)["provenance_problems"]
    assert "the study's 12 runs record 2 different train_data_sha256" in problems
    assert "the study's 12 runs record 2 different train_code_sha256" in problems
    assert "Provenance problems" in study.markdown({"analysis": study.analysis(records), "runs": 12,
                                                    "environment": {"date": "d", "commit": "c"}})  # fmt: skip


def test_the_plan_runs_seed_by_seed_with_the_regime_and_the_chosen_settings():
    todo = study.plan_runs({})
    assert len(todo) == 60 and [r[2] for r in todo[:6]] == [42] * 6
    flags = study.flags("hcl")
    assert flags[-len(study.REGIME) :] == study.REGIME
    assert flags[len(flags) - 1 - flags[::-1].index("--hcl_beta") + 1] == "0.2"  # the last --hcl_beta wins
    assert study.plan_runs({"infonce-b64-s42": {}})[0][0] == "hcl"


def test_the_committed_report_regenerates_byte_for_byte_from_its_runs_through_the_products_tests():
    """bench/results/study: report.json's analysis recomputed from runs.json and the kept results (the tests now by
    simcse_hn.study.analysis), and the page from it, equal to what is committed."""
    committed = json.loads((study.OUT / "report.json").read_text())
    recomputed = study.analysis(json.loads((study.OUT / "runs.json").read_text())["runs"])
    assert json.dumps(recomputed, sort_keys=True) == json.dumps(committed["analysis"], sort_keys=True)
    page = study.markdown({**committed, "analysis": recomputed})
    assert page == (study.OUT / "report.md").read_text(encoding="utf-8")
