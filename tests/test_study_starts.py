"""A plan's `starts` (docs/studies.md, "Starts"): the plan refuses each bad start in one line with its file and line,
the lock holds them (an edit is a change) and leaves a plan without them as it was; `run` scores each start once, as
an ordinary eval/sts.py report (its row the numbers of the same command run by hand), again only when its record is
gone, and never while another runner holds it; the report shows the starts as rows and each arm's difference from
each start, recomputed here with scipy; a forged or misplaced start record is refused in one line."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from study_fakes import PLAN, cosines, fake_runs, sha, spearman, with_rules, write_plan

from simcse_hn.study import lock, report
from simcse_hn.study.plan import PlanError, load_plan

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "studies.md"
NOISE = {"infonce": 1.0, "hcl": 0.5}


def doc_starts() -> str:
    """The doc's `starts:` block, as written."""
    return next(b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S) if "starts:" in b)


def with_starts(starts: str) -> str:
    return with_rules(PLAN + starts)


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def study(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simcse_hn.cli.study", *args], cwd=folder, env=env(), capture_output=True, text=True
    )


def test_each_bad_start_is_one_line_naming_its_line_and_the_lock_holds_the_starts(tmp_path, capsys):
    from simcse_hn.cli.study import main

    starts = (
        "starts:\n  mine: ./models/mine\n  bad name: builtin:tiny-bert\n  number: 3\n  hcl: builtin:tiny-bert:avg\n"
        "  nope: builtin:nothing\n  again: ./models/mine\n"
    )
    path = write_plan(tmp_path, with_starts(starts))
    lines = path.read_text().splitlines()
    first, last = lines.index("starts:"), lines.index("verdicts:")
    at = {line.split(":")[0].strip(): n for n, line in enumerate(lines[first:last], first + 1)}
    with pytest.raises(PlanError) as e:
        load_plan(str(path))
    missing = "no such folder (relative to the plan; a local path, not a Hub id)"
    assert e.value.problems == [
        f"{path}:{at['mine']}: starts.mine: ./models/mine: {missing}",
        f"{path}:{at['bad name']}: starts.bad name: a start's label is a plain name (letters, digits, '_', '-'): its "
        "files are named by it",
        f"{path}:{at['number']}: starts.number: a model as eval/sts.py's --baseline takes one (a folder, Hub id or "
        "builtin:NAME, then :POOLER optionally), got int",
        f"{path}:{at['hcl']}: starts.hcl: 'hcl' is an arm's name too; give the start a name of its own",
        f"{path}:{at['nope']}: starts.nope: builtin:nothing: not a builtin (builtin:tiny-bert, builtin:tiny-llama, "
        "builtin:all-MiniLM-L6-v2)",
        f"{path}:{at['again']}: starts.again: ./models/mine is start 'mine' too: two labels for one start",
        f"{path}:{at['again']}: starts.again: ./models/mine: {missing}",
    ]
    # the command: a missing local start is its one line, exit 2, before any lock
    path = write_plan(tmp_path, with_starts("starts:\n  mine: ./models/mine:cls\n"))
    assert main(["plan", str(path)]) == 2
    line = 1 + path.read_text().splitlines().index("  mine: ./models/mine:cls")
    assert capsys.readouterr().err == f"error: {path}:{line}: starts.mine: ./models/mine: {missing}\n"
    assert not (tmp_path / "study" / "lock.json").exists()
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert main(["plan", str(path)]) == 0
    plan = load_plan(str(path))
    version = lock.check_locked(plan)
    assert lock.locked_plan(plan, version)["plan"]["starts"] == {"mine": "./models/mine:cls"}
    path.write_text(path.read_text().replace("./models/mine:cls", "./models/mine:avg"))
    with pytest.raises(lock.LockError) as e:
        lock.check_locked(load_plan(str(path)))
    assert 'plan.starts.mine: "./models/mine:cls" -> "./models/mine:avg"' in str(e.value)
    assert "\n" not in str(e.value) and "--amend" in str(e.value)


def test_a_plan_without_starts_locks_and_reads_as_before(tmp_path):
    """No `starts` key in the plan as read, so every lock made before starts existed still holds (the lab's
    temperature study among them)."""
    plan = load_plan(str(write_plan(tmp_path, with_rules())), check_arms=False)
    assert plan.starts == {} and "starts" not in lock.canonical(plan)
    for name in ("plan.yaml", "plan_regime2.yaml"):
        committed = load_plan(str(ROOT / "bench" / "results" / "temperature" / name), check_arms=False)
        assert lock.check_locked(committed, scope="report")["version"] >= 1


def t_interval(values: list[float]) -> tuple[float, float, float]:
    x = np.asarray(values)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


@pytest.mark.slow
def test_run_scores_each_start_once_as_by_hand_and_the_report_shows_its_row_and_each_arms_difference(tmp_path):
    path = write_plan(tmp_path, with_starts(doc_starts()))
    assert study(tmp_path, "plan", "study.yaml").returncode == 0
    plan = load_plan(str(path), check_arms=False)
    version = lock.check_locked(plan)
    fake_runs(plan, version, NOISE)  # the arms' runs (scored here with scipy); the starts are scored for real
    done = study(tmp_path, "run", "study.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "starts to score: 2 of 2",
        "runs to do: 0 of 12",
        "starts/mean: scored",
        "starts/cls: scored",
    ]
    starts = tmp_path / "study" / "starts"
    record = json.loads((starts / "cls.json").read_text())
    assert record["command"] == (
        "simcse-hn-sts --model builtin:all-MiniLM-L6-v2 --output study/starts/cls-sts --no_progress_bar "
        "--no_save_to_model --data_dir sts --tasks stsb --pooler cls"
    )
    assert record["bound"]["scores"] == {n: sha(starts / "cls-sts" / n) for n in ("results.json", "predictions.npz")}
    before = {p.name: p.read_bytes() for p in starts.glob("*.json")}
    again = study(tmp_path, "run", "study.yaml")
    assert again.stdout.splitlines()[:2] == ["starts to score: 0 of 2", "runs to do: 0 of 12"]
    assert {p.name: p.read_bytes() for p in starts.glob("*.json")} == before  # scored once

    # the row is the report a user gets by hand with the same model, flags and pooler
    hand_flags = ["--pooler", "cls", "--data_dir", "sts", "--tasks", "stsb"]
    by_hand = subprocess.run(
        [
            sys.executable,
            str(ROOT / "eval" / "sts.py"),
            "--model",
            "builtin:all-MiniLM-L6-v2",
            *hand_flags,
            "--output",
            "by_hand",
        ],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert by_hand.returncode == 0, by_hand.stderr
    hand = json.loads((tmp_path / "by_hand" / "results.json").read_text())
    done = study(tmp_path, "report", "study.yaml")
    assert done.returncode == 0 and done.stderr == ""
    page, record = done.stdout, json.loads((tmp_path / "study" / "report.json").read_text())
    rows = record["starts"]["scores"]
    assert rows["cls"]["scores"] == {"average": hand["average"], "STS-B": hand["tasks"]["STS-B"]["spearman"]}
    assert rows["mean"]["scores"]["average"] != rows["cls"]["scores"]["average"]
    assert f"| start cls (builtin:all-MiniLM-L6-v2:cls) | {hand['average']:.2f} | " in page

    # each arm against each start: recomputed from the arms' cosines with scipy
    for arm in plan.arms:
        values = [spearman(tmp_path, cosines(tmp_path, arm, s, NOISE[arm])) for s in plan.seeds]
        assert record["starts"]["arm_means"][arm]["average"] == pytest.approx(np.mean(values))
        assert f"| {arm} | {np.mean(values):.2f} | {np.mean(values):.2f} |" in page  # the average, STS-B
        for label, start in ((label, rows[label]["scores"]["average"]) for label in ("mean", "cls")):
            found = record["starts"]["from_starts"][arm][label]
            mean, low, high = t_interval([v - start for v in values])
            assert (found["difference"], found["low"], found["high"]) == pytest.approx((mean, low, high))
            assert found["above"] == sum(v > start for v in values) and found["n"] == 6
            above = f"{found['above']} of 6"
            assert f"| {arm} | {label} | {mean:+.3f} | [{low:+.3f}, {high:+.3f}] | {above} |" in page
    verdicts, rest = page.split("## Exploratory")
    assert "start" not in verdicts.split("## Verdicts")[1] and "### Against each start (exploratory" in rest

    # a start cut short (its scores there, no record) is scored again, to the same numbers; a held one is not
    scored = json.loads((starts / "cls.json").read_text())
    (starts / "cls.json").unlink()
    with open(starts / "mean.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (starts / "mean.json").rename(tmp_path / "mean.json")
        done = study(tmp_path, "run", "study.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2:] == [
        "starts/mean: held by another runner (or a scorer still ending); run again later",
        "starts/cls: scored",
    ]
    assert json.loads((starts / "cls.json").read_text())["scores"] == scored["scores"]
    page = study(tmp_path, "report", "study.yaml").stdout
    assert "Starts (the encoders the arms start from, scored untrained): 1 of 2 in." in page and "Blind" in page
    (tmp_path / "mean.json").rename(starts / "mean.json")
    forged_records_are_refused(tmp_path, plan)


def forged_records_are_refused(folder: Path, plan) -> None:
    """Each forgery of a start record is counted out by the report in one line, and stops `run` in one line."""
    starts = folder / "study" / "starts"
    shutil.copytree(starts, folder / "starts_as_scored")

    def plus_one(record: dict) -> None:
        record["scores"]["average"] += 1
        record["scores"]["tasks"]["STS-B"] += 1

    def run_scores(record: dict) -> None:  # a trained run's scores folder put in the start's, its hashes forged
        shutil.rmtree(starts / "cls-sts")
        shutil.copytree(folder / "study" / "runs" / "hcl-s1-sts", starts / "cls-sts")
        run = json.loads((folder / "study" / "runs" / "hcl-s1.json").read_text())
        record["bound"]["scores"], record["scores"] = run["bound"]["scores"], run["scores"]

    forgeries = [
        (plus_one, "its STS-B "),
        (lambda r: r.update(start="mean", model="builtin:all-MiniLM-L6-v2"), "names start 'mean'"),
        (run_scores, "its results.json scored None, not the start's 'sentence-transformers/all-MiniLM-L6-v2'"),
        (lambda r: r.update(code_sha256="0" * 64), "scored by other code (code 000000000000)"),
    ]
    for change, why in forgeries:
        record = json.loads((starts / "cls.json").read_text())
        change(record)
        (starts / "cls.json").write_text(json.dumps(record))
        _, refused = report.write_report(plan)
        page = (folder / "study" / "report.md").read_text()
        assert list(refused) == ["starts/cls"] and refused["starts/cls"].startswith(why), refused
        assert "\n" not in refused["starts/cls"] and "Blind" in page and "1 of 2 in" in page
        if change is plus_one:  # `run` stops at it, in one line (one command is enough: it reads the same check)
            done = study(folder, "run", "study.yaml", "--dry_run")
            assert done.returncode == 2 and done.stderr.count("\n") == 1
            assert done.stderr.startswith(f"error: study/starts/cls.json: {why}") and "move starts/cls*" in done.stderr
        shutil.rmtree(starts)
        shutil.copytree(folder / "starts_as_scored", starts)
    assert report.write_report(plan)[1] == {}
