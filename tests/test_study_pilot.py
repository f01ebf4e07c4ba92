"""The pilot: its problems one line each; its go criteria; its tuning read for what a reviewer should doubt (a pick
at the edge of any grid, an objective's own `loss_options` grid included, or within its seeds' noise, and arms tuned
in different numbers of dimensions); the dev set counted against the test files sentence by sentence, case and
punctuation aside; and, end to end on the docs' plan, the confirmatory runs waiting for it, a dev set the plan
misstates refused, the grid tuned alike and the picks locked before the runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml
from study_fakes import PLAN, write_plan
from test_studies_doc import FIXTURES, study, write_example

from simcse_hn.errors import UserError
from simcse_hn.study import pilot, tuning
from simcse_hn.study.pilot_checks import check
from simcse_hn.study.plan import PlanError, load_plan

PILOT_PROBLEMS = """\
pilot:
  seeds: [1, true]
  criteria:
    loss_ratoi: 10
    loss_ratio: 10
    weight_share: {arms: [hcl, dcl], ratio: 0}
    clamp: {arms: [hcl], below: 0.5, above: 1}
  tune:
    infonce: {temperature: [0.04, 0.05]}
    hcl: {hcl_beta: [0.2, 0.4, 0.8]}
  untuned: {dcl: not an arm}
  dev: {file: nowhere.jsonl, split: dev, shares_with_test: 0}
"""


def plan_with(tmp_path, pilot_text: str):
    return load_plan(str(write_plan(tmp_path, PLAN + pilot_text)), check_arms=False)


def test_each_problem_of_the_pilot_is_one_line_naming_its_line(tmp_path):
    """A misspelt criterion would pass by never being read; an arm the plan lacks, a missing dev file, a dev set whose
    overlap with the test files the plan does not state: each refused."""
    plan = plan_with(tmp_path, PILOT_PROBLEMS)
    path = plan.path
    assert check(plan) == [
        f"{path}:15: pilot.seeds: a list of integer seeds, got [1, True]",
        f"{path}:17: pilot.criteria.loss_ratoi: unknown criterion; the criteria are loss_ratio, weight_share, clamp",
        f"{path}:18: pilot.criteria.loss_ratio: compares the baseline with the reference run; add pilot.reference "
        "(e.g. {queue_size: 0})",
        f"{path}:19: pilot.criteria.weight_share.arms: 'dcl' is not an arm of the plan",
        f"{path}:19: pilot.criteria.weight_share.ratio: a number > 0, got 0",
        f"{path}:20: pilot.criteria.clamp.above: unknown key; the keys are arms, below",
        f"{path}:21: pilot.tune: grids of unequal size (infonce 2, hcl 3); every arm gets the same tuning budget, or "
        "say why not in pilot.unequal_budget",
        f"{path}:24: pilot.untuned.dcl: not an arm of the plan",
        f"{path}:25: pilot.dev.file: nowhere.jsonl: no such file (relative to the plan; `simcse-hn-sts-data --output "
        "DIR` builds the STS folder from the Hub)",
        f"{path}:25: pilot.dev.shares_sentences_with_test: state how many of the dev set's pairs have a sentence a "
        "test file of the endpoint holds (case, punctuation and spacing aside; 0 for none)",
    ]
    plan = plan_with(tmp_path, PILOT_PROBLEMS.replace("  untuned:", "  unequal_budget: a joint grid\n  untuned:"))
    assert not any("unequal size" in line for line in check(plan))


def test_pilot_keys_are_train_py_keys_and_every_point_is_a_config_train_py_takes(tmp_path):
    pilot_part = {"overrides": {"max_stepz": 2}, "reference": {"queue_sizee": 0, "seed": 3}}
    path = write_plan(tmp_path, PLAN + yaml.safe_dump({"pilot": pilot_part}))
    with pytest.raises(PlanError) as e:
        load_plan(str(path))
    assert e.value.problems == [
        f"{path}:16: pilot.overrides.max_stepz: not a train.py key",
        f"{path}:18: pilot.reference.queue_sizee: not a train.py key",
        f"{path}:19: pilot.reference.seed: set by the study for each run; leave it out",
    ]
    pilot_part = {
        "reference": {"queue_size": -4},
        "tune": {"hcl": {"hcl_beta": [0.2, -1.0]}, "infonce": {"temperature": [0.05, 0.1]}},
    }
    path = write_plan(tmp_path, PLAN + yaml.safe_dump({"pilot": pilot_part}))
    with pytest.raises(PlanError) as e:
        load_plan(str(path))
    assert e.value.problems == [
        f"{path}:15: pilot.reference: queue_size: must be >= 0, got -4",
        f"{path}:18: pilot.tune.hcl: hcl_beta -1.0: hcl_beta: must be >= 0, got -1.0",
    ]


def test_the_uniform_share_counts_the_negatives_train_py_would_give():
    assert pilot.negatives_per_anchor({}) == 126  # train.py's batch 64, symmetric form: 2B - 2
    assert pilot.negatives_per_anchor({"per_device_train_batch_size": 64, "queue_size": 4096}) == 4222
    assert pilot.negatives_per_anchor({"contrast_form": "simcse", "per_device_train_batch_size": 8}) == 7  # B - 1


@pytest.mark.parametrize(("fractions", "ok"), [([0.3], True), ([0.7], False), ([0.3, 0.8], False), ([], False)])
def test_the_clamp_criterion_reads_the_arms_mean_clamped_fraction_and_a_missing_one_fails(tmp_path, fractions, ok):
    plan = plan_with(tmp_path, "pilot:\n  seeds: [1, 2]\n  criteria:\n    clamp: {arms: [hcl], below: 0.5}\n")
    assert check(plan) == []
    found = [{"arm": "hcl", "seed": s + 1, "change": None, "last": {"clamp_frac": f}} for s, f in enumerate(fractions)]
    verdict = pilot.verdict(plan, found, picks={})
    value = float(np.mean(fractions)) if fractions else None
    assert verdict["checks"] == {"hcl clamp": {"value": value, "needed": 0.5, "ok": ok}}
    assert verdict["go"] is ok


def dev_runs(arm: str, table: dict, key: str = "temperature") -> list[dict]:
    """Pilot runs of one arm with made-up dev scores: {value: [seed 1's, seed 2's, ...]}."""
    return [
        {"arm": arm, "seed": i + 1, "change": {key: value}, "dev": dev}
        for value, devs in table.items()
        for i, dev in enumerate(devs)
    ]


@pytest.mark.parametrize(
    ("infonce_dev", "edge"),
    [
        ({0.03: [80.0, 80.2], 0.05: [79.0, 79.4], 0.07: [78.0, 78.0]}, "lowest"),
        ({0.03: [78.0, 78.0], 0.05: [79.0, 79.4], 0.07: [80.0, 80.2]}, "highest"),
        ({0.03: [79.0, 79.4], 0.05: [80.0, 80.2], 0.07: [78.0, 78.0]}, None),
    ],
)
def test_the_pilot_page_doubts_a_pick_at_its_edge_or_within_the_seeds_noise(tmp_path, infonce_dev, edge):
    grid = "  tune:\n    infonce: {temperature: [0.03, 0.05, 0.07]}\n    hcl: {hcl_beta: [0.1, 0.2, 0.4]}\n"
    plan = plan_with(tmp_path, "pilot:\n  seeds: [1, 2]\n" + grid)
    hcl_dev = {0.1: [80.0, 80.1], 0.2: [80.3, 80.0], 0.4: [79.9, 80.0]}  # 0.2 ahead by 0.1, its seeds' sd 0.21
    found = dev_runs("infonce", infonce_dev) + dev_runs("hcl", hcl_dev, "hcl_beta")
    picks, _ = tuning.choose(plan, found)
    tuned = tuning.tuning(plan, found, picks)
    assert picks["hcl"] == {"hcl_beta": 0.2} and tuned["hcl"]["edges"] == {}
    assert tuned["infonce"]["edges"] == ({"temperature": edge} if edge else {})
    assert tuned["hcl"]["lead"] == pytest.approx(0.1) and tuned["hcl"]["sd_at_pick"] == pytest.approx(0.3 / 2**0.5)
    notes = [
        "hcl: the pick leads the next best point by 0.1, less than the sd of its dev score over the seeds "
        "(0.212): within the seeds' noise."
    ]
    if edge:
        value, beyond = {"lowest": ("0.03", "below"), "highest": ("0.07", "above")}[edge]
        notes.insert(
            0,
            f"infonce: the pick, temperature {value}, is the {edge} value of its grid: the best may lie "
            f"{beyond} it, which this pilot did not try.",
        )
    assert tuning.tuning_notes(tuned) == notes
    page = pilot.markdown(
        {
            "study": "tiny",
            "plan_version": 1,
            "checks": {},
            "go": True,
            "runs": [],
            "tuning": tuned,
            "dimensions": tuning.dimension_rows(plan),
        }
    )
    assert all(f"* {note}" in page for note in notes)
    assert "| infonce | temperature (3) | 3 |" in page and "| hcl | hcl_beta (3) | 3 |" in page


def test_a_loss_options_grid_has_edges_and_a_joint_grid_counts_its_dimensions(tmp_path):
    """Issue 69's shape: one arm tuned in temperature only, the others jointly in temperature and their own option
    (a `loss_options` grid of the user's objective among them), an arm left at 0.05: each arm's dimensions side by
    side, a warning that they are not tuned alike, an edge on the objective's own option, one seed's picks doubted."""
    grid = {
        "infonce": {"temperature": [0.03, 0.05, 0.07, 0.09]},
        "hcl": {"temperature": [0.03, 0.05], "loss_options": [{"beta": 0.1}, {"beta": 0.4}]},
    }
    text = PLAN.replace("hcl: {loss: hcl, hcl_beta: 0.5}", "hcl: {loss: hcl}\n  fixed: {temperature: 0.04}")
    part = {"seeds": [1], "tune": grid, "untuned": {"fixed": "InfoNCE at 0.04, against the tuned one"}}
    plan = load_plan(
        str(write_plan(tmp_path, text + yaml.safe_dump({"pilot": part}, sort_keys=False))), check_arms=False
    )
    rows = tuning.dimension_rows(plan)
    assert [(r["arm"], r["dimensions"], r["points"]) for r in rows] == [
        ("infonce", {"temperature": 4}, 4),
        ("hcl", {"temperature": 2, "loss_options.beta": 2}, 4),
        ("fixed", {}, 1),
    ]
    assert tuning.dimension_notes(rows) == [
        "warning: the arms are not tuned alike: hcl in 2 (temperature, loss_options.beta); infonce in 1 "
        "(temperature); fixed in 0 dimension(s); an arm tuned in more had more to choose from."
    ]
    found = [
        {"arm": "hcl", "seed": 1, "change": {"temperature": t, "loss_options": o}, "dev": 80 + t + o["beta"]}
        for t in (0.03, 0.05)
        for o in ({"beta": 0.1}, {"beta": 0.4})
    ]
    found += dev_runs("infonce", {0.03: [80.0], 0.05: [80.3], 0.07: [80.2], 0.09: [79.0]})
    picks, spread = tuning.choose(plan, found)
    assert picks["hcl"] == {"temperature": 0.05, "loss_options": {"beta": 0.4}} and spread is None
    tuned = tuning.tuning(plan, found, picks)
    assert tuned["hcl"]["edges"] == {"temperature": "highest", "loss_options.beta": "highest"}
    notes = tuning.tuning_notes(tuned)
    assert (
        "hcl: the pick, loss_options.beta 0.4, is the highest value of its grid: the best may lie above it, which "
        "this pilot did not try." in notes
    )
    assert "infonce: one pilot seed: whether the pick's lead (0.1) is more than noise is unknown." in notes


def test_the_dev_set_is_counted_against_the_test_files_sentence_by_sentence(tmp_path):
    """A dev pair that is a test pair up to a full stop and capitals, one that shares a sentence only, one apart."""
    tests = [
        {"sentence1": "A man plays the guitar.", "sentence2": "Someone plays music.", "score": 4.0},
        {"sentence1": "The cat sleeps.", "sentence2": "A dog barks loudly.", "score": 0.5},
    ]
    dev = [
        {"sentence1": "someone plays music", "sentence2": "A MAN PLAYS THE GUITAR", "score": 4.0},
        {"sentence1": "the cat, sleeps!", "sentence2": "Nothing like it.", "score": 1.0},
        {"sentence1": "Rain falls.", "sentence2": "Sun shines.", "score": 1.0},
    ]
    write_plan(tmp_path)
    (tmp_path / "sts" / "stsb.jsonl").write_text("".join(json.dumps(r | {"split": "test"}) + "\n" for r in tests))
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r | {"split": "dev"}) + "\n" for r in dev))
    part = {"dev": {"file": "dev.jsonl", "split": "dev", "shares_with_test": 0, "shares_sentences_with_test": 0}}
    (tmp_path / "study.yaml").write_text(PLAN + yaml.safe_dump({"pilot": part}))
    plan = load_plan(str(tmp_path / "study.yaml"), check_arms=False)
    found = tuning.overlap(plan)
    assert found == {"pairs": 1, "with_sentence": 2, "sentences": 3, "of": 3}
    assert pilot.overlap_problems(plan, found) == [
        f"{plan.path}: pilot.dev.shares_with_test: the plan states 0, but 1 of the dev set's pairs are test pairs of "
        "the endpoint (either order) (of its 3; case, punctuation and spacing aside)",
        f"{plan.path}: pilot.dev.shares_sentences_with_test: the plan states 0, but 2 of the dev set's pairs have a "
        "sentence a test file of the endpoint holds (of its 3; case, punctuation and spacing aside)",
    ]
    page = pilot.dev_lines({"dev": "dev.jsonl", "shared": found, "picks": {}})
    assert "The picks saw 1 pairs and 3 sentences that the endpoint's test files hold" in "\n".join(page)


PILOT = {
    "overrides": {"max_steps": 2},
    "seeds": [1],
    "reference": {"temperature": 1.0},
    "criteria": {"loss_ratio": 0.1, "weight_share": {"arms": ["margin"], "ratio": 0.5}},
    "dev": {"file": "dev.jsonl", "split": "dev", "shares_with_test": 0, "shares_sentences_with_test": 0},
    "tune": {"infonce": {"temperature": [0.05, 0.1]}, "margin": {"loss_options": [{"margin": 0.1}, {"margin": 0.3}]}},
}


@pytest.mark.slow
def test_the_pilot_tunes_on_dev_data_alike_and_locks_its_picks_before_the_runs(tmp_path):
    write_example(tmp_path)
    rows = [json.loads(line) for line in (FIXTURES / "sts_tiny.jsonl").read_text().splitlines()][:40]
    plan = tmp_path / "study.yaml"
    plan.write_text(plan.read_text() + yaml.safe_dump({"pilot": PILOT}))
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # the test file's own pairs
    said = study(tmp_path, "plan", "study.yaml").stdout  # how each arm is tuned, side by side
    assert "tuning: infonce: temperature (2 values); 2 grid points" in said
    assert "tuning: margin: loss_options.margin (2 values); 2 grid points" in said
    done = study(tmp_path, "run", "study.yaml", check=False)
    assert done.returncode == 2 and "the confirmatory runs wait for the pilot's picks" in done.stderr
    done = study(tmp_path, "pilot", "study.yaml", check=False)
    assert done.returncode == 2 and "the plan states 0, but 40 of the dev set's pairs are test pairs" in done.stderr

    shifted = [dict(r, sentence2=rows[(i + 1) % 40]["sentence2"]) for i, r in enumerate(rows)]  # pairs of its own
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shifted))
    done = study(tmp_path, "plan", "study.yaml", "--amend", "a dev set apart from the test pairs")
    done = study(tmp_path, "pilot", "study.yaml", check=False)  # its sentences are the test file's all the same
    assert done.returncode == 2 and "the plan states 0, but 40 of the dev set's pairs have a sentence" in done.stderr
    plan.write_text(plan.read_text().replace("shares_sentences_with_test: 0", "shares_sentences_with_test: 40"))
    study(tmp_path, "plan", "study.yaml", "--amend", "its sentences are the test file's: stated")
    page = study(tmp_path, "pilot", "study.yaml").stdout
    record = json.loads((tmp_path / "study" / "pilot" / "pilot.json").read_text())
    assert "**go**" in page and "shares 0 of its 40 sentence pairs" in page and "and 40 pairs" in page
    assert "| infonce | temperature 0.05 |" in page and '| margin | loss_options {"margin": 0.1} |' in page
    picked = record["picks"]["infonce"]["temperature"]  # a grid of two: the pick is at one of its edges
    edge = "lowest" if picked == 0.05 else "highest"
    assert f"* infonce: the pick, temperature {picked}, is the {edge} value of its grid" in page
    assert "* margin: the pick, loss_options.margin " in page  # the objective's own option has edges too
    assert "What the planned seeds can detect, said before the confirmatory lock:" in page
    for arm, grid in PILOT["tune"].items():  # the best mean dev score of the arm's own grid
        ((key, values),) = grid.items()
        dev = {json.dumps(r["change"]): r["dev"] for r in record["runs"] if r["arm"] == arm}
        best = max(values, key=lambda v: dev[json.dumps({key: v})])
        assert record["picks"][arm] == {key: best}
    versions = json.loads((tmp_path / "study" / "lock.json").read_text())["versions"]
    assert [(v["stage"], v["picks"]) for v in versions] == [
        ("pilot", None),
        ("pilot", None),
        ("pilot", None),
        ("confirmatory", record["picks"]),
    ]
    shared = record["shared"]
    assert (shared["pairs"], shared["with_sentence"], shared["of"]) == (0, 40, 40) and shared["sentences"] > 40
    assert f"The picks saw 0 pairs and {shared['sentences']} sentences that the endpoint's test files hold" in page
    assert "runs to do: 4 of 4" in study(tmp_path, "run", "study.yaml", "--dry_run").stdout
    # a pilot run's recorded dev score edited: a later sitting does not take it
    found = load_plan(str(plan), check_arms=False)
    run = pilot.pilot_runs(found)[1]
    path = tmp_path / "study" / "pilot" / f"{run['name']}.json"
    edited = json.loads(path.read_text())
    edited["dev"] += 5
    path.write_text(json.dumps(edited))
    with pytest.raises(UserError, match=rf"^pilot/{re.escape(run['name'])}.json: its dev score "):
        pilot._train(found, run, None, None)
