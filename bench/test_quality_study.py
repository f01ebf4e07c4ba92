"""bench/quality.py's bookkeeping, with stand-ins for training and scoring: which runs the study's seed rule still
needs, what `--resume` finishes, and that two sittings never train the same run at once."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def quality(tmp_path, monkeypatch):
    module = importlib.reload(importlib.import_module("bench.quality"))  # a fresh module for each test
    monkeypatch.setattr(module, "OUT", tmp_path / "results")
    calls = []

    def stand_in(command, log, threads=None):  # train.py makes the folder; eval/sts.py the report
        calls.append(command)
        if command[1] == "train.py":
            folder = Path(command[command.index("--output_dir") + 1])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "simcse_run.json").write_text("{}")
            (folder / "simcse_files.json").write_text("{}")
            log = [{"step": 10, "loss": 0.5, "pos_sim": 0.7}, {"step": 20, "loss": 0.01, "pos_sim": 0.75}]
            (folder / "trainer_state.json").write_text(json.dumps({"log_history": log}))
        else:
            report = Path(command[command.index("--output") + 1])
            report.mkdir(parents=True, exist_ok=True)
            (report / "results.json").write_text(json.dumps({"average": 77.0}))
        return 1.0

    monkeypatch.setattr(module, "run", stand_in)
    module.calls = calls
    return module


def index_with(scores: dict[tuple[str, int], float]) -> dict:
    return {"runs": {f"{arm}-b64-s{seed}": {"arm": arm, "seed": seed, "batch_size": 64, "average": average}
                     for (arm, seed), average in scores.items()}}  # fmt: skip


def keys(quality, todo) -> list[str]:
    return [quality.run_key(name, seed, batch) for name, _, seed, batch, _ in todo]


def test_the_plan_of_an_empty_study_is_three_seeds_per_arm_five_for_the_baseline_and_the_sweep(quality):
    todo = keys(quality, quality.study_plan({"runs": {}}))
    arms = quality.arms()
    assert todo[: 3 * len(arms)] == [f"{arm}-b64-s{seed}" for seed in (42, 43, 44) for arm in arms]
    assert todo[3 * len(arms): 3 * len(arms) + 2] == ["infonce-b64-s45", "infonce-b64-s46"]
    assert todo[3 * len(arms) + 2:] == [f"{name}-b64-s42" for name, _, _ in quality.SWEEP]
    assert len(set(todo)) == len(todo)


def test_an_arm_ahead_after_three_seeds_gets_five_and_one_behind_keeps_three(quality):
    scores = {("infonce", s): 77.0 for s in (42, 43, 44)}
    scores |= {("hcl", 42): 77.5, ("hcl", 43): 76.9, ("hcl", 44): 77.0}  # mean 77.13: ahead
    scores |= {("dcl", s): 76.5 for s in (42, 43, 44)}  # behind
    scores |= {("unremix", 42): 78.0, ("unremix", 43): 78.0}  # ahead so far, but only two seeds: not yet decided
    index = index_with(scores)
    assert quality.ahead_of_baseline(index, "hcl") is True
    assert quality.ahead_of_baseline(index, "dcl") is False
    assert quality.ahead_of_baseline(index, "unremix") is None
    todo = keys(quality, quality.study_plan(index))
    assert "hcl-b64-s45" in todo and "hcl-b64-s46" in todo
    assert not any(k.startswith(("dcl-b64-s4", "hcl-b64-s42", "hcl-b64-s43", "hcl-b64-s44")) for k in todo)
    assert "unremix-b64-s44" in todo and "unremix-b64-s45" not in todo
    assert "infonce-b64-s45" in todo and "infonce-b64-s42" not in todo


def test_a_batch_512_run_does_not_count_for_the_batch_64_rule(quality):
    index = index_with({("infonce", s): 77.0 for s in (42, 43, 44)} | {("hcl", s): 78.0 for s in (42, 43)})
    index["runs"]["hcl-b512-s44"] = {"arm": "hcl", "seed": 44, "batch_size": 512, "average": 80.0}
    assert quality.ahead_of_baseline(index, "hcl") is None
    assert "hcl-b64-s44" in keys(quality, quality.study_plan(index))


def test_resume_dry_run_lists_started_runs_first_then_the_plan_and_writes_nothing(quality, tmp_path, monkeypatch,
                                                                                   capsys):  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    quality.write_json(work / "hcl-b512-s42.args.json", {"name": "hcl", "flags": [], "seed": 42, "batch_size": 512,
                                                         "cache_minibatch_size": 64})  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["quality.py", "--resume", "--dry_run", "--work_dir", str(work)])
    quality.main()
    out = capsys.readouterr().out.split()
    listed = out[out.index("do:") + 2:]
    assert listed[0] == "hcl-b512-s42" and listed[1] == "infonce-b64-s42"
    assert int(out[out.index("do:") + 1]) == len(listed) == 1 + len(quality.study_plan({"runs": {}}))
    assert quality.calls == [] and sorted(p.name for p in work.iterdir()) == ["hcl-b512-s42.args.json"]
    assert not (tmp_path / "results").exists()


def test_a_dry_run_makes_no_work_dir_and_an_ignored_learning_rate_is_refused(quality, tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(sys, "argv", ["quality.py", "--seeds", "42", "--dry_run", "--work_dir", str(work)])
    quality.main()
    assert not work.exists()
    for extra in (["--sweep"], ["--resume"], ["--report"]):
        monkeypatch.setattr(sys, "argv", ["quality.py", *extra, "--learning_rate", "1e-4", "--work_dir", str(work)])
        with pytest.raises(SystemExit) as error:
            quality.main()
        assert error.value.code == 2


def test_a_run_another_sitting_holds_is_skipped_and_then_trained_once_free(quality, tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    args = ("infonce", ["--loss", "infonce"], 42, 64, None, work, tmp_path / "corpus.txt")
    with open(work / "infonce-b64-s42.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other sitting
        quality.train_and_score(*args)
        assert quality.calls == [] and "another sitting" in capsys.readouterr().out
    quality.train_and_score(*args)
    assert [c[1] for c in quality.calls] == ["train.py", "eval/sts.py"]
    entry = quality.load_index()["runs"]["infonce-b64-s42"]
    assert entry["average"] == 77.0 and entry["diagnostics"] == {"loss": 0.01, "pos_sim": 0.75}  # the last window
    quality.train_and_score(*args)  # recorded: never recomputed
    assert len(quality.calls) == 2


def test_a_run_after_the_start_within_deadline_is_left_for_the_next_sitting(quality, tmp_path, capsys):
    work = tmp_path / "work"
    quality.train_and_score("infonce", [], 42, 64, None, work, tmp_path / "corpus.txt", deadline=0.0)
    assert quality.calls == [] and "next sitting" in capsys.readouterr().out
    assert not (work / "infonce-b64-s42.args.json").exists()


def test_sick_by_label_reads_the_predictions_against_the_labels_and_refuses_a_mismatch(quality, tmp_path):
    import numpy as np

    labels = ["ENTAILMENT", "ENTAILMENT", "NEUTRAL", "CONTRADICTION", "CONTRADICTION"]
    rows = [{"split": "train", "score": 1.0, "entailment": "NEUTRAL"}]  # not in the test split: skipped
    rows += [{"split": "test", "score": float(i), "entailment": label} for i, label in enumerate(labels)]
    sick = tmp_path / "sickr.jsonl"
    sick.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    results = tmp_path / "run-sts"
    results.mkdir()
    cosine = np.array([0.9, 0.5, 0.4, 0.7, 0.3])
    np.savez(results / "predictions.npz", **{"SICK-R/cosine": cosine, "SICK-R/gold": np.arange(5.0)})
    values = quality.sick_by_label(results, sick)
    assert values["cos_entailment"] == pytest.approx(0.7) and values["cos_neutral"] == pytest.approx(0.4)
    assert values["cos_contradiction"] == pytest.approx(0.5)
    # pairs (entailment, contradiction): 0.9 > 0.7, 0.9 > 0.3, 0.5 < 0.7, 0.5 > 0.3 -> 3 of 4
    assert values["auc_entailment_vs_contradiction"] == pytest.approx(0.75)
    np.savez(results / "predictions.npz", **{"SICK-R/cosine": cosine, "SICK-R/gold": np.arange(5.0)[::-1]})
    assert quality.sick_by_label(results, sick) is None  # another order than the file's test split


def test_the_sick_table_pairs_each_arm_with_the_baseline_over_their_shared_seeds(quality, monkeypatch):
    auc = {"infonce-42": 0.60, "infonce-43": 0.70, "hcl-42": 0.61, "hcl-43": 0.72, "hcl-44": 0.99}
    monkeypatch.setattr(quality, "sick_by_label", lambda results: {
        "cos_entailment": 0.9, "cos_neutral": 0.6, "cos_contradiction": 0.8,
        "auc_entailment_vs_contradiction": auc[results.name]})  # fmt: skip
    runs = {f"{k}-b64": {"arm": k.split("-")[0], "seed": int(k.split("-")[1]), "batch_size": 64, "results": k}
            for k in auc}  # fmt: skip
    rows = {line.split(" | ")[0]: line for line in quality.sick_label_table(runs) if line.startswith("| ")}
    assert rows["| hcl"].endswith("| 0.6100, 0.7200, 0.9900 | +0.0150 (2 seeds, p 0.2) |")  # seed 44 unpaired
    assert rows["| infonce"].endswith("| 0.6000, 0.7000 |  |")


def test_a_learning_rate_override_names_its_runs_apart_and_reaches_train_py_last(quality, tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(quality, "shuffled_corpus", lambda path: path.write_text("a\nb\n"))
    monkeypatch.setattr(quality, "report", lambda index: None)
    monkeypatch.setattr(sys, "argv", ["quality.py", "--arms", "infonce", "--seeds", "42", "--batch_size", "512",
                                      "--cache_minibatch_size", "64", "--learning_rate", "8.5e-5",
                                      "--work_dir", str(work)])  # fmt: skip
    quality.main()
    train = next(c for c in quality.calls if c[1] == "train.py")
    assert train[train.index("--output_dir") + 1] == str(work / "infonce-lr8.5e-05-b512-s42")
    rates = [train[i + 1] for i, flag in enumerate(train) if flag == "--learning_rate"]
    assert rates == ["3e-5", "8.5e-05"]  # the recipe's, then the override, which argparse keeps
    assert train[train.index("--cache_minibatch_size") + 1] == "64"
    entry = quality.load_index()["runs"]["infonce-lr8.5e-05-b512-s42"]
    assert entry["arm"] == "infonce-lr8.5e-05" and entry["batch_size"] == 512
    assert json.loads((work / "infonce-lr8.5e-05-b512-s42.args.json").read_text())["flags"][-2:] == [
        "--learning_rate", "8.5e-05"]


def test_a_finished_run_keeps_its_results_beside_runs_json_and_an_older_entry_is_adopted(quality, tmp_path):
    work = tmp_path / "work"
    quality.train_and_score("infonce", [], 42, 64, None, work, tmp_path / "corpus.txt")
    entry = quality.load_index()["runs"]["infonce-b64-s42"]
    kept = quality.ROOT / entry["results"]
    assert kept == quality.OUT / "runs" / "infonce-b64-s42"
    assert json.loads((kept / "results.json").read_text()) == {"average": 77.0}
    shutil.rmtree(work)  # a new machine: the work dir is gone, what the report needs is not
    assert (kept / "results.json").is_file()
    # an entry an older bench/quality.py recorded, pointing into its work dir, is kept on the next start
    older = tmp_path / "old-work" / "hcl-b64-s42-sts"
    older.mkdir(parents=True)
    (older / "results.json").write_text(json.dumps({"average": 76.0}))
    with quality.locked_index() as index:
        index["runs"]["hcl-b64-s42"] = {"arm": "hcl", "seed": 42, "batch_size": 64, "results": str(older)}
        index["runs"]["dcl-b64-s42"] = {"arm": "dcl", "seed": 42, "batch_size": 64, "results": "outputs/gone"}
    quality.adopt_runs(tmp_path / "old-work")
    runs = quality.load_index()["runs"]
    assert quality.ROOT / runs["hcl-b64-s42"]["results"] == quality.OUT / "runs" / "hcl-b64-s42"
    assert (quality.OUT / "runs" / "hcl-b64-s42" / "results.json").read_text() == '{"average": 76.0}'
    assert runs["dcl-b64-s42"]["results"] == "outputs/gone"  # on no disk: left as recorded


def test_a_report_keeps_what_it_cannot_recompute_and_tables_the_sweep(quality, monkeypatch, capsys):
    quality.OUT.mkdir(parents=True)
    (quality.OUT / "runs.md").write_text("# old\n\n## SICK-R test pairs by entailment label\n\n"
                                         "| arm | batch | runs | a |\n|:--|--:|--:|--:|\n| hcl | 64 | 3 | 0.6 |\n")
    monkeypatch.setattr(quality, "report_command", lambda *a: pytest.fail(f"nothing to recompute: {a}"))
    index = index_with({("infonce", 42): 76.8, ("infonce", 43): 77.2, ("hcl", 42): 77.0, ("hcl", 43): 77.4,
                        ("hcl-beta0.2", 42): 77.5})  # fmt: skip
    for entry in index["runs"].values():
        entry["results"] = "outputs/gone"
    quality.report(index)
    assert "compare_b64 kept as it is: 5 of its runs' results are on no disk here" in capsys.readouterr().out
    text = (quality.OUT / "runs.md").read_text()
    assert "| hcl-beta0.2 | hcl | `--hcl_beta 0.2` | 77.50 | 77.00 | +0.50 | 77.20 ± 0.28 (2) |  |" in text
    # the old report's row is not copied: the runs without predictions are absent (issue 36)
    assert "0.6 |" not in text and "| hcl | 64 | 0 | – | – | – | – | absent | |" in text


def test_a_sweep_point_whose_setting_cannot_take_effect_is_flagged(quality):
    # ProGCL samples fit_pairs of a batch's 2N(2N-1)/2 pairs only when there are more (issue 36: progcl-fitall)
    assert "no-op: a batch of 64 has 8,128 pairs" in quality.sweep_no_op("progcl", ["--progcl_fit_pairs", "0"], 64)
    assert quality.sweep_no_op("progcl", ["--progcl_fit_pairs", "0"], 256) is None  # 130,816 pairs: sampled
    assert quality.sweep_no_op("progcl", ["--progcl_fit_pairs", "1000"], 64) is None  # fewer than the batch has
    assert quality.sweep_no_op("hcl", ["--hcl_beta", "0.2"], 64) is None
    index = index_with({("progcl", 42): 76.43, ("progcl", 43): 76.9, ("progcl-fitall", 42): 76.43})
    text = "\n".join(quality.sweep_table(index["runs"]))
    assert "| progcl-fitall | progcl | `--progcl_fit_pairs 0` | 76.43 | 76.43 | +0.00 |" in text
    assert "| no-op: a batch of 64 has 8,128 pairs" in text


def test_runs_of_one_arm_with_other_code_or_data_are_flagged(quality):
    index = index_with({("hcl", 42): 77.0, ("hcl", 43): 77.4, ("infonce", 42): 76.8})
    runs = index["runs"]
    same = {"train_data_sha256": "d1", "train_code_sha256": "c1", "eval_code_sha256": "c1"}
    for entry in runs.values():
        entry["provenance"] = dict(same)
    assert quality.mixed_provenance(runs) == []
    runs["hcl-b64-s43"]["provenance"]["train_data_sha256"] = "d2"
    runs["infonce-b64-s42"]["provenance"]["eval_code_sha256"] = "c2"
    assert quality.mixed_provenance(runs) == [
        "hcl at batch 64: 2 different train_data_sha256 over its 2 runs",
        "infonce at batch 64: 1 runs evaluated by other code than trained them",
    ]


def test_a_run_killed_while_writing_its_only_checkpoint_starts_over_instead_of_failing_to_resume(quality, tmp_path):
    # the package's rule (simcse_hn.study.runs.resume_flags): only a complete checkpoint is resumed from
    work = tmp_path / "work"
    folder = work / "infonce-b64-s42"
    (folder / "checkpoint-125").mkdir(parents=True)  # half-written: no weights, no state
    (folder / "simcse_run.json").write_text(json.dumps({"run_id": "r1"}))
    quality.train_and_score("infonce", [], 42, 64, None, work, tmp_path / "corpus.txt")
    train = next(c for c in quality.calls if c[1] == "train.py")
    assert "--overwrite_output_dir" in train and "--resume_from_checkpoint" not in train
