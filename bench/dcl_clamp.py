"""How often does DCL's lower clamp hold, and how strongly does it debias where it does not? On real SimCSE batches:
all-MiniLM-L6-v2, wiki sentences, two dropout views in train mode (64 sentences = 128 rows), with the `cls` pooler
and a fresh MLP head (what the loss sees when training starts) and with mean pooling (a trained embedding space).

For every tau+ and temperature: the clamped fraction of anchors (DCLLoss's `clamp_frac`) and, over the anchors not
clamped, the median share tau+ n e^{l_ip} / R_i of the negative sum that the debiasing removes (0: plain InfoNCE).

    python -m bench.dcl_clamp            # results: bench/results/dcl_clamp.{json,md}
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from bench.common import RESULTS, SHARED_DATA, environment, environment_line, minilm_path, write_report
from simcse_hn.data.collator import SimCSECollator, model_inputs
from simcse_hn.losses import DCLLoss
from simcse_hn.losses.base import cosine_similarities
from simcse_hn.losses.targets import build_targets
from simcse_hn.modeling.loading import load_tokenizer
from simcse_hn.modeling.model import SimCSEModel

TAU_PLUS = (1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.05, 0.1)
TEMPERATURES = (0.05, 0.1, 0.2, 0.5)  # SimCSE's 0.05 ... the DCL paper's 0.5 (CIFAR/STL, tau+ 0.1)
POOLERS = ("cls", "avg")


def corpus(seed: int = 0) -> list[str]:
    """The wiki slice in a fixed shuffled order (its file order is topically clustered)."""
    import random

    lines = [line for line in (SHARED_DATA / "corpus" / "wiki1m_subset.txt").read_text("utf-8").splitlines() if line]
    random.Random(seed).shuffle(lines)
    return lines


def load_minilm(pooler: str, seed: int = 0):
    """all-MiniLM-L6-v2 with `pooler`; `cls` gets a fresh MLP head (seeded), as train.py builds it."""
    torch.manual_seed(seed)
    path = minilm_path()
    return SimCSEModel.from_pretrained(path, pooler=pooler), load_tokenizer(path)


@torch.no_grad()
def dropout_views(model, tokenizer, sentences: list[str], max_length: int = 32, seed: int = 0) -> torch.Tensor:
    """Rows [a, a', b, b', ...] of one forward pass in train mode (two dropout masks per sentence). -> (2B, D)"""
    model.train()
    torch.manual_seed(seed)
    return model(**model_inputs(SimCSECollator(tokenizer, max_length)(sentences))).embeddings.float()


def debias_stats(z: torch.Tensor, tau_plus: float, temperature: float) -> dict:
    targets = build_targets(z.shape[0], "symmetric")
    out = DCLLoss(temperature, tau_plus=tau_plus).compute(z, targets)
    sim = cosine_similarities(z, z).double()
    logits = sim / temperature
    pos = logits.gather(1, targets.positive_index[:, None]).squeeze(1)
    log_r = torch.logsumexp(logits.masked_fill(~targets.negative_mask, float("-inf")), dim=1)
    n = targets.negative_mask.sum(dim=1).double()
    share = (tau_plus * n * (pos - log_r).exp()).clamp_max(1.0)  # tau+ n e^{l_p} / R
    open_rows = share < 1.0
    return {
        "clamp_frac": out.metrics["clamp_frac"].item(),
        "median_share_removed": share[open_rows].median().item() if open_rows.any() else None,
    }


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# DCL's lower clamp on real SimCSE batches",
        "",
        f"{environment_line(env, load=False)} {report['seconds']} s, load average "
        f"{' / '.join(map(str, report['load_average']))} (1/5/15 min, 2 cores) "
        "at the start. all-MiniLM-L6-v2, "
        f"{report['batches']} batches of {report['sentences']} wiki sentences (= {2 * report['sentences']} rows, two "
        "dropout views in train mode), max length 32, symmetric form (n = 2N - 2 negatives per anchor).",
        "",
        "Cell: clamped fraction of anchors, mean over batches (in brackets: over the anchors not clamped, the median "
        "share tau+ n e^{l_ip} / R_i of the negative sum the debiasing removes; '-' when every anchor is clamped).",
        "",
    ]
    for pooler in POOLERS:
        stats = report["similarities"][pooler]
        lines += [
            f"## pooler `{pooler}`" + (" (fresh MLP head)" if pooler == "cls" else " (mean pooling)"),
            "",
            f"positive cosine {stats['pos_sim']:.3f}, negative cosine mean {stats['neg_sim']:.3f} "
            f"(std {stats['neg_std']:.3f}, row maximum {stats['neg_row_max']:.3f} on average)",
            "",
            "| temperature | " + " | ".join(f"tau+ {t:g}" for t in TAU_PLUS) + " |",
            "|---|" + "---|" * len(TAU_PLUS),
        ]
        for temperature in TEMPERATURES:
            cells = []
            for tau_plus in TAU_PLUS:
                cell = report["results"][pooler][str(temperature)][str(tau_plus)]
                share = "-" if cell["median_share_removed"] is None else f"{cell['median_share_removed']:.2f}"
                cells.append(f"{cell['clamp_frac']:.2f} ({share})")
            lines.append(f"| {temperature:g} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--sentences", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start, load = time.time(), os.getloadavg()
    sentences = corpus()
    report = {"batches": args.batches, "sentences": args.sentences, "tau_plus": TAU_PLUS,
              "temperatures": TEMPERATURES, "results": {}, "similarities": {}}
    for pooler in POOLERS:
        model, tokenizer = load_minilm(pooler)
        views = [dropout_views(model, tokenizer, sentences[b * args.sentences:(b + 1) * args.sentences], seed=b)
                 for b in range(args.batches)]
        targets = build_targets(views[0].shape[0], "symmetric")
        sims = [cosine_similarities(z, z) for z in views]
        neg = [s[targets.negative_mask] for s in sims]
        report["similarities"][pooler] = {
            "pos_sim": sum(s.gather(1, targets.positive_index[:, None]).mean().item() for s in sims) / len(sims),
            "neg_sim": sum(x.mean().item() for x in neg) / len(neg),
            "neg_std": sum(x.std().item() for x in neg) / len(neg),
            "neg_row_max": sum(s.masked_fill(~targets.negative_mask, -2).max(1).values.mean().item()
                               for s in sims) / len(sims),
        }
        report["results"][pooler] = {}
        for temperature in TEMPERATURES:
            row = report["results"][pooler][str(temperature)] = {}
            for tau_plus in TAU_PLUS:
                per_batch = [debias_stats(z, tau_plus, temperature) for z in views]
                shares = [b["median_share_removed"] for b in per_batch if b["median_share_removed"] is not None]
                row[str(tau_plus)] = {
                    "clamp_frac": sum(b["clamp_frac"] for b in per_batch) / len(per_batch),
                    "clamp_frac_per_batch": [round(b["clamp_frac"], 4) for b in per_batch],
                    "median_share_removed": sorted(shares)[len(shares) // 2] if shares else None,
                }
        print(pooler, {t: {k: v["clamp_frac"] for k, v in r.items()} for t, r in report["results"][pooler].items()},
              flush=True)
    report.update(environment=environment(), seconds=round(time.time() - start),
                  load_average=[round(x, 2) for x in load])
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_report(RESULTS / "dcl_clamp", report, markdown)


if __name__ == "__main__":
    main()
