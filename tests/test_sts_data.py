"""simcse-hn-sts-data (issue 65): the STS folder built from the public Hub copies, served here by the Hub stand-in
(simcse_hn/testing/hub_server.py) in the shape of the real ones: MTEB's copies hold a task's pairs in one `test`
split with only sentence1, sentence2 and score (SICK-R all 9,927 pairs), sentence-transformers/stsb three splits on a
0-1 scale. The rows are those of the reference folder (../shared/data/sts) stripped of their labels, so the folder the
command builds can be compared with it line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SHARED_DATA

from simcse_hn.data.senteval import SENTEVAL, Block, find_blocks, scores_digest
from simcse_hn.data.sts import STS_FILES, STS_HUB_COPIES, STS_TASKS
from simcse_hn.testing.hub_server import HubStandIn

REFERENCE = SHARED_DATA / "sts"
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason="the reference STS folder ../shared/data/sts")


def reference_rows(task: str) -> list[dict]:
    return [json.loads(line) for line in (REFERENCE / STS_FILES[task]).read_text(encoding="utf-8").splitlines()]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def hub_copies(order: dict[str, list[int]] | None = None, change=None) -> dict[str, dict[str, bytes]]:
    """The Hub's copies made from the reference rows: MTEB's without labels, its parts in SentEval's order or in
    `order[task]` (indices of SENTEVAL[task]); `change(task, rows)` may alter a copy's rows."""
    copies = {}
    for task in STS_TASKS:
        rows = reference_rows(task)
        copy = STS_HUB_COPIES[task]
        if copy.splits is not None:  # sentence-transformers/stsb: its own splits, scores / 5
            copies[copy.dataset] = {
                f"{theirs}.jsonl": jsonl([{"sentence1": r["sentence1"], "sentence2": r["sentence2"],
                                           "score": r["score"] / 5} for r in rows if r["split"] == ours])
                for ours, theirs in copy.splits.items()}  # fmt: skip
            continue
        parts = [[r for r in rows if in_block(r, block)] for block in SENTEVAL[task]]
        ordered = [row for k in (order or {}).get(task, range(len(parts))) for row in parts[k]]
        stripped = [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "score": r["score"]} for r in ordered]
        if change is not None:
            stripped = change(task, stripped)
        copies[copy.dataset] = {"test.jsonl": jsonl(stripped)}
    return copies


def in_block(row: dict, block: Block) -> bool:
    return row["split"] == block.split and (block.subset is None or row["subset"] == block.subset)


def row_key(row: dict, subset: bool) -> tuple:
    return (row["sentence1"], row["sentence2"], row["split"]) + ((row.get("subset"),) if subset else ())


def run_command(args: list[str], hub: HubStandIn | None, hf_home: Path, offline: bool = False):
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1" if offline else "0",
               HF_DATASETS_OFFLINE="1" if offline else "0", PYTHONPATH=str(ROOT))  # fmt: skip
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    command = [sys.executable, "-m", "simcse_hn.cli.sts_data", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_the_digests_are_sentevals_parts():
    """Each part's digest, count and place (the reference folder's file order) as SentEval's files hold them."""
    if not REFERENCE.is_dir():
        pytest.skip("the reference STS folder ../shared/data/sts")
    for task in STS_TASKS:
        rows = reference_rows(task)
        for block in SENTEVAL[task]:
            part = [r["score"] for r in rows if in_block(r, block)]
            assert (len(part), scores_digest(part)) == (block.pairs, block.scores_sha256), (task, block)


def test_find_blocks_takes_the_parts_in_any_order_and_nothing_else():
    blocks = (Block("test", "a", 3, scores_digest([1.0, 2.0, 3.0])), Block("test", "b", 2, scores_digest([4.0, 0.5])))
    assert find_blocks([0.5, 4.0, 3.0, 1.0, 2.0], blocks) == [blocks[1], blocks[0]]  # each part in any order too
    assert find_blocks([1.0, 2.0, 3.0, 4.0, 0.5], blocks) == list(blocks)
    assert find_blocks([1.0, 4.0, 3.0, 2.0, 0.5], blocks) is None  # the parts mixed
    assert find_blocks([1.0, 2.0, 3.0, 4.0, 0.6], blocks) is None  # another score
    assert find_blocks([1.0, 2.0, 3.0, 4.0], blocks) is None  # a pair short


@needs_reference
def test_the_command_rebuilds_the_reference_folder_from_the_hub_copies(tmp_path):
    """STS12's parts in reverse order and SICK's SemEval files as test, train, trial are still found by their
    scores; STS13 with one score changed is written without sub-file labels, and says so."""

    def change(task, rows):
        if task == "STS13":
            rows[5] = rows[5] | {"score": rows[5]["score"] + 0.01}
        return rows

    order = {"STS12": [4, 3, 2, 1, 0], "SICK-R": [2, 0, 1]}
    out = tmp_path / "sts"
    with HubStandIn() as hub:
        hub.datasets.update(hub_copies(order, change))
        result = run_command(["--output", str(out)], hub, tmp_path / "hf")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 7
    assert lines[0] == (f"STS12: test 3,108 pairs from mteb/sts12-sts -> {out}/sts12.jsonl (SentEval's splits and "
                        "sub-files, proven by the scores)")  # fmt: skip
    assert "STS13: test 1,500 pairs from mteb/sts13-sts" in lines[1] and "no sub-file labels" in lines[1]
    assert lines[5] == (f"STS-B: train 5,749, dev 1,500, test 1,379 pairs from sentence-transformers/stsb -> "
                        f"{out}/stsb.jsonl (the copy's splits)")  # fmt: skip
    assert lines[6].startswith("SICK-R: test 4,927, train 4,500, dev 500 pairs from mteb/sickr-sts")
    for task in STS_TASKS:
        built = [json.loads(line) for line in (out / STS_FILES[task]).read_text(encoding="utf-8").splitlines()]
        reference = reference_rows(task)
        subset = task not in ("STS-B", "SICK-R", "STS13")  # one file each; STS13's copy lost its sub-files
        if task == "STS13":
            assert {r.get("subset") for r in built} == {None} and {r["split"] for r in built} == {"test"}
        assert sorted(row_key(r, subset) for r in built) == sorted(row_key(r, subset) for r in reference), task
        scores = sorted((r["sentence1"], r["sentence2"], round(r["score"], 6)) for r in built)
        expected = sorted((r["sentence1"], r["sentence2"], round(r["score"], 6)) for r in reference)
        assert scores == expected or task == "STS13", task
    sources = json.loads((out / "sources.json").read_text())
    assert sources["tasks"]["STS-B"]["scale"] == "the copy's scores x 5"
    assert sources["tasks"]["STS12"]["subsets"] == {b.subset: b.pairs for b in reversed(SENTEVAL["STS12"])}

    # eval/sts.py's loader without --data_dir reads the same copies (now from the datasets cache) and labels alike
    probe = ("import json; from simcse_hn.data.sts import load_sts_task; t = [load_sts_task(n) for n in "
             "('STS12', 'SICK-R')]; print(json.dumps([[x.pairs, sorted(x.subsets), x.labelled] for x in t]))")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, env=env)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    sts12_subsets = sorted(b.subset for b in SENTEVAL["STS12"])
    assert json.loads(loaded.stdout) == [[3108, sts12_subsets, True], [4927, ["test"], True]]


@needs_reference
def test_pairs_that_are_not_sentevals_are_refused_in_one_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "sts"
    with HubStandIn() as hub:
        hub.datasets.update(hub_copies(change=lambda task, rows: rows[1:] if task == "STS15" else rows))
        result = run_command(["--output", str(out), "--tasks", "sts12,sts15"], hub, tmp_path / "hf")
    assert result.returncode == 2
    assert result.stderr == "error: mteb/sts15-sts: STS15 has 2,999 pairs; SentEval's has 3,000\n"
    assert not out.exists() or not any(out.iterdir())


def test_offline_without_a_cache_it_says_so_in_one_line(tmp_path):
    out = tmp_path / "sts"
    result = run_command(["--output", str(out), "--tasks", "stsb"], None, tmp_path / "hf", offline=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: sentence-transformers/stsb: could not reach the Hub")
    assert not out.exists() or not any(out.iterdir())


def test_a_users_file_in_the_folder_is_never_replaced(tmp_path):
    out = tmp_path / "sts"
    out.mkdir()
    (out / "stsb.jsonl").write_text("mine\n")
    result = run_command(["--output", str(out), "--tasks", "stsb"], None, tmp_path / "hf", offline=True)
    assert result.returncode == 2
    assert "stsb.jsonl is there, not written by a report of simcse-hn, and would be replaced" in result.stderr
    assert (out / "stsb.jsonl").read_text() == "mine\n"


def test_help_is_short_and_the_command_is_installed_by_that_name():
    result = subprocess.run([sys.executable, "-m", "simcse_hn.cli.sts_data", "--help"], cwd=ROOT,
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert result.returncode == 0 and result.stdout.startswith("usage: simcse-hn-sts-data")
    assert len(result.stdout.splitlines()) < 25 and "--output" in result.stdout
    scripts = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'simcse-hn-sts-data = "simcse_hn.cli.sts_data:main"' in scripts
