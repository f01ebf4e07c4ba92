"""ProGCL's Beta mixture on real SimCSE batches (all-MiniLM-L6-v2, wiki sentences, two dropout views in train mode;
`cls` pooler with a fresh MLP head, and mean pooling). Two measurements:

1. Which component is "true negatives": 2N = 64 rows (32 sentences, the last one repeating the first exactly or
   nearly), 100 seeds; how often a duplicate pair gets more weight than its row's median under each rule.
2. A fit on M sampled pairs against the fit on every pair, at 2N = 1024: the components' means, standard deviations
   and weights, the weights w_ij, and the EM time per fit (one thread).

    python -m bench.progcl_fit           # results: bench/results/progcl_fit.{json,md}
"""

from __future__ import annotations

import os
import time

import torch

from bench.common import RESULTS, environment, environment_line, write_report
from bench.dcl_clamp import corpus, dropout_views, load_minilm
from simcse_hn.losses import ProGCLLoss
from simcse_hn.losses.base import cosine_similarities
from simcse_hn.losses.progcl import (
    EPS,
    BetaMixture,
    _features,
    _log_likelihoods,
    beta_mixture_em,
    identify_components,
    negative_posteriors,
)
from simcse_hn.losses.targets import build_targets

SEEDS = 100
SAMPLES = (1024, 4096, 16384, 65536)
REPEATS = 10
RULES = ("lower mean", "component 0 (reference)", "larger pi", "larger pi + tail guard (ours)")


def near_duplicate(sentence: str) -> str:
    words = sentence.split()
    return " ".join(words[:-1]) if len(words) > 3 else sentence + "."


def weights(x: torch.Tensor, fit: BetaMixture, true: int, negative_mask: torch.Tensor) -> torch.Tensor:
    """ProGCL-weight's w_ij = B_ij / mean_k B_ik with B = p(component `true` | x) x. -> (M, N)"""
    lik = torch.empty((2, x.numel()), dtype=torch.float64)
    _log_likelihoods(_features(x.reshape(-1)), fit.alpha, fit.beta, fit.pi, out=lik).exp_()
    b = torch.where(negative_mask, (lik[true] / (lik.sum(0) + EPS)).reshape(x.shape) * x, 0.0)
    return b / (b.sum(1, keepdim=True) / negative_mask.sum(1, keepdim=True))


def duplicate_fails(w: torch.Tensor, negative_mask: torch.Tensor, rows: int) -> bool:
    """Does any (duplicate, copy) pair, in either direction, weigh more than its row's median?"""
    pairs = [(i, j) for i in (0, 1) for j in (rows - 2, rows - 1)]
    return any(w[a, b] > w[a][negative_mask[a]].median() for i, j in pairs for a, b in ((i, j), (j, i)))


def rule_study(model, tokenizer, sentences: list[str], kind: str) -> dict:
    targets = build_targets(64, "symmetric")
    fails = dict.fromkeys(RULES, 0)
    guarded = 0
    for seed in range(SEEDS):
        batch = sentences[seed * 31:(seed + 1) * 31]
        batch.append(batch[0] if kind == "exact" else near_duplicate(batch[0]))
        z = dropout_views(model, tokenizer, batch, seed=seed)
        sim = cosine_similarities(z, z).double()
        x = ((sim + 1) / 2).clamp(EPS, 1 - EPS)
        fit = beta_mixture_em(x, mask=targets.negative_mask)
        means = fit.alpha / (fit.alpha + fit.beta)
        for rule, true in zip(RULES[:3], (int(means.argmin()), 0, int(fit.pi.argmax()))):
            fails[rule] += duplicate_fails(weights(x, fit, true, targets.negative_mask), targets.negative_mask, 64)
        out = ProGCLLoss(0.05, fit_pairs=0).compute(z, targets)  # the library's rule and guard, end to end
        guarded += int(out.metrics["bmm_unseparated"].item())
        fails[RULES[3]] += duplicate_fails(out.weights, targets.negative_mask, 64)
    return {"fails": fails, "unseparated": guarded}


def summary(fit: BetaMixture) -> dict:
    order, separated = identify_components(fit)
    alpha, beta, pi = (p.index_select(0, order) for p in fit[:3])  # [true, false]
    mean = alpha / (alpha + beta)
    return {"mean": mean, "sd": (mean * (1 - mean) / (alpha + beta + 1)).sqrt(), "pi": pi, "separated": separated}


def full_fit(z: torch.Tensor) -> tuple[ProGCLLoss, torch.Tensor]:
    """The fit on every unordered negative pair and its weights. -> fitted loss, w (M, N)"""
    targets = build_targets(z.shape[0], "symmetric")
    loss_fn = ProGCLLoss(0.05, fit_pairs=0)
    b, _, _ = loss_fn.fit_hardness(cosine_similarities(z, z), targets.negative_mask, square=True)
    return loss_fn, b / (b.sum(1, keepdim=True) / targets.negative_mask.sum(1, keepdim=True))


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def sample_study(z: torch.Tensor, other: BetaMixture) -> dict:
    """Sampled fits of batch z against its full fit; `other`: the full fit of another batch, whose weights on z
    show how much the fit moves from one batch to the next anyway."""
    mask = build_targets(z.shape[0], "symmetric").negative_mask
    sim = cosine_similarities(z, z)
    full_fn, full_w = full_fit(z)
    full = summary(full_fn.stored_fit())
    x = ((sim.double() + 1) / 2).clamp(EPS, 1 - EPS)
    pairs = x[torch.triu(mask, diagonal=1)]  # (P,) every unordered negative pair
    other_b = torch.where(mask, negative_posteriors(x, other)[0] * x, 0.0)
    other_diff = (other_b / (other_b.sum(1, keepdim=True) / mask.sum(1, keepdim=True)) - full_w)[mask].abs()
    out = {"pairs": pairs.numel(), "full": {k: v.tolist() for k, v in full.items()},
           "em_ms_full": median_ms(lambda: beta_mixture_em(pairs), 5),
           "other_batch_fit": {"w_p99": other_diff.quantile(0.99).item(), "w_max": other_diff.max().item()},
           "samples": {}}
    for m in SAMPLES:
        errors = {"mean": [], "sd_rel": [], "pi": [], "w_p99": [], "w_max": [], "same_decision": []}
        for r in range(REPEATS):
            torch.manual_seed(r)
            fn = ProGCLLoss(0.05, fit_pairs=m)
            b, _, _ = fn.fit_hardness(sim, mask, square=True)
            got = summary(fn.stored_fit())
            w = b / (b.sum(1, keepdim=True) / mask.sum(1, keepdim=True))
            diff = (w - full_w)[mask].abs()
            errors["mean"].append((got["mean"] - full["mean"]).abs().max().item())
            errors["sd_rel"].append(((got["sd"] - full["sd"]).abs() / full["sd"]).max().item())
            errors["pi"].append((got["pi"] - full["pi"]).abs().max().item())
            errors["w_p99"].append(diff.quantile(0.99).item())
            errors["w_max"].append(diff.max().item())
            errors["same_decision"].append(bool(got["separated"] == full["separated"]))
        worst = {k: (all(v) if k == "same_decision" else max(v)) for k, v in errors.items()}
        sample = pairs[torch.randint(0, pairs.numel(), (m,))]
        out["samples"][str(m)] = {**worst, "em_ms": median_ms(lambda sample=sample: beta_mixture_em(sample), 20)}
    return out


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# ProGCL's Beta mixture on real SimCSE batches",
        "",
        f"{environment_line(env, load=False)} {report['seconds']} s, load average "
        f"{' / '.join(map(str, report['load_average']))} (1/5/15 min, 2 cores) "
        "at the start. all-MiniLM-L6-v2, wiki sentences, two dropout views in train mode, max length 32; pooler `cls` "
        "with a fresh MLP head (what the loss sees when training starts) and mean pooling (a trained space). The "
        "fit: 10 EM iterations from Beta(1, 2), Beta(2, 1), pi = (0.95, 0.05), negatives only.",
        "",
        "## 1. Which component holds the true negatives",
        "",
        f"2N = 64 rows: 31 sentences and a duplicate of the first, exact or near (last word dropped), {SEEDS} seeds "
        "(batches and dropout masks). A seed fails when any of the 8 (duplicate, copy) pairs weighs more than its "
        "row's median under ProGCL-weight. Rules: the component with the lower mean, the reference code's component "
        "0, the one with the larger pi, and ours (larger pi, and uniform weights when the false component's upper "
        "tail is not the heavier one: beta_false >= beta_true).",
        "",
        "| pooler | duplicate | " + " | ".join(RULES) + " | unseparated (uniform) |",
        "|---|---|" + "---|" * (len(RULES) + 1),
    ]
    for key, row in report["rules"].items():
        pooler, kind = key.split("/")
        cells = " | ".join(f"{row['fails'][rule]}/{SEEDS}" for rule in RULES)
        lines.append(f"| {pooler} | {kind} | {cells} | {row['unseparated']}/{SEEDS} |")
    lines += [
        "",
        "## 2. Fitting a sample of M pairs instead of every pair (2N = 1024)",
        "",
        f"Per batch, the full fit on every unordered negative pair against {REPEATS} sampled fits per M (uniform, "
        "with replacement, as `fit_pairs` draws them); worst over the repetitions: the largest error of the two "
        "components' means (absolute), standard deviations (relative) and pi (absolute), the 99th percentile and "
        "maximum of |w_M - w_full| over the negatives (weights have mean 1 per row), whether the separation decision "
        "agreed in every repetition; EM time per fit (median, one thread). For scale, 'other batch': the weights "
        "this batch gets from the full fit of the other batch of the same pooler, against its own full fit: how "
        "much the fit moves from one step to the next anyway.",
        "",
        "| pooler | batch | pairs | full EM ms | M | EM ms | mean err | sd rel err | pi err | w p99 | w max "
        "| same decision |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, batches in report["sampling"].items():
        for b, entry in enumerate(batches):
            other = entry["other_batch_fit"]
            lines.append(f"| {key} | {b} | {entry['pairs']} | {entry['em_ms_full']:.0f} | other batch | | | | | "
                         f"{other['w_p99']:.3f} | {other['w_max']:.3f} | |")
            for m, e in entry["samples"].items():
                lines.append(
                    f"| {key} | {b} | {entry['pairs']} | {entry['em_ms_full']:.0f} | {m} | {e['em_ms']:.1f} | "
                    f"{e['mean']:.4f} | {e['sd_rel']:.3f} | {e['pi']:.3f} | {e['w_p99']:.3f} | {e['w_max']:.3f} | "
                    f"{'yes' if e['same_decision'] else 'no'} |"
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    torch.set_num_threads(1)
    start, load = time.time(), os.getloadavg()
    sentences = corpus()
    report = {"seeds": SEEDS, "samples": SAMPLES, "repeats": REPEATS, "rules": {}, "sampling": {}}
    for pooler in ("cls", "avg"):
        model, tokenizer = load_minilm(pooler)
        for kind in ("exact", "near"):
            report["rules"][f"{pooler}/{kind}"] = rule_study(model, tokenizer, sentences, kind)
            print(pooler, kind, report["rules"][f"{pooler}/{kind}"], flush=True)
        offset = SEEDS * 31
        views = [dropout_views(model, tokenizer, sentences[offset + b * 512:offset + (b + 1) * 512], seed=b)
                 for b in range(2)]
        fits = [full_fit(z)[0].stored_fit() for z in views]
        report["sampling"][pooler] = [sample_study(z, fits[1 - b]) for b, z in enumerate(views)]
        print(pooler, "sampling done", flush=True)
    report.update(environment=environment(), seconds=round(time.time() - start),
                  load_average=[round(x, 2) for x in load])
    write_report(RESULTS / "progcl_fit", report, markdown)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, and no stray arguments
    main()
