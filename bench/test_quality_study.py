"""bench/quality.py's reading of the quality study's records: SICK-R's test pairs by entailment label, the sweep
against its arms, runs of one arm with other code or data flagged, and a report that keeps what it cannot
recompute."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def quality(tmp_path, monkeypatch):
    module = importlib.reload(importlib.import_module("bench.quality"))  # a fresh module for each test
    monkeypatch.setattr(module, "OUT", tmp_path / "results")
    return module


def index_with(scores: dict[tuple[str, int], float]) -> dict:
    return {"runs": {f"{arm}-b64-s{seed}": {"arm": arm, "seed": seed, "batch_size": 64, "average": average}
                     for (arm, seed), average in scores.items()}}  # fmt: skip


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
