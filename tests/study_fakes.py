"""A study's finished runs without training: what eval/sts.py leaves in a run's scores folder (predictions of the
plan's STS-B test pairs, results.json with the scored model's record, the mark with each file's sha256) and the record
`simcse-hn-study run` writes beside it. The scores are Spearman x 100 of made-up cosines against the evaluation data's
gold scores, computed here with scipy, so a test knows each run's numbers independently of the study's code."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

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
RULES = {
    "margin": 0.5,
    "rules": [
        {"when": {"hcl": "better"}, "say": "HCL beats InfoNCE at this size."},
        {"when": {"hcl": "equivalent"}, "say": "HCL and InfoNCE are equivalent within half a point."},
    ],
}


def write_plan(folder: Path, text: str = PLAN) -> Path:
    """The plan with a tiny corpus and an STS-B file whose pairs are both its dev and its test pairs."""
    shutil.copyfile(FIXTURES / "tiny_corpus.txt", folder / "corpus.txt")
    (folder / "sts").mkdir(exist_ok=True)
    rows = (FIXTURES / "sts_tiny.jsonl").read_text()
    (folder / "sts" / "stsb.jsonl").write_text(rows + rows.replace('"split": "dev"', '"split": "test"'))
    (folder / "study.yaml").write_text(text)
    return folder / "study.yaml"


def gold(folder: Path) -> np.ndarray:
    rows = [json.loads(line) for line in (folder / "sts" / "stsb.jsonl").read_text().splitlines()]
    return np.asarray([r["score"] for r in rows if r["split"] == "test"], dtype=np.float64)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cosines(folder: Path, arm: str, seed: int, noise: float) -> np.ndarray:
    """Made-up cosines of a run: the gold scores plus noise of the arm's size, drawn for the arm and seed (two runs
    never share their predictions: the report takes a repeat for a copy)."""
    rng = np.random.default_rng([seed, *map(ord, arm)])
    return gold(folder) / 5 + noise * rng.normal(size=len(gold(folder)))


def spearman(folder: Path, values: np.ndarray) -> float:
    return float(100 * stats.spearmanr(values, gold(folder)).statistic)


def fake_run(plan, version: dict, arm: str, seed: int, noise: float, objective: dict | None = None) -> dict:
    """A finished, bound run of `arm` on `seed` (its scores folder and record) as the study writes them."""
    from simcse_hn.study import lock, records

    folder = Path(plan.folder)
    key = records.run_key(arm, seed)
    scores = Path(records.scores_folder(plan, key))
    scores.mkdir(parents=True, exist_ok=True)
    cosine = cosines(folder, arm, seed, noise)
    labels = np.asarray(["test"] * len(cosine), dtype=str)
    np.savez_compressed(
        scores / "predictions.npz", **{"STS-B/cosine": cosine, "STS-B/gold": gold(folder), "STS-B/subset": labels}
    )
    rho = spearman(folder, cosine)
    objective = objective or lock.locked_plan(plan, version)["arms"][arm]["objective"]
    results = {
        "average": rho,
        "tasks": {"STS-B": {"spearman": rho, "pairs": len(cosine)}},
        "training": {"seed": seed, **objective},
        "settings": {"code": {"source_sha256": "s"}},
    }
    (scores / "results.json").write_text(json.dumps(results))
    mark = {"files": {name: [sha(scores / name)] for name in ("results.json", "predictions.npz")}}
    (scores / "simcse_report.json").write_text(json.dumps(mark))
    record = {
        "arm": arm,
        "seed": seed,
        "plan_version": version["version"],
        "plan_sha256": version["plan_sha256"],
        "spec_sha256": records.spec_sha256(records.spec(plan, version, arm)),
        "config_sha256": version["arms"][arm],
        "code_sha256": version["code"]["sha256"],
        "data_sha256": version["data"]["sha256"],
        "bound": {
            "model": {"files": None},
            "scores": {n: sha(scores / n) for n in ("results.json", "predictions.npz")},
        },
        "trained": {"source_sha256": "s", "scored_by_source_sha256": "s"},
        "scores": {"average": rho, "tasks": {"STS-B": rho}},
        "diagnostics": {"loss": 0.1 * seed},
        "times": {"started": "2099-01-01T00:00:00+00:00"},
    }
    Path(records.record_path(plan, key)).write_text(json.dumps(record))
    return record


def fake_runs(plan, version: dict, noise: dict[str, float], keys: list[str] | None = None) -> dict[str, dict]:
    """fake_run for every run of the plan (or those of `keys`), each arm at its noise."""
    from simcse_hn.study import records

    out = {}
    for seed in plan.seeds:
        for arm in plan.arms:
            key = records.run_key(arm, seed)
            if keys is None or key in keys:
                out[key] = fake_run(plan, version, arm, seed, noise[arm])
    return out


def with_rules(text: str = PLAN, rules: dict | None = None) -> str:
    return text + yaml.safe_dump({"verdicts": rules or RULES}, sort_keys=False)
