"""The quick start in any clone (issue 65): a copy of the repository's tracked files with nothing beside it (no
../shared), step 2's config as written, on the tiny model built in code for speed. Offline with an empty cache it
trains, saves the model alone (no checkpoint) and ends with one line on how to get the STS data; online (the Hub
stand-in serving sentence-transformers/stsb) it scores STS-B dev from the Hub through `datasets`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from simcse_hn.testing.hub_server import HubStandIn

FAST = ["--model_name_or_path", "builtin:tiny-bert", "--max_steps", "3", "--eval_steps", "3",
        "--per_device_train_batch_size", "16", "--max_train_samples", "64", "--learning_rate", "1e-3"]  # fmt: skip


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The tracked files (bench/results/ left out: records only) in a folder with no sibling `shared`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    folder = tmp_path_factory.mktemp("any-clone") / "simcse-hn"
    for name in listed.stdout.decode().split("\0"):
        if name and not name.startswith("bench/results/") and (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    assert not (folder.parent / "shared").exists()
    return folder


def step_two(clone: Path, tmp_path: Path, env: dict, name: str, *extra: str) -> subprocess.CompletedProcess:
    out = tmp_path / name
    command = [sys.executable, "train.py", "--config", "configs/quickstart_minilm.yaml", *FAST, "--output_dir",
               str(out), "--disable_tqdm", "true", *extra]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(clone), HF_HOME=str(tmp_path / "hf-home"), OMP_NUM_THREADS="1", **env)
    return subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=600, env=env)


def test_offline_with_nothing_cached_step_two_trains_and_ends_with_one_line(clone, tmp_path):
    result = step_two(clone, tmp_path, {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, "offline")
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "offline"
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    assert not list(out.glob("checkpoint-*"))  # the model alone: no optimizer state for a 60-step run
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.endswith(
        "STS-B dev was not scored: sentence-transformers/stsb is not in the datasets cache and the Hub could not be "
        "reached; run online once (the cache keeps it), or build the STS folder where the Hub can be reached "
        "(simcse-hn-sts-data --output DIR) and pass --eval_file DIR/stsb.jsonl")
    assert "Traceback" not in result.stdout + result.stderr
    assert "STS-B dev Spearman" not in (out / "README.md").read_text()  # no dev score in the card
    again = step_two(clone, tmp_path, {"HF_HUB_OFFLINE": "1"}, "offline")  # a killed run's retry: it starts again
    assert again.returncode == 0, again.stderr[-2000:]
    resume = step_two(clone, tmp_path, {"HF_HUB_OFFLINE": "1"}, "offline", "--resume_from_checkpoint", "true")
    assert resume.returncode == 2  # nothing to resume from, said in one line
    expected = (f"error: resume_from_checkpoint: {out} holds this run's finished model (3 steps) and no checkpoint: "
                "there is nothing to resume")
    assert resume.stderr.splitlines()[-1] == expected


def test_without_eval_optional_an_unreachable_dev_set_stops_the_run_in_one_line(clone, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = step_two(clone, tmp_path, env, "strict", "--eval_optional", "false")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        "error: sentence-transformers/stsb: could not reach the Hub and the datasets cache has no copy")
    assert "simcse-hn-sts-data --output DIR" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "strict" / "model.safetensors").exists()


def test_online_step_two_scores_stsb_dev_from_the_hub(clone, tmp_path):
    rows = {"validation": [("A man plays a guitar.", "A man is playing a guitar.", 0.96),
                           ("A dog runs.", "A cat sleeps.", 0.1), ("Stocks fell.", "Markets dropped.", 0.8),
                           ("It rains.", "The sun shines.", 0.05), ("A girl reads.", "A child is reading.", 0.7)]}
    with HubStandIn() as hub:
        hub.datasets["sentence-transformers/stsb"] = {
            f"{split}.jsonl": "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n"
                                      for a, b, s in pairs).encode()
            for split, pairs in rows.items()}  # fmt: skip
        env = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
        result = step_two(clone, tmp_path, env, "online")
        fetched = [path for method, path in hub.requests if "/resolve/" in path and path.endswith(".jsonl")]
    assert result.returncode == 0, result.stderr[-3000:]
    assert fetched and all("sentence-transformers/stsb" in path for path in fetched)
    assert "5 STS dev pairs" in result.stdout
    assert "STS-B dev Spearman x 100 of the saved model (cls pooler): " in result.stdout
    assert "STS-B dev was not scored" not in result.stdout
