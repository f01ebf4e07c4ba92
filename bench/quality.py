"""Do better negatives make better encoders? The quality study on the fair sweep, with its statistics.

Every arm continues training all-MiniLM-L6-v2 (the pip package's copy) with SimCSE's unsupervised recipe and the
objective of one shipped config, `configs/unsup_bert_base_<arm>.yaml` (its loss keys only: the sweep is fair by
construction, tests/test_objectives_e2e.py checks the configs), on the 21k-sentence wiki slice (shuffled, seed 0):
`cls` pooler with the MLP head in training, batch 64, lr 3e-5, max length 32, one epoch (334 steps), STS-B dev every
125 steps and the best checkpoint kept, logging every 25 (at a larger batch both every as many sentences), then the
full STS suite (eval/sts.py: results.json, predictions.npz). The untrained model is scored once, with its CLS vector
and with mean pooling (MiniLM's own), as references.

    python -m bench.quality --seeds 42,43,44                      # every arm, three seeds
    python -m bench.quality --arms infonce,hcl --seeds 45,46      # more seeds where they are needed
    python -m bench.quality --arms infonce,hcl --batch_size 512 --cache_minibatch_size 64 --seeds 42   # GradCache
    python -m bench.quality --arms infonce,progcl_mix --batch_size 512 --cache_minibatch_size 64 --learning_rate 8.5e-5
                                                                  # ... at sqrt(8) x the lr: runs <arm>-lr8.5e-05
    python -m bench.quality --sweep                               # the one-seed sensitivity sweep
    python -m bench.quality --report                              # rebuild the report from what is there
    python -m bench.quality --resume --jobs 2                     # what the study still lacks, started runs first
    python -m bench.quality --resume --start_within 40            # start no run after 40 minutes: end at a boundary
    python -m bench.quality --resume --dry_run                    # list those runs and stop
    python -m bench.quality --seeds 43,44 --jobs 2                # two runs at once, one torch thread each

`--jobs N` runs N trainings at once with cores / N torch threads each. On the 2-core machine a MiniLM step gains only
~1.3x from its second thread, so two one-thread runs side by side finish more runs per hour than one two-thread run
after the other; each run records its thread count, the jobs beside it and its load (the report's times are wall
seconds under that sharing). The numbers of a run depend on its thread count only through float rounding.

Runs accumulate: each finished run (its folder under --work_dir, an entry in bench/results/quality/runs.json with
its time and machine load, and what the report needs of it under bench/results/quality/runs/<run>/: results.json,
predictions.npz and its training curves as curves.json) is kept and never recomputed, so the study can be spread over
sittings and machines (--work_dir does not travel; the results folder is committed); an interrupted run restarts from
its newest complete checkpoint. `--resume` adds to the runs asked for (none unless --seeds or --sweep
ask) first every run started under --work_dir that runs.json lacks, with its own arm, flags, seed and batch (each
run leaves <key>.args.json beside its folder when it starts), then every batch-64 run the study's seed rule still
needs: seeds 42-44 of every arm, seeds 45-46 of the baseline and of every arm whose mean over 42-44 beats the
baseline's, and the sweep. So the same `--resume` line, repeated each sitting, finishes the study. A run another
sitting is training (its <key>.lock held) is skipped, never trained twice into one folder. The report
(bench/results/quality/) goes through eval/compare.py: per-task and average means with 95 % t-intervals over seeds,
paired tests against symmetric InfoNCE, alignment and uniformity, plus a table of each arm's training diagnostics
(the last logging window, mean over seeds), the sweep against its arms' seed 42, SICK-R's test pairs by entailment
label (`sick_by_label`), and the training curves (the first seed of each arm, the sweep, other batches). Runs of
another batch or learning rate are compared apart (compare_b<batch>[-lr<rate>]/, against the baseline at the same
settings). A comparison some of whose runs have no results on disk (runs of an earlier machine, before they were kept)
stays as last written. `--report` writes every other page from runs.json and what is kept beside it alone
(bench/test_quality_pages.py regenerates each committed one byte for byte); a run's last window, the means over
seeds and what made a run are read as `simcse-hn-study` reads them (simcse_hn.study.runs, simcse_hn.study.report).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.common import RESULTS, ROOT, SHARED_DATA, environment, shuffled_corpus, write_json
from bench.quality_checks import mixed_provenance, run_provenance, sweep_no_op
from simcse_hn.cli import compare as compare_command
from simcse_hn.cli import curves as curves_command
from simcse_hn.errors import DataError
from simcse_hn.evaluation.comparability import scored_alike
from simcse_hn.files import portable_name
from simcse_hn.losses.registry import flag_prefix, resolve_objective
from simcse_hn.study.report import mean_windows
from simcse_hn.study.runs import held, last_values, resume_flags

BASELINE = "infonce"
OUT = RESULTS / "quality"
RECIPE = ["--model_name_or_path", "builtin:all-MiniLM-L6-v2", "--pooler", "cls", "--mlp_only_train", "true",
          "--eval_file", str(SHARED_DATA / "sts" / "stsb.jsonl"), "--eval_split", "dev", "--max_seq_length", "32",
          "--learning_rate", "3e-5", "--num_train_epochs", "1", "--eval_steps", "125", "--save_steps", "125",
          "--save_total_limit", "1", "--logging_steps", "25", "--report_to", "tensorboard", "--disable_tqdm",
          "true",
          # one forward per batch, as every run of the study before length groups existed: grouped forwards draw
          # other (equally random) dropout masks, and the study's runs must differ in the objective only
          "--length_groups", "1"]  # fmt: skip
# The one-seed sensitivity sweep: (name, arm whose config it starts from, flags that change)
SWEEP = [
    ("hcl-beta0.05", "hcl", ["--hcl_beta", "0.05"]),
    ("hcl-beta0.2", "hcl", ["--hcl_beta", "0.2"]),
    ("hcl-beta0.45", "hcl", ["--hcl_beta", "0.45"]),  # sentence-transformers' hardness_strength 9 at scale 20
    ("progcl-warmup0.5", "progcl", ["--progcl_warmup_ratio", "0.5"]),
    ("progcl-fitall", "progcl", ["--progcl_fit_pairs", "0"]),
    ("unremix-beta0.5", "unremix", ["--unremix_beta", "0.5"]),
    ("unremix-beta2", "unremix", ["--unremix_beta", "2.0"]),
    # DCL's clamp (docs/losses.md section 3): at t = 0.05 the trained space clamps nearly every anchor (the seed-42
    # arm: clamp_frac 0.99 and no gradient by step 150), so the sweep tries a smaller prior and the paper's own
    # temperature, against InfoNCE at that temperature
    ("dcl-tau1e-6", "dcl", ["--dcl_tau_plus", "1e-6"]),
    ("dcl-t0.5-tau0.1", "dcl", ["--temperature", "0.5", "--dcl_tau_plus", "0.1"]),
    ("infonce-t0.5", "infonce", ["--temperature", "0.5"]),
]
DIAGNOSTICS = ("loss", "pos_sim", "neg_sim", "harder_than_positive", "top1pct_weight_share", "neg_weight_max",
               "clamp_frac", "est_false_neg_frac", "bmm_fallback", "nonfinite_fallback")  # fmt: skip


def arm_flags(arm: str) -> list[str]:
    """The objective keys of configs/unsup_bert_base_<arm>.yaml as flags (every other key is the recipe's)."""
    config = yaml.safe_load((ROOT / "configs" / f"unsup_bert_base_{arm}.yaml").read_text(encoding="utf-8"))
    prefix = flag_prefix(resolve_objective(config["loss"]))
    keys = ["loss", "contrast_form", "temperature", *(["loss_options"] if "loss_options" in config else [])] + [
        k for k in config if prefix is not None and k.startswith(f"{prefix}_")
    ]
    flags = []
    for key in keys:
        value = config[key]
        if isinstance(value, dict):  # loss_options: JSON on the command line
            value = json.dumps(value)
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def arms() -> list[str]:
    names = sorted(p.name[len("unsup_bert_base_"):-len(".yaml")] for p in (ROOT / "configs").glob("unsup_bert_base_*"))
    return [BASELINE] + [name for name in names if name != BASELINE]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load_index() -> dict:
    path = OUT / "runs.json"
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


@contextlib.contextmanager
def locked_index():
    """runs.json read, changed by the caller and written back under an exclusive lock, so that several sittings (or
    --jobs) adding runs at once keep each other's entries."""
    import fcntl

    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "runs.json.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            index = load_index()
            yield index
            write_json(OUT / "runs.json", index)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def save_entry(key: str, entry: dict, work_dir: str) -> None:
    with locked_index() as index:
        index["runs"][key] = entry
        index["work_dir"] = portable_name(work_dir)


def run(command: list[str], log: Path, threads: int | None = None) -> float:
    start = time.time()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op threads in the child
    with open(log, "a", encoding="utf-8") as f:
        subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=True, env=env)
    return time.time() - start


def last_window(kept: Path) -> dict:
    """The diagnostics of a run's last logging window, from the curves `keep_run` kept (no second TensorBoard read)."""
    from simcse_hn.evaluation.curves import load_record

    try:
        series = load_record(str(kept / "curves.json"))[0].series
    except Exception as e:  # a report without diagnostics beats no report
        print(f"{kept}: no training curves ({e})", flush=True)
        return {}
    return last_values(series, DIAGNOSTICS)


def keep_run(key: str, scored: Path, trained: Path | None) -> Path:
    """What the report needs of a run, kept beside runs.json (committed, unlike --work_dir): the STS report's
    results.json and predictions.npz, and the training curves as curves.json
    (simcse_hn.evaluation.curves.save_record). A new machine has no --work_dir, and a report rebuilt there must not
    lose the runs of earlier sittings."""
    import shutil

    from simcse_hn.evaluation.curves import load_curves, save_record
    from simcse_hn.evaluation.results import PREDICTIONS

    kept = OUT / "runs" / key
    kept.mkdir(parents=True, exist_ok=True)
    for name in ("results.json", PREDICTIONS):
        if (scored / name).is_file():
            shutil.copyfile(scored / name, kept / name)
    if trained is not None and trained.is_dir():
        try:
            save_record([load_curves(str(trained), name=key)], str(kept / "curves.json"))
        except Exception as e:  # the scores are kept either way
            print(f"{trained}: no training curves kept ({e})", flush=True)
    return kept


def adopt_runs(work: Path) -> None:
    """Runs recorded with their results only under a --work_dir (by an older bench/quality.py) are kept beside
    runs.json, and their entries point there; runs whose results are on no disk any more are left as recorded."""
    def outside(entry: dict) -> bool:
        results = ROOT / entry["results"]
        return not results.is_relative_to(OUT / "runs") and (results / "results.json").is_file()

    if not any(outside(entry) for entry in load_index()["runs"].values()):
        return  # nothing to adopt: runs.json untouched
    with locked_index() as index:
        for key, entry in index["runs"].items():
            if outside(entry):
                trained = work / key if entry.get("seed") is not None else None
                entry["results"] = _rel(keep_run(key, ROOT / entry["results"], trained))
                entry.setdefault("sick_by_label", sick_by_label(ROOT / entry["results"]))


def run_key(name: str, seed: int, batch: int) -> str:
    return f"{name}-b{batch}-s{seed}"


def started_runs(work: Path) -> list[tuple]:
    """The runs a sitting started under `work` that runs.json does not hold, from the <key>.args.json each run
    writes when it starts, in key order. -> [(name, flags, seed, batch, cache), ...]"""
    done = load_index()["runs"]
    pending = {}
    for path in sorted(work.glob("*.args.json")):
        args = json.loads(path.read_text(encoding="utf-8"))
        key = run_key(args["name"], args["seed"], args["batch_size"])
        if key not in done:
            fields = ("name", "flags", "seed", "batch_size", "cache_minibatch_size")
            pending[key] = tuple(args[field] for field in fields)
    # runs started before the markers existed: a batch-64 folder of a known arm or sweep entry is enough to rebuild
    # its arguments (a larger batch's GradCache setting is not recorded anywhere else, so such a run is reported)
    sweep = {name: (arm, changes) for name, arm, changes in SWEEP}
    known = set(arms()) | set(sweep)
    for folder in sorted(p for p in work.glob("*-b*-s*") if (p / "simcse_run.json").is_file()):
        name, _, rest = folder.name.rpartition("-b")
        batch, _, seed = rest.partition("-s")
        if folder.name in done or folder.name in pending or not (batch.isdigit() and seed.isdigit()):
            continue
        if name not in known or int(batch) != 64:
            print(f"{folder}: started, but its arguments are not recorded; rerun it with its own flags", flush=True)
            continue
        flags = arm_flags(sweep[name][0]) + sweep[name][1] if name in sweep else arm_flags(name)
        pending[folder.name] = (name, flags, int(seed), 64, None)
    return [pending[key] for key in sorted(pending)]


FIRST_SEEDS = (42, 43, 44)  # every arm
MORE_SEEDS = (45, 46)  # the baseline, and every arm its first three seeds put ahead of the baseline


def ahead_of_baseline(index: dict, arm: str) -> bool | None:
    """Whether `arm`'s mean STS average over the first three seeds (batch 64) beats the baseline's over the same
    seeds; None until both have all three."""
    scores = {(e["arm"], e["seed"]): e["average"] for e in index["runs"].values()
              if e.get("seed") in FIRST_SEEDS and e.get("batch_size") == 64}  # fmt: skip
    if not all((name, seed) in scores for name in (arm, BASELINE) for seed in FIRST_SEEDS):
        return None
    return statistics.mean(scores[arm, s] for s in FIRST_SEEDS) > statistics.mean(scores[BASELINE, s] for s in
                                                                                  FIRST_SEEDS)  # fmt: skip


def study_plan(index: dict) -> list[tuple]:
    """The batch-64 runs the study still lacks by its own rule, in the order they settle most: the first three seeds
    of every arm, then seeds 45-46 of the baseline and of every arm ahead of it after three, then the one-seed sweep.
    An arm whose first three seeds are not all in yet gets its later seeds from a later sitting's plan.
    -> [(name, flags, seed, batch, cache), ...]"""
    done = index["runs"]
    first = [(arm, seed) for seed in FIRST_SEEDS for arm in arms()]
    more = [(arm, seed) for seed in MORE_SEEDS for arm in arms()
            if arm == BASELINE or ahead_of_baseline(index, arm)]  # fmt: skip
    todo = [(arm, arm_flags(arm), seed, 64, None) for arm, seed in first + more
            if run_key(arm, seed, 64) not in done]  # fmt: skip
    todo += [(name, arm_flags(arm) + changes, 42, 64, None) for name, arm, changes in SWEEP
             if run_key(name, 42, 64) not in done]  # fmt: skip
    return todo


def train_and_score(name: str, flags: list[str], seed: int, batch: int, cache: int | None, work: Path,
                    corpus: Path, threads: int | None = None, jobs: int = 1,
                    deadline: float | None = None) -> None:  # fmt: skip
    key = run_key(name, seed, batch)
    if key in load_index()["runs"]:
        return
    if deadline is not None and time.time() > deadline:
        print(f"{key}: not started, --start_within has passed; left for the next sitting", flush=True)
        return
    work.mkdir(parents=True, exist_ok=True)
    with held(str(work / f"{key}.lock")) as mine:  # released when this sitting ends, however it ends
        if not mine:
            print(f"{key}: another sitting is running it; skipped here", flush=True)
            return
        _train_and_score(key, name, flags, seed, batch, cache, work, corpus, threads, jobs)


def _train_and_score(key: str, name: str, flags: list[str], seed: int, batch: int, cache: int | None, work: Path,
                     corpus: Path, threads: int | None, jobs: int) -> None:  # fmt: skip
    marker = work / f"{key}.args.json"  # what --resume needs to finish this run if the sitting stops
    if not marker.is_file():
        write_json(marker, {"name": name, "flags": flags, "seed": seed, "batch_size": batch,
                            "cache_minibatch_size": cache})  # fmt: skip
    folder = work / key
    load_before = os.getloadavg()
    every = str(max(1, round(125 * 64 / batch)))  # the recipe's evaluation every 8,000 sentences, at any batch size
    log_every = str(max(1, round(25 * 64 / batch)))  # and its logging every 1,600 (the diagnostics' windows)
    command = [sys.executable, "train.py", *RECIPE, "--train_file", str(corpus), "--output_dir", str(folder),
               "--per_device_train_batch_size", str(batch), "--seed", str(seed), "--eval_steps", every,
               "--save_steps", every, "--logging_steps", log_every, *flags]  # fmt: skip
    if cache:
        command += ["--cache_minibatch_size", str(cache)]
    command += resume_flags(str(folder))[0]  # an interrupted run: from its newest complete checkpoint
    folder.parent.mkdir(parents=True, exist_ok=True)
    report = Path(str(folder) + "-sts")
    train_seconds = eval_seconds = None
    if not (folder / "simcse_files.json").is_file():  # no final save yet
        print(f"{key}: training", flush=True)
        train_seconds = run(command, work / f"{key}.log", threads)
    if not (report / "results.json").is_file():
        eval_seconds = run([sys.executable, "eval/sts.py", "--model", str(folder), "--data_dir",
                            str(SHARED_DATA / "sts"), "--output", str(report), "--no_progress_bar"],
                           work / f"{key}.log", threads)  # fmt: skip
    results = json.loads((report / "results.json").read_text())
    kept = keep_run(key, report, folder)
    entry = {
        "arm": name, "seed": seed, "batch_size": batch, "cache_minibatch_size": cache, "flags": flags,
        "results": _rel(kept), "average": results["average"], "sick_by_label": sick_by_label(kept),
        "train_seconds": train_seconds and round(train_seconds, 1),
        "eval_seconds": eval_seconds and round(eval_seconds, 1),
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
        "torch_threads": threads, "jobs": jobs,
        "diagnostics": last_window(kept), "environment": environment(),
        "provenance": run_provenance(folder, report),
    }  # fmt: skip
    save_entry(key, entry, str(work))
    print(f"{key}: STS average {results['average']:.2f}", flush=True)


def references(work: Path) -> None:
    for key, pooler in (("before-cls", "cls_before_pooler"), ("before-avg", "avg")):
        if key in load_index()["runs"]:
            continue
        report = work / f"{key}-sts"
        seconds = None
        if not (report / "results.json").is_file():  # scored already by an interrupted sitting: kept
            seconds = run([sys.executable, "eval/sts.py", "--model", "builtin:all-MiniLM-L6-v2", "--pooler", pooler,
                           "--data_dir", str(SHARED_DATA / "sts"), "--output", str(report), "--no_progress_bar"],
                          work / f"{key}.log")  # fmt: skip
        results = json.loads((report / "results.json").read_text())
        kept = keep_run(key, report, None)
        entry = {"arm": key, "seed": None, "results": _rel(kept), "average": results["average"],
                 "sick_by_label": sick_by_label(kept), "eval_seconds": seconds and round(seconds, 1),
                 "environment": environment()}  # fmt: skip
        save_entry(key, entry, str(work))


SICK_LABELS = ("ENTAILMENT", "NEUTRAL", "CONTRADICTION")


@functools.lru_cache(maxsize=4)
def sick_test_rows(sick: Path) -> list[dict]:
    """SICK's test-split rows with their entailment labels, read once per report (simcse_hn.data's STS reader keeps
    only the pair and its score)."""
    rows = [json.loads(line) for line in sick.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == "test"]


def sick_by_label(results: Path, sick: Path | None = None) -> dict | None:
    """How a scored model places SICK-R's test pairs by their entailment label, from its predictions.npz: the mean
    cosine of each label's pairs and the AUC of telling entailment (a paraphrase: what an unsupervised batch holds as
    a false negative) from contradiction (a lexically close but opposite sentence: a hard true negative) by cosine
    alone. An objective that pushes false negatives away lowers the first; one that separates hard true negatives
    raises the AUC. None when the predictions or the labels are missing or do not line up with the test split."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    sick = SHARED_DATA / "sts" / "sickr.jsonl" if sick is None else sick
    if not (results / "predictions.npz").is_file() or not sick.is_file():
        return None
    rows = sick_test_rows(sick)
    with np.load(results / "predictions.npz") as predictions:
        if "SICK-R/cosine" not in predictions.files:
            return None
        cosine, gold = predictions["SICK-R/cosine"], predictions["SICK-R/gold"]
    if len(rows) != len(cosine) or not np.allclose(gold, [r["score"] for r in rows]):
        print(f"{results}: SICK-R predictions do not match {sick}'s test split; no label table", flush=True)
        return None
    labels = np.array([r.get("entailment") for r in rows])
    out = {f"cos_{label.lower()}": float(cosine[labels == label].mean()) for label in SICK_LABELS}
    entail, contra = cosine[labels == "ENTAILMENT"], cosine[labels == "CONTRADICTION"]
    out["auc_entailment_vs_contradiction"] = float(mannwhitneyu(entail, contra).statistic / (len(entail) *
                                                                                            len(contra)))  # fmt: skip
    return out


def learning_rate_suffix(arm: str) -> str:
    """'-lr8.5e-05' for a run of `--learning_rate 8.5e-5`, '' for the recipe's rate."""
    return arm[arm.rindex("-lr"):] if "-lr" in arm else ""


def baseline_of(arm: str) -> str:
    """The run name an arm is paired with: the baseline at the same learning rate."""
    return BASELINE + learning_rate_suffix(arm)


def sick_label_table(runs: dict) -> list[str]:
    """The report's SICK-R-by-label section: one row per arm and batch (mean over its runs), the references first,
    with each arm's AUC paired over seeds against the baseline's at the same batch (a t-test over the shared seeds)."""
    from simcse_hn.evaluation.stats import paired_t_test

    groups: dict[tuple, dict] = {}  # (arm, batch) -> {seed: values}
    for _, entry in sorted(runs.items(), key=lambda kv: (kv[1].get("seed") is not None, kv[1]["arm"],
                                                         str(kv[1].get("batch_size")), kv[1].get("seed") or 0)):
        values = entry.get("sick_by_label") or sick_by_label(ROOT / entry["results"])
        group = groups.setdefault((entry["arm"], entry.get("batch_size", "–")), {})
        if values is not None:
            group[entry.get("seed")] = values
    if not groups:
        return []
    auc = "auc_entailment_vs_contradiction"
    names = [f"cos_{label.lower()}" for label in SICK_LABELS] + [auc]
    lines = ["", "## SICK-R test pairs by entailment label (mean over each arm's runs)", "",
             "Mean cosine of the 1,414 entailment, 2,793 neutral and 720 contradiction pairs, and the AUC of telling "
             "entailment (a paraphrase, which an unsupervised batch treats as a negative: a false negative) from "
             "contradiction (lexically close, opposite in meaning: a hard true negative) by cosine alone. The last "
             f"column pairs the AUC with {BASELINE}'s at the same batch (and learning rate) over the seeds both "
             "have. A row of 0 runs is absent: its runs' predictions were lost with an earlier machine (before "
             "bench/quality.py kept them beside runs.json), and the report copies no figure it cannot recompute.", "",
             "| arm | batch | runs | " + " | ".join(names) + " | AUC of each run, by seed | AUC vs baseline |",
             "|:--|--:|--:|" + "--:|" * len(names) + ":--|:--|"]  # fmt: skip
    for (arm, batch), members in groups.items():
        if not members:
            lines.append(f"| {arm} | {batch} | 0 | " + " | ".join("–" for _ in names) + " | absent | |")
            continue
        cells = " | ".join(f"{statistics.mean(m[n] for m in members.values()):.4f}" for n in names)
        each = ", ".join(f"{m[auc]:.4f}" for m in members.values())
        base = groups.get((baseline_of(arm), batch), {})
        shared = [seed for seed in members if seed is not None and seed in base]
        versus = ""
        if arm != baseline_of(arm) and shared:
            test = paired_t_test([members[seed][auc] for seed in shared], [base[seed][auc] for seed in shared])
            versus = f"{test['difference']:+.4f} ({len(shared)} seed{'s' * (len(shared) > 1)}"
            versus += f", p {test['p']:.2g})" if len(shared) > 1 else ")"
        lines.append(f"| {arm} | {batch} | {len(members)} | {cells} | {each} | {versus} |")
    return lines


def report(index: dict, out: Path | None = None) -> None:
    """eval/compare.py over the runs of batch 64 (the larger batches apart), runs.md, the curves; from the results
    and curves runs.json names, into `out` (default OUT, beside them)."""
    out = OUT if out is None else out
    runs = index["runs"]
    by_variant: dict[tuple[int, str], list[str]] = {}  # (batch, learning-rate suffix) -> runs, compared apart
    for key, entry in runs.items():
        if entry.get("seed") is not None:
            by_variant.setdefault((entry["batch_size"], learning_rate_suffix(entry["arm"])), []).append(key)
    for (batch, suffix), keys in sorted(by_variant.items()):
        baseline = BASELINE + suffix
        keys = sorted(keys, key=lambda k: (runs[k]["arm"] != baseline, runs[k]["arm"], runs[k]["seed"]))
        if batch == 64 and not suffix:
            keys = [k for k in ("before-cls", "before-avg") if k in runs] + keys
        folder = out / f"compare_b{batch}{suffix}"
        lost = [k for k in keys if not (ROOT / runs[k]["results"] / "results.json").is_file()]
        if lost:  # an earlier machine's runs without kept results: their comparison stays as last written
            print(f"{_rel(folder)} kept as it is: {len(lost)} of its runs' results are on no disk here "
                  f"({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''})", flush=True)
            continue
        groups = [runs[k]["arm"] for k in keys]
        seeds = [str(runs[k]["seed"]) if runs[k]["seed"] is not None else "0" for k in keys]
        baseline = baseline if baseline in groups else groups[0]
        problem = scored_apart(keys, runs, groups, seeds, baseline)
        if problem:  # an arm's seeds scored otherwise are not replicates: no statistics over them
            print(f"{_rel(folder)} not rewritten: {problem}", flush=True)
            continue
        title = f"Quality study, batch {batch}" + (f", learning rate {suffix[3:]}" if suffix else "")
        report_command(compare_command.main, [*[str(ROOT / runs[k]["results"]) for k in keys], "--group",
                                              ",".join(groups), "--seeds", ",".join(seeds), "--baseline", baseline,
                                              "--output", str(folder), "--title", title])  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.md").write_text(runs_page(runs), encoding="utf-8")
    draw_curves(runs, by_variant, out)


def report_command(main: Callable[[list[str]], int], argv: list[str]) -> None:
    """A report command of the package (eval/compare.py, eval/curves.py) in this process, its page unprinted; a
    refusal (a file of someone else's in the way) is said in its one line, and the rest of the report goes on."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as said:
        failed = main(argv) != 0
    if failed:
        print(said.getvalue().strip(), flush=True)


def runs_page(runs: dict) -> str:
    """runs.md: every run's row, the diagnostics per arm and batch, the provenance, the sweep and SICK-R by label."""
    lines = ["# Quality study: the runs", "",
             "Each row is one run; diagnostics are the last logging window of training (1,600 sentences: 25 steps "
             "at batch 64). Times are wall "
             "seconds with the 1-minute load average before and after; jobs: trainings run at once (--jobs), with "
             "their torch threads.", "",
             "| run | STS avg | train s | eval s | load | jobs | " + " | ".join(DIAGNOSTICS) + " |",
             "|:--|--:|--:|--:|:--|:--|" + "--:|" * len(DIAGNOSTICS)]  # fmt: skip
    for key, entry in sorted(runs.items()):
        load = entry.get("load_average")
        load = f"{load['before'][0]:.1f} / {load['after'][0]:.1f}" if load else "–"
        diagnostics = entry.get("diagnostics", {})
        cells = " | ".join(f"{diagnostics[d]:.4g}" if d in diagnostics else "–" for d in DIAGNOSTICS)
        threads = entry.get("torch_threads") or "all"
        jobs = f"{entry.get('jobs', 1)} x {threads} threads" if "train_seconds" in entry else "–"
        lines.append(f"| {key} | {entry['average']:.2f} | {entry.get('train_seconds', '–')} | "
                     f"{entry.get('eval_seconds', '–')} | {load} | {jobs} | {cells} |")  # fmt: skip
    # one row per arm and batch size: a batch-512 run's loss is ten times a batch-64 run's, so they are not averaged
    arms_seen = sorted({(e["arm"], e["batch_size"]) for e in runs.values() if e.get("seed") is not None})
    lines += ["", "## Diagnostics per arm and batch size (mean over its runs)", "",
              "| arm | batch | runs | " + " | ".join(DIAGNOSTICS) + " |",
              "|:--|--:|--:|" + "--:|" * len(DIAGNOSTICS)]  # fmt: skip
    for arm, batch in arms_seen:
        members = [e for e in runs.values()
                   if e["arm"] == arm and e.get("batch_size") == batch and e.get("diagnostics")]  # fmt: skip
        means = mean_windows([e["diagnostics"] for e in members], DIAGNOSTICS)
        cells = " | ".join(f"{means[d]:.4g}" if d in means else "–" for d in DIAGNOSTICS)
        lines.append(f"| {arm} | {batch} | {len(members)} | {cells} |")
    # flagged, not hidden: an arm's means below may pool runs of different code or data
    unrecorded = sum(not (e.get("provenance") or {}).get("train_code_sha256") for e in runs.values())
    lines += ["", "## Provenance", "", f"{unrecorded} of {len(runs)} runs record no training code or data hash (run "
              "before train.py wrote them, or references without training).",
              *[f"* {problem}" for problem in mixed_provenance(runs)]]
    lines += sweep_table(runs)
    lines += sick_label_table(runs)
    return "\n".join(lines) + "\n"


def scored_apart(keys: list[str], runs: dict, groups: list[str], seeds: list[str], baseline: str) -> str | None:
    """Why the runs of one comparison cannot be its groups (simcse_hn.evaluation.comparability: an arm whose runs were
    scored under another protocol, tasks, data, pooler or input length; a baseline tested against an arm scored
    otherwise), or None when they can."""
    members = []
    for key, group, seed in zip(keys, groups, seeds):
        with open(ROOT / runs[key]["results"] / "results.json", encoding="utf-8") as f:
            members.append({"results": json.load(f), "group": group, "seed": seed})
    try:
        scored_alike(members, split=False, baseline=baseline)
    except DataError as e:
        return str(e)
    return None


def sweep_table(runs: dict) -> list[str]:
    """The sensitivity sweep against the seed-42 run of the arm each entry starts from, with that arm's seed-to-seed
    spread for scale: one seed shows a shape, not a difference."""
    rows = []
    for name, arm, changes in SWEEP:
        entry = runs.get(run_key(name, 42, 64))
        if entry is None:
            continue
        base = runs.get(run_key(arm, 42, 64))
        spread = [e["average"] for e in runs.values() if e["arm"] == arm and e.get("batch_size") == 64]
        versus = f"{base['average']:.2f} | {entry['average'] - base['average']:+.2f}" if base else "– | –"
        scale = f"{statistics.mean(spread):.2f} ± {statistics.stdev(spread):.2f} ({len(spread)})" if len(
            spread) > 1 else "–"  # fmt: skip
        note = sweep_no_op(arm, changes, 64) or ""
        rows.append(f"| {name} | {arm} | `{' '.join(changes)}` | {entry['average']:.2f} | {versus} | {scale} | "
                    f"{note} |")
    if not rows:
        return []
    return ["", "## Sensitivity sweep (one seed each, batch 64)", "",
            "Each entry changes one setting of the arm it starts from and trains seed 42 only: it shows the shape "
            "of the response, not a difference the study can test. For scale, the last column is the arm's own "
            "STS average over its seeds (mean ± standard deviation, runs). A point noted no-op cannot differ from its "
            "arm (its setting does not take effect at this batch): its difference is seed noise at most.", "",
            "| run | arm | changes | STS avg | arm, seed 42 | difference | arm over seeds | note |",
            "|:--|:--|:--|--:|--:|--:|--:|:--|", *rows]  # fmt: skip


def draw_curves(runs: dict, by_variant: dict, out: Path) -> None:
    """Training curves from each run's curves.json kept under OUT/runs/ (with or without its scores), into `out`: the
    first batch-64 seed of every arm (curves/), the sweep beside the baseline's seed 42 (curves_sweep/), and every run
    of another batch or learning rate (curves_b<batch>[-lr<rate>]/). A chart some of whose runs have no kept curves
    stays as last drawn."""
    first = {}
    for key, entry in sorted(runs.items(), key=lambda kv: kv[1].get("seed") or 0):
        if entry.get("seed") is not None and entry["batch_size"] == 64 and entry["arm"] not in first:
            first[entry["arm"]] = key
    sweep = [name for name, _, _ in SWEEP]
    charts = {"curves": [first[arm] for arm in arms() if arm in first],
              "curves_sweep": [first[name] for name in [BASELINE] + sweep if name in first]}
    for (batch, suffix), keys in sorted(by_variant.items()):
        if (batch, suffix) != (64, ""):
            charts[f"curves_b{batch}{suffix}"] = sorted(keys, key=lambda k: (runs[k]["arm"], runs[k]["seed"]))
    for chart, keys in charts.items():
        records = [OUT / "runs" / key / "curves.json" for key in keys]
        if len(keys) < 2 or not all(r.is_file() for r in records):
            continue
        report_command(curves_command.main, [*map(str, records), "--output", str(out / chart)])


def main() -> None:  # noqa: C901
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(arms()), help="comma-separated subset of " + ",".join(arms()))
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 42, or none with --resume)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--cache_minibatch_size", type=int, default=None, help="GradCache for large batches")
    parser.add_argument("--learning_rate", type=float, default=None,
                        help="another learning rate than the recipe's 3e-5 (e.g. scaled with --batch_size); the "
                        "runs are named <arm>-lr<value>, apart from the recipe's")  # fmt: skip
    parser.add_argument("--sweep", action="store_true", help="the one-seed sensitivity sweep (seed 42)")
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--resume", action="store_true", help="also finish every run started under --work_dir that "
                        "runs.json lacks (with its own arm, seed and batch), then every run the study's seed rule "
                        "still needs (3 seeds per arm, 5 for the baseline and every arm ahead of it, the sweep)")
    parser.add_argument("--start_within", type=float, default=None, metavar="MINUTES",
                        help="start no run later than this many minutes into the sitting (the rest wait for the "
                        "next one), so a sitting can end at a run boundary")  # fmt: skip
    parser.add_argument("--dry_run", action="store_true", help="print the runs that would be done, and stop")
    parser.add_argument("--work_dir", default=str(ROOT / "outputs" / "quality"))
    parser.add_argument("--max_steps", type=int, default=None, help="smoke test only: stop every run early")
    parser.add_argument("--jobs", type=int, default=1, help="trainings at once, cores / jobs torch threads each")
    parser.add_argument("--results_dir", default=None, help="where runs.json and the report go (default: " +
                        str((RESULTS / "quality").relative_to(ROOT)) + ")")  # fmt: skip
    args = parser.parse_args()
    if args.results_dir:
        globals()["OUT"] = Path(args.results_dir)
    if args.max_steps:
        RECIPE.extend(["--max_steps", str(args.max_steps)])

    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.learning_rate is not None and (args.sweep or args.report or (args.resume and args.seeds is None)):
        parser.error("--learning_rate applies to the runs --arms and --seeds ask for (not to --sweep, --report or "
                     "what --resume finishes, which keep their own)")  # fmt: skip
    work = Path(args.work_dir)
    if not args.dry_run:
        adopt_runs(work)
    if not args.report:
        todo = started_runs(work) + study_plan(load_index()) if args.resume else []
        if args.sweep:
            todo += [(name, arm_flags(arm) + changes, 42, 64, None) for name, arm, changes in SWEEP]
        elif args.seeds is not None or not args.resume:
            seeds = [int(s) for s in (args.seeds or "42").split(",")]
            lr = [] if args.learning_rate is None else ["--learning_rate", f"{args.learning_rate:g}"]
            suffix = f"-lr{args.learning_rate:g}" if lr else ""
            todo += [(arm + suffix, arm_flags(arm) + lr, seed, args.batch_size, args.cache_minibatch_size)
                     for seed in seeds for arm in args.arms.split(",")]  # fmt: skip
        keys = [run_key(name, seed, batch) for name, _, seed, batch, _ in todo]
        todo = [run_args for i, run_args in enumerate(todo) if keys[i] not in keys[:i]]  # each run once
        if args.resume or args.dry_run:
            print(f"runs to do: {len(todo)}", flush=True)
        if args.dry_run:
            for name, _, seed, batch, _ in todo:
                print(f"  {run_key(name, seed, batch)}", flush=True)
            return
        work.mkdir(parents=True, exist_ok=True)
        corpus = work / "wiki_shuffled.txt"
        if not corpus.is_file():
            shuffled_corpus(corpus)
        references(work)
        threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
        deadline = time.time() + 60 * args.start_within if args.start_within is not None else None
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(train_and_score, *run_args, work, corpus, threads, args.jobs, deadline)
                       for run_args in todo]  # fmt: skip
            failed = [(run_args[0], run_args[2], future.exception()) for run_args, future in zip(todo, futures)
                      if future.exception() is not None]  # waits for each; a failed run does not stop the others
        for arm, seed, error in failed:
            print(f"{arm} seed {seed} failed: {error}", flush=True)
        if failed:
            raise SystemExit(f"{len(failed)} run(s) failed; their logs are under {work}")
    with locked_index() as index:
        index["work_dir"] = portable_name(args.work_dir)
    report(load_index())
    print(f"report: {OUT}", flush=True)


if __name__ == "__main__":
    main()
