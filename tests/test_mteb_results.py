"""MTEB result files (issue 38): eval/sts.py writes one per task in MTEB's layout and schema, with or without mteb;
they load with mteb's own loaders and hold MTEB's numbers (recomputed here independently, and by MTEB's evaluator
in eval/mteb_check.py); eval/compare.py reads such folders beside our reports and never pools runs scored apart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from test_reports_compare import write_run
from test_sts_cli import absolute_paths, load_script, write_data

from simcse_hn.data.sts import STS_TASKS, load_sts_task
from simcse_hn.evaluation import mteb_results
from simcse_hn.evaluation.encoding import load_encoder
from simcse_hn.modeling.model import SimCSEModel
from simcse_hn.testing.models import build_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")
needs_mteb = pytest.mark.skipif(not mteb_results.mteb_installed(), reason="mteb is not installed (the [mteb] extra)")
TASK_FILES = {f"{task.name}.json" for task in mteb_results.MTEB_TASKS.values()}
TRAINING = {"loss": "infonce", "contrast_form": "symmetric", "loss_kwargs": {"temperature": 0.05}}


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """A tiny SimCSE folder trained 'with infonce, seed 42' (its simcse_config), the suite's data, and the report of
    eval/sts.py on it (SICK-R on the test split), written with mteb when it is installed."""
    root = tmp_path_factory.mktemp("mteb")
    model = root / "tiny-infonce"
    encoder, tokenizer = build_tiny_bert(seed=4, dropout=0.0)
    SimCSEModel(encoder, pooler="avg").save_pretrained(str(model), tokenizer, extra_config={
        **TRAINING, "seed": 42, "run_id": "run-a"})  # fmt: skip
    data = write_data(root / "sts")
    report = root / "report"
    argv = ["--model", str(model), "--data_dir", str(data), "--output", str(report), "--no_progress_bar",
            "--device", "cpu", "--batch_size", "7"]  # fmt: skip
    assert load_script("sts").main(argv) == 0
    return {"root": root, "model": model, "data": data, "report": report, "argv": argv}


def revision_folder(report: Path) -> Path:
    return report / "mteb" / "results" / "local__tiny-infonce" / mteb_results.NO_REVISION


def reference_scores(model: Path, data: Path) -> dict[str, dict[str, float]]:
    """MTEB's STS scores recomputed without our code: each task's test pairs (SICK-R all of them) pooled, each
    distinct sentence encoded once (SICK-R's dev pairs here repeat test pairs with other scores: a sentence encoded
    twice in other batches would break the tie their equal cosines make), then scipy on the cosine, the negative
    Manhattan and Euclidean distances."""
    encode, _ = load_encoder(str(model), device="cpu", batch_size=3)
    out = {}
    for name in STS_TASKS:
        task = load_sts_task(name, str(data), sickr_all=True)
        s1 = [s for p in task.subsets.values() for s in p.sentence1]
        s2 = [s for p in task.subsets.values() for s in p.sentence2]
        gold = [g for p in task.subsets.values() for g in p.scores]
        distinct = sorted(set(s1) | set(s2))
        rows = dict(zip(distinct, encode(distinct).double().numpy()))
        a, b = (np.stack([rows[s] for s in side]) for side in (s1, s2))
        values = {"cosine": np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1),
                  "manhattan": -np.sum(np.abs(a - b), axis=1), "euclidean": -np.sqrt(np.sum((a - b) ** 2, axis=1))}
        scores = {}
        for kind, v in values.items():
            scores[f"{kind}_pearson"], scores[f"{kind}_spearman"] = pearsonr(gold, v)[0], spearmanr(gold, v)[0]
        scores["pearson"], scores["spearman"] = scores["cosine_pearson"], scores["cosine_spearman"]
        out[name] = scores | {"pairs": len(gold)}
    return out


def test_sts_writes_one_mteb_file_per_task_in_mteb_layout_with_mtebs_numbers(suite):
    folder = revision_folder(suite["report"])
    assert {p.name for p in folder.iterdir()} == TASK_FILES | {"model_meta.json"}
    meta = json.loads((folder / "model_meta.json").read_text())
    assert meta["name"] == "local/tiny-infonce" and meta["revision"] == "no_revision_available"
    assert (meta["embed_dim"], meta["similarity_fn_name"], meta["adapted_from"]) == (32, "cosine", None)
    reference = reference_scores(suite["model"], suite["data"])
    results = json.loads((suite["report"] / "results.json").read_text())
    record = results["settings"]["mteb_results"]
    assert record["folder"] == "mteb/results/local__tiny-infonce/no_revision_available"  # relative to the report
    assert absolute_paths(results) == [] and absolute_paths(meta) == []
    for name, task in mteb_results.MTEB_TASKS.items():
        saved = json.loads((folder / f"{task.name}.json").read_text())
        assert (saved["task_name"], saved["dataset_revision"]) == (task.name, task.revision)
        assert set(saved) == {"dataset_revision", "task_name", "mteb_version", "scores", "evaluation_time",
                              "kg_co2_emissions", "date", "evaluation_phases"}  # fmt: skip
        assert saved["evaluation_time"] > 0 and list(saved["scores"]) == ["test"]
        (entry,) = saved["scores"]["test"]
        assert (entry["hf_subset"], entry["languages"]) == ("default", ["eng-Latn"])
        assert entry["main_score"] == entry["cosine_spearman"]
        for key in mteb_results.SCORE_KEYS:  # files round to 6 decimals, as MTEB's do; batches of 3 and of 7 differ
            assert entry[key] == pytest.approx(record["tasks"][name][key], abs=5.1e-7), (name, key)  # in float32
            assert record["tasks"][name][key] == pytest.approx(reference[name][key], abs=1e-6), (name, key)
        assert record["tasks"][name]["pairs"] == reference[name]["pairs"]
    # the report keeps SimCSE's protocol and MTEB's cosine: one number wherever the pairs are the same (STS12-16
    # pooled, STS-B), not for SICK-R (4,927 test pairs against all 9,927)
    for name in STS_TASKS[:-1]:
        mteb_file = 100 * record["tasks"][name]["cosine_spearman"]
        assert results["tasks"][name]["spearman"] == pytest.approx(mteb_file, abs=1e-9), name
        assert results["tasks"][name]["spearman"] == pytest.approx(100 * reference[name]["cosine_spearman"])
    assert results["tasks"]["SICK-R"]["pairs"] == 8 and record["tasks"]["SICK-R"]["pairs"] == 11
    text = (suite["report"] / "results.md").read_text()
    assert "## MTEB result files" in text and "the same number wherever the pairs are the same" in text


def test_report_and_mteb_file_are_one_number_where_float32_ties_near_copies():
    """Issue 65's STS12: 72.3647 in a report, 72.3676 in its MTEB file. The report took float64 cosines (equal within
    1e-12 counted as ties), the MTEB file takes MTEB's (scikit-learn's paired cosine on float32), where cosines
    within float32's resolution of each other are one value: near-copies (cosine 1 - 1e-9 here) tie with exact copies
    in one and rank below them in the other. The report now takes MTEB's cosine: from the same embeddings its number
    equals the MTEB file's and scikit-learn's, what MTEB's evaluator calls."""
    from sklearn.metrics.pairwise import paired_cosine_distances

    from simcse_hn.data.sts import STSPairs, STSTask
    from simcse_hn.evaluation.scoring import score_encoded_tasks, tie_equal

    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 16)).astype(np.float32)
    near = (base * (1 + rng.normal(scale=3e-5, size=base.shape))).astype(np.float32)  # (40, 16) near-copies
    embeddings = torch.from_numpy(np.concatenate([base, near, rng.normal(size=(40, 16)).astype(np.float32)]))
    index = {f"s{i}": i for i in range(120)}
    first = [f"s{i}" for i in range(40)] * 3  # each sentence with itself, its near-copy and an unrelated one
    second = [f"s{i}" for i in range(120)]
    gold = [float(g) for g in rng.uniform(0, 5, size=120)]
    task = STSTask("STS12", "test", {"all": STSPairs(first, second, gold)}, multi_file=True)
    scores, _ = score_encoded_tasks(embeddings, index, [task])
    mteb = mteb_results.score_tasks(embeddings, index, [task], "cosine", 1.0)["STS12"][0]
    assert scores["tasks"]["STS12"]["spearman"] == pytest.approx(100 * mteb["cosine_spearman"], abs=1e-9)
    rows = embeddings.numpy()
    a, b = rows[[index[s] for s in first]], rows[[index[s] for s in second]]
    sklearn = 100 * spearmanr(1 - paired_cosine_distances(a, b), gold).statistic
    assert scores["tasks"]["STS12"]["spearman"] == pytest.approx(sklearn, abs=1e-9)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    float64 = np.sum(a64 * b64, axis=1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)
    assert abs(100 * spearmanr(tie_equal(float64), gold).statistic - sklearn) > 0.1  # the earlier report's number


def test_without_mteb_the_files_have_the_same_schema_and_numbers(suite, tmp_path, monkeypatch):
    with_mteb = revision_folder(suite["report"])
    monkeypatch.setitem(sys.modules, "mteb", None)  # as if the extra were not installed
    assert not mteb_results.mteb_installed()
    report = tmp_path / "report"
    argv = [*suite["argv"][:5], str(report), *suite["argv"][6:]]
    assert load_script("sts").main(argv) == 0
    folder = revision_folder(report)
    assert {p.name for p in folder.iterdir()} == TASK_FILES | {"model_meta.json"}
    written_by = json.loads((report / "results.json").read_text())["settings"]["mteb_results"]["written_by"]
    assert written_by == "simcse-hn, in mteb 2.x's schema"
    mine = json.loads((folder / "model_meta.json").read_text())
    theirs = json.loads((with_mteb / "model_meta.json").read_text())
    assert list(mine) == list(theirs) == list(mteb_results.MODEL_META_DEFAULTS)
    for name in TASK_FILES:
        mine, theirs = (json.loads((f / name).read_text()) for f in (folder, with_mteb))
        assert list(mine) == list(theirs) and mine["mteb_version"] is None
        (a,), (b,) = mine["scores"]["test"], theirs["scores"]["test"]
        if theirs["mteb_version"]:  # mteb copies its version into each subset's scores
            b = {k: v for k, v in b.items() if k != "mteb_version"}
        assert list(a) == list(b)
        assert {k: a[k] for k in mteb_results.SCORE_KEYS} == {k: b[k] for k in mteb_results.SCORE_KEYS}


@needs_mteb
def test_mteb_loads_our_files_and_reads_our_scores(suite, tmp_path, monkeypatch):
    from mteb import ResultCache
    from mteb.models import ModelMeta
    from mteb.results import TaskResult

    folder = revision_folder(suite["report"])
    record = json.loads((suite["report"] / "results.json").read_text())["settings"]["mteb_results"]
    for name, task in mteb_results.MTEB_TASKS.items():
        result = TaskResult.from_disk(folder / f"{task.name}.json", load_historic_data=False)
        assert result.task_name == task.name and result.get_score() == pytest.approx(
            record["tasks"][name]["cosine_spearman"], abs=5.1e-7)  # fmt: skip
    meta = ModelMeta.model_validate(json.loads((folder / "model_meta.json").read_text()))
    assert (meta.name, meta.revision, meta.embed_dim) == ("local/tiny-infonce", "no_revision_available", 32)
    cache = ResultCache(str(suite["report"] / "mteb"))
    names = [task.name for task in mteb_results.MTEB_TASKS.values()]
    loaded = cache.load_results(models=["local/tiny-infonce"], tasks=names, include_remote=False,
                                validate_and_filter=True)  # fmt: skip
    (model,) = loaded.model_results
    scores = {mteb_results.OUR_NAME[r.task_name]: r.get_score() for r in model.task_results}
    assert scores == pytest.approx({t: s["cosine_spearman"] for t, s in record["tasks"].items()}, abs=5.1e-7)

    # the files written without mteb load the same way
    monkeypatch.setitem(sys.modules, "mteb", None)
    report = tmp_path / "report"
    assert load_script("sts").main([*suite["argv"][:5], str(report), *suite["argv"][6:]]) == 0
    monkeypatch.delitem(sys.modules, "mteb")
    for task in mteb_results.MTEB_TASKS.values():
        result = TaskResult.from_disk(revision_folder(report) / f"{task.name}.json", load_historic_data=False)
        assert result.task_name == task.name and result.dataset_revision == task.revision


@needs_mteb
def test_the_static_task_table_is_mtebs_own_metadata():
    import mteb

    for task in mteb_results.MTEB_TASKS.values():
        metadata = mteb.get_task(task.name).metadata
        assert (metadata.dataset["path"], metadata.dataset["revision"]) == (task.dataset, task.revision)
        assert metadata.eval_splits == [mteb_results.SPLIT] and metadata.main_score == mteb_results.MAIN_SCORE
        assert metadata.hf_subsets_to_langscripts == {mteb_results.HF_SUBSET: mteb_results.LANGUAGES}


@needs_mteb
@pytest.mark.slow
def test_mteb_check_agrees_with_mtebs_evaluator(suite, capsys):
    """MTEB's own evaluator (its STS tasks pointed at the local files, its sentence-transformers wrapper) on the
    tiny model agrees with the report's numbers to 1e-6 on every score of every task. MTEB encodes one sentence at a
    time here: the fixture's SICK-R repeats pairs, whose cosines are ties in exact arithmetic (and in ours, which
    encodes each text once); at MTEB's batch of 5 padding noise (~1e-7) split them and moved SICK-R's Spearman by
    3.9e-2 on its 11 pairs."""
    check = load_script("mteb_check")
    argv = ["--report", str(suite["report"]), "--model", str(suite["model"]), "--data_dir", str(suite["data"]),
            "--batch_size", "1"]  # fmt: skip
    assert check.main(argv) == 0, capsys.readouterr().out
    out = json.loads((suite["report"] / "mteb_check.json").read_text())
    assert set(out["tasks"]) == set(STS_TASKS) and out["max_difference"] <= 1e-6
    assert absolute_paths(out) == []
    assert "agrees, largest difference" in capsys.readouterr().out


def test_compare_puts_an_mteb_folder_beside_our_reports(suite, tmp_path):
    """A published model's MTEB folder (as mteb writes one: another org, a revision) beside two seeds of ours: it is
    a run of its own under MTEB's protocol, never pooled with ours nor tested against them, and a --group that puts
    it with ours is refused."""
    compare = load_script("compare")
    for seed, shift in ((42, 0.0), (43, 0.5)):
        write_run(tmp_path, f"infonce-s{seed}", "infonce", seed, shift, temperature=0.05)
    published = tmp_path / "published"
    scores = {k: 0.8 for k in mteb_results.SCORE_KEYS}
    fields = {"name": "sentence-transformers/all-MiniLM-L6-v2", "revision": "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"}
    mteb_results.write_results(str(published), mteb_results.model_meta(fields), {
        task: mteb_results.task_result(task, scores | {"cosine_spearman": 0.7 + k / 100}, 1.0, _date())
        for k, task in enumerate(("STS12", "STS-B"))})  # fmt: skip
    out = tmp_path / "cmp"
    runs = [str(tmp_path / "infonce-s42"), str(tmp_path / "infonce-s43"), str(published)]
    assert compare.main([*runs, "--output", str(out), "--baseline", "infonce", "--bootstrap", "0"]) == 0
    record = json.loads((out / "comparison.json").read_text())
    assert list(record["groups"]) == ["infonce", "sentence-transformers/all-MiniLM-L6-v2"]
    minilm = record["groups"]["sentence-transformers/all-MiniLM-L6-v2"]
    assert minilm["scores"]["STS12"]["mean"] == pytest.approx(70.0) and minilm["scores"]["STS-B"]["mean"] == 71.0
    assert record["groups"]["infonce"]["seeds"] == [42, 43]
    assert len(record["protocol"]) == 2 and "MTEB protocol (each task alone, SICK-R all 9,927 pairs)" in record[
        "protocol"]  # fmt: skip
    assert any(n.startswith("sentence-transformers/all-MiniLM-L6-v2: beside infonce, not tested against it "
                            "(different protocols") for n in record["notes"]), record["notes"]  # fmt: skip
    assert not any("run_id" in note for note in record["notes"])
    assert absolute_paths(record["runs"]) == []
    text = (out / "comparison.md").read_text()
    assert "| sentence-transformers/all-MiniLM-L6-v2 | 70.00 | 71.00 | 70.50 | MTEB protocol" in text

    # our own report's MTEB folder: read with the training record of the report that wrote it
    assert compare.main([str(suite["report"]), str(suite["report"] / "mteb"), "--output", str(tmp_path / "c2"),
                         "--bootstrap", "0"]) == 0  # fmt: skip
    both = json.loads((tmp_path / "c2" / "comparison.json").read_text())
    assert len(both["groups"]) == 2 and any("split into 2 groups, never pooled: different protocols" in n
                                            for n in both["notes"])  # fmt: skip

    assert compare.main([*runs, "--output", str(out), "--group", "infonce,infonce,infonce"]) == 2


def _date():
    from datetime import datetime, timezone

    return datetime(2026, 12, 1, tzinfo=timezone.utc)


def test_sickr_test_split_and_sickr_all_reports_are_never_two_seeds(suite, tmp_path, capsys):
    """Two reports of one objective, one on SICK-R's test split and one with --sickr_all: split by default with a
    note naming what differs (not run ids), refused under --group and as a baseline."""
    other = tmp_path / "model-s43"
    encoder, tokenizer = build_tiny_bert(seed=5, dropout=0.0)
    SimCSEModel(encoder, pooler="avg").save_pretrained(str(other), tokenizer, extra_config={
        **TRAINING, "seed": 43, "run_id": "run-b"})  # fmt: skip
    report = tmp_path / "report-all"
    argv = ["--model", str(other), "--data_dir", str(suite["data"]), "--output", str(report), "--sickr_all",
            "--no_progress_bar", "--device", "cpu", "--no_mteb_results"]  # fmt: skip
    assert load_script("sts").main(argv) == 0
    compare = load_script("compare")
    reports = [str(suite["report"]), str(report)]
    assert compare.main([*reports, "--output", str(tmp_path / "c"), "--bootstrap", "0"]) == 0
    record = json.loads((tmp_path / "c" / "comparison.json").read_text())
    assert sorted(record["groups"]) == ["infonce [aggregation all, SICK-R all 9,927 pairs (MTEB), SICK-R 11 pairs]",
                                        "infonce [aggregation all, SICK-R test (SimCSE), SICK-R 8 pairs]"] or len(
        record["groups"]) == 2  # fmt: skip
    assert all(len(g["runs"]) == 1 for g in record["groups"].values())
    (note,) = [n for n in record["notes"] if "split into" in n]
    assert note.startswith("infonce: split into 2 groups, never pooled: different protocols (aggregation all, "
                           "SICK-R test (SimCSE) | aggregation all, SICK-R all 9,927 pairs (MTEB)); different data")
    assert not any("run_id" in n or "run-a" in n or "run-b" in n for n in record["notes"]), record["notes"]
    capsys.readouterr()
    assert compare.main([*reports, "--output", str(tmp_path / "c"), "--group", "infonce,infonce"]) == 2
    assert capsys.readouterr().err.startswith("error: group 'infonce' mixes runs scored differently, different "
                                              "protocols (aggregation all, SICK-R test (SimCSE) | ")  # fmt: skip
    assert compare.main([*reports, "--output", str(tmp_path / "c"), "--baseline", "infonce"]) == 2
    assert capsys.readouterr().err.startswith("error: the baseline 'infonce' mixes runs scored differently")
