"""simcse_hn.study without training: a plan's problems one line each, the lock and its versions, the inverted exact
test against a scan of the test itself, and a report that stays blind until every run is in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from simcse_hn.errors import UserError
from simcse_hn.evaluation.stats import sign_flip_test
from simcse_hn.study import analysis, lock, pilot, report, runs
from simcse_hn.study.plan import PlanError, load_plan, power_lines

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PLAN = """\
name: tiny
base:
  model_name_or_path: builtin:tiny-bert
  train_file: corpus.txt
  max_steps: 4
arms:
  infonce: {}
  hcl: {loss: hcl, hcl_beta: 0.5}
baseline: infonce
seeds: [1, 2, 3, 4, 5, 6]
evaluation: {data_dir: sts, tasks: stsb}
smallest_effect: 0.5
spread: 0.2
"""


def write_plan(folder: Path, text: str = PLAN) -> Path:
    shutil.copyfile(FIXTURES / "tiny_corpus.txt", folder / "corpus.txt")
    (folder / "sts").mkdir(exist_ok=True)
    shutil.copyfile(FIXTURES / "sts_tiny.jsonl", folder / "sts" / "stsb.jsonl")
    (folder / "study.yaml").write_text(text)
    return folder / "study.yaml"


def problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as e:
        load_plan(str(path), eval_options={"data_dir", "tasks", "aggregation"})
    return e.value.problems


def test_each_problem_of_a_plan_is_one_line_naming_its_line(tmp_path):
    bad = PLAN.replace("hcl_beta: 0.5", "hcl_bta: 0.5").replace("[1, 2, 3, 4, 5, 6]", "[7]")
    bad = bad.replace("smallest_effect", "endpoint: STS13\nsmallest_effect").replace("max_steps: 4", "seed: 3")
    found = problems(write_plan(tmp_path, bad))
    assert found == [
        f"{tmp_path / 'study.yaml'}:5: base.seed: set by the study for each run; leave it out",
        f"{tmp_path / 'study.yaml'}:8: arms.hcl.hcl_bta: not a train.py key",
        f"{tmp_path / 'study.yaml'}:10: seeds: a list of one seed cannot show a difference from seed noise; give 2 "
        "to 20",
        f"{tmp_path / 'study.yaml'}:12: endpoint: 'STS13' is not a score of the report; choose from average, STS-B, "
        "alignment, uniformity",
    ]


def test_arms_that_train_alike_and_values_train_py_refuses_are_named(tmp_path):
    same = PLAN.replace("hcl: {loss: hcl, hcl_beta: 0.5}", "again: {loss: infonce, temperature: 0.05}")
    assert problems(write_plan(tmp_path, same)) == [
        f"{tmp_path / 'study.yaml'}:8: arms.again: trains exactly as arm 'infonce': two names for one arm"
    ]
    negative = PLAN.replace("hcl_beta: 0.5", "hcl_beta: -1")
    (found,) = problems(write_plan(tmp_path, negative))
    assert found.startswith(f"{tmp_path / 'study.yaml'}:8: arms.hcl: hcl_beta") and "-1" in found


def test_the_detectable_effect_matches_the_noncentral_t_and_the_floor_is_said():
    assert analysis.detectable_sd(10, 0.01) == pytest.approx(1.332, abs=1e-3)  # the lab's plan: 1.333 sd
    rng = np.random.default_rng(0)  # a simulation of the same power at that effect
    hits = [abs(np.mean(d)) / (np.std(d, ddof=1) / np.sqrt(10)) > 3.2498 for d in rng.normal(1.332, 1, (20000, 10))]
    assert np.mean(hits) == pytest.approx(0.8, abs=0.01)


def test_the_plan_says_what_it_can_detect_and_when_the_exact_test_cannot_reject(tmp_path):
    plan = load_plan(str(write_plan(tmp_path)), check_arms=False)
    lines = power_lines(plan)
    assert "at the assumed sd 0.2: " in lines[1] and "smallest p" not in " ".join(lines)  # 2/64 < 0.05
    few = load_plan(str(write_plan(tmp_path, PLAN.replace("[1, 2, 3, 4, 5, 6]", "[1, 2, 3, 4]"))), check_arms=False)
    assert power_lines(few)[-1].startswith("warning: with 4 seeds the exact sign-flip test's smallest p is 2/16")


def scan(d: list[float], level: float) -> tuple[float, float]:
    """The shifts not rejected, by the test itself on a fine grid."""
    grid = np.linspace(min(d) - 0.2, max(d) + 0.2, 4001)
    kept = [s for s in grid if sign_flip_test(np.subtract(d, s), np.zeros(len(d)))["p"] >= level]
    return min(kept), max(kept)


@pytest.mark.parametrize("n, level", [(6, 0.05), (8, 0.01), (10, 0.01)])
def test_the_simultaneous_interval_is_the_exact_test_inverted(n, level):
    d = list(np.random.default_rng(n).normal(0.3, 0.2, n))
    low, high = analysis.sign_flip_interval(d, level)
    step = (max(d) - min(d) + 0.4) / 4000
    assert scan(d, level) == pytest.approx((low, high), abs=step)
    assert analysis.sign_flip_interval(d[:4], 0.05) == (float("-inf"), float("inf"))  # floor 2/16 >= 0.05


def test_the_labs_study_read_again_dcl_is_bounded_by_an_interval_that_holds_zero():
    """bench/results/study: DCL's raw sign-flip p 0.029 beside Holm's 0.088 ("no difference shown"); its unadjusted
    t-interval [+0.001, +0.013] excludes 0, the simultaneous interval at 0.05 / 5 must not."""
    recorded = json.loads((Path(__file__).resolve().parents[1] / "bench/results/study/runs.json").read_text())["runs"]
    arms = ("infonce", "hcl", "dcl", "progcl", "progcl_mix", "unremix")
    values = {arm: [recorded[f"{arm}-b64-s{seed}"]["average"] for seed in range(42, 52)] for arm in arms}
    result = analysis.compare(values, "infonce", 0.05, 0.1)
    tests = result["tests"]
    assert tests["dcl"]["p_sign_flip_holm"] == pytest.approx(0.0879, abs=1e-4) and tests["dcl"]["low"] > 0
    dcl = tests["dcl"]["simultaneous"]
    assert not tests["dcl"]["differs"] and dcl["low"] <= 0 <= dcl["high"]
    assert tests["dcl"]["reading"].startswith("no difference shown; the simultaneous interval bounds it to [")
    for arm in ("hcl", "unremix"):
        assert tests[arm]["differs"] and tests[arm]["at_floor"] and tests[arm]["p_sign_flip_holm"] == pytest.approx(
            5 * 2 / 1024)  # fmt: skip
        assert tests[arm]["simultaneous"]["low"] > 0
    for v in tests.values():  # an interval that excludes 0 goes with "differs", always
        assert v["differs"] or v["simultaneous"]["low"] <= 0 <= v["simultaneous"]["high"]


def fake_records(plan, version, keys, value) -> None:
    """Records of finished runs as runs.run_one writes them, with made-up scores (the report reads only these)."""
    for arm in plan.arms:
        for seed in plan.seeds:
            key = runs.run_key(arm, seed)
            if key not in keys:
                continue
            score = value(arm, seed)
            record = {"arm": arm, "seed": seed, "plan_version": version["version"],
                      "spec_sha256": runs.spec_sha256(runs.spec(plan, version, arm)),
                      "code_sha256": version["code"]["sha256"], "data_sha256": version["data"]["sha256"],
                      "trained": {"source_sha256": "s", "scored_by_source_sha256": "s"},
                      "scores": {"average": score, "tasks": {"STS-B": score}}, "diagnostics": {"loss": 0.1 * seed}}
            path = Path(runs.record_path(plan, key))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))


def test_a_report_before_the_last_run_compares_nothing_then_tests_every_arm(tmp_path):
    plan = load_plan(str(write_plan(tmp_path)), check_arms=False)
    version = lock.lock(plan)
    keys = [runs.run_key(a, s) for s in plan.seeds for a in plan.arms]
    fake_records(plan, version, keys[:-1], lambda arm, seed: 71.777 + (arm == "hcl") + 0.1 * (seed % 3))
    page = report.write_report(plan)
    record = json.loads((tmp_path / "study" / "report.json").read_text())
    assert "11 of 12 runs in" in page and "Blind" in page and "| hcl | 5 of 6 |" in page
    assert "71.8" not in page and "72.8" not in page and set(record) & {"summary", "comparison", "per_task"} == set()
    fake_records(plan, version, keys[-1:], lambda arm, seed: 72.777 + 0.1 * (seed % 3))
    page = report.write_report(plan)
    assert "12 of 12 runs in" in page and "| hcl | +1.000 |" in page and "0.0312 (floor)" in page
    for seed in plan.seeds:  # each pair of the test, and the count of seeds ahead
        assert f"| {seed} | {71.777 + 0.1 * (seed % 3):.2f} | +1.00 |" in page
    assert "| ahead / behind | | 6 / 0 |" in page
    assert report.markdown(json.loads((tmp_path / "study" / "report.json").read_text())) == page


def test_a_changed_plan_or_objective_is_refused_until_amended(tmp_path):
    path = write_plan(tmp_path, PLAN.replace("{loss: hcl, hcl_beta: 0.5}", "{loss: mine.py:Mine}"))
    (tmp_path / "mine.py").write_text("# an objective\n")
    plan = load_plan(str(path), check_arms=False)
    first = lock.lock(plan)
    assert first["code"]["objectives"] == {"mine.py": lock.file_sha256(str(tmp_path / "mine.py"))}
    assert lock.lock(plan) == first  # nothing changed: nothing new
    (tmp_path / "mine.py").write_text("# an objective, edited\n")
    with pytest.raises(lock.LockError, match=r"the code \(mine.py\) changed since version 1 was locked"):
        lock.check_locked(plan)
    path.write_text(path.read_text() + "# more\n")
    with pytest.raises(lock.LockError, match="the plan, the code"):
        lock.lock(plan)
    second = lock.lock(plan, reason="the objective's fix")
    assert (second["version"], second["reason"]) == (2, "the objective's fix") and lock.check_locked(plan) == second
    assert (tmp_path / "study" / "versions" / "v1.yaml").read_text() + "# more\n" == path.read_text()


def test_a_pilot_that_tunes_nothing_still_locks_the_confirmatory_stage(tmp_path):
    """Every arm untuned (a second regime at the first one's picks): the pilot's picks are {}, the same as none; its
    go must still lock a confirmatory version, or the runs wait for ever (and the pilot's page would say otherwise)."""
    untuned = {"infonce": "the first regime's pick", "hcl": "the first regime's pick"}
    pilot = {"seeds": [1], "reference": {"queue_size": 0}, "criteria": {"loss_ratio": 10}, "untuned": untuned}
    path = write_plan(tmp_path, PLAN + yaml.safe_dump({"pilot": pilot}))
    plan = load_plan(str(path), check_arms=False)
    first = lock.lock(plan)
    assert first["stage"] == "pilot"
    with pytest.raises(lock.LockError, match="the confirmatory runs wait for the pilot's picks"):
        lock.check_locked(plan, stage="confirmatory")
    second = lock.lock(plan, reason="the pilot's picks", picks={}, stage="confirmatory")
    assert (second["version"], second["stage"], second["picks"]) == (2, "confirmatory", {})
    assert lock.check_locked(plan, stage="confirmatory") == second
    assert lock.lock(plan) == second  # nothing changed since: nothing new
    with pytest.raises(lock.LockError, match=r"the stage \(confirmatory -> pilot\) changed since version 2"):
        lock.lock(plan, stage="pilot")


def test_a_family_of_two_plans_is_blind_until_both_are_in_then_holm_runs_over_all_their_comparisons(tmp_path):
    second = PLAN.replace("name: tiny", "name: second").replace(
        "hcl: {loss: hcl, hcl_beta: 0.5}", "hcl: {loss: hcl, hcl_beta: 0.5}\n  dcl: {loss: dcl}"
    ) + "output_dir: study2\n"  # fmt: skip
    path = write_plan(tmp_path, PLAN + "family: [second.yaml]\n")
    (tmp_path / "second.yaml").write_text(second + "family: [study.yaml]\n")  # plans may name each other
    first, other = load_plan(str(path), check_arms=False), load_plan(str(tmp_path / "second.yaml"), check_arms=False)
    assert (first.family, first.family_comparisons) == (("second.yaml",), 2)
    assert power_lines(first)[0].startswith("6 paired seeds, 3 comparisons (1 against infonce, 2 in its family), "
                                            "Holm at 0.05: a two-sided paired t at 0.01667")  # fmt: skip
    noise = np.random.default_rng(0).normal(0, 0.3, size=(3, 7))
    effect = {"infonce": 0.0, "hcl": 0.4, "dcl": 0.1}
    arms = list(effect)

    def score(arm: str, seed: int) -> float:
        return 75.0 + effect[arm] + noise[arms.index(arm), seed]

    one, two = lock.lock(first), lock.lock(other)
    fake_records(first, one, [runs.run_key(a, s) for s in first.seeds for a in first.arms], score)
    keys = [runs.run_key(a, s) for s in other.seeds for a in other.arms]
    fake_records(other, two, keys[:-1], score)
    page = report.write_report(first)
    record = json.loads((tmp_path / "study" / "report.json").read_text())
    assert "12 of 12 runs in" in page and "second (17 of 18 runs in)" in page
    assert "Blind" in page and "of every plan of its family" in page and "comparison" not in json.dumps(record)
    fake_records(other, two, keys[-1:], score)
    page = report.write_report(first)
    record = json.loads((tmp_path / "study" / "report.json").read_text())
    family = record["family_comparison"]
    assert list(family["tests"]) == ["tiny: hcl", "second: hcl", "second: dcl"] and family["level"] == 0.05 / 3
    raw = {name: sign_flip_test([score(arm, s) for s in first.seeds], [score("infonce", s) for s in first.seeds])["p"]
           for name, arm in (("tiny: hcl", "hcl"), ("second: hcl", "hcl"), ("second: dcl", "dcl"))}  # fmt: skip
    ordered, running = sorted(raw, key=raw.get), 0.0  # Holm by hand: the k-th smallest p times (m - k), a running max
    for k, name in enumerate(ordered):
        running = max(running, min(1.0, raw[name] * (3 - k)))
        assert family["tests"][name]["p_sign_flip_holm"] == pytest.approx(running)
    assert record["comparison"]["m"] == 1 and "## The family: Holm over the 3 comparisons of tiny, second" in page
    assert report.markdown(record) == page


def test_a_family_member_that_is_missing_or_at_another_level_is_a_problem_of_the_plan(tmp_path):
    path = write_plan(tmp_path, PLAN + "family: [second.yaml, none.yaml, study.yaml, third.yaml]\n")
    (tmp_path / "second.yaml").write_text(PLAN.replace("name: tiny", "name: second") + "alpha: 0.01\n")
    (tmp_path / "third.yaml").write_text(PLAN)
    found = problems(path)
    assert any(p.endswith("family: third.yaml: named 'tiny' as another plan of the family; give each a name")
               for p in found)  # fmt: skip
    assert any(p.endswith("family: second.yaml: alpha 0.01; one family has one family-wise level") for p in found)
    assert any(p.endswith("family: none.yaml: no such plan file") for p in found)
    assert any(p.endswith("family: study.yaml: the plan itself; list the other plans of the family") for p in found)


def test_an_endpoint_eval_sts_will_not_measure_is_refused_at_the_plan_and_named_at_the_report(tmp_path):
    """alignment and uniformity are measured on STS-B's dev pairs: a data folder without them, or the flag that turns
    them off, is refused by `plan`, before any run. A record without the endpoint is one line at the report."""
    path = write_plan(tmp_path, PLAN.replace("smallest_effect", "endpoint: alignment\nsmallest_effect"))
    stsb = tmp_path / "sts" / "stsb.jsonl"
    with_dev = stsb.read_text()
    stsb.write_text(with_dev.replace('"split": "dev"', '"split": "test"'))
    assert problems(path) == [f"{path}:12: endpoint: 'alignment': eval/sts.py will not measure it: {stsb} has no "
                              "split 'dev' rows (alignment and uniformity are measured on STS-B dev)"]  # fmt: skip
    stsb.write_text(with_dev)
    plan = load_plan(str(path), check_arms=False)
    on = path.read_text()
    path.write_text(on.replace("tasks: stsb}", "tasks: stsb, no_alignment_uniformity: true}"))
    with pytest.raises(PlanError) as e:
        load_plan(str(path), eval_options={"data_dir", "tasks", "no_alignment_uniformity"})
    assert e.value.problems == [f"{path}:12: endpoint: 'alignment': eval/sts.py will not measure it: "
                                "evaluation.no_alignment_uniformity turns them off"]  # fmt: skip
    path.write_text(on)
    version = lock.lock(plan)
    fake_records(plan, version, [runs.run_key(a, s) for s in plan.seeds for a in plan.arms], lambda arm, seed: 70.0)
    with pytest.raises(UserError, match=r"^runs/infonce-s1.json: no 'alignment' score; its eval/sts.py report did "
                                        "not measure it$"):  # fmt: skip
        report.write_report(plan)


def test_pilot_keys_are_train_py_keys_and_a_refused_value_names_no_temporary_file(tmp_path):
    pilot = {"overrides": {"max_stepz": 2}, "reference": {"queue_sizee": 0, "seed": 3}}
    path = write_plan(tmp_path, PLAN + yaml.safe_dump({"pilot": pilot}))
    assert problems(path) == [f"{path}:16: pilot.overrides.max_stepz: not a train.py key",
                              f"{path}:18: pilot.reference.queue_sizee: not a train.py key",
                              f"{path}:19: pilot.reference.seed: set by the study for each run; leave it out"]
    path = write_plan(tmp_path, PLAN.replace("hcl_beta: 0.5", "hcl_beta: -1"))
    (found,) = problems(path)
    assert found.startswith(f"{path}:8: arms.hcl: ") and "hcl_beta" in found and "arm.yaml" not in found, found
    # the pilot's grid: its keys are train.py keys, and every point (and the reference) is a config train.py takes
    pilot = {"tune": {"infonce": {"temperatur": [0.05]}, "hcl": {"seed": [1]}}}
    path = write_plan(tmp_path, PLAN + yaml.safe_dump({"pilot": pilot}))
    assert problems(path) == [f"{path}:17: pilot.tune.hcl.seed: set by the study for each run; leave it out",
                              f"{path}:20: pilot.tune.infonce.temperatur: not a train.py key"]  # fmt: skip
    pilot = {"reference": {"queue_size": -4},
             "tune": {"hcl": {"hcl_beta": [0.2, -1.0]}, "infonce": {"temperature": [0.05, 0.1]}}}  # fmt: skip
    path = write_plan(tmp_path, PLAN + yaml.safe_dump({"pilot": pilot}))
    assert problems(path) == [
        f"{path}:15: pilot.reference: queue_size: must be >= 0, got -4",
        f"{path}:18: pilot.tune.hcl: hcl_beta -1.0: hcl_beta: must be >= 0, got -1.0",
    ]


def test_the_uniform_share_counts_the_negatives_train_py_would_give():
    assert pilot.negatives_per_anchor({}) == 126  # train.py's batch 64, symmetric form: 2B - 2
    assert pilot.negatives_per_anchor({"per_device_train_batch_size": 64, "queue_size": 4096}) == 4222
    assert pilot.negatives_per_anchor({"contrast_form": "simcse", "per_device_train_batch_size": 8}) == 7  # B - 1


def test_a_reading_where_bonferronis_t_interval_and_the_exact_test_disagree_says_so():
    v = {"differs": False, "difference": 0.3, "simultaneous": {"low": 0.004, "high": 0.6}}
    assert analysis.reading(v, 0.2).startswith("no difference shown by the exact test; Bonferroni's paired-t "
                                               "interval [+0.004, +0.600]")  # fmt: skip
    assert analysis.reading(v, 0.2).endswith("excludes 0: the two tests disagree")


def test_a_changed_data_file_is_named(tmp_path):
    plan = load_plan(str(write_plan(tmp_path)), check_arms=False)
    lock.lock(plan)
    with open(tmp_path / "corpus.txt", "a", encoding="utf-8") as f:
        f.write("one more sentence\n")
    with pytest.raises(lock.LockError, match=r": the data \(train corpus.txt\) changed since version 1 was locked"):
        lock.check_locked(plan)


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


def test_each_problem_of_the_pilot_is_one_line_naming_its_line(tmp_path):
    """A misspelt criterion would pass by never being read; an arm the plan lacks, a missing dev file: each refused."""
    path = write_plan(tmp_path, PLAN + PILOT_PROBLEMS)
    assert pilot.check(load_plan(str(path), check_arms=False)) == [
        f"{path}:15: pilot.seeds: a list of integer seeds, got [1, True]",
        f"{path}:17: pilot.criteria.loss_ratoi: unknown criterion; the criteria are loss_ratio, weight_share, clamp",
        f"{path}:18: pilot.criteria.loss_ratio: compares the baseline with the reference run; add pilot.reference "
        "(e.g. {queue_size: 0})",
        f"{path}:19: pilot.criteria.weight_share.arms: 'dcl' is not an arm of the plan",
        f"{path}:19: pilot.criteria.weight_share.ratio: a number > 0, got 0",
        f"{path}:20: pilot.criteria.clamp.above: unknown key; the keys are arms, below",
        f"{path}:21: pilot.tune: grids of unequal size (infonce 2, hcl 3); every arm gets the same tuning budget",
        f"{path}:24: pilot.untuned.dcl: not an arm of the plan",
        f"{path}:25: pilot.dev.file: nowhere.jsonl: no such file (relative to the plan; `simcse-hn-sts-data --output "
        "DIR` builds the STS folder from the Hub)",
    ]  # fmt: skip


@pytest.mark.parametrize(("fractions", "ok"), [([0.3], True), ([0.7], False), ([0.3, 0.8], False), ([], False)])
def test_the_clamp_criterion_reads_the_arms_mean_clamped_fraction_and_a_missing_one_fails(tmp_path, fractions, ok):
    path = write_plan(tmp_path, PLAN + "pilot:\n  seeds: [1, 2]\n  criteria:\n    clamp: {arms: [hcl], below: 0.5}\n")
    plan = load_plan(str(path), check_arms=False)
    assert pilot.check(plan) == []
    found = [{"arm": "hcl", "seed": s + 1, "change": None, "last": {"clamp_frac": f}} for s, f in enumerate(fractions)]
    verdict = pilot.verdict(plan, found, picks={})
    value = float(np.mean(fractions)) if fractions else None
    assert verdict["checks"] == {"hcl clamp": {"value": value, "needed": 0.5, "ok": ok}}
    assert verdict["go"] is ok


@pytest.mark.parametrize(("infonce_dev", "edge"), [
    ({0.03: [80.0, 80.2], 0.05: [79.0, 79.4], 0.07: [78.0, 78.0]}, "lowest"),
    ({0.03: [78.0, 78.0], 0.05: [79.0, 79.4], 0.07: [80.0, 80.2]}, "highest"),
    ({0.03: [79.0, 79.4], 0.05: [80.0, 80.2], 0.07: [78.0, 78.0]}, None),
])  # fmt: skip
def test_the_pilot_page_shows_each_grid_and_doubts_a_pick_at_its_edge_or_within_the_seeds_noise(
    tmp_path, infonce_dev, edge
):
    grid = "  tune:\n    infonce: {temperature: [0.03, 0.05, 0.07]}\n    hcl: {hcl_beta: [0.1, 0.2, 0.4]}\n"
    plan = load_plan(str(write_plan(tmp_path, PLAN + "pilot:\n  seeds: [1, 2]\n" + grid)), check_arms=False)
    hcl_dev = {0.1: [80.0, 80.1], 0.2: [80.3, 80.0], 0.4: [79.9, 80.0]}  # 0.2 ahead by 0.1, its seeds' sd 0.21
    found = [{"arm": arm, "seed": seed, "change": {key: value}, "dev": devs[seed - 1]}
             for arm, key, table in (("infonce", "temperature", infonce_dev), ("hcl", "hcl_beta", hcl_dev))
             for value, devs in table.items() for seed in (1, 2)]  # fmt: skip
    picks, _ = pilot.choose(plan, found)
    tuned = pilot.tuning(plan, found, picks)
    assert picks["hcl"] == {"hcl_beta": 0.2} and tuned["hcl"]["edges"] == {}
    assert tuned["infonce"]["edges"] == ({"temperature": edge} if edge else {})
    assert [p["mean"] for p in tuned["infonce"]["points"]] == pytest.approx([np.mean(v) for v in infonce_dev.values()])
    assert tuned["hcl"]["lead"] == pytest.approx(0.1) and tuned["hcl"]["sd_at_pick"] == pytest.approx(0.3 / 2**0.5)
    noise = "hcl: the pick leads the next best point by 0.1, less than the sd of its dev score over the seeds (0.212)"
    notes = [noise + ": within the seeds' noise."]
    if edge:
        value, beyond = {"lowest": ("0.03", "below"), "highest": ("0.07", "above")}[edge]
        notes.insert(0, f"infonce: the pick, temperature {value}, is the {edge} value of its grid: the best may lie "
                        f"{beyond} it, which this pilot did not try.")  # fmt: skip
    assert pilot.tuning_notes(tuned) == notes
    page = pilot.markdown({"study": "tiny", "plan_version": 1, "checks": {}, "go": True, "runs": [], "tuning": tuned})
    middle = infonce_dev[0.05]
    row = f"| infonce | temperature 0.05 | {np.mean(middle):.4g} | {np.std(middle, ddof=1):.4g} | "
    assert row + ("pick |" if edge is None else " |") in page
    assert all(f"* {note}" in page for note in notes)


@pytest.mark.parametrize(("shared", "said"), [
    (None, "whose pairs were not counted against the endpoint's test files (the evaluation data is on the Hub)"),
    (0, "which shares 0 sentence pairs with the endpoint's test files"),
    (186, "which shares 186 sentence pairs with the endpoint's test files"),
])  # fmt: skip
def test_the_pilot_page_says_what_the_dev_set_shares_with_the_test_files(shared, said):
    record = {"study": "tiny", "plan_version": 1, "checks": {}, "go": True, "runs": [], "dev": "dev.jsonl",
              "shared_pairs": shared, "picks": {"infonce": {"temperature": 0.05}}}  # fmt: skip
    page = pilot.markdown(record)
    assert f"Tuned on dev.jsonl, {said}. Picks: infonce " in page and "None" not in page
    assert ("The picks saw 186 pairs that the endpoint's test files hold" in page) is (shared == 186)


def test_a_grid_of_several_options_tunes_every_combination_at_the_same_budget(tmp_path):
    grid = "  tune:\n    infonce: {temperature: [0.03, 0.04, 0.05, 0.06]}\n" \
           "    hcl: {temperature: [0.04, 0.05], hcl_beta: [0.1, 0.2]}\n"  # fmt: skip
    dev = "  dev: {file: dev.jsonl, shares_with_test: 0}\n"
    path = write_plan(tmp_path, PLAN + "pilot:\n  seeds: [1, 2]\n" + dev + grid)
    (tmp_path / "dev.jsonl").write_text((FIXTURES / "sts_tiny.jsonl").read_text())
    plan = load_plan(str(path), check_arms=False)
    assert pilot.check(plan) == []
    names = [r["name"] for r in pilot.pilot_runs(plan) if r["arm"] == "hcl" and r["seed"] == 1]
    assert names == ["hcl-temperature=0.04,hcl_beta=0.1-s1", "hcl-temperature=0.04,hcl_beta=0.2-s1",
                     "hcl-temperature=0.05,hcl_beta=0.1-s1", "hcl-temperature=0.05,hcl_beta=0.2-s1"]  # fmt: skip
    config = next(r["config"] for r in pilot.pilot_runs(plan) if r["name"] == names[1])
    assert (config["loss"], config["temperature"], config["hcl_beta"]) == ("hcl", 0.04, 0.2)
    # hcl best at temperature 0.04 (its lowest) and beta 0.2 (its highest); infonce inside its grid
    found = [{"arm": "hcl", "seed": seed, "change": {"temperature": t, "hcl_beta": b},
              "dev": 80 + (t == 0.04) + b + 0.01 * seed} for t in (0.04, 0.05) for b in (0.1, 0.2) for seed in (1, 2)]
    found += [{"arm": "infonce", "seed": seed, "change": {"temperature": t}, "dev": 80 - abs(t - 0.05)}
              for t in (0.03, 0.04, 0.05, 0.06) for seed in (1, 2)]  # fmt: skip
    picks, _ = pilot.choose(plan, found)
    assert picks == {"infonce": {"temperature": 0.05}, "hcl": {"temperature": 0.04, "hcl_beta": 0.2}}
    tuned = pilot.tuning(plan, found, picks)
    assert tuned["hcl"]["edges"] == {"temperature": "lowest", "hcl_beta": "highest"}
    assert tuned["infonce"]["edges"] == {}
    assert [n.split(":")[1] for n in pilot.tuning_notes(tuned)] == [
        " the pick, temperature 0.04, is the lowest value of its grid",
        " the pick, hcl_beta 0.2, is the highest value of its grid",
    ]
    page = pilot.markdown({"study": "tiny", "plan_version": 1, "checks": {}, "go": True, "runs": [], "tuning": tuned})
    assert "| hcl | temperature 0.04, hcl_beta 0.2 | 81.2" in page
    assert "| hcl | temperature 0.05, hcl_beta 0.1 | 80.1" in page

    path.write_text(path.read_text().replace("[0.03, 0.04, 0.05, 0.06]", "[0.03, 0.04, 0.05]"))
    assert pilot.check(load_plan(str(path), check_arms=False)) == [
        f"{path}:17: pilot.tune: grids of unequal size (infonce 3, hcl 4); every arm gets the same tuning budget"]
    path.write_text(path.read_text().replace("hcl_beta: [0.1, 0.2]", "hcl_beta: []"))
    problems = pilot.check(load_plan(str(path), check_arms=False))
    assert any("pilot.tune.hcl: options and their grids" in line for line in problems)


def test_each_job_holds_its_own_gpu_for_the_whole_run(tmp_path):
    """Four runs, two jobs on GPUs 3 and 5: no two runs at once on one GPU, whichever ends first."""
    import threading
    import time

    held, seen, guard = set(), [], threading.Lock()

    def work(item, device):
        with guard:
            assert device not in held, f"{item} on GPU {device}, which another run holds"
            held.add(device)
            seen.append(device)
        time.sleep(0.05 if item % 2 else 0.01)  # uneven lengths: a slot-by-index scheme would double up
        with guard:
            held.remove(device)
        return item

    futures = runs.on_devices(2, ["3", "5"], work, [0, 1, 2, 3, 4, 5])
    assert [f.result() for f in futures] == [0, 1, 2, 3, 4, 5] and set(seen) == {"3", "5"}


@pytest.mark.parametrize("stage", ["run", "pilot"])
def test_the_gpu_and_threads_reach_the_training_process(tmp_path, monkeypatch, stage):
    plan = load_plan(str(write_plan(tmp_path)), check_arms=False)
    lock.lock(plan)
    seen = {}

    def stop(module, args, cwd, log, env):
        seen.update(env)
        raise RuntimeError("stopped before training")

    monkeypatch.setattr(runs if stage == "run" else pilot, "run_module", stop)
    with pytest.raises(RuntimeError, match="stopped before training"):
        if stage == "run":
            runs.run_one(plan.path, "infonce", 1, threads=3, device="5")
        else:
            pilot._train(plan, pilot.pilot_runs(plan)[0], 3, "5")
    assert (seen["CUDA_VISIBLE_DEVICES"], seen["OMP_NUM_THREADS"]) == ("5", "3")


def test_gpus_and_executor_params_are_checked_before_the_lock_is_read(tmp_path, capsys):
    from simcse_hn.cli.study import main

    path = str(write_plan(tmp_path))  # never locked: a check after the lock's would say so instead
    cases = [(["--jobs", "2", "--gpus", "0"], "error: --gpus: 1 GPU ids for --jobs 2; give one per job"),
             (["--executor_param", "timeout_min"], "error: --executor_param: 'timeout_min' is not KEY=VALUE")]
    for args, line in cases:
        assert main(["run", path, *args]) == 2
        assert capsys.readouterr().err == line + "\n"
    for command in ("run", "pilot"):  # the pilot's workers too: one line, not a traceback from the pool
        for flag, value in (("--jobs", "0"), ("--threads", "0"), ("--threads", "-2")):
            assert main([command, path, flag, value]) == 2
            assert capsys.readouterr().err == f"error: {flag}: at least 1, got {value}\n"


def test_executor_params_reach_submitit_and_one_it_refuses_is_one_line(tmp_path, monkeypatch, capsys):
    submitit = pytest.importorskip("submitit")
    from simcse_hn.cli.study import main

    plan = load_plan(str(write_plan(tmp_path)), check_arms=False)
    lock.lock(plan)
    given = {}
    update = submitit.AutoExecutor.update_parameters

    def record(self, **kwargs):
        given.update(kwargs)
        return update(self, **kwargs)

    monkeypatch.setattr(submitit.AutoExecutor, "update_parameters", record)
    monkeypatch.setattr(submitit.AutoExecutor, "map_array", lambda self, *a: [])  # submit nothing
    run = ["run", plan.path, "--engine", "submitit", "--cluster", "local"]
    assert main([*run, "--executor_param", "timeout_min=30", "--executor_param", "cpus_per_task=2"]) == 0
    assert given == {"timeout_min": 30, "cpus_per_task": 2}
    capsys.readouterr()
    assert main([*run, "--executor_param", "slurm_partitoin=gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --executor_param slurm_partitoin=gpu: submitit's local executor refuses it: ")
    assert err.count("\n") == 1
