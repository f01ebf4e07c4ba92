"""The report reads only records it has checked against their files (study_fakes writes runs as the study does,
with scores computed here by scipy): blind until every run is in, then the plan's verdicts word for word and the rest
under a heading that says it is exploratory; and every way of passing it a record that is not what it says is refused
in one line naming the run: an edited number, a record copied to another seed's name (alone, or with its folders and
its seed edited), a forged scores file, gold scores that are not the data's, an edited weight, a record without
hashes, a stray record, a copy under another name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from study_fakes import PLAN, RULES, fake_run, fake_runs, sha, spearman, with_rules, write_plan

from simcse_hn.evaluation.stats import sign_flip_test
from simcse_hn.study import lock, records, report
from simcse_hn.study.plan import load_plan
from simcse_hn.study.report_page import EXPLORATORY, markdown

NOISE = {"infonce": 1.0, "hcl": 0.5}  # HCL's cosines nearer the gold scores: ahead on every seed


def study(tmp_path: Path, text: str = with_rules()) -> tuple:
    plan = load_plan(str(write_plan(tmp_path, text)), check_arms=False)
    return plan, lock.lock(plan)


def values(tmp_path: Path, arm: str, seeds) -> list[float]:
    from study_fakes import cosines

    return [spearman(tmp_path, cosines(tmp_path, arm, s, NOISE[arm])) for s in seeds]


def refused(plan) -> dict[str, str]:
    report.write_report(plan)
    return json.loads((Path(plan.study_dir) / "report.json").read_text())["refused"]


def test_blind_before_the_last_run_then_the_plans_verdicts_word_for_word_and_the_rest_exploratory(tmp_path):
    plan, version = study(tmp_path)
    keys = [records.run_key(a, s) for s in plan.seeds for a in plan.arms]
    fake_runs(plan, version, NOISE, keys[:-1])
    page, _ = report.write_report(plan)
    record = json.loads((tmp_path / "study" / "report.json").read_text())
    assert "11 of 12 runs in" in page and "Blind" in page and "| hcl | 5 of 6 |" in page
    assert "Verdict" not in page and set(record) & {"summary", "comparison", "verdicts"} == set()
    fake_runs(plan, version, NOISE, keys[-1:])
    page, gone = report.write_report(plan)
    record = json.loads((tmp_path / "study" / "report.json").read_text())
    hcl, infonce = values(tmp_path, "hcl", plan.seeds), values(tmp_path, "infonce", plan.seeds)
    expected = sign_flip_test(hcl, infonce)["p"]
    assert gone == {} and expected == pytest.approx(2 / 64)
    test = record["comparison"]["tests"]["hcl"]
    assert test["p_sign_flip"] == pytest.approx(expected) and test["difference"] == pytest.approx(
        np.mean(np.subtract(hcl, infonce))
    )
    # the verdicts: HCL better (Holm's p below 0.05), written as the plan wrote it, and nothing else above the line
    verdicts, rest = page.split(EXPLORATORY)
    assert RULES["rules"][0]["say"] in verdicts and RULES["rules"][1]["say"] not in page
    assert "| hcl | differs, better |" in verdicts and "(rule 1: hcl better)" in verdicts
    said = [
        line
        for line in verdicts.splitlines()[
            verdicts.splitlines().index("## Verdicts: the plan's rules, word for word") :
        ]
        if line.strip()
    ]
    assert [line for line in said if not line.startswith(("|", "#", "(rule", "Outcomes by"))] == [
        RULES["rules"][0]["say"]
    ]
    assert "What the study could detect:" in rest and f"{test['difference']:+.3f}" in rest
    assert markdown(record) == page


def test_rules_that_hold_for_no_outcome_give_no_verdict_and_equivalence_is_tost_at_the_simultaneous_level(tmp_path):
    rules = {
        "margin": 60.0,
        "rules": [
            {"when": {"hcl": "worse"}, "say": "HCL loses."},
            {"when": {"hcl": "equivalent"}, "say": "Within sixty points."},
        ],
    }
    plan, version = study(tmp_path, with_rules(rules=rules))
    fake_runs(plan, version, NOISE)
    page, _ = report.write_report(plan)
    tost = json.loads((tmp_path / "study" / "report.json").read_text())["comparison"]["tests"]["hcl"]["tost"]
    assert tost["p"] == pytest.approx(1 / 64)  # every difference inside +-20: the one-sided floor, below 0.05
    assert "Within sixty points." in page and "HCL loses." not in page
    rules["margin"] = 0.001
    plan, version = study(tmp_path / "x" if not (tmp_path / "x").mkdir() else None, with_rules(rules=rules))
    fake_runs(plan, version, NOISE)
    page, _ = report.write_report(plan)
    assert "No rule of the plan holds for these outcomes: the plan earns no verdict here." in page


def test_a_record_whose_numbers_seed_or_files_are_not_its_own_is_refused_in_one_line(tmp_path):
    plan, version = study(tmp_path)
    fake_runs(plan, version, NOISE)
    runs = tmp_path / "study" / "runs"

    def edit(key: str, change) -> None:
        path = runs / f"{key}.json"
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    def minus_five(r: dict) -> None:  # issue 67's first forgery
        r["scores"]["tasks"]["STS-B"] -= 5
        r["scores"]["average"] -= 5

    edit("hcl-s1", minus_five)
    shutil.copyfile(runs / "infonce-s1.json", runs / "infonce-s2.json")  # a seed's record under another's name
    for name in ("hcl-s3", "hcl-s3-sts"):  # a whole run copied onto another seed, its seed edited to match
        shutil.rmtree(runs / name) if (runs / name).is_dir() else None
    shutil.copytree(runs / "hcl-s2-sts", runs / "hcl-s3-sts")
    edit("hcl-s3", lambda r: r.update(json.loads((runs / "hcl-s2.json").read_text()), seed=3))
    results = json.loads((runs / "hcl-s3-sts" / "results.json").read_text())
    results["training"]["seed"] = 3
    (runs / "hcl-s3-sts" / "results.json").write_text(json.dumps(results))  # ... with its mark and hashes redone
    mark = {"files": {n: [sha(runs / "hcl-s3-sts" / n)] for n in ("results.json", "predictions.npz")}}
    (runs / "hcl-s3-sts" / "simcse_report.json").write_text(json.dumps(mark))
    edit(
        "hcl-s3",
        lambda r: r["bound"]["scores"].update(
            {n: sha(runs / "hcl-s3-sts" / n) for n in ("results.json", "predictions.npz")}
        ),
    )
    edit("infonce-s4", lambda r: r.update(arm="hcl"))
    edit("infonce-s5", lambda r: r.pop("bound"))
    results = json.loads((runs / "hcl-s5-sts" / "results.json").read_text())  # a forged scores file, mark and all
    results["average"] += 1
    (runs / "hcl-s5-sts" / "results.json").write_text(json.dumps(results))
    shutil.copyfile(runs / "hcl-s6.json", runs / "hcl-s7.json")
    found = refused(plan)
    said = found.pop("hcl-s1")
    forged = json.loads((runs / "hcl-s1.json").read_text())["scores"]["tasks"]["STS-B"]
    assert said.startswith(f"its STS-B {forged} is not what its predictions give (") and float(
        said[:-1].split("(")[-1]
    ) == pytest.approx(json.loads((runs / "hcl-s1-sts" / "results.json").read_text())["average"])
    assert found == {
        "infonce-s2": "names arm 'infonce' seed 1, not the run infonce-s2",
        "infonce-s4": "names arm 'hcl' seed 4, not the run infonce-s4",
        "infonce-s5": "no hashes of its model and scores (version 1's runs carry them)",
        "hcl-s5": "results.json is not the file eval/sts.py wrote (simcse_report.json lists another)",
        "hcl-s7": "not a run of the plan (no arm and seed of it has this name)",
        "hcl-s3": "its predictions are hcl-s2's: a copy",
    }
    page = (tmp_path / "study" / "report.md").read_text()
    assert "6 of 12 runs in" in page and "Blind" in page


def test_gold_scores_that_are_not_the_evaluation_datas_and_a_changed_weight_are_refused(tmp_path):
    plan, version = study(tmp_path)
    fake_runs(plan, version, NOISE)
    runs = tmp_path / "study" / "runs"
    scores = runs / "hcl-s1-sts"
    with np.load(scores / "predictions.npz") as data:
        arrays = dict(data)
    arrays["STS-B/gold"] = arrays["STS-B/gold"][::-1].copy()  # the forger's gold, to fit the forged scores
    np.savez_compressed(scores / "predictions.npz", **arrays)
    record = json.loads((runs / "hcl-s1.json").read_text())
    record["bound"]["scores"]["predictions.npz"] = sha(scores / "predictions.npz")
    mark = json.loads((scores / "simcse_report.json").read_text())
    mark["files"]["predictions.npz"] = [sha(scores / "predictions.npz")]
    (scores / "simcse_report.json").write_text(json.dumps(mark))
    (runs / "hcl-s1.json").write_text(json.dumps(record))
    model = runs / "hcl-s2"  # a model folder beside its record: its weights bound by sha256
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "simcse_files.json").write_text(json.dumps({"files": ["model.safetensors", "simcse_files.json"]}))
    record = json.loads((runs / "hcl-s2.json").read_text())
    record["bound"]["model"]["files"] = {"model.safetensors": sha(model / "model.safetensors")}
    (runs / "hcl-s2.json").write_text(json.dumps(record))
    (model / "model.safetensors").write_bytes(b"weights, edited")
    found = refused(plan)
    assert found["hcl-s1"] == "predictions.npz: STS-B's gold scores are not the evaluation data's test pairs"
    assert found["hcl-s2"] == "its model folder's model.safetensors is not what its record binds"


def test_a_run_of_another_seed_or_objective_in_the_scores_is_refused(tmp_path):
    plan, version = study(tmp_path)
    objective = lock.locked_plan(plan, version)["arms"]["hcl"]["objective"]
    fake_runs(plan, version, NOISE)
    other = {**objective, "loss_kwargs": {**objective["loss_kwargs"], "beta": 0.7}}
    fake_run(plan, version, "hcl", 2, NOISE["hcl"], objective=other)
    assert refused(plan)["hcl-s2"] == (
        f"the scored model was trained with the options {other['loss_kwargs']}, not "
        f"the arm's {objective['loss_kwargs']}"
    )


def test_the_family_reads_its_verdicts_from_holm_over_every_plan(tmp_path):
    second = (
        PLAN.replace("name: tiny", "name: second").replace(
            "hcl: {loss: hcl, hcl_beta: 0.5}", "hcl: {loss: hcl, hcl_beta: 0.5}\n  dcl: {loss: dcl}"
        )
        + "output_dir: study2\n"
    )
    rules = {"rules": [{"when": {"hcl": "better", "second: dcl": "not_shown"}, "say": "HCL, not DCL."}]}
    path = write_plan(tmp_path, with_rules(PLAN + "family: [second.yaml]\n", rules))
    (tmp_path / "second.yaml").write_text(second + "family: [study.yaml]\n")  # plans may name each other
    first, other = load_plan(str(path), check_arms=False), load_plan(str(tmp_path / "second.yaml"), check_arms=False)
    one, two = lock.lock(first), lock.lock(other)
    fake_runs(first, one, NOISE)
    keys = [records.run_key(a, s) for s in other.seeds for a in other.arms]
    fake_runs(other, two, {**NOISE, "dcl": 1.0}, keys[:-1])
    page, _ = report.write_report(first)
    assert "second (17 of 18 runs in)" in page and "Blind" in page and "of every plan of its family" in page
    fake_runs(other, two, {**NOISE, "dcl": 1.0}, keys[-1:])
    page, _ = report.write_report(first)
    record = json.loads((tmp_path / "study" / "report.json").read_text())
    assert list(record["verdicts"]["outcomes"]) == ["tiny: hcl", "second: hcl", "second: dcl"]
    assert record["family_comparison"]["m"] == 3 and record["comparison"]["m"] == 1
    holds = (
        "better" in record["verdicts"]["outcomes"]["tiny: hcl"]
        and "not_shown" in record["verdicts"]["outcomes"]["second: dcl"]
    )
    assert ("HCL, not DCL." in page.split(EXPLORATORY)[0]) is holds


def test_rules_given_for_a_plan_locked_without_any_are_said_to_come_after_the_runs(tmp_path):
    plan, version = study(tmp_path, PLAN)
    fake_runs(plan, version, NOISE)
    page, _ = report.write_report(plan)
    assert "The plan states no verdict rules: nothing on this page is a verdict." in page
    given = tmp_path / "rules.yaml"
    given.write_text(yaml.safe_dump({"source": "the plan's prose", "verdicts": RULES}))
    page, _ = report.write_report(plan, str(given))
    assert (
        "These rules were not locked with the plan: they were given to `report` after the runs, from rules.yaml "
        "(the plan's prose)."
    ) in page and RULES["rules"][0]["say"] in page
    plan, _ = study(tmp_path / "y" if not (tmp_path / "y").mkdir() else None)
    with pytest.raises(report.PlanError, match="locks its own verdict rules; they are the only ones"):
        report.write_report(plan, str(given))


def test_rules_locked_after_the_first_run_started_are_said_to_be_no_preregistration(tmp_path):
    plan, version = study(tmp_path, PLAN)
    fake_runs(plan, version, NOISE)
    for path in (tmp_path / "study" / "runs").glob("*.json"):  # the runs started long before any lock
        record = json.loads(path.read_text())
        record["times"]["started"] = "2000-01-01T00:00:00+00:00"
        path.write_text(json.dumps(record))
    Path(plan.path).write_text(with_rules())
    plan = load_plan(plan.path, check_arms=False)
    amended = lock.lock(plan, reason="verdict rules, after the runs")
    page, _ = report.write_report(plan)
    assert (
        f"These rules were locked at {amended['locked_at']}, after the first run started "
        "(2000-01-01T00:00:00+00:00): they are not preregistered."
    ) in page.split(EXPLORATORY)[0]
