"""docs/studies.md as a user runs it: the objective file and the plan written from scratch, `plan`, `run` with two
workers (one run killed part-way and resumed), a report at 3 of 4 runs (blind) and at 4 of 4; the plan edited after
its runs (refused, then amended); the same runs through submitit's local executor, with the same records as the
local workers' (but for machine and times) and, for the killed run, the same as a run never killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simcse_hn.files import MANIFEST, file_sha256
from simcse_hn.training.checkpoints import CHECKPOINT_MANIFEST, last_complete_checkpoint, read_run_id

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "studies.md"
FIXTURES = ROOT / "tests" / "fixtures"


def block(language: str, index: int = 0) -> str:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[index]


def write_example(folder: Path) -> None:
    """The doc's objective and plan as written, with a tiny corpus and a tiny STS-B test file beside them."""
    (folder / "margin.py").write_text(block("python"), encoding="utf-8")
    (folder / "study.yaml").write_text(block("yaml"), encoding="utf-8")
    shutil.copyfile(FIXTURES / "tiny_corpus.txt", folder / "corpus.txt")
    (folder / "sts").mkdir()
    rows = FIXTURES.joinpath("sts_tiny.jsonl").read_text(encoding="utf-8").replace('"split": "dev"', '"split": "test"')
    (folder / "sts" / "stsb.jsonl").write_text(rows, encoding="utf-8")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def study(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """A line of the doc's bash block (simcse-hn-study ...), run from the plan's folder."""
    done = subprocess.run(
        [sys.executable, "-m", "simcse_hn.cli.study", *args], cwd=folder, env=env(), capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def records(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((folder / "study" / "runs").glob("*.json"))}


def checkpointed(folder: Path) -> list[str]:
    """The runs with a complete checkpoint and no final save (still training)."""
    return [
        p.name
        for p in sorted((folder / "study" / "runs").glob("*-s?"))
        if not (p / MANIFEST).is_file() and last_complete_checkpoint(str(p), read_run_id(str(p))) is not None
    ]


def without_machine_and_times(record: dict) -> dict:
    """A record less where and when it ran, and the hashes of the files that name their own run: results.json (its
    date), the model folder's simcse_config.json and card (its run id). The weights' hashes stay."""
    out = {k: v for k, v in record.items() if k not in ("where", "times", "resumed_from")}
    scores = {k: v for k, v in out["bound"]["scores"].items() if k != "results.json"}
    model = {k: v for k, v in out["bound"]["model"]["files"].items() if k not in ("simcse_config.json", "README.md")}
    out["bound"] = {"scores": scores, "model": {"files": model}}
    return out


@pytest.mark.slow
def test_the_docs_study_from_scratch_killed_resumed_blind_refused_and_through_submitit(tmp_path):
    pytest.importorskip("submitit")
    folder = tmp_path / "mine"
    folder.mkdir()
    write_example(folder)
    commands = [line.split()[1:] for line in block("bash").splitlines() if line.strip()]
    assert [c[0] for c in commands] == ["plan", "run", "report"]

    done = study(folder, *commands[0])
    assert "locked: version 1" in done.stdout and "smallest p is 2/4 = 0.5" in done.stdout

    # two workers; killed once a run has its first whole checkpoint and no final save. The window is two tiny
    # training steps, so the poll is a file test every 2 ms that stops the workers (SIGSTOP) before the full check
    worker = subprocess.Popen(
        [sys.executable, "-m", "simcse_hn.cli.study", *commands[1]],
        cwd=folder,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs, deadline, killed = folder / "study" / "runs", time.time() + 300, []
    while not killed and worker.poll() is None and time.time() < deadline:
        whole = runs.glob(f"*-s?/checkpoint-*/{CHECKPOINT_MANIFEST}")
        if any(not (p.parent.parent / MANIFEST).is_file() for p in whole):
            os.killpg(worker.pid, signal.SIGSTOP)
            killed = checkpointed(folder)
            if not killed:
                os.killpg(worker.pid, signal.SIGCONT)
        time.sleep(0.002)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    finished_before = len(records(folder))
    assert killed, "no run was caught between its first checkpoint and its end"
    blind = study(folder, *commands[2]).stdout
    assert f"{finished_before} of 4 runs in" in blind and "Blind" in blind
    done = study(folder, *commands[1])
    finished = records(folder)
    resumed = [k for k in killed if finished[k]["resumed_from"] == "checkpoint-2"]
    assert len(finished) == 4 and resumed
    assert [(r["arm"], r["seed"]) for r in finished.values()] == sorted(
        [(a, s) for a in ("infonce", "margin") for s in (1, 2)], key=lambda x: (x[0], x[1])
    )

    # 3 of 4: counts and diagnostics, no arm compared, no score
    last = folder / "study" / "runs" / "margin-s2.json"
    last.rename(tmp_path / "held.json")
    page = study(folder, "report", "study.yaml").stdout
    report = json.loads((folder / "study" / "report.json").read_text())
    assert "3 of 4 runs in" in page and "Blind" in page and "mean average" not in page
    assert "summary" not in report and "comparison" not in report and "scores" not in json.dumps(report)
    (tmp_path / "held.json").rename(last)
    page = study(folder, "report", "study.yaml").stdout
    assert "4 of 4 runs in" in page and "| margin | " in page and "[-inf, +inf]" in page
    assert "No rule of the plan holds for these outcomes: the plan earns no verdict here." in page

    # a scores file edited and its record deleted: `run` scores again, and eval/sts.py refuses to replace the edited
    # file (one line); with the mark forged to match, the scores are made again, the edited number gone
    forged = tmp_path / "forged"
    shutil.copytree(folder, forged)
    results = forged / "study" / "runs" / "infonce-s1-sts" / "results.json"
    data = json.loads(results.read_text())
    data["average"] += 3
    results.write_text(json.dumps(data))
    (forged / "study" / "runs" / "infonce-s1.json").unlink()
    done = study(forged, "run", "study.yaml", check=False)
    assert done.returncode == 1 and "results.json is there, changed since a report wrote it" in done.stderr
    assert done.stderr.count("\n") == 1 and not (forged / "study" / "runs" / "infonce-s1.json").exists()
    mark = forged / "study" / "runs" / "infonce-s1-sts" / "simcse_report.json"
    listed = json.loads(mark.read_text())
    listed["files"]["results.json"] = [file_sha256(str(results))]
    mark.write_text(json.dumps(listed))
    study(forged, "run", "study.yaml")
    rescored = json.loads((forged / "study" / "runs" / "infonce-s1.json").read_text())
    assert rescored["scores"] == finished["infonce-s1"]["scores"]
    assert rescored["bound"]["model"] == finished["infonce-s1"]["bound"]["model"]

    # the same runs again through submitit's local executor, in a copy without two of the records
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    again = sorted({resumed[0], "infonce-s1" if resumed[0] != "infonce-s1" else "margin-s1"})
    for key in again:
        for path in (copy / "study" / "runs").glob(f"{key}*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    study(
        copy,
        "run",
        "study.yaml",
        "--engine",
        "submitit",
        "--cluster",
        "local",
        "--threads",
        str(finished[again[0]]["where"]["threads"]),
    )
    redone = records(copy)
    for key in again:
        assert redone[key]["where"]["engine"] == "submitit:local"
        assert without_machine_and_times(redone[key]) == without_machine_and_times(finished[key])

    # a comment is no change; an edited value is refused in one line, the doc's own; amended, the runs stay (same
    # settings); a changed setting refuses them
    plan = folder / "study.yaml"
    text = plan.read_text()
    plan.write_text("# a note\n" + text)
    assert "runs to do: 0 of 4" in study(folder, "run", "study.yaml").stdout
    plan.write_text(text.replace("learning_rate: 1.0e-3", "learning_rate: 1.0e-4"))
    done = study(folder, "run", "study.yaml", check=False)
    said = next(line for line in DOC.read_text().splitlines() if line.startswith("error: study.yaml: changed"))
    assert done.returncode == 2 and done.stderr == said + "\n"
    plan.write_text(text + "# a note\n")
    plan.write_text(plan.read_text().replace("{margin: 0.1}", "{margin: 0.2}"))
    study(folder, "plan", "study.yaml", "--amend", "a larger margin")
    page = study(folder, "report", "study.yaml").stdout
    assert "2 of 4 runs in" in page and "margin-s1: trained under other settings (plan version 1)" in page
    done = study(folder, "run", "study.yaml", check=False)
    assert done.returncode == 2 and "move runs/margin-s1* away" in done.stderr


def trainers(study_folder: Path) -> dict[int, str]:
    """{pid: output folder} of every live process training a run of the study in `study_folder` (a runner's child,
    child.py's wrapper, started there). Other studies on the machine (another test's, in the other pytest-xdist worker,
    with the same run names; a real study's) are not this one's."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            where = os.readlink(entry / "cwd")
        except OSError:
            continue
        if "simcse_hn.study.child" in argv and "simcse_hn.cli.train" in argv and state not in ("Z", "X"):
            if where == os.path.realpath(study_folder):
                found[int(entry.name)] = argv[argv.index("--output_dir") + 1]
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
def test_a_runner_killed_with_sigkill_takes_its_trainers_with_it_and_a_new_one_never_doubles_a_run(tmp_path):
    """kill -9 of `run` while its trainers train, then `run` again at once: the old trainers die with their runner,
    and at no moment do two live trainers write one run folder; the study then finishes as usual."""
    write_example(tmp_path)
    plan = tmp_path / "study.yaml"
    plan.write_text(
        plan.read_text().replace("max_steps: 4", "max_steps: 400").replace("save_steps: 2", "save_steps: 100")
    )
    study(tmp_path, "plan", "study.yaml")
    command = [sys.executable, "-m", "simcse_hn.cli.study", "run", "study.yaml", "--jobs", "2"]
    first = subprocess.Popen(
        command, cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 240
    while len(trainers(tmp_path)) < 2 and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    old = trainers(tmp_path)
    assert len(old) == 2, "the runner never had two trainers at once"
    first.send_signal(signal.SIGKILL)  # the runner alone, not its process group
    first.wait()
    second = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    gone_at, seen = None, []
    start = time.time()
    while second.poll() is None and time.time() < start + 600:
        now = trainers(tmp_path)
        folders = list(now.values())
        seen.append(len(folders))
        assert len(set(folders)) == len(folders), f"two trainers on one run folder: {now}"
        if gone_at is None and not set(old) & set(now):
            gone_at = time.time() - start
        time.sleep(0.05)
    said = second.communicate()[0]
    assert gone_at is not None and gone_at < 5, f"the killed runner's trainers lived on: {old}"
    study(tmp_path, "run", "study.yaml")  # whatever the second runner left (a run held while a trainer ended)
    assert len(records(tmp_path)) == 4, said
    assert "4 of 4 runs in" in study(tmp_path, "report", "study.yaml").stdout


def prose() -> str:
    return " ".join(DOC.read_text(encoding="utf-8").split())


def test_the_docs_counts_of_dev_sets_in_the_test_files_are_the_pilots(tmp_path):
    """docs/studies.md's numbers: STS-B's and SICK-R's dev pairs against the whole suite's test files, and the
    temperature study's 369 pairs (made with case and spacing aside), counted as the pilot counts."""
    from conftest import SHARED_DATA

    from simcse_hn.study import tuning
    from simcse_hn.study.plan import load_plan

    sts = SHARED_DATA / "sts"
    rows = {
        name: [json.loads(line) for line in (sts / name).read_text().splitlines()]
        for name in ("stsb.jsonl", "sickr.jsonl")
    }
    tests = {
        frozenset(" ".join(s.lower().split()) for s in (r["sentence1"], r["sentence2"]))
        for path in sts.glob("*.jsonl")
        for r in map(json.loads, path.read_text().splitlines())
        if r["split"] == "test"
    }
    disjoint = [
        r
        for r in rows["stsb.jsonl"]
        if r["split"] == "dev"
        and frozenset(" ".join(s.lower().split()) for s in (r["sentence1"], r["sentence2"])) not in tests
    ]
    found = {}
    for name, dev in (
        ("stsb", [r for r in rows["stsb.jsonl"] if r["split"] == "dev"]),
        ("sickr", [r for r in rows["sickr.jsonl"] if r["split"] == "dev"]),
        ("disjoint", disjoint),
    ):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
        plan = yaml.safe_dump(
            {
                "name": name,
                "base": {"model_name_or_path": "builtin:tiny-bert"},
                "arms": {"a": {}, "b": {"temperature": 0.1}},
                "baseline": "a",
                "seeds": [1, 2],
                "evaluation": {"data_dir": str(sts)},
                "smallest_effect": 0.5,
                "pilot": {"dev": {"file": f"{name}.jsonl"}},
            }
        )
        (tmp_path / f"{name}.yaml").write_text(plan)
        found[name] = tuning.overlap(load_plan(str(tmp_path / f"{name}.yaml"), check_arms=False))
    text = prose()
    assert found["stsb"]["of"] == 1500 and found["sickr"]["of"] == 500 and found["disjoint"]["of"] == 369
    assert (
        f"of STS-B dev's 1,500 pairs, {found['stsb']['pairs']:,} are test pairs and "
        f"{found['stsb']['with_sentence']:,} have a test sentence; of SICK-R dev's 500, {found['sickr']['pairs']} "
        f"and {found['sickr']['with_sentence']}."
    ) in text
    assert (
        f'369 "disjoint" STS-B dev pairs (bench/results/temperature/plan.md, counted there with case and '
        f"spacing aside only) hold {found['disjoint']['pairs']} test pairs up to punctuation, and "
        f"{found['disjoint']['with_sentence']} pairs with a test sentence."
    ) in text


def test_the_docs_evaluation_line_is_a_pair_the_suite_reads_and_its_tie_example_is_exact(tmp_path):
    from simcse_hn.data.sts import load_sts_task
    from simcse_hn.evaluation.stats import sign_flip_test

    (tmp_path / "stsb.jsonl").write_text(block("json"))
    task = load_sts_task("STS-B", str(tmp_path))
    assert task.pairs == 1 and task.subsets["test"].scores == [5.0]
    text = prose()
    a, b = re.search(r"STS averages of ([\d., ]+) against ([\d., ]+) give p = 14/16 = 0\.875", text).groups()
    values = [[float(x) for x in part.replace(", ", " ").split()] for part in (a, b)]
    assert sign_flip_test(*values)["p"] == 14 / 16
