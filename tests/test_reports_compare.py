"""Multi-seed statistics: textbook numbers and SciPy for the t-interval and the paired t-test, a brute-force paired
bootstrap, and eval/compare.py grouping runs by objective and pairing them by seed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats
from scipy.stats import spearmanr
from test_sts_cli import load_script

from simcse_hn.evaluation import stats
from simcse_hn.evaluation.results import save_predictions

pytestmark = pytest.mark.usefixtures("one_thread")

# Student (1908) / Cushny & Peebles: extra hours of sleep under two drugs, the same ten patients (R's `sleep`).
# t.test(extra ~ group, paired = TRUE): t = -4.0621, df = 9, p = 0.002833, 95% CI [-2.4598858, -0.7001142].
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_t_interval_gives_the_textbook_and_scipy_numbers():
    values = [76.07, 76.68, 76.31]
    out = stats.t_interval(values)
    mean, sem = np.mean(values), scipy_stats.sem(values)
    assert out["n"] == 3 and out["mean"] == pytest.approx(mean) and out["std"] == pytest.approx(np.std(values, ddof=1))
    low, high = scipy_stats.t.interval(0.95, 2, loc=mean, scale=sem)
    assert (out["low"], out["high"]) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert out["high"] - mean == pytest.approx(4.303 * sem, rel=1e-4)  # t(0.975, 2) = 4.303 in every t table
    single = stats.t_interval([75.0])
    assert single["mean"] == 75.0 and single["n"] == 1 and np.isnan(single["std"]) and np.isnan(single["low"])


def test_paired_t_test_gives_students_sleep_numbers():
    out = stats.paired_t_test(SLEEP_1, SLEEP_2)
    assert out["n"] == 10 and out["difference"] == pytest.approx(-1.58)
    assert out["t"] == pytest.approx(-4.0621, abs=1e-4) and out["p"] == pytest.approx(0.002833, abs=1e-6)
    assert out["low"] == pytest.approx(-2.4598858, abs=1e-7) and out["high"] == pytest.approx(-0.7001142, abs=1e-7)
    reference = scipy_stats.ttest_rel(SLEEP_1, SLEEP_2)
    assert (out["t"], out["p"]) == (pytest.approx(reference.statistic), pytest.approx(reference.pvalue))


def test_sign_flip_test_is_exact_over_every_sign_pattern():
    """Against a loop over all 2^n patterns written out here, and its known extremes: all differences of one sign give
    the smallest p, 2 / 2^n; a difference of 0 gives 1."""
    import itertools

    d = [0.3, -0.1, 0.25, 0.05, 0.4, -0.2, 0.15]
    observed = abs(sum(d) / len(d))
    extreme = sum(abs(sum(s * x for s, x in zip(signs, d)) / len(d)) >= observed - 1e-12
                  for signs in itertools.product((1, -1), repeat=len(d)))  # fmt: skip
    result = stats.sign_flip_test([x + 1 for x in d], [1.0] * len(d))
    assert result["p"] == pytest.approx(extreme / 2 ** len(d)) and result["difference"] == pytest.approx(observed)
    assert stats.sign_flip_test([2.0] * 10, [1.0] * 10)["p"] == pytest.approx(2 / 1024)
    assert stats.sign_flip_test([1.0, 2.0], [1.0, 2.0])["p"] == 1.0
    with pytest.raises(ValueError, match="1 to 20 pairs"):
        stats.sign_flip_test([], [])


def test_holm_adjusts_step_down_keeps_order_and_leaves_out_untested_groups():
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": float("nan"), "e": 0.5})
    # m = 4 finite: 0.01 x 4, 0.03 x 3, 0.04 x 2 -> 0.09 (monotone), 0.5 x 1 -> 0.5
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "e": 0.5})
    assert stats.holm({"only": 0.02}) == {"only": 0.02} and stats.holm({}) == {}
    assert stats.holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}


def fake_predictions(rng, noise: float, base=None):
    """Two sub-files for STS12 (so aggregations differ), one file for STS-B; gold scores with ties."""
    layout = {"STS12": {"MSRpar": 25, "OnWN": 18}, "STS-B": {"test": 30}}
    out = {}
    for task, subsets in layout.items():
        gold = base[task]["gold"] if base else np.round(rng.uniform(0, 5, sum(subsets.values())), 0)
        subset = np.asarray([name for name, n in subsets.items() for _ in range(n)])
        out[task] = {"cosine": gold + rng.normal(0, noise, len(gold)), "gold": gold, "subset": subset}
    return out


def brute_force_bootstrap(predictions, aggregation, resamples, seed):
    """One resample at a time, scipy.stats.spearmanr, the draws in the order stats.bootstrap_draws documents."""
    rng = np.random.default_rng(seed)
    draws = {}
    for task, columns in predictions.items():
        names = list(dict.fromkeys(columns["subset"].tolist()))
        draws[task] = []
        for name in names:
            positions = np.flatnonzero(columns["subset"] == name)
            draws[task].append(positions[rng.integers(0, len(positions), size=(resamples, len(positions)))])
    scores = {task: [] for task in predictions}
    for b in range(resamples):
        for task, columns in predictions.items():
            parts = [block[b] for block in draws[task]]
            c, g = columns["cosine"], columns["gold"]
            if aggregation == "all" or task == "STS-B":
                scores[task].append(spearmanr(c[np.concatenate(parts)], g[np.concatenate(parts)]).statistic * 100)
            else:
                per_file = [spearmanr(c[p], g[p]).statistic * 100 for p in parts]
                weights = [len(p) for p in parts] if aggregation == "wmean" else None
                scores[task].append(np.average(per_file, weights=weights))
    scores = {task: np.asarray(v) for task, v in scores.items()}
    scores["average"] = np.mean([scores[t] for t in predictions], axis=0)
    return scores


@pytest.mark.parametrize("aggregation", ["all", "mean", "wmean"])
def test_paired_bootstrap_equals_a_brute_force_reference(aggregation):
    rng = np.random.default_rng(7)
    a = fake_predictions(rng, 1.0)
    b = fake_predictions(rng, 1.2, base=a)
    draws = stats.bootstrap_draws(a, resamples=60, seed=3)
    for predictions in (a, b):
        fast = stats.bootstrap_scores(predictions, draws, aggregation, chunk=17)  # chunks that do not divide 60
        slow = brute_force_bootstrap(predictions, aggregation, 60, seed=3)
        for key in slow:
            np.testing.assert_allclose(fast[key], slow[key], rtol=0, atol=1e-9)
    # the observed scores (no resampling) are the results' numbers
    observed = stats.observed_scores(a, aggregation)
    assert observed["STS-B"] == pytest.approx(spearmanr(a["STS-B"]["cosine"], a["STS-B"]["gold"]).statistic * 100)

    d = brute_force_bootstrap(a, aggregation, 60, 3)["average"]
    d -= brute_force_bootstrap(b, aggregation, 60, 3)["average"]
    summary = stats.bootstrap_difference(d, observed=0.5)
    assert summary["low"] == pytest.approx(np.percentile(d, 2.5))
    assert summary["high"] == pytest.approx(np.percentile(d, 97.5))
    beyond = min(np.sum(d <= 0), np.sum(d >= 0))
    assert summary["p"] == pytest.approx(min(1.0, 2 * (beyond + 1) / 61)) and summary["resamples"] == 60


def write_run(root, name, loss, seed, average_shift, predictions=None, training_extra=None, **kwargs):
    """A results.json as eval/sts.py writes it (two tasks), with training record and optionally predictions.npz."""
    folder = root / name
    folder.mkdir()
    if predictions is not None:
        tasks = {t: {"spearman": spearmanr(c["cosine"], c["gold"]).statistic * 100, "pairs": len(c["gold"]),
                     "subsets": {}} for t, c in predictions.items()}  # fmt: skip
        save_predictions(str(folder / "predictions.npz"), predictions)
    else:
        tasks = {t: {"spearman": 70.0 + k + average_shift, "pairs": 10, "subsets": {}} for k, t in
                 enumerate(["STS12", "STS-B"])}  # fmt: skip
    training = None if loss is None else {"loss": loss, "loss_kwargs": kwargs, "contrast_form": "symmetric",
                                          "seed": seed, **(training_extra or {})}  # fmt: skip
    results = {"model": f"/train/{name}", "pooler": "cls", "aggregation": "all", "sickr_pairs": "test", "date": "d",
               "versions": {}, "settings": {}, "training": training, "tasks": tasks,
               "average": float(np.mean([t["spearman"] for t in tasks.values()])),
               "alignment_uniformity": {"alignment": 0.2 + average_shift / 100, "uniformity": -2.0,
                                        "positive_pairs": 3, "sentences": 9, "threshold": 4.0}}  # fmt: skip
    (folder / "results.json").write_text(json.dumps(results))
    return results


def test_compare_groups_by_objective_pairs_by_seed_and_tests_against_the_baseline(tmp_path, capsys):
    compare = load_script("compare")
    shifts = {("infonce", 42): 0.0, ("infonce", 43): 0.6, ("infonce", 44): -0.3,
              ("hcl", 43): 0.9, ("hcl", 42): 0.25, ("hcl", 44): 0.1, ("hcl", 45): 2.0}  # fmt: skip
    results = {}
    for (loss, seed), shift in shifts.items():  # hcl's seeds in another order, and a seed the baseline lacks
        kwargs = {"beta": 0.1} if loss == "hcl" else {}
        results[(loss, seed)] = write_run(tmp_path, f"{loss}-s{seed}", loss, seed, shift, **kwargs)
    write_run(tmp_path, "hcl-b2-s42", "hcl", 42, 5.0, beta=2.0)  # same loss, other beta: another group
    write_run(tmp_path, "minilm", None, None, -10.0)  # no training record: a group of its own
    out = tmp_path / "cmp"
    paths = sorted(str(p) for p in tmp_path.iterdir() if p.is_dir() and p.name != "cmp")
    assert compare.main([*paths, "--output", str(out), "--baseline", "infonce", "--bootstrap", "0"]) == 0

    record = json.loads((out / "comparison.json").read_text())
    assert list(record["groups"])[0] == "infonce"  # the baseline first, the others in the order of the runs
    assert list(record["groups"])[1:] == ["hcl (beta 2.0)", "hcl (beta 0.1)", "minilm"]
    hcl = record["groups"]["hcl (beta 0.1)"]
    assert sorted(hcl["seeds"]) == [42, 43, 44, 45]
    averages = [results[("hcl", s)]["average"] for s in (42, 43, 44, 45)]
    low, high = scipy_stats.t.interval(0.95, 3, loc=np.mean(averages), scale=scipy_stats.sem(averages))
    assert hcl["scores"]["Avg."]["mean"] == pytest.approx(np.mean(averages))
    assert (hcl["scores"]["Avg."]["low"], hcl["scores"]["Avg."]["high"]) == (pytest.approx(low), pytest.approx(high))
    test = record["tests"]["hcl (beta 0.1)"]
    assert sorted(test["seeds"]) == ["42", "43", "44"]  # 45 has no baseline partner
    a = [results[("hcl", s)]["tasks"]["STS-B"]["spearman"] for s in (42, 43, 44)]
    b = [results[("infonce", s)]["tasks"]["STS-B"]["spearman"] for s in (42, 43, 44)]
    reference = scipy_stats.ttest_rel(a, b)
    assert test["t_test"]["STS-B"]["t"] == pytest.approx(reference.statistic)
    assert test["t_test"]["STS-B"]["p"] == pytest.approx(reference.pvalue)
    assert record["tests"]["hcl (beta 2.0)"]["t_test"]["Avg."]["n"] == 1  # one seed: a difference, no test
    # the only tested group is a family of one: Holm leaves its p as it is, and the untested ones get none
    avg = test["t_test"]["Avg."]
    assert avg["p_holm"] == pytest.approx(avg["p"])
    assert "p_holm" not in record["tests"]["hcl (beta 2.0)"]["t_test"]["Avg."]
    assert record["tests"]["minilm"]["seeds"] == []

    text = (out / "comparison.md").read_text()
    assert "95% t-interval over seeds" in text and "scipy.stats.ttest_rel" in text
    assert f"| hcl (beta 0.1) | 3 | {avg['difference']:.2f} | {avg['p']:.3f} | {avg['p_holm']:.3f} |" in text
    sts12 = [r["tasks"]["STS12"]["spearman"] for key, r in results.items() if key[0] == "hcl"]
    assert f"| hcl (beta 0.1) | 4 | {np.mean(sts12):.2f} ± {np.std(sts12, ddof=1):.2f} |" in text
    assert "hcl-s42 | hcl (beta 0.1) | 42 |" in text  # runs labelled by their model's folder, not "results"
    for name in ("comparison.png", "comparison_delta.png", "alignment_uniformity.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert text in capsys.readouterr().out


def test_compare_bootstraps_over_pairs_from_predictions(tmp_path):
    compare = load_script("compare")
    rng = np.random.default_rng(11)
    base = fake_predictions(rng, 1.0)
    runs = {}
    for seed in (1, 2):
        for loss, noise in (("infonce", 1.0), ("hcl", 0.8)):
            runs[(loss, seed)] = fake_predictions(rng, noise, base=base)
            write_run(tmp_path, f"{loss}-{seed}", loss, seed, 0.0, predictions=runs[(loss, seed)])
    out = tmp_path / "cmp"
    paths = sorted(str(p) for p in tmp_path.iterdir() if p.is_dir())
    assert compare.main([*paths, "--output", str(out), "--baseline", "infonce", "--bootstrap", "40"]) == 0
    test = json.loads((out / "comparison.json").read_text())["tests"]["hcl"]

    # the reference: the same 40 resamples (numpy seed 0, drawn from the first run's pairs) for every run
    reference = {key: brute_force_bootstrap(p, "all", 40, seed=0) for key, p in runs.items()}
    per_seed = {s: reference[("hcl", s)]["average"] - reference[("infonce", s)]["average"] for s in (1, 2)}
    for s in (1, 2):
        got = test["bootstrap_per_seed"]["Avg."][str(s)]
        assert got["low"] == pytest.approx(np.percentile(per_seed[s], 2.5), abs=1e-9)
        observed = stats.observed_scores(runs[("hcl", s)], "all")["average"]
        observed -= stats.observed_scores(runs[("infonce", s)], "all")["average"]
        assert got["difference"] == pytest.approx(observed, abs=1e-9)
    pooled = (per_seed[1] + per_seed[2]) / 2
    assert test["bootstrap"]["Avg."]["high"] == pytest.approx(np.percentile(pooled, 97.5), abs=1e-9)
    assert test["bootstrap"]["Avg."]["seeds"] == 2


def test_checkpoints_of_one_run_are_one_replicate_and_a_path_in_the_geometry_chart(tmp_path, monkeypatch):
    compare = load_script("compare")
    for step, shift in ((500, 0.3), (125, 0.0), (250, 0.2)):
        results = write_run(tmp_path, f"ckpt{step}", "infonce", 42, shift)
        results["model"] = f"/train/infonce/checkpoint-{step}"
        (tmp_path / f"ckpt{step}" / "results.json").write_text(json.dumps(results))
    drawn = []
    import simcse_hn.evaluation.plots

    monkeypatch.setattr(simcse_hn.evaluation.plots, "plot_alignment_uniformity",
                        lambda series, path, caption=None, connect=True: drawn.append((series, connect)))  # fmt: skip
    paths = [str(tmp_path / name) for name in ("ckpt500", "ckpt125", "ckpt250")]
    assert compare.main([*paths, "--output", str(tmp_path / "cmp")]) == 0
    record = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert record["groups"]["infonce"]["runs"] == ["infonce/checkpoint-500"]  # the same seed thrice: one replicate
    assert any("a seed appears more than once" in note for note in record["notes"])
    (series, connect), = drawn
    assert connect == [True] and [tag for tag, _, _ in series[0][1]] == ["step 125", "step 250", "step 500"]


def test_compare_errors_are_one_line(tmp_path, capsys):
    compare = load_script("compare")
    write_run(tmp_path, "a", "infonce", 1, 0.0)
    results = write_run(tmp_path, "b", "hcl", 1, 0.0)
    cases = [
        (["--baseline", "dcl"], "--baseline: no group 'dcl'; groups: infonce, hcl"),
        (["--group", "x"], "--group: 1 values for 2 runs"),
        (["--bootstrap", "-1"], "--bootstrap must be >= 0, got -1"),
    ]
    for extra, message in cases:
        assert compare.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "o"), *extra]) == 2
        assert capsys.readouterr().err.strip() == f"error: {message}"
    (tmp_path / "b" / "results.json").write_text(json.dumps(results | {"aggregation": "mean"}))
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "o"), "--baseline",
                         "infonce"]) == 2  # fmt: skip
    assert "different protocols" in capsys.readouterr().err



def test_runs_scored_under_other_protocols_are_split_or_refused_never_pooled(tmp_path, capsys):
    """Issue 39's case: one objective, two seeds, one scored on SICK-R's test split and one on all 9,927 pairs. By
    default the group is split with a note naming the field; a --group that mixes them, or a mixed baseline, is
    refused in one line; the notes name no run ids."""
    compare = load_script("compare")
    write_run(tmp_path, "a", "infonce", 42, 0.0, training_extra={"run_id": "r1"})
    mixed = write_run(tmp_path, "b", "infonce", 43, 1.0, training_extra={"run_id": "r2"})
    (tmp_path / "b" / "results.json").write_text(json.dumps(mixed | {"sickr_pairs": "all"}))
    paths, out = [str(tmp_path / "a"), str(tmp_path / "b")], tmp_path / "o"
    assert compare.main([*paths, "--output", str(out), "--bootstrap", "0"]) == 0
    record = json.loads((out / "comparison.json").read_text())
    assert sorted(record["groups"]) == ["infonce [aggregation all, SICK-R all 9,927 pairs (MTEB)]",
                                        "infonce [aggregation all, SICK-R test (SimCSE)]"]  # fmt: skip
    assert all(len(g["seeds"]) == 1 for g in record["groups"].values())  # never pooled as two seeds
    notes = " ".join(record["notes"])
    assert "infonce: split into 2 groups, never pooled: different protocols" in notes
    assert "run_id" not in notes
    capsys.readouterr()
    for extra in (["--group", "x,x"], ["--baseline", "infonce"]):
        assert compare.main([*paths, "--output", str(out), "--bootstrap", "0", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "mixes runs scored differently, different protocols" in err, err
        assert "\n" not in err
