"""The STS suite (STS12-16, STS-B test, SICK-R test) for a SimCSE folder, a Hub id or a sentence-transformers model.

    python eval/sts.py --model PATH_OR_ID [--pooler avg] --data_dir ../shared/data/sts --output runs/sts \
        [--tasks all|sts12,stsb,...] [--aggregation all|mean|wmean] [--sickr_all] [--batch_size 128] \
        [--max_seq_length N] [--device cpu] [--save_to_model] [--push_to_hub --hub_model_id user/name] \
        [--curves] [--no_alignment_uniformity] [--mteb_results DIR | --no_mteb_results]

Writes results.json, results.md (the SimCSE paper's table + sub-file scores) and results.png into --output, and
predictions.npz: every pair's cosine and gold score per task (format: simcse_hn.evaluation.results.save_predictions),
what eval/compare.py's paired bootstrap resamples. With STS-B dev in the data (the `dev` split of stsb.jsonl, or the
Hub's validation split) it also reports alignment and uniformity under SimCSE's protocol, from the same encode call. A
SimCSE folder's simcse_config.json (the objective, its settings, the seed) is copied into results.json as
"training"; --curves adds the run's training curves (eval/curves.py) under --output/curves.
It also writes one MTEB result file per task, in MTEB's layout and schema (simcse_hn.evaluation.mteb_results), into an
MTEB results cache (default --output/mteb): results/{org}__{model}/{revision}/{Task}.json and model_meta.json, holding
MTEB's numbers (each task alone, SICK-R's 9,927 pairs), through mteb's own TaskResult when mteb is installed.
--baseline MODEL[:POOLER] (repeatable) scores another encoder (the one a model was trained from, say) in the same run
and protocol: a row beside the model's in results.md, results.png, the printed table and a simcse-hn folder's card
(README.md, with the command; sts_results.json beside it). Without --data_dir: the Hub's copies, via `datasets`.
No file in --output (or --mteb_results) that a report did not write is replaced (files.ReportFolder): one line refuses.
User errors (a missing or malformed task file, a bad flag) print one `error: ...` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time

from simcse_hn.cli.answers import check_sts_flags
from simcse_hn.cli.sts_records import code_settings, training_config
from simcse_hn.data.sts import load_sts_task, parse_tasks
from simcse_hn.errors import DataError, UserError
from simcse_hn.evaluation import mteb_results, reports
from simcse_hn.evaluation.analysis import alignment_uniformity_encoded, load_stsb_dev
from simcse_hn.evaluation.comparability import data_fingerprint
from simcse_hn.evaluation.curves import load_curves, write_curves
from simcse_hn.evaluation.encoding import load_encoder
from simcse_hn.evaluation.plots import plot_results
from simcse_hn.evaluation.reports import model_label, parse_baseline, pooling_name, results_markdown, results_table
from simcse_hn.evaluation.results import PREDICTIONS, save_predictions, sts_results
from simcse_hn.evaluation.scoring import (
    AGGREGATION_HELP,
    AGGREGATIONS,
    check_aggregation,
    encode_union,
    score_encoded_tasks,
)
from simcse_hn.export import hub
from simcse_hn.export.model_card import save_sts_results, sts_card_is_ours
from simcse_hn.files import ReportFolder, portable_name
from simcse_hn.modeling.loading import resolve_packaged
from simcse_hn.provenance import check_own_checkout, run_command

logger = logging.getLogger("eval.sts")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="SimCSE output folder, Hub id, or sentence-transformers model.")
    parser.add_argument(
        "--pooler",
        default=None,
        help="Evaluate as a SimCSEModel with this pooler: cls, cls_before_pooler, avg, avg_first_last, avg_top2, "
        "last (a decoder's last token). Default: the pooler saved in simcse_config.json, else the model's "
        "sentence-transformers modules when it has modules.json, else 'cls'.",
    )
    parser.add_argument(
        "--data_dir",
        default=None,
        help="Folder with sts12..16.jsonl, stsb.jsonl, sickr.jsonl. "
        "Default: the public copies on the Hub (needs network).",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="Folder for results.json, results.md, results.png and predictions.npz. Default: beside the model, "
        "never inside it: MODEL-sts for a local folder, sts-NAME in the current folder for a Hub id.",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="MODEL[:POOLER]",
        help="Also score this encoder (a folder, Hub id or builtin:NAME; :POOLER picks a pooler, else its own: the "
        "sentence-transformers modules of such a model) in the same run and protocol, as a row beside --model's, "
        "e.g. the model it was trained from. Repeatable.",
    )
    parser.add_argument("--tasks", default="all", help="'all' or a comma-separated list, e.g. sts12,stsb,sickr.")
    parser.add_argument(
        "--aggregation",
        choices=AGGREGATIONS,
        default="all",
        help="; ".join(AGGREGATION_HELP.values()) + ". STS-B and SICK-R are single files either way.",
    )
    parser.add_argument(
        "--sickr_all",
        action="store_true",
        help="Score SICK-R on all 9,927 pairs as MTEB does, "
        "instead of SimCSE's 4,927 test pairs; labelled as such in every output.",
    )
    parser.add_argument("--batch_size", type=int, default=128, help="Sentences per encoder batch.")
    parser.add_argument(
        "--max_seq_length",
        type=int,
        default=None,
        help="Truncate longer inputs (tokens). Default: the model's own inference length (its sentence-transformers "
        "max_seq_length, else the encoder's limit), recorded in results.json.",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... Default: cuda when available.")
    parser.add_argument(
        "--save_to_model",
        action="store_true",
        help="Write sts_results.json into the local --model folder and update its model card (STS table and "
        "model-index) when simcse-hn wrote the card; a folder simcse-hn trained gets both without this flag.",
    )
    parser.add_argument(
        "--no_save_to_model",
        action="store_true",
        help="Leave the --model folder as it is, even one simcse-hn trained (simcse-hn-study scores its runs so: a "
        "run's model files stay those its record binds).",
    )
    parser.add_argument(
        "--allow_other_code",
        action="store_true",
        help="Run even when the imported simcse_hn is not this checkout's (recorded in results.json settings).",
    )
    parser.add_argument(
        "--require_same_code",
        action="store_true",
        help="Refuse a model whose simcse_config.json records training code (source_sha256) other than this "
        "evaluation's, or none (a study's evaluation must run the checkout that trained it).",
    )
    parser.add_argument("--push_to_hub", action="store_true", help="Upload the results to the model's Hub repo.")
    parser.add_argument(
        "--hub_model_id", default=None, help="Hub repo for --push_to_hub (default: --model when it is a Hub id)."
    )
    parser.add_argument("--no_progress_bar", action="store_true", help="Hide the encoding progress bar.")
    parser.add_argument(
        "--no_alignment_uniformity",
        action="store_true",
        help="Skip alignment and uniformity on STS-B dev (by default measured when the data has that split).",
    )
    add_report_arguments(parser)
    return parser


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The MTEB result files' flags and --curves."""
    parser.add_argument(
        "--mteb_results",
        default=None,
        metavar="DIR",
        help="MTEB results cache for the MTEB result files (DIR/results/{org}__{model}/{revision}/{Task}.json, as "
        "mteb.ResultCache(DIR) reads). Default: OUTPUT/mteb.",
    )
    parser.add_argument(
        "--mteb_model_name",
        default=None,
        help="The name the MTEB files are filed under (org/model). Default: --hub_model_id, the Hub id, else "
        "local/<folder name>.",
    )
    parser.add_argument("--no_mteb_results", action="store_true", help="Write no MTEB result files.")
    parser.add_argument(
        "--curves",
        action="store_true",
        help="Also draw the training curves of --model (a training output or checkpoint folder: trainer_state.json, "
        "TensorBoard events) into --output/curves.",
    )


def main(argv: list[str] | None = None, script: str | None = None) -> int:
    """`script`: the file that started this run (eval/sts.py), whose checkout's package must be the one imported
    (provenance.check_own_checkout); None for the console script, whose package is its code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return run(args, script)
    except UserError as e:  # a bad task file or flag, a model folder without a usable tokenizer, ...
        print(f"error: {e}", file=sys.stderr)
        return 2


def default_output(model: str) -> str:
    """Beside the model, never inside it (a report in the folder would be taken for one of its files)."""
    if os.path.isdir(model):
        return os.path.normpath(model) + "-sts"
    return "sts-" + model.rstrip("/").split("/")[-1].split(":")[-1]


REPORT_FILES = ("results.json", "results.md", "results.png", PREDICTIONS)  # into --output, whatever else


def run(args: argparse.Namespace, script: str | None = None) -> int:
    command = run_command("python eval/sts.py" if script else "simcse-hn-sts", build_parser(), args, ("model",))
    other_code = check_own_checkout(script, allow_other=args.allow_other_code) if script else None
    if other_code is not None:
        logger.warning("%s", other_code)
    check_sts_flags(args)  # what the front refuses before torch is imported, refused alike here
    args.output = args.output or default_output(args.model)
    requested_model = args.model  # a builtin's Hub id names its MTEB files
    if args.model.startswith("builtin:") and args.model != "builtin:tiny-bert":  # a pip package's copy of a model
        args.model = resolve_packaged(args.model, field="--model")
    local_model = os.path.isdir(args.model)
    provenance = code_settings(args.model, other_code, args.require_same_code)  # refuses before any encoding
    if args.save_to_model and args.no_save_to_model:
        raise DataError("--save_to_model and --no_save_to_model: choose one")
    if args.save_to_model and not local_model:
        raise DataError(f"--save_to_model needs a local model folder; {args.model!r} is not one")
    hub_repo = args.hub_model_id or (None if local_model else args.model)
    if args.push_to_hub and not hub_repo:
        raise DataError("--push_to_hub needs --hub_model_id when --model is a local folder")
    baselines = [parse_baseline(spec) for spec in args.baseline]
    if args.device is not None and args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise DataError(f"--device {args.device}: no CUDA device is available here")
    if args.batch_size < 1:
        raise DataError(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.max_seq_length is not None and args.max_seq_length < 2:  # 0 would read as unset, < 0 fail in a tokenizer
        raise DataError(f"--max_seq_length must be >= 2, got {args.max_seq_length}")
    try:
        names = parse_tasks(args.tasks)
    except ValueError as e:
        raise DataError(f"--tasks: {e}") from None
    ReportFolder(args.output).check(REPORT_FILES)  # a user's file in the way: refused before any model loads
    mteb_cache = args.mteb_results or os.path.join(args.output, "mteb")
    mteb_inside = not os.path.relpath(os.path.abspath(mteb_cache), os.path.abspath(args.output)).startswith("..")
    ReportFolder(mteb_cache, "--mteb_results").check(())  # a file, or a mark that is not ours

    # Read and check every task file before the model loads: a bad line fails in seconds.
    tasks = [load_sts_task(name, args.data_dir, sickr_all=args.sickr_all) for name in names]
    for task in tasks:
        logger.info("%s: %d pairs from %s (%s)", task.name, task.pairs, task.source, ", ".join(task.subsets))
    check_aggregation(tasks, args.aggregation)
    # MTEB scores SICK-R on all its pairs: without --sickr_all those are loaded too and encoded in the same call
    mteb_tasks = [] if args.no_mteb_results else [
        load_sts_task(task.name, args.data_dir, sickr_all=True) if task.name == "SICK-R" and not args.sickr_all
        else task for task in tasks]  # fmt: skip
    mteb_extra = [s for task in mteb_tasks if task not in tasks for p in task.subsets.values()
                  for s in p.sentence1 + p.sentence2]  # fmt: skip
    dev, dev_source = (None, None) if args.no_alignment_uniformity else load_stsb_dev(args.data_dir)
    curves = None
    if args.curves:
        if not local_model:
            raise DataError(f"--curves needs a local training output folder; {args.model!r} is not one")
        curves = load_curves(args.model)

    dev = (dev, dev_source)
    scored = encode_and_score(args, args.model, args.pooler, tasks, dev, extra=mteb_extra, name=requested_model)
    info = scored["info"]
    settings = {
        "command": command,
        "tasks": names,
        "data": args.data_dir or "hub",
        "sources": {task.name: task.source for task in tasks},
        "encoder": info["backend"],
        "modules": info["modules"],
        "batch_size": args.batch_size,
        "max_seq_length": info["max_seq_length"],  # the length inputs were truncated to
        "max_seq_length_requested": args.max_seq_length,
        "device": info["device"],
        "predictions": PREDICTIONS,
        "data_sha256": {task.name: data_fingerprint(task) for task in tasks},  # what eval/compare.py checks
        **provenance,
    }
    results = sts_results(scored["scores"], args.model, info["pooler"], args.sickr_all, settings, scored["geometry"],
                          training_config(args.model))  # fmt: skip
    rows = score_rows(args, results, info, baselines, tasks, dev)

    written, record = write_reports(args, requested_model, rows, scored, mteb_tasks, (mteb_cache, mteb_inside), curves)
    if args.save_to_model or (local_model and not args.no_save_to_model and sts_card_is_ours(args.model)):
        save_sts_results(args.model, record)
    print(results_table(rows) + f"protocol: {reports.protocol(results)}")  # the rows share it; the files say it too
    geometry = scored["geometry"]
    if geometry is not None:
        print(f"alignment {geometry['alignment']:.4f}, uniformity {geometry['uniformity']:.4f} (STS-B dev)")
    logger.info("wrote %s to %s", ", ".join(written), args.output)

    if args.push_to_hub:
        try:  # the token comes from HF_TOKEN or `hf auth login`
            hub.push_sts_results(hub_repo, results, token=None)  # looked up here: tests stand in for the push
        except hub.HubError as e:  # one line already; the local results are written
            print(f"error: {e}", file=sys.stderr)
            return 2
        logger.info("pushed STS results to %s", hub_repo)
    return 0


def score_rows(args, results: dict, info: dict, baselines, tasks, dev) -> list[tuple[str, dict]]:
    """(label, results) of the model, then of each --baseline, scored with the same tasks, protocol and input length
    as the model's."""
    label = model_label(args.model)
    if not baselines:
        return [(label, results)]
    rows = [(f"{label} ({pooling_name(args.model, info)})", results)]
    for name, path, pooler in baselines:
        length = info["max_seq_length"]
        base = encode_and_score(args, path, pooler, tasks, dev, max_seq_length=length, name=name)
        used = {"encoder": base["info"]["backend"], "modules": base["info"]["modules"], "max_seq_length": length}
        record = sts_results(base["scores"], path, base["info"]["pooler"], args.sickr_all, used, base["geometry"],
                             training_config(path))  # fmt: skip
        record["label"] = f"{model_label(portable_name(name))} ({pooling_name(path, base['info'])})"
        rows.append((record["label"], record))
    return rows


def write_reports(args, requested_model: str, rows, scored, mteb_tasks, mteb, curves) -> tuple[list[str], dict]:
    """results.json, predictions.npz, results.md, results.png (and curves) into --output, and the MTEB result files
    into their cache (`mteb`: its folder, and whether it is inside --output), each folder checked before anything
    moves into either. -> (the files written, the results record with its baselines)"""
    (label, results), baselines = rows[0], rows[1:]
    mteb_cache, mteb_inside = mteb
    outside = mteb_tasks and not mteb_inside  # an MTEB cache of its own: its own mark
    with ReportFolder(args.output) as report, (ReportFolder(mteb_cache, "--mteb_results") if outside
                                               else contextlib.nullcontext()) as cache:  # fmt: skip
        if mteb_tasks:
            cache_dir = cache.path() if outside else report.path(os.path.relpath(mteb_cache, args.output))
            mteb_record = write_mteb_files(args, requested_model, scored, mteb_tasks, results, cache_dir)
            mteb_record["folder"] = os.path.relpath(os.path.join(mteb_cache, mteb_record["folder"]), args.output)
            results["settings"]["mteb_results"] = mteb_record  # results.md's MTEB section reads it
        record = results | ({"baselines": [r for _, r in baselines]} if baselines else {})
        write_json(report.path("results.json"), record)
        save_predictions(report.path(PREDICTIONS), scored["predictions"])
        with open(report.path("results.md"), "w", encoding="utf-8") as f:
            f.write(results_markdown(results, label, baselines=baselines))
        plot_results(rows, report.path("results.png"), title=model_label(args.model))
        if curves is not None:
            write_curves([curves], report.path("curves"))
        if outside:
            cache.check(cache.staged())  # before anything moves into either folder
        written = report.commit()  # the MTEB cache inside --output moves with it
        if outside:
            written += [os.path.join(mteb_cache, name) for name in cache.commit()]
    return written, record


def encode_and_score(args, model: str, pooler: str | None, tasks, dev, extra=(), max_seq_length=None, name=None):
    """Load `model` (`name`: as the user named it, for its progress bar), encode the suite's sentences once (with
    those of STS-B dev, `dev` = (pairs or None, their source), and `extra`), score every task.
    -> {"info", "scores", "predictions", "geometry", "embeddings", "index", "seconds"}"""
    shown = model_label(portable_name(name or model)) + (f" ({pooler} pooler)" if pooler else "")
    try:
        encode, info = load_encoder(
            model,
            pooler=pooler,
            device=args.device,
            batch_size=args.batch_size,
            max_seq_length=max_seq_length or args.max_seq_length,
            show_progress_bar=False if args.no_progress_bar else f"encoding {shown}",
        )
    except OSError as e:  # missing folder or Hub repo, no network, unreadable weights
        raise DataError(f"could not load model {model!r} ({str(e).splitlines()[0]})") from None
    # one encode call: the suite's sentences, then the STS-B dev sentences it lacks (about a quarter of them)
    start = time.perf_counter()
    pairs, source = dev
    extra = [*(pairs.sentence1 + pairs.sentence2 if pairs else []), *extra]
    embeddings, index = encode_union(encode, tasks, extra=extra)
    seconds = time.perf_counter() - start
    scores, predictions = score_encoded_tasks(embeddings, index, tasks, args.aggregation)
    geometry = None
    if pairs is not None:
        geometry = alignment_uniformity_encoded(embeddings, index, pairs, device=info["device"]) | {"source": source}
    return {"info": info, "scores": scores, "predictions": predictions, "geometry": geometry,
            "embeddings": embeddings, "index": index, "seconds": seconds}  # fmt: skip


def write_mteb_files(args, requested_model: str, scored: dict, mteb_tasks, results: dict, cache: str) -> dict:
    """The MTEB result files into the MTEB cache `cache` (a staging folder). -> results.json's record of them, its
    folder relative to the cache"""
    info, embeddings = scored["info"], scored["embeddings"]
    similarity = mteb_results.similarity_function(args.model, info["backend"])
    scores = mteb_results.score_tasks(embeddings, scored["index"], mteb_tasks, similarity, scored["seconds"])
    fields = {
        "name": args.mteb_model_name or mteb_results.model_name(requested_model, args.hub_model_id),
        "revision": mteb_results.model_revision(args.model),
        "embed_dim": int(embeddings.shape[1]),
        "max_tokens": info["max_seq_length"],
        "similarity_fn_name": similarity,
        "framework": ["Sentence Transformers", "PyTorch"],
        "adapted_from": mteb_results.adapted_from(results.get("training")),
    }
    return mteb_results.write_report_folder(cache, cache, scores, mteb_tasks, fields)


def write_json(path: str, results: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
