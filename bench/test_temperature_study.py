"""An independent check of the temperature study's committed records (issue 56, bench/results/temperature/), with
numpy, scipy and yaml only: none of simcse_hn.study's code reads the records here.

* The locks: each plan's versions in order; both plans' confirmatory runs on one code hash and one training and
  evaluation data hash; every run record of its plan's latest version, started after that version was locked; the
  regime 2 plan locked before regime 1's last run started.
* The pilot: each tuned arm's pick is its grid point with the best mean dev score over the pilot's seeds (a tie: the
  first), and the picks are what regime 1's confirmatory version locked and regime 2's plan trains.
* The arms of a plan differ only in their objective's keys and the temperature (the runs' config files).
* The reports: blind (no score, no mean, no test) while a run of the family is missing; once every run is in, every
  figure recomputed from the run records: the arm means and sd, each difference with its 95 % t-interval, the paired t
  and exact sign-flip p, Holm over each plan's comparisons and over the family of both plans, and the simultaneous
  interval (the test at alpha / m does not reject at its ends and rejects just outside them), the per-task
  differences and the arms' mean diagnostics; and every run's scores from the cosines and gold scores of its
  `<run>-sts/predictions.npz` (Spearman x 100 over each task's pairs, averaged over the seven tasks).
* The recomputation agrees with simcse_hn.study.analysis on made-up paired values (two implementations).
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

FOLDER = Path(__file__).resolve().parent / "results" / "temperature"
PLANS = {"plan.yaml": "study", "plan_regime2.yaml": "study_regime2"}
OBJECTIVE_KEYS = ("loss", "temperature", "hcl_", "unremix_")


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def latest(study: str) -> dict:
    return read(FOLDER / study / "lock.json")["versions"][-1]


def run_records(study: str) -> dict[str, dict]:
    return {p.stem: read(p) for p in sorted((FOLDER / study / "runs").glob("*.json"))}


def plan(name: str) -> dict:
    return yaml.safe_load((FOLDER / name).read_text(encoding="utf-8"))


# --- the recomputation -----------------------------------------------------------------------------------------------


def sign_flip_p(d: np.ndarray, shift: float = 0.0) -> float:
    """The exact two-sided sign-flip p of mean(d - shift) = 0, by enumerating every sign pattern."""
    x = d - shift
    sums = np.array([np.dot(signs, x) for signs in itertools.product((1.0, -1.0), repeat=len(x))])
    observed = abs(x.sum())
    return float(np.mean(np.abs(sums) >= observed - 1e-9 * (1 + observed)))


def holm(p: dict[str, float]) -> dict[str, float]:
    order = sorted(p, key=p.get)
    out, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * p[name]))
        out[name] = running
    return out


def recompute(groups: dict[str, tuple[dict[str, list[float]], str]], alpha: float) -> dict[str, dict]:
    """{plan: ({arm: values by seed}, baseline)} -> {"plan: arm" (or "arm" for one plan): figures}, Holm over all."""
    tests = {}
    for name, (values, baseline) in groups.items():
        for arm in values:
            if arm == baseline:
                continue
            a, b = np.array(values[arm]), np.array(values[baseline])
            d = a - b
            n, sd = len(d), float(np.std(d, ddof=1))
            half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
            key = arm if len(groups) == 1 else f"{name}: {arm}"
            tests[key] = {"difference": float(d.mean()), "low": float(d.mean() - half), "high": float(d.mean() + half),
                          "p_t": float(stats.ttest_rel(a, b).pvalue), "p_sign_flip": sign_flip_p(d),
                          "sd_of_differences": sd, "d": d}  # fmt: skip
    for key, adjusted in (("p_sign_flip", holm({k: v["p_sign_flip"] for k, v in tests.items()})),
                          ("p_t", holm({k: v["p_t"] for k, v in tests.items()}))):  # fmt: skip
        for name, v in tests.items():
            v[f"{key}_holm"] = adjusted[name]
    return tests


def assert_same(reported: dict[str, dict], mine: dict[str, dict], level: float) -> None:
    assert set(reported) == set(mine)
    for name, v in mine.items():
        got = reported[name]
        for key in ("difference", "low", "high", "p_t", "p_sign_flip", "p_sign_flip_holm", "p_t_holm",
                    "sd_of_differences"):  # fmt: skip
            assert got[key] == pytest.approx(v[key], rel=1e-9, abs=1e-12), (name, key)
        low, high = got["simultaneous"]["low"], got["simultaneous"]["high"]
        if math.isfinite(low):  # the test at `level` keeps the ends and rejects just beyond them
            step = 1e-6 * (1 + abs(low) + abs(high))
            assert sign_flip_p(v["d"], low) >= level and sign_flip_p(v["d"], high) >= level, name
            assert sign_flip_p(v["d"], low - step) < level and sign_flip_p(v["d"], high + step) < level, name


def values_of(records: dict[str, dict], arms, seeds) -> dict[str, list[float]]:
    return {arm: [records[f"{arm}-s{seed}"]["scores"]["average"] for seed in seeds] for arm in arms}


# --- the tests -------------------------------------------------------------------------------------------------------


def test_the_recomputation_agrees_with_the_study_command_on_made_up_values():
    from simcse_hn.study.analysis import compare, compare_family

    rng = np.random.default_rng(0)
    one = {"infonce": list(rng.normal(76, 0.3, 10))}
    one |= {"hcl": list(np.add(one["infonce"], rng.normal(0.3, 0.2, 10))),
            "unremix": list(np.add(one["infonce"], rng.normal(0.0, 0.2, 10)))}  # fmt: skip
    two = {arm: list(np.add(v, rng.normal(0.1, 0.2, 10))) for arm, v in one.items()}
    reported = compare(one, "infonce", 0.05, 0.2)
    assert_same(reported["tests"], recompute({"a": (one, "infonce")}, 0.05), reported["level"])
    family = compare_family({"a": (one, "infonce"), "b": (two, "infonce")}, 0.05, 0.2)
    assert_same(family["tests"], recompute({"a": (one, "infonce"), "b": (two, "infonce")}, 0.05), family["level"])


def test_the_plans_were_locked_in_order_and_every_run_is_of_the_latest_version_on_one_code_hash():
    codes, train_data, evaluation = set(), [], set()
    first_started, last_started = {}, {}
    for name, study in PLANS.items():
        versions = read(FOLDER / study / "lock.json")["versions"]
        assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
        assert [when(v["locked_at"]) for v in versions] == sorted(when(v["locked_at"]) for v in versions)
        last = versions[-1]
        if last["stage"] == "confirmatory":
            codes.add(last["code"]["sha256"])
            train_data.append(last["data"]["train"])
            evaluation.add(last["data"]["evaluation"])
        records = run_records(study)
        for key, record in records.items():
            assert record["plan_version"] == last["version"] and last["stage"] == "confirmatory", key
            assert record["code_sha256"] == last["code"]["sha256"] and record["data_sha256"] == last["data"]["sha256"]
            assert record["trained"]["source_sha256"] == record["trained"]["scored_by_source_sha256"] == \
                last["code"]["source_sha256"], key  # fmt: skip
            assert when(record["times"]["started"]) >= when(last["locked_at"]), key
        starts = [when(r["times"]["started"]) for r in records.values()]
        first_started[name], last_started[name] = min(starts, default=None), max(starts, default=None)
    assert len(codes) <= 1 and len(evaluation) <= 1
    assert all(t == train_data[0] for t in train_data)
    regime2_locked = when(read(FOLDER / "study_regime2" / "lock.json")["versions"][0]["locked_at"])
    assert last_started["plan.yaml"] is None or regime2_locked <= last_started["plan.yaml"]


def test_the_picks_are_the_best_mean_dev_scores_and_both_regimes_train_them():
    pilot = read(FOLDER / "study" / "pilot" / "pilot.json")
    grid = plan("plan.yaml")["pilot"]["tune"]
    seeds = plan("plan.yaml")["pilot"]["seeds"]
    for arm, option in grid.items():
        (key, values), = option.items()
        means = [np.mean([read(FOLDER / "study" / "pilot" / f"{arm}-{key}={json.dumps(v)}-s{s}.json")["dev"]
                          for s in seeds]) for v in values]  # fmt: skip
        best = values[int(np.argmax(means))]  # argmax: the first of equal means
        assert pilot["picks"][arm] == {key: best}
        assert plan("plan_regime2.yaml")["arms"][arm][key] == best
    confirmatory = [v for v in read(FOLDER / "study" / "lock.json")["versions"] if v["stage"] == "confirmatory"]
    assert confirmatory and all(v["picks"] == pilot["picks"] for v in confirmatory)
    assert pilot["shared_pairs"] == 0


def test_the_arms_differ_only_in_their_objective_and_temperature():
    for study in PLANS.values():
        configs = {p.stem: yaml.safe_load(p.read_text(encoding="utf-8"))
                   for p in sorted((FOLDER / study / "configs").glob("*.yaml"))}  # fmt: skip
        for a, b in itertools.combinations(configs, 2):
            differing = {k for k in set(configs[a]) | set(configs[b]) if configs[a].get(k) != configs[b].get(k)}
            assert all(k.startswith(OBJECTIVE_KEYS) for k in differing), (study, a, b, differing)


@pytest.mark.parametrize("name", list(PLANS))
def test_each_report_is_blind_until_every_run_is_in_then_every_figure_recomputes(name):
    study = PLANS[name]
    path = FOLDER / study / "report.json"
    if not path.is_file():
        assert not (FOLDER / study / "report.md").exists()
        return
    report, spec = read(path), plan(name)
    members = [name, *spec.get("family", [])]
    records = {m: run_records(PLANS[m]) for m in members}
    complete = all(len(records[m]) == len(plan(m)["arms"]) * len(plan(m)["seeds"]) for m in members)
    if not complete:
        assert not {"summary", "comparison", "family_comparison", "per_task"} & set(report)
        assert not any(word in (FOLDER / study / "report.md").read_text(encoding="utf-8")
                       for word in ("mean average", "difference", "sign-flip p |"))  # fmt: skip
        return
    values = values_of(records[name], spec["arms"], spec["seeds"])
    for arm, v in values.items():
        assert report["summary"][arm]["mean"] == pytest.approx(np.mean(v), rel=1e-12)
        assert report["summary"][arm]["sd"] == pytest.approx(np.std(v, ddof=1), rel=1e-9)
    mine = recompute({name: (values, spec["baseline"])}, spec["alpha"])
    assert_same(report["comparison"]["tests"], mine, report["comparison"]["level"])
    if len(members) > 1:
        groups = {plan(m)["name"]: (values_of(records[m], plan(m)["arms"], plan(m)["seeds"]), plan(m)["baseline"])
                  for m in members}  # fmt: skip
        family = recompute(groups, spec["alpha"])
        assert_same(report["family_comparison"]["tests"], family, report["family_comparison"]["level"])
    tasks = next(iter(records[name].values()))["scores"]["tasks"]
    for arm in spec["arms"]:
        if arm == spec["baseline"]:
            continue
        for task in tasks:
            d = [records[name][f"{arm}-s{seed}"]["scores"]["tasks"][task]
                 - records[name][f"{spec['baseline']}-s{seed}"]["scores"]["tasks"][task] for seed in spec["seeds"]]
            assert report["per_task"][arm][task] == pytest.approx(np.mean(d), rel=1e-9, abs=1e-12), (arm, task)
    for arm in spec["arms"]:
        runs = [records[name][f"{arm}-s{seed}"]["diagnostics"] for seed in spec["seeds"]]
        for key, value in report["diagnostics_by_arm"][arm].items():
            assert value == pytest.approx(np.mean([r[key] for r in runs]), rel=1e-9, abs=1e-12), (arm, key)


@pytest.mark.parametrize("study", list(PLANS.values()))
def test_every_run_scores_are_the_spearman_of_its_predictions(study):
    for key, record in run_records(study).items():
        predictions = np.load(FOLDER / study / "runs" / f"{key}-sts" / "predictions.npz")
        tasks = record["scores"]["tasks"]
        assert set(tasks) == {name.split("/")[0] for name in predictions.files}, key
        for task, score in tasks.items():
            rho = stats.spearmanr(predictions[f"{task}/cosine"], predictions[f"{task}/gold"]).statistic
            assert score == pytest.approx(100 * rho, rel=1e-12), (key, task)
        assert record["scores"]["average"] == pytest.approx(np.mean(list(tasks.values())), rel=1e-12), key


def test_the_figures_docs_quality_md_quotes_are_the_reports():
    """docs/quality.md's table of the family and its arm means, against the reports (rounded as the page rounds)."""
    doc = (FOLDER.parents[2] / "docs" / "quality.md").read_text(encoding="utf-8")
    family = read(FOLDER / "study_regime2" / "report.json")["family_comparison"]["tests"]
    rows = {"bank of 4,096": "temperature-bank4096", "topic batches + bank": "temperature-topic-bank4096"}
    arms = {"HCL beta 0.2": "hcl", "UnReMix beta 1": "unremix"}
    seen = set()
    for line in doc.splitlines():
        cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
        if len(cells) < 7 or cells[0] not in rows or cells[1] not in arms:
            continue
        v = family[f"{rows[cells[0]]}: {arms[cells[1]]}"]
        assert cells[2] == f"{v['difference']:+.2f} [{v['low']:+.2f}, {v['high']:+.2f}]", line
        sim = v["simultaneous"]
        assert cells[3] == f"[{sim['low']:+.2f}, {sim['high']:+.2f}]", line
        assert float(cells[5]) == pytest.approx(v["p_sign_flip_holm"], abs=0.006), line
        assert (cells[6] == "no difference shown") == (v["p_sign_flip_holm"] >= 0.05), line
        seen.add(line)
    assert len(seen) == 4
    for study in PLANS.values():
        for arm, v in read(FOLDER / study / "report.json")["summary"].items():
            assert f"{v['mean']:.2f} ({v['sd']:.2f})" in doc, (study, arm)


def test_the_readme_line_on_the_labs_result_quotes_the_reports():
    """The README says of the two studies what their reports' verdicts say, in their words: the first's two verdict
    sentences, and that the second's plan earns none; its tuning is said to be unalike."""
    readme = " ".join((FOLDER.parents[2] / "README.md").read_text(encoding="utf-8").split())
    first = read(FOLDER.parent / "study" / "report.json")["verdicts"]["verdicts"]
    assert [v["say"] for v in first] == ["HCL (beta 0.2) differs from InfoNCE.", "UnReMix differs from InfoNCE."]
    quoted = " and ".join(f'"{v["say"]}"' for v in first)
    assert f"earns, by its plan's rule: {quoted}" in readme
    assert read(FOLDER / "study_regime2" / "report.json")["verdicts"]["verdicts"] == []
    assert "its plan's rules earn no verdict" in readme and "(not alike)" in readme
    assert "Every other figure on that page is exploratory." in readme
