"""simcse_hn.study without training: a plan's problems one line each (a missing local path and a verdict rule the
report cannot read among them), the lock over what actually runs (the base's config file, objectives imported by
module name and their helpers; a diff naming each changed key, a comment-only edit no change), and the exact test's
counts under ties against an enumeration in exact rational arithmetic."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml
from study_fakes import PLAN, with_rules, write_plan

from simcse_hn.evaluation import stats
from simcse_hn.study import analysis, lock
from simcse_hn.study.plan import PlanError, load_plan
from simcse_hn.study.power import power_lines

DOC = Path(__file__).resolve().parents[1] / "docs" / "studies.md"


def problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as e:
        load_plan(str(path), eval_options={"data_dir", "tasks", "aggregation", "no_alignment_uniformity"})
    return e.value.problems


# --- the plan --------------------------------------------------------------------------------------------------------


def test_each_problem_of_a_plan_is_one_line_naming_its_line(tmp_path):
    bad = PLAN.replace("hcl_beta: 0.5", "hcl_bta: 0.5").replace("[1, 2, 3, 4, 5, 6]", "[7]")
    bad = bad.replace("smallest_effect", "endpoint: STS13\nsmallest_effect").replace("max_steps: 4", "seed: 3")
    path = tmp_path / "study.yaml"
    assert problems(write_plan(tmp_path, bad)) == [
        f"{path}:5: base.seed: set by the study for each run; leave it out",
        f"{path}:8: arms.hcl.hcl_bta: not a train.py key",
        f"{path}:10: seeds: a list of one seed cannot show a difference from seed noise; give 2 to 20",
        f"{path}:12: endpoint: 'STS13' is not a score of the report; choose from average, STS-B, alignment, "
        "uniformity",
    ]


def test_arms_that_train_alike_and_values_train_py_refuses_are_named_unless_the_pilot_tunes_one(tmp_path):
    same = PLAN.replace("hcl: {loss: hcl, hcl_beta: 0.5}", "again: {loss: infonce, temperature: 0.05}")
    path = tmp_path / "study.yaml"
    assert problems(write_plan(tmp_path, same)) == [
        f"{path}:8: arms.again: trains exactly as arm 'infonce': two names for one arm"
    ]
    # an arm at 0.05 beside one the pilot tunes: the pick may part them, so both stand
    pilot = {
        "tune": {"infonce": {"temperature": [0.03, 0.05]}},
        "untuned": {"again": "InfoNCE at 0.05"},
        "dev": {"file": "sts/stsb.jsonl", "shares_with_test": 0, "shares_sentences_with_test": 0},
    }
    load_plan(str(write_plan(tmp_path, same + yaml.safe_dump({"pilot": pilot}))))
    negative = PLAN.replace("hcl_beta: 0.5", "hcl_beta: -1")
    (found,) = problems(write_plan(tmp_path, negative))
    assert found.startswith(f"{path}:8: arms.hcl: hcl_beta") and "-1" in found and "arm.yaml" not in found


def test_a_value_of_the_wrong_kind_is_a_line_and_a_base_value_every_arm_refuses_is_named_once_at_the_base(tmp_path):
    path = tmp_path / "study.yaml"
    listed = PLAN.replace("baseline: infonce", "baseline: [infonce]")  # was a TypeError's traceback
    assert problems(write_plan(tmp_path, listed)) == [
        f"{path}:9: baseline: ['infonce'] is not one of the arms (infonce, hcl)"
    ]
    numbered = PLAN.replace("hcl: {loss: hcl, hcl_beta: 0.5}", "2: {loss: hcl}")  # YAML's number: a traceback too
    assert problems(write_plan(tmp_path, numbered)) == [f"{path}:8: arms.2: an arm's name is text; quote it: '2'"]
    base = PLAN.replace("max_steps: 4", "max_steps: [4]")  # once, on the base's line, not on every arm's
    assert problems(write_plan(tmp_path, base)) == [f"{path}:5: base.max_steps: expected one value, got a list [4]"]


def test_a_local_path_that_is_not_there_is_refused_at_the_plan_not_taken_for_a_hub_id(tmp_path):
    """train_file and eval_file are files whatever their name; a model name is a path unless it is a Hub id or a
    builtin; the evaluation's data_dir is a folder. Each one missing is a line of its own, before any lock."""
    text = PLAN.replace("train_file: corpus.txt", "train_file: corpus.txt\n  eval_file: dev/none.jsonl")
    text = text.replace("hcl: {loss: hcl, hcl_beta: 0.5}", "hcl: {loss: hcl, model_name_or_path: ./models/mine}")
    path = write_plan(tmp_path, text)
    (tmp_path / "corpus.txt").unlink()
    assert problems(path) == [
        f"{path}:4: base.train_file: corpus.txt: no such file or folder (relative to the plan; a local path, not a "
        "Hub id)",
        f"{path}:5: base.eval_file: dev/none.jsonl: no such file or folder (relative to the plan; a local path, not a "
        "Hub id)",
        f"{path}:9: arms.hcl.model_name_or_path: ./models/mine: no such file or folder (relative to the plan; a "
        "local path, not a Hub id)",
    ]
    path = write_plan(tmp_path, PLAN.replace("data_dir: sts", "data_dir: sts_gone"))
    assert problems(path) == [
        f"{path}:11: evaluation.data_dir: sts_gone: no such folder (relative to the plan; a local path, not a Hub id)"
    ]


def test_verdict_rules_name_only_comparisons_and_outcomes_the_report_has(tmp_path):
    rules = {
        "rules": [
            {"when": {"hcl": "beter"}, "say": "x"},
            {"when": {"dcl": "better"}, "say": "y"},
            {"when": {"hcl": "equivalent"}, "say": ""},
            {"say": "no condition"},
        ],
        "equivalence": "eyeball",
        "margn": 0.2,
    }
    path = write_plan(tmp_path, with_rules(rules=rules))
    lines = path.read_text().splitlines()
    at = {
        key: 1 + next(i for i, line in enumerate(lines) if line.startswith(f"  {key}:"))
        for key in ("rules", "equivalence", "margn")
    }
    assert problems(path) == [
        f"{path}:{at['margn']}: verdicts.margn: unknown key; the keys are margin, equivalence, rules",
        f"{path}:{at['equivalence']}: verdicts.equivalence: 'eyeball': one of tost, intervals",
        f"{path}:{at['rules']}: verdicts.rules.0: when: hcl: 'beter' is not an outcome (better, worse, differs, "
        "not_shown, equivalent, inconclusive)",
        f"{path}:{at['rules']}: verdicts.rules.1: when: 'dcl' is not a comparison of the plan (hcl)",
        f"{path}:{at['rules']}: verdicts.rules.2: say: the verdict's words, a non-empty string",
        f"{path}:{at['rules']}: verdicts.rules.2: when: hcl: 'equivalent' needs verdicts.margin, the equivalence "
        "margin",
        f"{path}:{at['rules']}: verdicts.rules.3: a rule is {{when: {{comparison: outcome, ...}}, say: the verdict's "
        "words}",
    ]


def test_plan_refuses_a_plan_that_states_no_verdict_rules(tmp_path, capsys):
    from simcse_hn.cli.study import main

    path = write_plan(tmp_path)
    assert main(["plan", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: verdicts: state what each outcome earns before any run (docs/studies.md, 'Verdicts')\n"
    )
    assert not (tmp_path / "study" / "lock.json").exists()


# --- what a plan can detect ------------------------------------------------------------------------------------------


def test_the_detectable_effect_matches_the_noncentral_t_and_the_floor_is_said():
    assert analysis.detectable_sd(10, 0.01) == pytest.approx(1.332, abs=1e-3)  # the lab's plan: 1.333 sd
    rng = np.random.default_rng(0)  # a simulation of the same power at that effect
    hits = [abs(np.mean(d)) / (np.std(d, ddof=1) / np.sqrt(10)) > 3.2498 for d in rng.normal(1.332, 1, (20000, 10))]
    assert np.mean(hits) == pytest.approx(0.8, abs=0.01)


def test_the_plan_says_what_it_can_detect_and_how_many_seeds_a_measured_spread_needs(tmp_path):
    plan = load_plan(str(write_plan(tmp_path)), check_arms=False)
    lines = power_lines(plan)
    assert "at the assumed sd 0.2: " in lines[1] and "at or below" in lines[1] and "smallest p" not in " ".join(lines)
    # the temperature study: 10 seeds, 2 comparisons, smallest effect 0.2; its observed sd 0.256 needs more seeds
    measured = power_lines(plan, 0.4)[-1]
    needed = analysis.seeds_needed(0.4, 0.5, 0.05)
    assert measured.endswith(f"the planned 6 seeds do not reach it; {needed} seeds would")
    assert analysis.detectable_sd(needed, 0.05) * 0.4 <= 0.5 < analysis.detectable_sd(needed - 1, 0.05) * 0.4
    few = load_plan(str(write_plan(tmp_path, PLAN.replace("[1, 2, 3, 4, 5, 6]", "[1, 2, 3, 4]"))), check_arms=False)
    assert power_lines(few)[-1].startswith("warning: with 4 seeds the exact sign-flip test's smallest p is 2/16")


# --- exact means exact -----------------------------------------------------------------------------------------------


def exact_p(a: list[str], b: list[str], shift: Fraction = Fraction(0), side: str = "two-sided") -> Fraction:
    """The sign-flip p of decimal scores in exact rational arithmetic, every one of the 2^n sign patterns."""
    d = [Fraction(x) - Fraction(y) - shift for x, y in zip(a, b)]
    observed = sum(d)
    count = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        s = sum(sign * x for sign, x in zip(signs, d))
        count += (
            abs(s) >= abs(observed) if side == "two-sided" else (s >= observed if side == "greater" else s <= observed)
        )
    return Fraction(count, 2 ** len(d))


def test_the_tie_the_package_split_counts_as_a_tie():
    """The tied case of issue 67: STS averages on a 0.01 lattice whose differences tie in exact arithmetic and not
    in float64; scipy's relative tolerance gave p = 0.75, the exact count is 14 of 16 patterns."""
    a, b = ["76.82", "76.46", "76.25", "76.13"], ["76.37", "76.33", "76.66", "76.71"]
    assert exact_p(a, b) == Fraction(7, 8)
    assert stats.sign_flip_test([float(x) for x in a], [float(x) for x in b])["p"] == 0.875


@pytest.mark.parametrize(
    "n, step, seed", [(4, "0.01", 0), (6, "0.01", 1), (8, "0.05", 2), (10, "0.25", 3), (7, "1", 4), (9, "0.125", 5)]
)
def test_on_a_lattice_the_p_the_interval_and_tost_are_the_exact_counts(n, step, seed):
    """Scores on a lattice (as Spearman x 100 on ranks are), with many exact ties among their sign-flip sums: the p,
    both TOST p and the ends of the simultaneous interval equal an enumeration in Fraction arithmetic."""
    rng = np.random.default_rng(seed)
    unit = Fraction(step)
    a = [str(Fraction(7600) * Fraction(1, 100) + unit * int(k)) for k in rng.integers(0, 12, n)]
    b = [str(Fraction(7600) * Fraction(1, 100) + unit * int(k)) for k in rng.integers(0, 12, n)]
    a = [f"{float(Fraction(x)):.6f}" for x in a]
    b = [f"{float(Fraction(x)):.6f}" for x in b]
    fa, fb = [float(x) for x in a], [float(x) for x in b]
    assert stats.sign_flip_test(fa, fb)["p"] == float(exact_p(a, b))
    d = list(np.subtract(fa, fb))
    tolerance = stats.tie_tolerance(n, max(map(abs, fa + fb)))
    margin = Fraction(step) * 3
    got = analysis.tost(d, float(margin), tolerance)
    assert got["p_lower"] == float(exact_p(a, b, -margin, "greater"))
    assert got["p_upper"] == float(exact_p(a, b, margin, "less"))
    level = 0.1 if n < 6 else 0.05
    low, high = analysis.sign_flip_interval(d, level, tolerance)
    if not np.isfinite(low):
        assert 2 / 2**n >= level
        return
    exact = [Fraction(x) - Fraction(y) for x, y in zip(a, b)]
    means = {sum(s) / len(s) for k in range(1, n + 1) for s in itertools.combinations(exact, k)}
    ordered = sorted(means)
    candidates = sorted(means | {(u + v) / 2 for u, v in zip(ordered, ordered[1:])})
    kept = [c for c in candidates if exact_p(a, b, c) >= Fraction(level).limit_denominator(10**6)]
    assert (low, high) == (pytest.approx(float(kept[0]), abs=1e-9), pytest.approx(float(kept[-1]), abs=1e-9))


@pytest.mark.parametrize("n, level", [(6, 0.05), (8, 0.01), (10, 0.01)])
def test_the_simultaneous_interval_is_the_exact_test_inverted(n, level):
    d = list(np.random.default_rng(n).normal(0.3, 0.2, n))
    low, high = analysis.sign_flip_interval(d, level)
    grid = np.linspace(min(d) - 0.5, max(d) + 0.5, 4001)
    kept = [s for s in grid if stats.sign_flip_test(np.subtract(d, s), np.zeros(n))["p"] >= level]
    step = (max(d) - min(d) + 1.0) / 4000
    assert (min(kept), max(kept)) == pytest.approx((low, high), abs=step)
    assert analysis.sign_flip_interval(d[:4], 0.05) == (float("-inf"), float("inf"))  # floor 2/16 >= 0.05


def test_the_labs_study_read_again_dcl_is_bounded_by_an_interval_that_holds_zero():
    """bench/results/study: DCL's raw sign-flip p 0.029 beside Holm's 0.088; its unadjusted t-interval [+0.001,
    +0.013] excludes 0, the simultaneous interval at 0.05 / 5 must not."""
    recorded = json.loads((Path(__file__).resolve().parents[1] / "bench/results/study/runs.json").read_text())["runs"]
    arms = ("infonce", "hcl", "dcl", "progcl", "progcl_mix", "unremix")
    values = {arm: [recorded[f"{arm}-b64-s{seed}"]["average"] for seed in range(42, 52)] for arm in arms}
    tests = analysis.compare(values, "infonce", 0.05)["tests"]
    assert tests["dcl"]["p_sign_flip_holm"] == pytest.approx(0.0879, abs=1e-4) and tests["dcl"]["low"] > 0
    dcl = tests["dcl"]["simultaneous"]
    assert not tests["dcl"]["differs"] and dcl["low"] <= 0 <= dcl["high"]
    for arm in ("hcl", "unremix"):
        assert tests[arm]["differs"] and tests[arm]["at_floor"]
        assert tests[arm]["p_sign_flip_holm"] == pytest.approx(5 * 2 / 1024) and tests[arm]["simultaneous"]["low"] > 0
    for v in tests.values():  # an interval that excludes 0 goes with "differs", always
        assert v["differs"] or v["simultaneous"]["low"] <= 0 <= v["simultaneous"]["high"]


# --- the lock --------------------------------------------------------------------------------------------------------


def locked(tmp_path: Path, text: str) -> tuple:
    plan = load_plan(str(write_plan(tmp_path, text)), check_arms=False)
    return plan, lock.lock(plan)


def refusal(plan) -> str:
    with pytest.raises(lock.LockError) as e:
        lock.check_locked(plan)
    return str(e.value)


def test_an_edit_to_the_base_config_file_is_a_change_named_with_both_values(tmp_path):
    (tmp_path / "base.yaml").write_text("learning_rate: 1.0e-3\nmax_seq_length: 32\n")
    plan, first = locked(tmp_path, PLAN.replace("base:\n", "base:\n  config: base.yaml\n"))
    assert (
        first["arms"]
        and json.loads((tmp_path / "study" / first["resolved_file"]).read_text())["arms"]["hcl"]["learning_rate"]
        == 1e-3
    )
    (tmp_path / "base.yaml").write_text("learning_rate: 1.0e-4\nmax_seq_length: 32\n")
    plan = load_plan(plan.path, check_arms=False)
    said = refusal(plan)
    assert "changed since version 1 was locked: plan.base.learning_rate: 0.001 -> 0.0001; nothing runs" in said
    assert said.count("\n") == 0


def test_a_comment_only_edit_is_no_change_and_a_value_edit_names_the_key(tmp_path):
    plan, first = locked(tmp_path, with_rules())
    path = Path(plan.path)
    path.write_text("# a note on the plan\n" + path.read_text().replace("6]\n", "6]  # paired by seed\n"))
    assert lock.check_locked(plan) == first and lock.lock(plan) == first
    path.write_text(path.read_text().replace("hcl_beta: 0.5", "hcl_beta: 0.6").replace("margin: 0.5", "margin: 0.4"))
    plan = load_plan(str(path), check_arms=False)
    assert ": plan.arms.hcl.hcl_beta: 0.5 -> 0.6; plan.verdicts.margin: 0.5 -> 0.4; nothing runs" in refusal(plan)


@pytest.mark.parametrize("form", ["file", "module"])
def test_every_file_an_objective_imports_is_locked_in_either_naming(tmp_path, form):
    """`mine.py:Mine` and `pkg.mine:Mine`, each importing a helper module of the plan's folder: the lock holds the
    sha256 of every file the import loads outside installed packages, and an edit of the helper is refused by name."""
    import re

    objective = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[0]
    folder = tmp_path / ("pkg" if form == "module" else "")
    folder.mkdir(exist_ok=True)
    (folder / "__init__.py").write_text("") if form == "module" else None
    (tmp_path / "helper.py").write_text("SCALE = 1.0\n")
    (folder / "mine.py").write_text("import helper  # noqa: F401\n" + objective)
    name = "pkg.mine:MarginLoss" if form == "module" else "mine.py:MarginLoss"
    plan, first = locked(tmp_path, PLAN.replace("{loss: hcl, hcl_beta: 0.5}", f"{{loss: '{name}'}}"))
    expected = {"helper.py", "pkg/__init__.py", "pkg/mine.py"} if form == "module" else {"helper.py", "mine.py"}
    assert set(first["code"]["objectives"]) == expected
    (tmp_path / "helper.py").write_text("SCALE = 2.0\n")
    said = refusal(plan)
    assert f'code.helper.py: "{first["code"]["objectives"]["helper.py"][:12]}" -> "' in said


def test_a_changed_data_file_is_named_and_a_pilot_without_picks_locks_the_confirmatory_stage(tmp_path):
    plan, _ = locked(tmp_path, PLAN)
    with open(tmp_path / "corpus.txt", "a", encoding="utf-8") as f:
        f.write("one more sentence\n")
    assert ': data.train.corpus.txt: "' in refusal(plan)
    untuned = {"infonce": "the first regime's pick", "hcl": "the first regime's pick"}
    pilot = {"seeds": [1], "reference": {"queue_size": 0}, "criteria": {"loss_ratio": 10}, "untuned": untuned}
    other = tmp_path / "other"
    other.mkdir()
    plan, first = locked(other, PLAN + yaml.safe_dump({"pilot": pilot}))
    assert first["stage"] == "pilot"
    with pytest.raises(lock.LockError, match="the confirmatory runs wait for the pilot's picks"):
        lock.check_locked(plan, stage="confirmatory")
    second = lock.lock(plan, reason="the pilot's picks", picks={}, stage="confirmatory")
    assert (second["version"], second["stage"], second["picks"]) == (2, "confirmatory", {})
    assert lock.check_locked(plan, stage="confirmatory") == second and lock.lock(plan) == second
    with pytest.raises(lock.LockError, match=r"the stage: confirmatory -> pilot"):
        lock.lock(plan, stage="pilot")
