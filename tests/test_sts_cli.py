"""eval/sts.py and eval/compare.py as a user runs them: the files they write, and one-line errors with exit 2."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, numpy_alignment, numpy_uniformity
from huggingface_hub import ModelCard
from scipy.stats import spearmanr

from simcse_hn.data.sts import STS_TASKS, load_sts_task
from simcse_hn.evaluation.encoding import load_encoder
from simcse_hn.evaluation.results import load_predictions
from simcse_hn.evaluation.scoring import score_sts_tasks
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert

RESULT_KEYS = {"model", "pooler", "aggregation", "sickr_pairs", "date", "versions", "settings", "training", "tasks",
               "average", "alignment_uniformity"}  # fmt: skip
FILES = {
    "sts12.jsonl": ("test", ["MSRpar", "MSRvid"]),
    "sts13.jsonl": ("test", ["FNWN", "headlines"]),
    "sts14.jsonl": ("test", ["images", "OnWN"]),
    "sts15.jsonl": ("test", ["belief", "images"]),
    "sts16.jsonl": ("test", ["plagiarism", "postediting"]),
    "stsb.jsonl": ("test", ["MSRvid"]),
    "sickr.jsonl": ("test", ["SICK"]),
}


def load_script(name: str):
    return importlib.import_module(f"simcse_hn.cli.{name}")


def write_data(root, pairs_per_subset: int = 8):
    """Task files in the shared-data layout (plus a dev split in stsb/sickr that must be ignored)."""
    rng = random.Random(0)
    words = "a the man dog cat plays runs guitar ball park red big small old river tree bird near".split()
    root.mkdir(parents=True, exist_ok=True)
    for filename, (split, subsets) in FILES.items():
        rows = []
        for subset in subsets:
            for _ in range(pairs_per_subset):
                s1, s2 = (" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(2))
                rows.append({"sentence1": s1, "sentence2": s2, "score": rng.randint(0, 50) / 10, "split": split,
                             "subset": subset})  # fmt: skip
        if filename in ("stsb.jsonl", "sickr.jsonl"):
            rows += [dict(row, split="dev", score=5.0 - row["score"]) for row in rows[:3]]
        if filename == "stsb.jsonl":  # STS-B dev: suite sentences and new ones; positives (> 4), and a 4.0 (not one)
            scores = [4.6, 4.0, 5.0, 1.2, 4.2]
            rows += [{"sentence1": rows[k]["sentence1"], "sentence2": f"a new dev sentence {k}", "score": score,
                      "split": "dev", "subset": "MSRvid"} for k, score in enumerate(scores)]  # fmt: skip
        (root / filename).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A SimCSE output folder (simcse_config.json with pooler avg, tokenizer, sentence-transformers files)."""
    path = str(tmp_path_factory.mktemp("model"))
    encoder, tokenizer = build_tiny_bert(seed=4, dropout=0.0)
    SimCSEModel(encoder, pooler="avg").save_pretrained(path, tokenizer)
    return path


def absolute_paths(record) -> list[str]:
    """Every string in a JSON record that is an absolute path or holds one (a machine's path)."""
    if isinstance(record, dict):
        return [p for key, value in record.items() for p in absolute_paths(key) + absolute_paths(value)]
    if isinstance(record, list):
        return [p for value in record for p in absolute_paths(value)]
    machine = isinstance(record, str) and ("site-packages" in record or re.search(r"(^|[\s'\"(])/\w", record))
    return [record] if machine else []


def assert_portable(record, *paths) -> None:
    assert absolute_paths(record) == [], absolute_paths(record)
    text = json.dumps(record)
    assert not any(str(path) in text for path in paths)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # this checkout's simcse_hn first, also where another checkout is the editable install
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "eval" / "sts.py"), *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=cwd)  # fmt: skip


def test_save_to_model_updates_a_trained_models_card_and_reports_go_beside_the_folder(tmp_path):
    """A card written at the end of training keeps everything but its STS part; without --output the report goes
    next to the model folder, not into it."""
    from simcse_hn.export.model_card import write_model_card

    folder = tmp_path / "trained"
    encoder, tokenizer = build_tiny_bert(seed=5, dropout=0.0)
    SimCSEModel(encoder, pooler="avg").save_pretrained(str(folder), tokenizer, extra_config={"loss": "hcl"})
    write_model_card(str(folder), dev_spearman=77.25)
    assert "Not evaluated on the STS benchmarks yet" in (folder / "README.md").read_text()
    data = write_data(tmp_path / "sts")
    result = run_cli("--model", str(folder), "--data_dir", str(data), "--save_to_model", "--no_progress_bar")
    assert result.returncode == 0, result.stderr
    report = tmp_path / "trained-sts"
    assert (report / "results.json").is_file() and not (folder / "results.json").exists()
    results = json.loads((report / "results.json").read_text())
    card = ModelCard.load(str(folder / "README.md"))
    assert "77.25" in card.text and "hcl" in card.data.tags  # the training part of the card is kept
    assert "Not evaluated on the STS benchmarks yet" not in card.text
    assert f"| trained | {results['tasks']['STS12']['spearman']:.2f} |" in card.text
    manifest = json.loads((folder / "simcse_files.json").read_text())["files"]
    assert {"sts_results.json", "README.md"} <= set(manifest)  # a push uploads them


def test_cli_writes_results_json_markdown_plot_and_model_copy(tmp_path, model_dir):
    data = write_data(tmp_path / "sts")
    out = tmp_path / "out"
    cwd = tmp_path / "cwd" / "deeper"  # neither holding the model nor beside it (as a checkout under /tmp would be)
    cwd.mkdir(parents=True)
    result = run_cli("--model", model_dir, "--data_dir", str(data), "--output", str(out), "--aggregation", "wmean",
                     "--batch_size", "5", "--save_to_model", "--no_progress_bar", "--device", "cpu",
                     cwd=cwd)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "protocol: aggregation wmean, SICK-R test (SimCSE)\n" in result.stdout

    results = json.loads((out / "results.json").read_text())
    assert set(results) == RESULT_KEYS
    # named without this machine's paths (issue 39: records carried absolute paths): the folder's name, outside the
    # working directory; the data likewise
    assert results["model"] == os.path.basename(model_dir) and results["pooler"] == "avg"  # pooler: simcse_config
    assert_portable(results, tmp_path, model_dir)
    assert results["aggregation"] == "wmean" and results["sickr_pairs"] == "test"
    assert list(results["tasks"]) == list(STS_TASKS)
    assert results["tasks"]["STS12"]["pairs"] == 16
    assert set(results["tasks"]["STS12"]["subsets"]) == {"MSRpar", "MSRvid"}
    assert results["tasks"]["STS-B"]["pairs"] == 8 and list(results["tasks"]["SICK-R"]["subsets"]) == ["test"]
    for task in results["tasks"].values():
        assert set(task) == {"spearman", "pairs", "subsets"}
        assert all(set(s) == {"spearman", "pairs"} for s in task["subsets"].values())
    assert {"torch", "transformers", "sentence-transformers", "scipy"} <= set(results["versions"])
    assert results["settings"]["batch_size"] == 5 and results["settings"]["encoder"] == "simcse"
    with open(os.path.join(model_dir, "sts_results.json"), encoding="utf-8") as f:
        assert json.load(f) == results
    assert results["settings"]["max_seq_length"] == 128  # the tiny encoder's own length, recorded
    card = ModelCard.load(os.path.join(model_dir, "README.md"))  # --save_to_model: the card on disk is complete
    assert {r.dataset_name: r.metric_value for r in card.data.eval_results} == {
        name: round(task["spearman"], 2) for name, task in results["tasks"].items()
    }
    assert "Not evaluated on the STS benchmarks yet" not in card.text

    # the same numbers in-process, through the library
    tasks = [load_sts_task(name, str(data)) for name in STS_TASKS]
    encode, _ = load_encoder(model_dir, device="cpu", batch_size=3)
    expected = score_sts_tasks(encode, tasks, "wmean")
    for name, task in expected["tasks"].items():
        assert results["tasks"][name]["spearman"] == pytest.approx(task["spearman"], abs=1e-6)
    assert results["average"] == pytest.approx(expected["average"], abs=1e-6)

    # the model folder's training config travels with the results
    with open(os.path.join(model_dir, "simcse_config.json"), encoding="utf-8") as f:
        assert results["training"] == json.load(f)

    # alignment and uniformity on STS-B dev (its `dev` rows), against NumPy on embeddings encoded on their own
    dev = [row for row in map(json.loads, (data / "stsb.jsonl").read_text().splitlines()) if row["split"] == "dev"]
    sentences = list(dict.fromkeys([r["sentence1"] for r in dev] + [r["sentence2"] for r in dev]))
    vectors = dict(zip(sentences, encode(sentences).double().numpy()))
    positives = [r for r in dev if r["score"] > 4]
    geometry = results["alignment_uniformity"]
    assert geometry["positive_pairs"] == len(positives) >= 3 and geometry["sentences"] == len(sentences)
    x = np.stack([vectors[r["sentence1"]] for r in positives])
    y = np.stack([vectors[r["sentence2"]] for r in positives])
    assert geometry["alignment"] == pytest.approx(numpy_alignment(x, y), rel=1e-6)
    assert geometry["uniformity"] == pytest.approx(numpy_uniformity(np.stack(list(vectors.values()))), rel=1e-6)
    assert geometry["source"].endswith("stsb.jsonl (split dev)") and "gold score > 4" in geometry["protocol"]

    # every pair's cosine and gold score, in sub-file order: they give the reported correlations again
    predictions = load_predictions(str(out / "predictions.npz"))
    assert results["settings"]["predictions"] == "predictions.npz" and predictions.keys() == results["tasks"].keys()
    for name, task in results["tasks"].items():
        cosine, gold, subset = (predictions[name][k] for k in ("cosine", "gold", "subset"))
        assert len(cosine) == task["pairs"] and list(dict.fromkeys(subset)) == list(task["subsets"])
        for sub, scored in task["subsets"].items():
            rho = spearmanr(cosine[subset == sub], gold[subset == sub]).statistic * 100
            assert rho == pytest.approx(scored["spearman"], abs=1e-9)

    markdown = (out / "results.md").read_text()
    assert "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |" in markdown
    assert f"| {geometry['alignment']:.4f} | {geometry['uniformity']:.4f} |" in markdown
    assert "Protocol: alignment (alpha 2) and uniformity (t 2)" in markdown
    assert f"alignment {geometry['alignment']:.4f}, uniformity {geometry['uniformity']:.4f}" in result.stdout
    row = " | ".join(f"{results['tasks'][n]['spearman']:.2f}" for n in STS_TASKS) + f" | {results['average']:.2f} |"
    assert row in markdown and row in result.stdout
    assert "wmean (SentEval" in markdown and "| MSRpar | 8 |" in markdown
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BAD_INPUTS = [
    ("missing", "sts14.jsonl: file not found (STS14 expects sts14.jsonl in the data folder; `simcse-hn-sts-data "
                "--output DIR` builds the folder from the Hub)"),
    ('{"sentence1": "a", "sentence2": "b", "score": ', "sts14.jsonl:3: malformed JSON (Expecting value)"),
    ('{"sentence1": "a", "sentence2": "b", "score": "n/a"}', "sts14.jsonl:3: field 'score' is not a number: 'n/a'"),
    ('{"sentence2": "b", "score": 1.0}', "sts14.jsonl:3: missing field 'sentence1'"),
]


def damaged_data(root, damage: str):
    data = write_data(root, pairs_per_subset=3)
    path = data / "sts14.jsonl"
    if damage == "missing":
        path.unlink()
    else:
        lines = path.read_text().splitlines()
        lines[2] = damage
        path.write_text("\n".join(lines) + "\n")
    return data


@pytest.mark.parametrize("damage, message", BAD_INPUTS)
def test_cli_bad_task_file_prints_one_error_line_and_exits_2(tmp_path, capsys, damage, message):
    data = damaged_data(tmp_path / "sts", damage)
    argv = ["--model", "builtin:tiny-bert", "--data_dir", str(data), "--output", str(tmp_path / "out")]
    assert load_script("sts").main(argv) == 2
    assert capsys.readouterr().err == f"error: {data}/{message}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, message", BAD_INPUTS[1:3])
def test_cli_bad_task_file_in_a_subprocess(tmp_path, damage, message):
    data = damaged_data(tmp_path / "sts", damage)
    result = run_cli("--model", "builtin:tiny-bert", "--data_dir", str(data), "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"error: {data}/{message}"
    assert "Traceback" not in result.stderr


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    sts = load_script("sts")
    data = write_data(tmp_path / "sts", pairs_per_subset=3)
    common = ["--data_dir", str(data), "--output", str(tmp_path / "out")]
    cases = [
        (["--model", "user/model", "--save_to_model"], "--save_to_model needs a local model folder"),
        (["--model", str(tmp_path), "--push_to_hub"], "--push_to_hub needs --hub_model_id"),
        (["--model", "builtin:tiny-bert", "--tasks", "sts12,sts99"], "--tasks: unknown STS task 'sts99'"),
        (["--model", str(tmp_path / "nowhere"), "--tasks", "sts12"], "--model: no such model folder: "),
        (["--model", "user/nowhere", "--tasks", "sts12"], "could not load model"),
        (["--model", "builtin:tiny-bert", "--pooler", "max"], "--pooler: no pooler 'max'; choose from cls, "),
        (["--model", "builtin:tiny-bert", "--batch_size", "0"], "--batch_size must be >= 1"),
        (["--model", "builtin:tiny-bert", "--max_seq_length", "0"], "--max_seq_length must be >= 2, got 0"),
        (["--model", "builtin:tiny-bert", "--max_seq_length", "129"], "--max_seq_length: 129 is above the 128 "),
        (["--model", "builtin:tiny-brt"], "--model: builtin:tiny-brt is not a builtin model (did you mean "),
        (["--model", "builtin:tiny-bert", "--baseline", "builtin:tiny-brt:avg"], "--baseline builtin:tiny-brt:avg: "),
    ]
    if not torch.cuda.is_available():
        cases.append((["--model", "builtin:tiny-bert", "--device", "cuda"], "--device cuda: no CUDA device"))
    for argv, message in cases:
        assert sts.main(argv + common) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err


def test_cli_sickr_all_and_push_to_hub(tmp_path, monkeypatch, capsys):
    import simcse_hn.export.hub

    pushed = []

    def push_sts_results(repo_id: str, results: dict, token: str | None = None) -> None:
        pushed.append((repo_id, results, token))

    monkeypatch.setattr(simcse_hn.export.hub, "push_sts_results", push_sts_results, raising=False)
    sts = load_script("sts")
    data = write_data(tmp_path / "sts", pairs_per_subset=4)
    out = tmp_path / "out"
    argv = ["--model", "builtin:tiny-bert", "--pooler", "cls", "--data_dir", str(data), "--output", str(out),
            "--tasks", "stsb,sickr", "--sickr_all", "--push_to_hub", "--hub_model_id", "me/tiny"]  # fmt: skip
    capsys.readouterr()
    assert sts.main(argv) == 0
    assert "protocol: aggregation all, SICK-R all 9,927 pairs (MTEB)\n" in capsys.readouterr().out  # printed too
    results = json.loads((out / "results.json").read_text())
    assert results["sickr_pairs"] == "all" and list(results["tasks"]) == ["STS-B", "SICK-R"]
    assert results["tasks"]["SICK-R"]["pairs"] == 7 and set(results["tasks"]["SICK-R"]["subsets"]) == {"test", "dev"}
    assert results["pooler"] == "cls"
    assert "all 9,927 pairs (MTEB's protocol" in (out / "results.md").read_text()
    assert pushed == [("me/tiny", results, None)]

    def refuse(repo_id, results, token=None):
        raise simcse_hn.export.hub.HubError(f"push STS results to {repo_id}: 401 Unauthorized")

    monkeypatch.setattr(simcse_hn.export.hub, "push_sts_results", refuse)
    capsys.readouterr()
    assert sts.main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: push STS results to me/tiny: 401 Unauthorized"
    assert json.loads((out / "results.json").read_text())["tasks"].keys() == results["tasks"].keys()


def test_compare_puts_runs_side_by_side(tmp_path, capsys):
    compare = load_script("compare")

    def fake(model, spearman, aggregation="all", tasks=STS_TASKS):
        scored = {t: {"spearman": spearman + k, "pairs": 10, "subsets": {}} for k, t in enumerate(tasks)}
        average = sum(s["spearman"] for s in scored.values()) / len(scored)
        return {"model": model, "pooler": "cls", "aggregation": aggregation, "sickr_pairs": "test", "date": "d",
                "versions": {}, "settings": {}, "tasks": scored, "average": average}  # fmt: skip

    for folder in ("infonce", "hcl", "other"):
        (tmp_path / folder / "sts").mkdir(parents=True)
    (tmp_path / "infonce" / "sts" / "results.json").write_text(json.dumps(fake("/runs/unsup-infonce", 70.0)))
    (tmp_path / "hcl" / "sts" / "sts_results.json").write_text(json.dumps(fake("outputs/unsup-hcl", 71.234)))
    (tmp_path / "other" / "sts" / "results.json").write_text(json.dumps(fake("/runs/unsup-infonce", 60.0, "mean",
                                                                              STS_TASKS[:2])))  # fmt: skip
    out = tmp_path / "cmp"
    assert compare.main([str(tmp_path / "infonce" / "sts"), str(tmp_path / "hcl" / "sts"),
                         str(tmp_path / "other" / "sts" / "results.json"), "--output", str(out)]) == 0  # fmt: skip
    table = (out / "comparison.md").read_text()
    assert "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. | Protocol |" in table
    # labels from the model's name, not the report folder ("sts"); the same model twice: its report's folder added
    row = "| infonce/unsup-infonce | 70.00 | 71.00 | 72.00 | 73.00 | 74.00 | 75.00 | 76.00 | 73.00 | aggregation all,"
    assert row in table
    assert "| outputs/unsup-hcl | 71.23 | 72.23 |" in table  # a relative path that is not here: kept as written
    assert "| other/unsup-infonce | 60.00 | 61.00 | – | – | – | – | – | 60.50 | aggregation mean," in table
    assert "Groups over seeds" not in table and "no statistics over seeds" in table  # nothing recorded to group by
    assert (out / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert compare.main([str(tmp_path / "missing"), "--output", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith("missing: file not found")
