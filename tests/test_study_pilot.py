"""`simcse-hn-study pilot` on the docs' plan with a pilot part: the confirmatory runs wait for it, a dev set that
shares pairs with the test files the plan did not state is refused, the grid is tuned on the dev set with the same
budget per arm, and the picks are locked as a new version that the runs then train."""

from __future__ import annotations

import json

import pytest
import yaml
from test_studies_doc import FIXTURES, study, write_example

PILOT = {
    "overrides": {"max_steps": 2},
    "seeds": [1],
    "reference": {"temperature": 1.0},
    "criteria": {"loss_ratio": 0.1, "weight_share": {"arms": ["margin"], "ratio": 0.5}},
    "dev": {"file": "dev.jsonl", "split": "dev", "shares_with_test": 0},
    "tune": {"infonce": {"temperature": [0.05, 0.1]}, "margin": {"loss_options": [{"margin": 0.1}, {"margin": 0.3}]}},
}


@pytest.mark.slow
def test_the_pilot_tunes_on_dev_data_alike_and_locks_its_picks_before_the_runs(tmp_path):
    write_example(tmp_path)
    rows = [json.loads(line) for line in (FIXTURES / "sts_tiny.jsonl").read_text().splitlines()][:40]
    plan = tmp_path / "study.yaml"
    plan.write_text(plan.read_text() + yaml.safe_dump({"pilot": PILOT}))
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # the test file's own pairs
    study(tmp_path, "plan", "study.yaml")
    done = study(tmp_path, "run", "study.yaml", check=False)
    assert done.returncode == 2 and "the confirmatory runs wait for the pilot's picks" in done.stderr
    done = study(tmp_path, "pilot", "study.yaml", check=False)
    assert done.returncode == 2 and "the plan states 0, but 40 of the dev set's pairs are in" in done.stderr

    shifted = [dict(r, sentence2=rows[(i + 1) % 40]["sentence2"]) for i, r in enumerate(rows)]  # pairs of its own
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shifted))
    study(tmp_path, "plan", "study.yaml", "--amend", "a dev set apart from the test pairs")
    page = study(tmp_path, "pilot", "study.yaml").stdout
    record = json.loads((tmp_path / "study" / "pilot" / "pilot.json").read_text())
    assert "**go**" in page and "shares 0 sentence pairs" in page
    assert "| infonce | temperature 0.05 |" in page and '| margin | loss_options {"margin": 0.1} |' in page
    picked = record["picks"]["infonce"]["temperature"]  # a grid of two: the pick is at one of its edges
    edge = "lowest" if picked == 0.05 else "highest"
    assert f"* infonce: the pick, temperature {picked}, is the {edge} value of its grid" in page
    assert "margin: the pick" not in page  # values that are not numbers have no edge
    assert sorted(r["name"] for r in record["runs"]) == ["infonce-temperature=0.05-s1", "infonce-temperature=0.1-s1",
                                                         "margin-loss_options={margin:0.1}-s1",
                                                         "margin-loss_options={margin:0.3}-s1", "reference-s1"]
    for arm, grid in PILOT["tune"].items():  # the best mean dev score of the arm's own grid
        ((key, values),) = grid.items()
        dev = {json.dumps(r["change"]): r["dev"] for r in record["runs"] if r["arm"] == arm}
        best = max(values, key=lambda v: dev[json.dumps({key: v})])
        assert record["picks"][arm] == {key: best}
    versions = json.loads((tmp_path / "study" / "lock.json").read_text())["versions"]
    assert [(v["stage"], v["picks"]) for v in versions] == [("pilot", None), ("pilot", None),
                                                           ("confirmatory", record["picks"])]
    assert "runs to do: 4 of 4" in study(tmp_path, "run", "study.yaml", "--dry_run").stdout
