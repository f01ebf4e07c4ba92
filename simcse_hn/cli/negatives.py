"""What each objective does to the hardest in-batch negatives: the page a researcher reads to see whether the
"hard negatives" of a batch are paraphrases (false negatives) or real negatives, and how each objective weighs them.

    python eval/negatives.py MODEL CORPUS [--batches 2] [--batch_size 64] [--anchors 5] [--top 5] \
        [--objectives NAME,NAME,...] [--seed 0] [--output DIR]

Samples `--batches` random batches of `--batch_size` sentences from CORPUS (a training file: .txt, .jsonl, .csv),
embeds each as training does (rows [a, a', b, b', ...], the model in train mode: two dropout views, no gradient),
and for the first `--anchors` sentences of each batch lists their `--top` most similar in-batch negatives
(symmetric form) with the cosine and the weight each objective gives them (mean one over the anchor's negatives;
an objective with uniform weights weighs every negative 1; one with a warm-up as after it). `--objectives` takes
`--loss` values (default: every built-in objective), a class of yours as module:Class too. Prints the Markdown and
writes negatives.md and negatives.json to --output (default: beside the model, MODEL-negatives). One `error: ...`
line and exit 2 for a bad argument or file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys

from simcse_hn.cli.answers import OneLineParser
from simcse_hn.errors import UserError

logger = logging.getLogger("eval.negatives")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="A SimCSE output folder, a Hub id or builtin:tiny-bert.")
    parser.add_argument("corpus", help="Training sentences: .txt (one per line), .jsonl or .csv (--text_column).")
    parser.add_argument("--text_column", default="text")
    parser.add_argument("--batches", type=int, default=2, help="Random batches to look at.")
    parser.add_argument("--batch_size", type=int, default=64, help="Sentences per batch (training's batch size).")
    parser.add_argument("--anchors", type=int, default=5, help="Anchors listed per batch.")
    parser.add_argument("--top", type=int, default=5, help="Most similar negatives listed per anchor.")
    parser.add_argument("--objectives", default=None, help="Comma-separated --loss values (default: the built-ins).")
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--max_seq_length", type=int, default=32, help="Training's token limit.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="Folder for negatives.md/json (default: MODEL-negatives).")
    return parser


def check(args) -> list[str]:
    from simcse_hn.losses import BUILTIN, ObjectiveError, resolve_objective

    names = list(BUILTIN) if args.objectives is None else [n.strip() for n in args.objectives.split(",") if n.strip()]
    if not names:
        raise UserError("--objectives: empty; give --loss values, e.g. infonce,hcl")
    for name in names:
        try:
            resolve_objective(name)
        except ObjectiveError as e:
            raise UserError(f"--objectives: {e}") from None
    for flag in ("batches", "anchors", "top"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.batch_size < 2:
        raise UserError(f"--batch_size must be >= 2 (a sentence needs negatives), got {args.batch_size}")
    if args.anchors > args.batch_size:
        raise UserError(f"--anchors {args.anchors} is more than the --batch_size {args.batch_size}")
    return names


def weigh_batch(model, tokenizer, sentences: list[str], names: list[str], temperature: float, max_length: int):
    """-> cosine (2B, 2B), {objective: weights (2B, 2B), mean one over each row's negatives}, negative_mask,
    {objective: its diagnostics on the batch}"""
    import torch

    from simcse_hn.data.collator import SimCSECollator, model_inputs
    from simcse_hn.losses import build_loss
    from simcse_hn.losses.targets import build_targets
    from simcse_hn.training.step import contrastive_loss

    batch = SimCSECollator(tokenizer, max_length)(sentences)
    text_ids, batch = batch["text_ids"], model_inputs(batch)
    model.train()  # the two dropout views training sees
    losses = {name: build_loss(name, temperature=temperature) for name in names}
    needs_head = any(loss.needs_head_inputs for loss in losses.values()) and model.mlp is not None
    with torch.no_grad():
        output = model(**batch, return_head_inputs=needs_head)  # embeddings (2B, D)
        mask = build_targets(output.embeddings.shape[0]).negative_mask  # (2B, 2B), the training step's
        unit = torch.nn.functional.normalize(output.embeddings.double(), dim=1)
        sim = unit @ unit.T
        weights, diagnostics = {}, {}
        for name, loss_fn in losses.items():  # at the schedule's end: past any warm-up
            out = contrastive_loss(loss_fn, output.embeddings, head_inputs=output.head_inputs, text_ids=text_ids,
                                   step=1, max_steps=1)  # fmt: skip
            weights[name] = mask.double() if out.weights is None else out.weights.double()
            diagnostics[name] = {key: round(float(value), 6) for key, value in out.metrics.items()}
    return sim, weights, mask, diagnostics


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    names = check(args)
    from simcse_hn.data.sentences import load_sentences
    from simcse_hn.losses.targets import RowLayout
    from simcse_hn.modeling.loading import load_tokenizer, resolve_packaged
    from simcse_hn.modeling.model import SimCSEModel

    sentences = load_sentences(args.corpus, args.text_column)
    if len(sentences) < args.batch_size:
        raise UserError(f"{args.corpus}: {len(sentences)} sentences, fewer than one batch of {args.batch_size}")
    path = resolve_packaged(args.model, field="model")
    tokenizer = load_tokenizer(path, field="model")
    model = SimCSEModel.from_pretrained(path)
    rng = random.Random(args.seed)
    report = {"model": args.model, "corpus": os.path.basename(args.corpus), "objectives": names,
              "temperature": args.temperature, "batch_size": args.batch_size, "seed": args.seed,
              "batches": []}  # fmt: skip
    for _ in range(args.batches):
        texts = rng.sample(sentences, args.batch_size)
        sim, weights, mask, diagnostics = weigh_batch(
            model, tokenizer, texts, names, args.temperature, args.max_seq_length
        )
        anchors, layout = [], RowLayout()  # the rows [a, a', b, b', ...] of weigh_batch
        for k in range(args.anchors):
            row = layout.rows_per_text * k  # sentence k's first view
            order = sim[row].masked_fill(~mask[row], float("-inf")).argsort(descending=True)[: args.top]
            negatives = [
                {
                    "text": texts[int(j) // layout.rows_per_text],
                    "cosine": round(float(sim[row, j]), 4),
                    "same_text": texts[int(j) // layout.rows_per_text] == texts[k],
                    "weights": {name: round(float(weights[name][row, j]), 4) for name in names},
                }
                for j in order
            ]
            positive = round(float(sim[row, row + 1]), 4)
            anchors.append({"text": texts[k], "positive_cosine": positive, "negatives": negatives})
        report["batches"].append({"anchors": anchors, "diagnostics": diagnostics})
    markdown = render(report)
    output = args.output or default_output(args.model)
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "negatives.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    with open(os.path.join(output, "negatives.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    print(markdown, end="")
    logger.info("wrote negatives.md and negatives.json to %s", output)
    return 0


def default_output(model: str) -> str:
    """Beside a local model folder (MODEL-negatives), else negatives-NAME in the current folder."""
    if os.path.isdir(model):
        return os.path.normpath(model) + "-negatives"
    return "negatives-" + model.rstrip("/").split("/")[-1].split(":")[-1]


def render(report: dict) -> str:
    names = report["objectives"]
    lines = [
        f"# Hardest in-batch negatives: {report['model']}",
        "",
        f"Corpus `{report['corpus']}`, {len(report['batches'])} random batches of {report['batch_size']} sentences "
        f"(seed {report['seed']}), two dropout views each, symmetric form, temperature {report['temperature']}. "
        "Weights have mean one over an anchor's negatives (uniform weights: 1 for every negative; an objective with "
        "a warm-up after it). A `=` marks a negative that is the anchor's own text.",
        "",
    ]
    from simcse_hn.losses import resolve_objective

    for b, batch in enumerate(report["batches"], start=1):
        for name, metrics in batch["diagnostics"].items():
            note = resolve_objective(name).describe_batch(metrics)
            if note:
                lines += [f"Batch {b}: {note}", ""]
        for anchor in batch["anchors"]:
            lines += [f"## Batch {b}: {anchor['text']}", "", f"Positive (its other view): cosine "
                      f"{anchor['positive_cosine']:.4f}", ""]  # fmt: skip
            lines.append("| negative | cosine | " + " | ".join(names) + " |")
            lines.append("|:--|--:|" + "--:|" * len(names))
            for negative in anchor["negatives"]:
                text = negative["text"].replace("|", "\\|")
                mark = "= " if negative["same_text"] else ""
                cells = " | ".join(f"{negative['weights'][name]:.3f}" for name in names)
                lines.append(f"| {mark}{text} | {negative['cosine']:.4f} | {cells} |")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
