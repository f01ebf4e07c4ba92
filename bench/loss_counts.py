"""What each loss call does, counted rather than timed: matrix-product FLOPs, (M, N) memory passes and operator calls
of one forward + backward, against the floors of bench/loss_overhead.py, before and after a change.

Counts do not depend on the machine's load, so they can be taken while other work runs, where the wall times of
bench/loss_overhead.py cannot. Three counts per call, from one forward + backward under torch's dispatcher:

* matrix FLOPs (torch.utils.flop_counter.FlopCounterMode), as a multiple of the floor's (its three 2N x 2N x d
  products: the similarities and their two gradients);
* (M, N) passes: the bytes of every tensor of at least M x N elements that an operator reads or writes, in units of
  one float32 (M, N) matrix (a bool mask counts 1/4, an int64 index 2, a (3, M, N) stack 3; views are free; an
  in-place scatter counts its index and source, not the tensor it writes a few entries of; an allocation counts
  nothing, an `out=` tensor once, as written);
* operators: every aten call but views, detach and alias (each costs a few microseconds of dispatch on a CPU,
  whatever its size).

The calls are those of bench/loss_overhead.py `loss_runs` (symmetric form, ProGCL after its warm-up): `trainer`
(simcse_hn.training.step.contrastive_loss), `plain` (loss_fn(z, z, positive_index)), `plain mask` (the same with
the standard mask), `plain gathered` (loss_fn(z[a], z, positive_index, mask): anchors of their own, the general
path) and `plain indexed` (the same call with anchor_index=a, where the code has it).

    python -m bench.loss_counts --before 61ebf8c   # results: bench/results/loss_counts.{json,md}
    python -m bench.loss_counts --quick            # a smoke run: 2N = 64, d = 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS, DIM = 1024, 768  # issue 70's size: 2N = 1024, d = 768
CALLS = ("trainer", "plain", "plain mask", "plain gathered", "plain indexed")
MAX_STEPS = 1000
ALLOCATIONS = {"aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided", "aten::empty_like"}
# in-place operators that write only the entries their index names
SPARSE_WRITES = {"aten::scatter_", "aten::scatter_add_", "aten::index_put_", "aten::index_fill_", "aten::index_add_"}


def count_calls(rows: int, dim: int) -> dict:
    """{run: {"flops": ..., "passes": ..., "ops": ...}} for the floors and every objective's calls, counted with the
    simcse_hn that `import simcse_hn` finds (this checkout's, or another's through PYTHONPATH)."""
    import torch
    import torch.nn.functional as F
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    from simcse_hn.losses import build_loss
    from simcse_hn.losses.targets import LossContext, contrastive_targets
    from simcse_hn.training.step import contrastive_loss

    cells = rows * rows
    skipped = {"aten::detach", "aten::alias", "aten::lift_fresh"}

    class Traffic(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view or func._schema.name in skipped:
                return out
            self.ops += 1
            if func._schema.name in ALLOCATIONS:  # memory handed out, not written
                return out
            # an `out=` tensor is written (counted with the result), not read
            inputs = tree_leaves((args, {k: v for k, v in (kwargs or {}).items() if k != "out"}))
            tensors = [*inputs, *tree_leaves(out)]
            if func._schema.name in SPARSE_WRITES:  # writes its index's entries into self: self is not streamed
                tensors = [t for t in tensors if not (isinstance(t, torch.Tensor) and t.data_ptr() == out.data_ptr())]
            for tensor in tensors:
                if isinstance(tensor, torch.Tensor) and tensor.numel() >= cells:
                    self.bytes += tensor.numel() * tensor.element_size()
            return out

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(rows * 7 + dim)
    h = torch.randn(rows, dim, generator=generator)
    weight = torch.randn(dim, dim, generator=generator) / dim**0.5
    z = torch.tanh(h @ weight).requires_grad_()
    anchor_rows, positive_index, negative_mask = contrastive_targets(rows, "symmetric")
    excluded = ~negative_mask.clone().index_put_((anchor_rows, positive_index), torch.tensor(True))

    def floor() -> torch.Tensor:
        zn = F.normalize(z, dim=-1)
        logits = (zn @ zn.T / 0.05).fill_diagonal_(float("-inf"))
        return F.cross_entropy(logits, torch.arange(rows) ^ 1)

    def floor_gathered() -> torch.Tensor:
        logits = F.normalize(z[anchor_rows], dim=-1) @ F.normalize(z, dim=-1).T / 0.05
        return F.cross_entropy(logits.masked_fill(excluded, float("-inf")), positive_index)

    runs = {"floor": floor, "floor gathered": floor_gathered}
    from simcse_hn.losses import benchmark_settings

    for name, (loss_name, options) in benchmark_settings().items():
        options = {**options, **({"warmup_ratio": 0.0} if loss_name == "progcl" else {})}
        loss_fn = build_loss(loss_name, temperature=0.05, **options)
        head = loss_fn.needs_head_inputs
        features = {"anchor_features": h, "candidate_features": h} if head else {}
        context = LossContext(step=MAX_STEPS, max_steps=MAX_STEPS, **features)
        if head:
            features = {"anchor_features": h[anchor_rows], "candidate_features": h}
        gathered = LossContext(step=MAX_STEPS, max_steps=MAX_STEPS, **features)
        calls = {
            "trainer": lambda f=loss_fn, hi=(h if head else None): contrastive_loss(
                f, z, form="symmetric", head_inputs=hi, step=MAX_STEPS, max_steps=MAX_STEPS
            ),
            "plain": lambda f=loss_fn, c=context: f(z, z, positive_index, None, c),
            "plain mask": lambda f=loss_fn, c=context: f(z, z, positive_index, negative_mask, c),
            "plain gathered": lambda f=loss_fn, c=gathered: f(z[anchor_rows], z, positive_index, negative_mask, c),
            "plain indexed": lambda f=loss_fn, c=gathered: f(
                z[anchor_rows], z, positive_index, negative_mask, c, anchor_index=anchor_rows
            ),
        }
        for call, run in calls.items():
            runs[f"{name} {call}"] = lambda run=run: run().loss

    counts = {}
    for name, run in runs.items():
        try:
            run().backward()  # warm-up: lazily built caches (ProGCL's triangle) are not counted
        except TypeError:  # a call this code does not have (anchor_index before it existed)
            continue
        z.grad = None
        with FlopCounterMode(display=False) as flops:
            run().backward()
        z.grad = None
        traffic = Traffic()
        with traffic:
            run().backward()
        z.grad = None
        counts[name] = {"flops": flops.get_total_flops(), "passes": traffic.bytes / (4 * cells), "ops": traffic.ops}
    return counts


def counts_at(revision: str, rows: int, dim: int) -> dict:
    """count_calls with the package of another revision (`git archive` of simcse_hn into a temporary folder),
    counted in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", revision, "simcse_hn"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": tmp}
        command = [sys.executable, __file__, "--emit", "--rows", str(rows), "--dim", str(dim)]
        out = subprocess.run(command, cwd=tmp, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def markdown(record: dict) -> str:
    from bench.common import environment_line

    after, before = record["counts"], record.get("before", {})
    floor = after["floor"]["flops"]
    names = [n for n in after if not n.startswith("floor")]
    lines = [
        "# What each loss call does, counted",
        "",
        environment_line(record["environment"], load=False) + f" 2N = {record['rows']}, d = {record['dim']}, one "
        "forward + backward per call (bench/loss_counts.py: matrix FLOPs as a multiple of the floor's three "
        "products; (M, N) passes: bytes of tensors of at least M x N elements read or written, in float32 (M, N) "
        "matrices; operators: aten calls but views). Counts, not times: the machine's load does not change them."
        + (f" Before: {record['before_revision']}." if before else ""),
        "",
        "| call | matrix FLOPs / floor | (M, N) passes | operators |",
        "|---|---|---|---|",
    ]

    def cell(name: str, key: str, fmt: str) -> str:
        now = format(after[name][key] / floor if key == "flops" else after[name][key], fmt)
        if name not in before:
            return now + (" (new)" if before else "")
        was = format(before[name][key] / before["floor"]["flops"] if key == "flops" else before[name][key], fmt)
        return now if was == now else f"{was} -> {now}"

    for name in ["floor", "floor gathered", *names]:
        lines.append(
            f"| {name} | {cell(name, 'flops', '.2f')} | {cell(name, 'passes', '.1f')} | {cell(name, 'ops', 'd')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--before", default=None, help="a git revision whose code is counted beside this checkout's")
    parser.add_argument("--quick", action="store_true", help="2N = 64, d = 32: a smoke run of the script")
    parser.add_argument("--name", default=None, help="results file stem (default loss_counts)")
    parser.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)  # counts_at's subprocess
    args = parser.parse_args()
    rows, dim = (64, 32) if args.quick else (args.rows, args.dim)
    if args.emit:
        print(json.dumps(count_calls(rows, dim)))
        return
    sys.path.insert(0, str(ROOT))
    from bench.common import RESULTS, environment, write_report

    record = {"environment": environment(), "rows": rows, "dim": dim, "counts": count_calls(rows, dim)}
    if args.before:
        record["before_revision"] = args.before
        record["before"] = counts_at(args.before, rows, dim)
    name = args.name or ("loss_counts_quick" if args.quick else "loss_counts")
    write_report(RESULTS / name, record, markdown, echo=True)


if __name__ == "__main__":
    main()
