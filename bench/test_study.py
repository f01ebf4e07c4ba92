"""bench/results/study on the study command's page: the committed report is what bench/study.py writes from the
committed records (every score recomputed from the kept predictions), and its verdicts are plan.md's rule (an arm
differs when its Holm-adjusted exact sign-flip p is below 0.05), recomputed here with numpy and scipy alone."""

import itertools
import json

import numpy as np
import pytest

from bench import study
from simcse_hn.study.report_page import EXPLORATORY, markdown


def sign_flip_p(d: np.ndarray) -> float:
    sums = np.array([np.dot(signs, d) for signs in itertools.product((1.0, -1.0), repeat=len(d))])
    return float(np.mean(np.abs(sums) >= abs(d.sum()) - 1e-9))


@pytest.fixture(scope="module")
def record() -> dict:
    return study.record()


def test_the_committed_report_is_the_study_commands_page_of_the_committed_records(record):
    assert json.loads((study.OUT / "report.json").read_text()) == json.loads(json.dumps(record))
    assert markdown(record) == (study.OUT / "report.md").read_text(encoding="utf-8")
    assert record["in"] == 60 and record["refused"] == {}


def test_the_verdicts_are_plan_mds_rule_read_by_holm_over_the_five_arms(record):
    runs = json.loads((study.OUT / "runs.json").read_text())["runs"]
    values = {arm: np.array([runs[f"{arm}-b64-s{s}"]["average"] for s in study.SEEDS]) for arm in study.ARMS}
    raw = {arm: sign_flip_p(values[arm] - values["infonce"]) for arm in study.ARMS[1:]}
    order, running, holm = sorted(raw, key=raw.get), 0.0, {}
    for k, arm in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * raw[arm]))
        holm[arm] = running
    differ = [arm for arm in study.ARMS[1:] if holm[arm] < 0.05]
    assert differ == ["hcl", "unremix"]
    said = [v["say"] for v in record["verdicts"]["verdicts"]]
    assert said == ["HCL (beta 0.2) differs from InfoNCE.", "UnReMix differs from InfoNCE."]
    verdicts = (study.OUT / "report.md").read_text(encoding="utf-8").split(EXPLORATORY)[0]
    assert "they were given to `report` after the runs" in verdicts and all(line in verdicts for line in said)
