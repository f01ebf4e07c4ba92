"""Cross-check a report's MTEB result files against MTEB's own evaluator, run offline on the same local files.

    python eval/mteb_check.py --report reports/minilm --model PATH_OR_ID --data_dir ../shared/data/sts \
        [--tolerance 1e-6] [--batch_size 32]

Needs `mteb` (pip install -e ".[mteb]"). MTEB's STS tasks (mteb.get_task: STS12 ... SICK-R) are pointed at the data
folder's JSON Lines instead of the Hub: each task's `dataset` is set to the file read by `datasets` (the test rows;
every row for SICK-R, as MTEB's copy holds all 9,927 pairs) and marked loaded, then `mteb.evaluate` scores the model
(loaded by sentence-transformers, encoded by MTEB's own wrapper) with no cache. Every score of every task the report
wrote (unrounded, from results.json; its files, which round to 6 decimals as MTEB's do, are checked against them)
is compared with MTEB's, and so is the report's own table wherever it scored the same pairs the same way (every
task but SICK-R's test split; STS12-16 under aggregation `all`): one number per task. Prints a table and writes
mteb_check.json into the report. Exit status 1 when a
difference exceeds --tolerance, 2 on a user error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from simcse_hn.data.sts import STS_DATA_HINT, STS_FILES
from simcse_hn.errors import DataError
from simcse_hn.evaluation import mteb_results


def mteb_task(name: str, data_dir: str):
    """MTEB's task `name` (ours) with its dataset read from data_dir's file instead of the Hub."""
    import datasets
    import mteb

    path = os.path.join(data_dir, STS_FILES[name])
    if not os.path.isfile(path):
        where = f"{name} expects {STS_FILES[name]} in the data folder; {STS_DATA_HINT}"
        raise DataError(f"{path}: file not found ({where})")
    rows = datasets.load_dataset("json", data_files=path, split="train")
    if name != "SICK-R":
        rows = rows.filter(lambda row: row["split"] == "test")
    task = mteb.get_task(mteb_results.MTEB_TASKS[name].name)
    task.dataset = datasets.DatasetDict({mteb_results.SPLIT: rows.select_columns(["sentence1", "sentence2", "score"])})
    task.data_loaded = True
    return task


def check(report: str, model: str, data_dir: str, batch_size: int = 32) -> dict:
    """-> {"folder", "tasks": {task: {"ours": scores, "mteb": scores, "max_difference"}}, "max_difference"}"""
    import mteb
    from sentence_transformers import SentenceTransformer

    path = os.path.join(report, "results.json")
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found (a report written by eval/sts.py)")
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    record = (results.get("settings") or {}).get("mteb_results")
    if not record:
        raise DataError(f"{path}: no settings.mteb_results (written with --no_mteb_results?)")
    folder = os.path.join(report, record["folder"])
    files = {}
    for task in record["tasks"]:  # the files hold the report's numbers, to their 6 decimals
        files[task] = mteb_results.read_task_file(os.path.join(folder, f"{mteb_results.MTEB_TASKS[task].name}.json"))
        for key in mteb_results.SCORE_KEYS:
            if abs(files[task]["scores"][key] - record["tasks"][task][key]) > 5.1e-7:
                raise DataError(f"{folder}: {task} {key} is not the report's {record['tasks'][task][key]!r}")
    tasks = [mteb_task(task, data_dir) for task in record["tasks"]]
    encoder = SentenceTransformer(model, device="cpu")
    result = mteb.evaluate(encoder, tasks, cache=None, encode_kwargs={"batch_size": batch_size},
                           show_progress_bar=False)  # fmt: skip
    theirs = {mteb_results.OUR_NAME[r.task_name]: r.scores[mteb_results.SPLIT][0] for r in result.task_results}
    out = {"folder": record["folder"], "mteb_version": mteb.__version__, "tasks": {}}
    for task, mine in record["tasks"].items():
        scores = {key: float(mine[key]) for key in mteb_results.SCORE_KEYS}
        reference = {key: float(theirs[task][key]) for key in mteb_results.SCORE_KEYS}
        difference = max(abs(scores[key] - reference[key]) for key in scores)
        out["tasks"][task] = {"ours": scores, "mteb": reference, "max_difference": difference}
        table = same_pairs_score(results, task)
        if table is not None:  # the report's own table, where it scored the same pairs as MTEB: one number
            out["tasks"][task]["report"] = table
            out["tasks"][task]["max_difference"] = max(difference, abs(table - reference["cosine_spearman"]))
    out["max_difference"] = max(t["max_difference"] for t in out["tasks"].values())
    return out


def same_pairs_score(results: dict, task: str) -> float | None:
    """The report's table value of `task` (Spearman x 100, as a fraction) where it scored MTEB's pairs, pooled as
    MTEB pools them: STS-B, STS12-16 under aggregation `all`, SICK-R only with --sickr_all. None elsewhere."""
    entry = (results.get("tasks") or {}).get(task)
    if entry is None or (task == "SICK-R" and results.get("sickr_pairs") != "all"):
        return None
    if task not in ("STS-B", "SICK-R") and results.get("aggregation") != "all":
        return None
    return float(entry["spearman"]) / 100


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", required=True, help="An eval/sts.py output folder (results.json, mteb/).")
    parser.add_argument("--model", required=True, help="The model the report scored (a folder or Hub id).")
    parser.add_argument("--data_dir", required=True, help="Its data folder (sts12..16, stsb, sickr).jsonl.")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="Largest difference allowed per score.")
    parser.add_argument("--batch_size", type=int, default=32, help="MTEB's encode batch size.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not mteb_results.mteb_installed():
        print('error: mteb is not installed (pip install -e ".[mteb]")', file=sys.stderr)
        return 2
    try:
        out = check(args.report, args.model, args.data_dir, args.batch_size)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out["tolerance"] = args.tolerance
    with open(os.path.join(args.report, "mteb_check.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    keys = len(mteb_results.SCORE_KEYS)
    print(
        f"| Task | report (table) | cosine_spearman (ours) | cosine_spearman (MTEB) | largest difference, {keys} "
        "scores and the table |\n|:---|---:|---:|---:|---:|"
    )
    for task, scores in out["tasks"].items():
        table = f"{scores['report']:.6f}" if "report" in scores else "other pairs"
        print(
            f"| {mteb_results.MTEB_TASKS[task].name} | {table} | {scores['ours']['cosine_spearman']:.6f} | "
            f"{scores['mteb']['cosine_spearman']:.6f} | {scores['max_difference']:.2e} |"
        )
    agree = out["max_difference"] <= args.tolerance
    print(f"mteb {out['mteb_version']}: {'agrees' if agree else 'DIFFERS'}, largest difference "
          f"{out['max_difference']:.2e} (tolerance {args.tolerance:g})")  # fmt: skip
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
