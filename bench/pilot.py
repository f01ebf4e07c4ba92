"""The pilot of the hard-negative study: does a regime exist on this machine in which the objectives act?

The earlier quality study (bench/results/quality/) trained all-MiniLM-L6-v2 on random batches of the wiki slice,
where the task is solved at once (InfoNCE's last-window loss 0.0025 at batch 64, HCL's weights near uniform, DCL
clamping 99 % of anchors). This pilot trains the same model with the same recipe on candidate regimes, short runs
of each of InfoNCE, HCL and DCL (the study's arms, `configs/unsup_bert_base_<arm>.yaml`), and reads each regime
against the go criterion written in bench/results/pilot/plan.md before the first run:

* loss: InfoNCE's last logging window at least ten times the saturated regime's (0.0025 at batch 64, the quality
  study's records), and at least ten times that of this pilot's own random-batch run of the same length;
* weights at work: HCL's `top1pct_weight_share` (the share of an anchor's weight on its most similar 1 % of
  negatives) at least twice the uniform share (ceil(1 % of n) / n for n = 2B - 2 negatives: 2/126 at B = 64);
* DCL's clamp off for most anchors: `clamp_frac` below 0.5 in the last window.
`harder_than_positive` is recorded as a diagnostic only (a dropout positive is very close to its anchor). The
checks and the uniform share are the package's (simcse_hn.study.pilot, what `simcse-hn-study pilot` reads a user's
plan with); this bench adds the lab's regimes, its saturated reference and its page, which `python -m bench.report
bench/results/pilot/pilot5.json` writes again from the record (bench/test_pilot.py recomputes every committed
pilot's verdicts from its runs).

Regimes (`--regimes`, at `--batch_size`): `random` batches; `topic-k<clusters>-s<share>`, topic batches
(`--topic_batches true`, clustered by the start model) at several cluster counts and within-cluster shares; and
`mined` / `mined-topic-k<clusters>-s<share>`, paired data with one mined hard negative per sentence (plan3.md): each
example is (sentence, the same sentence as its dropout positive, its most similar sentence of the whole shuffled
slice under `--mined_max_score`, by the start model through scripts/mine_negatives.py), in random or topic batches;
`queue-k<size>-m<momentum>`, random batches and a memory bank of that many entries (plan4.md).
`--random_arms` limits the arms of the `random` regime (the reference of the loss check needs InfoNCE alone).
Every run: builtin:all-MiniLM-L6-v2, pooler cls, MLP in training only, max length 32, lr 3e-5, the first
`--corpus_lines` sentences of the shuffled wiki slice (bench.common.shuffled_corpus), `--steps` optimizer steps,
logging every `--logging_steps`, no evaluation or checkpoints; one seed.

    python -m bench.pilot                             # the plan's grid; results bench/results/pilot/pilot.{json,md}
    python -m bench.pilot --resume                    # runs already finished are read, not run again
    python -m bench.pilot --model builtin:tiny-bert --steps 4 --logging_steps 2 --corpus_lines 256 --name pilot_smoke
                                                      # a smoke run (its page: bench/results/pilot/pilot_smoke.md)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from bench.common import RESULTS, ROOT, environment, environment_line, load_average, shuffled_corpus, write_report
from bench.quality import arm_flags
from simcse_hn.errors import UserError
from simcse_hn.modeling.loading import resolve_packaged
from simcse_hn.study import pilot as study_pilot
from simcse_hn.study.runs import run_module

OUT = RESULTS / "pilot"
SATURATED_LOSS = 0.0025  # InfoNCE's last-window loss at batch 64 in the saturated regime (bench/results/quality)
LOSS_RATIO, SHARE_RATIO, CLAMP_BELOW = 10, 2, 0.5  # plan.md's go criterion
REGIMES = ("random", "topic-k24-s1.0", "topic-k96-s1.0", "topic-k24-s0.5")
OBJECTIVES = ("infonce", "hcl", "dcl")
KEYS = ("loss", "pos_sim", "neg_sim", "harder_than_positive", "top1pct_weight_share", "neg_weight_max", "clamp_frac")


def objective_flags(arm: str) -> list[str]:
    """The objective keys of configs/unsup_bert_base_<arm>.yaml as flags (the study's arms, bench.quality.arm_flags);
    `<arm>@key=value,...` overrides keys of that config (plan.md's DCL follow-up: `dcl@dcl_tau_plus=1e-4`)."""
    arm, _, overrides = arm.partition("@")
    flags = arm_flags(arm)
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        flags += [f"--{key}", value]
    return flags


def is_mined(regime: str) -> bool:
    return regime == "mined" or regime.startswith("mined-")


def queue_of(regime: str) -> tuple[int, float] | None:
    """`queue-k<K>-m<momentum>` (random batches and a queue of K entries, plan4.md) -> (K, momentum); else None."""
    parts = regime.split("-")
    if parts[0] != "queue":
        return None
    try:
        if len(parts) != 3 or parts[1][:1] != "k" or parts[2][:1] != "m":
            raise ValueError(regime)
        return int(parts[1][1:]), float(parts[2][1:])
    except ValueError:
        raise SystemExit(f"error: --regimes: {regime!r} is not 'queue-k<size>-m<momentum>'") from None


def regime_flags(regime: str) -> list[str]:
    """`random`, `topic-k<K>-s<share>`, `mined`, `mined-topic-k<K>-s<share>` or `queue-k<K>-m<momentum>` as train.py
    flags (a mined regime's training file is chosen apart, `run_one`)."""
    if regime in ("random", "mined"):
        return []
    queue = queue_of(regime)
    if queue is not None:
        return ["--queue_size", str(queue[0]), "--momentum", str(queue[1])]
    parts = regime.removeprefix("mined-").split("-")
    try:
        if len(parts) != 3 or parts[0] != "topic" or parts[1][:1] != "k" or parts[2][:1] != "s":
            raise ValueError(regime)
        clusters, share = int(parts[1][1:]), float(parts[2][1:])
    except ValueError:
        raise SystemExit(f"error: --regimes: {regime!r} is not 'random', 'topic-k<clusters>-s<share>', 'mined' or "
                         "'mined-topic-k<clusters>-s<share>'") from None
    return ["--topic_batches", "true", "--topic_clusters", str(clusters), "--topic_share", str(share)]


def negatives_per_anchor(batch_size: int, regime: str) -> int:
    """A symmetric batch of B sentences: 2B - 2 negatives per row, and the K entries of a full queue (the package's
    count, simcse_hn.study.pilot); B mined examples (anchor, positive, negative): the other B - 1 positives and all B
    negatives."""
    if is_mined(regime):
        return 2 * batch_size - 1
    queue = queue_of(regime)
    return study_pilot.negatives_per_anchor({"per_device_train_batch_size": batch_size,
                                             "queue_size": queue[0] if queue else 0})  # fmt: skip


def uniform_top_share(batch_size: int, regime: str = "random") -> float:
    """The top-1 % share of uniform weights over the negatives of an anchor (`negatives_per_anchor`)."""
    return study_pilot.uniform_top_share(negatives_per_anchor(batch_size, regime))


def run_one(out: Path, corpus: Path, model: str, regime: str, arm: str, args: argparse.Namespace,
            mined: Path | None = None) -> dict:
    """Train one run (unless `--resume` finds it finished) and read its logging windows; a mined regime trains on
    `mined`, the others on `corpus`."""
    train_file = mined if is_mined(regime) else corpus
    state = out / f"checkpoint-{args.steps}" / "trainer_state.json"  # the one checkpoint, at the last step
    if not (args.resume and state.is_file()):
        command = ["--model_name_or_path", model, "--pooler", "cls",
                   "--mlp_only_train", "true", "--train_file", str(train_file), "--max_seq_length", "32",
                   "--per_device_train_batch_size", str(args.batch_size), "--learning_rate", "3e-5",
                   "--max_steps", str(args.steps), "--logging_steps", str(args.logging_steps),
                   "--eval_strategy", "no", "--save_steps", str(args.steps), "--save_total_limit", "1",
                   "--load_best_model_at_end", "false", "--report_to", "none",
                   "--disable_tqdm", "true", "--seed", str(args.seed), "--output_dir", str(out),
                   "--overwrite_output_dir", "true", *regime_flags(regime), *objective_flags(arm)]  # fmt: skip
        load, log = load_average(), out.parent / f"{out.name}.log"
        log.unlink(missing_ok=True)  # this run's log only
        try:  # as simcse-hn-study trains its runs
            seconds = run_module("simcse_hn.cli.train", command, str(ROOT), str(log), {**os.environ})
        except UserError as e:
            raise SystemExit(f"error: run {out.name}: {e}") from None
        (state.parent / "optimizer.pt").unlink(missing_ok=True)  # the logs are what the pilot keeps
        (out / "pilot_run.json").write_text(json.dumps({"seconds": seconds, "load_average_before": load}))
    timing = json.loads((out / "pilot_run.json").read_text()) if (out / "pilot_run.json").is_file() else {}
    seconds, load = timing.get("seconds"), timing.get("load_average_before")
    history = _history(state)
    windows = [{k: entry[k] for k in ("step", *KEYS) if k in entry} for entry in history if "loss" in entry]
    return {"regime": regime, "arm": arm, "seconds": seconds, "load_average_before": load, "windows": windows,
            "last": windows[-1] if windows else {}}  # fmt: skip


def _history(state: Path) -> list[dict]:
    if state.is_file():
        return json.loads(state.read_text(encoding="utf-8"))["log_history"]
    raise SystemExit(f"error: {state}: missing (the run did not finish)")


def first_passing(by: dict, regime: str, base: str, passes) -> str | None:
    """Of a regime's arms of objective `base` (`hcl`, `hcl@hcl_beta=0.2`, ...), in the order they ran, the first whose
    last window `passes`; else the first of them (None without any)."""
    arms = [arm for (r, arm) in by if r == regime and arm.partition("@")[0] == base]
    passing = [arm for arm in arms if passes(by[(regime, arm)])]
    return (passing or arms or [None])[0]


def verdicts(runs: list[dict], batch_size: int) -> dict[str, dict]:
    """Each regime against the plan's criteria (the package's checks, simcse_hn.study.pilot). With several settings of
    HCL or DCL in a regime (plan5.md), the first that meets its criterion (in the order they ran) stands for the
    objective."""
    by = {(r["regime"], r["arm"]): r["last"] for r in runs}
    random_loss = by.get(("random", "infonce"), {}).get("loss")
    out = {}
    for regime in dict.fromkeys(r["regime"] for r in runs):
        n = negatives_per_anchor(batch_size, regime)

        def share(last: dict | None, n: int = n) -> dict:
            return study_pilot.share_check((last or {}).get("top1pct_weight_share"), n, SHARE_RATIO)

        def clamp(last: dict | None) -> dict:
            return study_pilot.clamp_check((last or {}).get("clamp_frac"), CLAMP_BELOW)

        loss = by.get((regime, "infonce"), {}).get("loss")
        hcl = first_passing(by, regime, "hcl", lambda last: share(last)["ok"])
        dcl = first_passing(by, regime, "dcl", lambda last: clamp(last)["ok"])
        hcl_check, dcl_check = share(by.get((regime, hcl))), clamp(by.get((regime, dcl)))
        checks = {
            "loss_vs_saturated": study_pilot.loss_check(loss, SATURATED_LOSS, LOSS_RATIO)["ok"],
            "loss_vs_random": None if regime == "random" else study_pilot.loss_check(loss, random_loss,
                                                                                      LOSS_RATIO)["ok"],
            "hcl_top1pct_share": hcl_check["ok"],
            "dcl_clamp_off": dcl_check["ok"],
        }  # fmt: skip
        known = [v for k, v in checks.items() if v is not None]
        out[regime] = {"infonce_loss": loss, "hcl_top1pct_weight_share": hcl_check["value"],
                       "dcl_clamp_frac": dcl_check["value"], "hcl_share_needed": hcl_check["needed"],
                       "checks": checks, "go": bool(known) and all(known) and None not in checks.values()}
        if (hcl or "hcl") != "hcl" or (dcl or "dcl") != "dcl":  # settings other than the configs': say which
            out[regime].update(hcl_arm=hcl, dcl_arm=dcl)
    return out


def mined_lines(report: dict) -> list[str]:
    """How the mined regimes were made and what their share threshold is (nothing for pilots without them)."""
    mining = report.get("mining")
    if not mining:
        return []
    b = report["batch_size"]
    n, share = negatives_per_anchor(b, "mined"), uniform_top_share(b, "mined")
    return [f"Mined regimes: each of the {mining['examples']} examples is (sentence, the same sentence, its most "
            f"similar sentence among the {mining['pool']} of the shuffled slice with a score <= "
            f"{mining['max_score']}) by {report['model']} (scripts/mine_negatives.py; {mining['dropped']} sentences "
            f"kept no negative and are left out); mean score of the mined negatives {mining['mean_score']:.3f}. "
            f"{b} examples give {n} negatives per anchor: HCL's share must be >= "
            f"{SHARE_RATIO * share:.4f} (2 x uniform {share:.4f}).", ""]


def queue_lines(report: dict) -> list[str]:
    """What the queue regimes' threshold is (nothing for pilots without them)."""
    b, out = report["batch_size"], []
    for regime in report["verdicts"]:
        queue = queue_of(regime)
        if queue is not None:
            n, share = negatives_per_anchor(b, regime), uniform_top_share(b, regime)
            out.append(f"{regime}: random batches and a queue of {queue[0]} entries (momentum {queue[1]:g}; full from "
                       f"step {math.ceil(queue[0] / b) + 1} on), {n} negatives per anchor once full: HCL's share must "
                       f"be >= {SHARE_RATIO * share:.4f} (2 x uniform {share:.4f}).")  # fmt: skip
    return out + [""] if out else []


def mine(work: Path, lines: list[str], pool: Path, model: str, max_score: float) -> tuple[Path, dict]:
    """One mined hard negative per sentence of `lines` (scripts/mine_negatives.py, candidates the sentences of
    `pool`), written to work/mined.jsonl; -> (the file, what the report says of it)."""
    pairs, mined = work / "pairs.jsonl", work / "mined.jsonl"
    if not mined.is_file():
        pairs.write_text("".join(json.dumps({"anchor": t, "positive": t}) + "\n" for t in lines), encoding="utf-8")
        command = [sys.executable, str(ROOT / "scripts" / "mine_negatives.py"), "--train_file", str(pairs),
                   "--model", resolve_packaged(model), "--output", str(mined), "--corpus", str(pool),
                   "--num_negatives", "1", "--sampling_strategy", "top", "--max_score", str(max_score),
                   "--batch_size", "128"]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        (work / "mining.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        if done.returncode != 0:
            raise SystemExit(f"error: mining failed ({done.returncode}): {(done.stdout + done.stderr).strip()[-300:]}")
    rows = [json.loads(line) for line in mined.read_text(encoding="utf-8").splitlines() if line.strip()]
    scores = _cosines(model, [r["anchor"] for r in rows], [r["negative_1"] for r in rows])
    summary = {"examples": len(rows), "dropped": len(lines) - len(rows), "max_score": max_score,
               "pool": sum(1 for _ in pool.open(encoding="utf-8")), "mean_score": float(scores.mean()),
               "same_text": sum(r["anchor"] == r["negative_1"] for r in rows)}  # fmt: skip
    return mined, summary


def _cosines(model: str, first: list[str], second: list[str]):
    """The start model's cosine of each pair (first[i], second[i]), as sentence-transformers encodes."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(resolve_packaged(model))
    a = encoder.encode(first, batch_size=128, convert_to_tensor=True, normalize_embeddings=True)
    b = encoder.encode(second, batch_size=128, convert_to_tensor=True, normalize_embeddings=True)
    return (a * b).sum(dim=1).cpu()


def markdown(report: dict) -> str:
    b = report["batch_size"]
    lines = ["# Pilot: a regime in which the objectives act", "", environment_line(report["environment"]), "",
             f"Plan: bench/results/pilot/{report.get('plan', 'plan.md')} (committed before the first run). "
             f"{report['steps']} steps at "
             f"batch {b}, the first {report['corpus_lines']} sentences of the shuffled wiki slice, seed "
             f"{report['seed']}, model {report['model']}, logging every {report['logging_steps']} steps.",
             "", "## Against the go criterion (last logging window)", "",
             f"Thresholds: InfoNCE loss >= {LOSS_RATIO * SATURATED_LOSS:g} (10 x the saturated regime's "
             f"{SATURATED_LOSS}) and >= 10 x this pilot's random-batch run; HCL top-1 % weight share >= "
             f"{SHARE_RATIO * uniform_top_share(b):.4f} "
             f"(2 x uniform {uniform_top_share(b):.4f}); DCL clamp_frac < 0.5.", "",
             *mined_lines(report), *queue_lines(report),
             "| regime | InfoNCE loss | vs saturated | vs random | HCL top-1 % share | ok | DCL clamp | ok | go |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def show(value, digits=4):
        if isinstance(value, bool):
            return "yes" if value else "no"
        return "–" if value is None else f"{value:.{digits}g}"

    for regime, v in report["verdicts"].items():
        c = v["checks"]
        lines.append(f"| {regime} | {show(v['infonce_loss'])} | {show(c['loss_vs_saturated'])} | "
                     f"{show(c['loss_vs_random'])} | {show(v['hcl_top1pct_weight_share'])} | "
                     f"{show(c['hcl_top1pct_share'])} | {show(v['dcl_clamp_frac'])} | {show(c['dcl_clamp_off'])} | "
                     f"{'**go**' if v['go'] else 'no'} |")  # fmt: skip
    chosen = [f"{regime}: HCL {v['hcl_arm']}, DCL {v['dcl_arm']}" for regime, v in report["verdicts"].items()
              if "hcl_arm" in v]  # fmt: skip
    if chosen:
        lines += ["", "The settings that stand for HCL and DCL above (the first to meet its criterion, in the plan's "
                  "order; else the first run): " + "; ".join(chosen) + "."]  # fmt: skip
    lines += ["", "## Every run's last window", "",
              "| regime | arm | " + " | ".join(KEYS) + " | train s | load before |",
              "|---|---|" + "---|" * (len(KEYS) + 2)]  # fmt: skip
    for r in report["runs"]:
        last = r["last"]
        lines.append(f"| {r['regime']} | {r['arm']} | " + " | ".join(show(last.get(k)) for k in KEYS)
                     + f" | {show(r['seconds'], 4)} | {show((r['load_average_before'] or [None])[0], 3)} |")
    lines += ["", "`harder_than_positive` is a diagnostic here, not a criterion. Every window of every run is in "
              "the JSON."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--arms", default=",".join(OBJECTIVES), help="study arms: configs/unsup_bert_base_<arm>.yaml")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--corpus_lines", type=int, default=6400)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--model", default="builtin:all-MiniLM-L6-v2")
    parser.add_argument("--work_dir", default=None, help="run folders; default outputs/pilot in the checkout")
    parser.add_argument("--name", default="pilot", help="results file stem under bench/results/pilot/")
    parser.add_argument("--resume", action="store_true", help="read runs that already finished instead of rerunning")
    parser.add_argument("--plan", default="plan.md", help="the plan this pilot follows, in bench/results/pilot/")
    parser.add_argument("--random_arms", help="arms of the random regime (default: --arms)")
    parser.add_argument("--mined_max_score", type=float, default=0.9, help="mined regimes: skip nearer candidates")
    parser.add_argument("--pool_lines", type=int, help="mined regimes: candidates from the first N lines of the slice")
    args = parser.parse_args()
    regimes = [r for r in args.regimes.split(",") if r]
    arms = [a for a in args.arms.split(",") if a]
    for regime in regimes:
        regime_flags(regime)  # a bad name fails before anything runs
    for arm in arms:
        if not (ROOT / "configs" / f"unsup_bert_base_{arm.partition('@')[0]}.yaml").is_file():
            raise SystemExit(f"error: --arms: no configs/unsup_bert_base_{arm}.yaml")
    work = Path(args.work_dir) if args.work_dir else ROOT / "outputs" / args.name
    work.mkdir(parents=True, exist_ok=True)
    full = shuffled_corpus(work / "corpus_full.txt")
    lines = full.read_text(encoding="utf-8").splitlines()[: args.corpus_lines]
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    mined, mining = None, None
    if any(is_mined(regime) for regime in regimes):
        pool = work / "pool.txt"
        pool.write_text("\n".join(full.read_text(encoding="utf-8").splitlines()[: args.pool_lines]) + "\n",
                        encoding="utf-8")
        mined, mining = mine(work, lines, pool, args.model, args.mined_max_score)
        print(f"mined: {mining}", flush=True)
    random_arms = [a for a in (args.random_arms or args.arms).split(",") if a]
    env = environment()
    runs = []
    for regime in regimes:
        for arm in random_arms if regime == "random" else arms:
            folder = work / f"{regime}-{arm}-b{args.batch_size}-s{args.seed}"
            runs.append(run_one(folder, corpus, args.model, regime, arm, args, mined))
            last = runs[-1]["last"]
            print(f"{folder.name}: " + ", ".join(f"{k} {last[k]:.4g}" for k in KEYS if k in last), flush=True)
    report = {"environment": env, "model": args.model, "batch_size": args.batch_size, "steps": args.steps,
              "logging_steps": args.logging_steps, "corpus_lines": len(lines), "seed": args.seed,
              "plan": args.plan, "saturated_loss": SATURATED_LOSS, "runs": runs, "mining": mining,
              "verdicts": verdicts(runs, args.batch_size),
              "load_average_end": load_average()}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    write_report(OUT / args.name, report, markdown, echo=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
