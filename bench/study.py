"""The confirmatory study in the memory-bank regime (bench/results/study/plan.md) on the study command's page. Its runs
(the lab's earlier runner: runs.json, runs/<run>/predictions.npz) carry no hashes and no lock: each score is recomputed
from the predictions and the evaluation data, then tested, read against plan.md's rules (verdicts.yaml, given after
the runs) and written by simcse_hn.study's own code. `python -m bench.study` rewrites report.{json,md}.
"""

from __future__ import annotations

import json

import yaml

from bench.common import RESULTS, ROOT, SHARED_DATA
from simcse_hn.study import binding
from simcse_hn.study.files import text_sha256, write_atomic, write_json
from simcse_hn.study.plan import Plan
from simcse_hn.study.records import run_key
from simcse_hn.study.report import analyse
from simcse_hn.study.report_page import markdown

OUT = RESULTS / "study"
ARMS = ("infonce", "hcl", "dcl", "progcl", "progcl_mix", "unremix")
SEEDS = list(range(42, 52))
CHECKED = "each score recomputed from its kept predictions and the evaluation data (the records hold no hashes)"


def plan() -> Plan:
    """plan.md's study in the study command's terms: its arms, seeds, endpoint, test and level (plan.md states no
    smallest effect of interest)."""
    return Plan(
        path=str(OUT / "plan.md"),
        name="memory-bank",
        base={},
        arms={arm: {} for arm in ARMS},
        baseline="infonce",
        seeds=SEEDS,
        evaluation={"data_dir": str(SHARED_DATA / "sts")},
        endpoint="average",
        test="sign_flip",
        correction="holm",
        alpha=0.05,
        smallest_effect=None,
        spread=None,
        output_dir=".",
        pilot=None,
    )


def runs(entries: dict) -> tuple[dict, dict]:
    """The runs as the study command's records, their scores recomputed from the predictions; -> (taken, refused)."""
    gold = binding.Gold(str(SHARED_DATA / "sts"), sickr_all=False)
    taken, refused = {}, {}
    for seed in SEEDS:
        for arm in ARMS:
            entry = entries[f"{arm}-b64-s{seed}"]
            again = binding.recomputed(str(ROOT / entry["results"]), gold, "all")
            if abs(again["average"] - entry["average"]) > binding.SCORE_TOLERANCE * (1 + abs(again["average"])):
                refused[run_key(arm, seed)] = f"runs.json's average {entry['average']} is not its predictions'"
                continue
            taken[run_key(arm, seed)] = {
                "arm": arm,
                "seed": seed,
                "scores": again,
                "diagnostics": entry["diagnostics"],
                "times": {},
            }
    return taken, refused


def record() -> dict:
    """The study command's report record of the study, from runs.json and the kept predictions."""
    entries = json.loads((OUT / "runs.json").read_text(encoding="utf-8"))["runs"]
    taken, refused = runs(entries)
    provenance = {
        k: {e["provenance"][k] for e in entries.values()} for k in ("train_code_sha256", "train_data_sha256")
    }
    version = {
        "version": "plan.md",
        "plan_sha256": text_sha256((OUT / "plan.md").read_text(encoding="utf-8")),
        "code": {"sha256": "/".join(sorted(provenance["train_code_sha256"]))},
        "data": {"sha256": "/".join(sorted(provenance["train_data_sha256"]))},
    }
    given = yaml.safe_load((OUT / "verdicts.yaml").read_text(encoding="utf-8"))
    rules = {"source": "verdicts.yaml", "note": given["source"], "rules": given["verdicts"]}
    return analyse(plan(), version, taken, refused, None, rules) | {"checked": CHECKED}


def main() -> None:
    found = record()
    write_json(str(OUT / "report.json"), found)
    write_atomic(str(OUT / "report.md"), markdown(found))
    print(markdown(found), end="")


if __name__ == "__main__":
    main()
