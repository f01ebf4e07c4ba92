"""The temperature study's reports (bench/results/temperature/) are `simcse-hn-study report`'s pages of its committed
records, run on a copy of the folder: regime 1's without verdict rules (its plan was locked without any), regime 2's
with plan.md's rules given after the runs (verdicts.yaml), whose verdicts follow plan.md's own words: the claim is
withdrawn only with no difference shown and both intervals inside ±0.2, and stands only if the arms still differ.
Neither holds, so the plan earns no verdict. A record edited in the copy is refused and the report goes blind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from simcse_hn.cli.study import main
from simcse_hn.study.report_page import EXPLORATORY

FOLDER = Path(__file__).resolve().parent / "results" / "temperature"
SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def copy(tmp_path) -> Path:
    """The study's folder at the same depth below a folder beside which `shared` lies, as in the checkout (the plans
    name the evaluation data ../../../../shared/data/sts)."""
    (tmp_path / "shared").symlink_to(SHARED)
    target = tmp_path / "repo" / "bench" / "results" / "temperature"
    shutil.copytree(FOLDER, target)
    return target


def test_the_committed_reports_are_the_study_commands_pages_of_the_committed_records(copy, monkeypatch, capsys):
    monkeypatch.chdir(copy)
    assert main(["report", "plan.yaml"]) == 0
    assert main(["report", "plan_regime2.yaml", "--verdicts", "verdicts.yaml"]) == 0
    assert capsys.readouterr().err == ""  # no record refused
    for study in ("study", "study_regime2"):
        for name in ("report.md", "report.json"):
            assert (copy / study / name).read_text() == (FOLDER / study / name).read_text(), (study, name)


def test_regime_twos_verdicts_follow_plan_mds_rule(copy):
    record = json.loads((FOLDER / "study_regime2" / "report.json").read_text())
    family = record["family_comparison"]["tests"]
    regime1 = [family[f"temperature-bank4096: {arm}"] for arm in ("hcl", "unremix")]
    inside = [
        all(-0.2 < x < 0.2 for x in (v["low"], v["high"], v["simultaneous"]["low"], v["simultaneous"]["high"]))
        for v in regime1
    ]
    assert inside == [False, False] and not any(v["p_sign_flip_holm"] < 0.05 for v in regime1)
    assert record["verdicts"]["verdicts"] == []
    verdicts = (FOLDER / "study_regime2" / "report.md").read_text().split(EXPLORATORY)[0]
    assert "No rule of the plan holds for these outcomes: the plan earns no verdict here." in verdicts
    assert "they were given to `report` after the runs, from verdicts.yaml" in verdicts
    page = (FOLDER / "study" / "report.md").read_text().split(EXPLORATORY)[0]
    assert "The plan states no verdict rules: nothing on this page is a verdict." in page


def test_an_edited_record_of_the_study_is_refused_and_the_report_goes_blind(copy, monkeypatch, capsys):
    path = copy / "study" / "runs" / "hcl-s101.json"
    record = json.loads(path.read_text())
    record["scores"]["average"] += 0.5
    path.write_text(json.dumps(record))
    monkeypatch.chdir(copy)
    assert main(["report", "plan.yaml"]) == 0
    said = capsys.readouterr()
    assert said.err.startswith("refused: hcl-s101: its average ") and said.err.count("\n") == 1
    assert "29 of 30 runs in" in said.out and "Blind" in said.out
