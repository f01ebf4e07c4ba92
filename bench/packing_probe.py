"""Would padding-free ("packed") training reach more of the machine's limit than length groups? A probe, not a
feature: the trainer's forward is not changed by it.

Packed: a batch's tokens without any padding, all in one row of the encoder (position ids restart at each sentence),
so that every per-token matrix product is one product over all the batch's tokens; attention still runs per sentence
(an attention function registered with transformers' AttentionInterface scatters the packed queries, keys and values
into the padded layout, runs scaled_dot_product_attention with the key mask, and gathers the result back). That is
what padding-free training on GPUs does (varlen attention kernels); the question here is whether it pays on a CPU.

Against, in the same process, step by step in turn (the order rotated each round), on the same batches:
  groups8  the trainer's CPU default, SimCSEModel with 8 length groups (6 % of the positions are padding);
  padded   one padded forward per batch (29 % padding);
  packed   the packed forward (no padding);
  packed-compiled  the packed forward with the encoder under torch.compile (inductor, dynamic shapes: the token
           count changes every batch; compiled once before the rounds, its time not in them; --no_compiled skips it).
Each step: forward of the batch's 2B rows (SimCSE: each sentence twice, dropout on), pooler cls + MLP head, a plain
InfoNCE (cross-entropy over the cosine / 0.05 of the two halves, the same loss for every arm), backward, fused AdamW.
FLOPs and the limit as in bench/train_throughput.py (common.encoder_flops over the sentences' own tokens,
common.matmul_rates in the same process). The packed forward's embeddings are checked against the padded forward's
(dropout off) before timing. One profiled step per arm splits the time into matrix products and the rest.

    python -m bench.packing_probe            # all-MiniLM-L6-v2: results/packing_probe.{json,md}
    python -m bench.packing_probe --quick    # a tiny BERT built in code (packing_probe_quick)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import (
    RESULTS,
    EncoderShape,
    best_rates,
    encoder_flops,
    environment,
    environment_line,
    limit_fraction,
    limit_sentence,
    matmul_rates,
    training_bench_inputs,
    write_report,
)
from bench.step_profile import operator_table

ATTENTION = "simcse_packed_probe"
ARMS = ("groups8", "padded", "packed", "packed-compiled")


class PackPlan:
    """Where a padded batch's real tokens are. attention_mask (B, T), right padding."""

    def __init__(self, attention_mask):
        import torch

        self.rows, self.width = attention_mask.shape
        self.tokens = attention_mask.reshape(-1).nonzero().squeeze(1)  # (N,) flat positions of the real tokens
        self.key_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        lengths = attention_mask.sum(1)  # (B,)
        self.starts = torch.cumsum(lengths, 0) - lengths  # (B,) each sentence's first token in the packed row
        positions = torch.arange(self.width, device=attention_mask.device).expand(self.rows, -1)  # (B, T)
        self.position_ids = positions.reshape(-1)[self.tokens][None]  # (1, N)


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface: with a `pack_plan`, attention within each sentence of a packed row
    (query/key/value (1, heads, N, d) -> (1, N, heads, d)); without one, transformers' sdpa attention."""
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plan = kwargs.pop("pack_plan", None)
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)  # fmt: skip
    heads, size = query.shape[1], query.shape[3]

    def padded(x):  # (1, heads, N, d) -> (B, heads, T, d), zeros at the padding
        flat = x[0].transpose(0, 1).reshape(-1, heads * size)  # (N, heads*d)
        out = flat.new_zeros(plan.rows * plan.width, heads * size).index_copy(0, plan.tokens, flat)
        return out.view(plan.rows, plan.width, heads, size).transpose(1, 2)

    out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value), attn_mask=plan.key_mask,
                                         dropout_p=dropout, scale=scaling)  # fmt: skip
    out = out.transpose(1, 2).reshape(plan.rows * plan.width, heads, size).index_select(0, plan.tokens)
    return out.unsqueeze(0), None  # (1, N, heads, d)


def packed_embeddings(model, input_ids, attention_mask, encoder=None):
    """SimCSEModel (pooler cls) over a packed batch: the CLS row of each sentence through the MLP head; `encoder`:
    the model's encoder or a compiled one. -> (B, D)"""
    import torch

    plan = PackPlan(attention_mask)
    ids = input_ids.reshape(-1)[plan.tokens][None]  # (1, N)
    encoder = model.encoder if encoder is None else encoder
    out = encoder(input_ids=ids, position_ids=plan.position_ids, token_type_ids=torch.zeros_like(ids), pack_plan=plan,
                  return_dict=True)  # fmt: skip
    cls = out.last_hidden_state[0, plan.starts]  # (B, H)
    return model.mlp(cls) if model.uses_head else cls


def register() -> None:
    """The probe's attention function, under ATTENTION, with sdpa's mask function: a name without a mask function
    gets no padding mask at all, and the padded forwards under it would attend to the padding."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def load(model_path: str):
    from transformers import AutoModel, AutoTokenizer

    from simcse_hn.modeling.model import SimCSEModel

    register()
    encoder = AutoModel.from_pretrained(model_path)
    if encoder.config.model_type != "bert":
        raise SystemExit(f"the probe packs BERT's absolute positions; {model_path} is {encoder.config.model_type}")
    model = SimCSEModel(encoder, "cls")
    return model, AutoTokenizer.from_pretrained(model_path)


def max_differences(model, batch) -> dict:
    """Largest |difference| of the embeddings (dropout off, head on) from the padded forward under transformers'
    own sdpa attention: of the packed forward, and of the padded forward under the probe's attention function
    (what the groups8 and padded arms run)."""
    import torch

    model.eval()
    model.mlp_only_train = False
    model.length_groups = 1
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        model.encoder.set_attn_implementation("sdpa")
        reference = model(ids, mask).embeddings
        model.encoder.set_attn_implementation(ATTENTION)
        padded = model(ids, mask).embeddings
        packed = packed_embeddings(model, ids, mask)
    model.mlp_only_train = True
    model.train()
    return {"packed": float((packed - reference).abs().max()), "padded": float((padded - reference).abs().max())}


def run(
    model_path: str,
    corpus: Path,
    batch_size: int,
    max_length: int,
    rounds: int,
    warmup: int,
    threads: int,
    arms: tuple[str, ...] = ARMS,
):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(42)
    model, tokenizer = load(model_path)
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = warmup + rounds

    def batch(step):
        sentences = lines[step * batch_size : (step + 1) * batch_size]
        return tokenizer(sentences + sentences, padding=True, truncation=True, max_length=max_length,
                         return_tensors="pt")  # fmt: skip

    differences = max_differences(model, batch(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)
    labels = torch.arange(batch_size)
    labels = torch.cat([labels + batch_size, labels])

    def step(arm, features):
        ids, mask = features["input_ids"], features["attention_mask"]
        if arm.startswith("packed"):
            z = packed_embeddings(model, ids, mask, compiled if arm == "packed-compiled" else None)
        else:
            model.length_groups = 8 if arm == "groups8" else 1
            z = model(ids, mask).embeddings
        z = F.normalize(z, dim=-1)
        logits = (z @ z.T / 0.05).fill_diagonal_(float("-inf"))
        F.cross_entropy(logits, labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    compiled, compile_seconds = None, None
    if "packed-compiled" in arms:
        compiled = torch.compile(model.encoder, dynamic=True)
        start = time.perf_counter()
        for index in range(2):  # the first batch compiles, the second shows no new graph is needed
            step("packed-compiled", batch(index))
        compile_seconds = time.perf_counter() - start

    shape = EncoderShape.of(model.config)
    first = batch(0)
    rates = [matmul_rates(shape, int(first["attention_mask"].sum()), training=True)]
    seconds = {arm: [] for arm in arms}
    useful = []
    for index in range(steps):
        features = batch(index)
        for arm in arms[index % len(arms) :] + arms[: index % len(arms)]:
            start = time.perf_counter()
            step(arm, features)
            if index >= warmup:
                seconds[arm].append(time.perf_counter() - start)
        if index >= warmup:
            lengths = features["attention_mask"].sum(1).tolist()
            useful.append(encoder_flops(shape, lengths, training=True, head_rows=len(lengths))["useful"])
    rates.append(matmul_rates(shape, int(first["attention_mask"].sum()), training=True))
    limit = best_rates(*rates)

    profile = {}
    features = batch(steps)
    for arm in arms:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            step(arm, features)
        profile[arm] = operator_table(profiler, steps=1, rows=8)

    results = {}
    for arm in arms:
        ratios = [a / b for a, b in zip(seconds[arm], seconds["groups8"])]
        results[arm] = {"median_step_s": statistics.median(seconds[arm]), "step_seconds": seconds[arm],
                        "vs_groups8": statistics.median(ratios),
                        **limit_fraction(sum(useful), sum(seconds[arm]), limit)}  # fmt: skip
    return {
        "max_embedding_difference": differences,
        "arms": results,
        "profile": profile,
        "rates": limit,
        "compile_seconds": compile_seconds,
    }


def op_label(op: str) -> str:
    """A profiler key, short: aten's prefix dropped, inductor's '## Call CompiledFxGraph <hash> ##' as 'compiled
    graph'."""
    return "compiled graph" if "CompiledFxGraph" in op else op.removeprefix("aten::")


def markdown(report: dict) -> str:
    r = report["result"]
    lines = ["# Padding-free (packed) training steps against length groups (a probe)", "",
             environment_line(report["environment"]), "",
             f"Model {report['model_label']}, pooler cls + MLP head, batch {report['batch_size']} sentences "
             f"({2 * report['batch_size']} rows, dropout on), max length {report['max_length']}, a plain InfoNCE, "
             f"fused AdamW, {report['threads']} torch thread(s); {report['rounds']} rounds after {report['warmup']} "
             "warm-up, each round one step of every arm on the same batch, order rotated (bench/packing_probe.py's "
             "docstring). Fraction = useful FLOP/s (the sentences' own tokens) / the limit.", "",
             "Embeddings (dropout off) against the padded forward under transformers' sdpa attention: max "
             f"|difference| of the packed forward {r['max_embedding_difference']['packed']:.2e}, of the padded "
             f"forward under the probe's attention function {r['max_embedding_difference']['padded']:.2e}.", "",
             "| arm | median step s | vs groups8 (median per round) | of the limit |",
             "|---|---|---|---|"]  # fmt: skip
    for arm, a in r["arms"].items():
        lines.append(f"| {arm} | {a['median_step_s']:.3f} | {a['vs_groups8']:.3f} | {a['fraction_of_limit']:.1%} |")
    if r.get("compile_seconds") is not None:
        lines += ["", f"packed-compiled: compiling and its first two steps took {r['compile_seconds']:.0f} s, before "
                  "the rounds."]  # fmt: skip
    lines += ["", f"Limit: {limit_sentence(r['rates'])}.", "",
              "One profiled step per arm (torch.profiler, self CPU time; products = bench/step_profile.py's "
              "MATMUL_OPS: mm, addmm, bmm, baddbmm, the attention kernel):", "",
              "| arm | self CPU ms | products ms | the rest ms | top operators (ms) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for arm, p in r["profile"].items():
        total = p["self_cpu_ms_per_step"]
        top = ", ".join(f"{op_label(e['op'])} {e['ms_per_step']:.0f}" for e in p["top"][:6])
        lines.append(f"| {arm} | {total:.0f} | {total * p['matmul_share']:.0f} | "
                     f"{total * (1 - p['matmul_share']):.0f} | {top} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny BERT built in code, a smoke run")
    parser.add_argument("--model", default=None, help="default all-MiniLM-L6-v2 (the bench extra)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--no_compiled", action="store_true", help="skip the packed-compiled arm")
    args = parser.parse_args(argv)
    corpus, model, label = training_bench_inputs(args.quick, args.model)
    if args.quick:
        args.rounds, args.warmup, args.batch_size = 3, 1, 16
    report = {"environment": environment(), "model_label": label, "rounds": args.rounds, "warmup": args.warmup,
              "threads": args.threads, "batch_size": args.batch_size, "max_length": args.max_length}  # fmt: skip
    start = time.time()
    arms = tuple(arm for arm in ARMS if not (args.no_compiled and arm == "packed-compiled"))
    report["result"] = run(str(model), corpus, args.batch_size, args.max_length, args.rounds, args.warmup,
                           args.threads, arms)  # fmt: skip
    report["seconds"] = round(time.time() - start)
    name = "packing_probe_quick" if args.quick else "packing_probe"
    write_report(RESULTS / name, report, markdown, echo=True)


if __name__ == "__main__":
    main()
