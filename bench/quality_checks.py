"""What bench/quality.py checks before it reports: a sweep point whose setting cannot take effect at its batch (it
cannot differ from its arm), and runs of one arm trained or evaluated by other code or on other data."""

from __future__ import annotations

from simcse_hn.losses.progcl import FIT_PAIRS


def sweep_no_op(arm: str, changes: list[str], batch: int) -> str | None:
    """Why the sweep point (`changes` to `arm`'s config) is the arm itself at `batch`, or None when it can differ.
    ProGCL samples fit_pairs of a batch's 2N(2N-1)/2 pairs only when there are more: with no more, every fit already
    uses all pairs, so `--progcl_fit_pairs 0` (all) changes nothing."""
    if arm.startswith("progcl") and "--progcl_fit_pairs" in changes:
        pairs = 2 * batch * (2 * batch - 1) // 2
        fitted = int(changes[changes.index("--progcl_fit_pairs") + 1])
        if min(fitted or pairs, pairs) == min(FIT_PAIRS, pairs):
            return (f"no-op: a batch of {batch} has {pairs:,} pairs, no more than fit_pairs {FIT_PAIRS:,}, "
                    "so the arm's fit already uses every pair")  # fmt: skip
    return None


def mixed_provenance(runs: dict) -> list[str]:
    """One line per arm and batch whose runs record more than one training data hash or code hash, or whose
    evaluation ran other code than its training: such runs are not one arm's repeats."""
    groups: dict[tuple, list[dict]] = {}
    for entry in runs.values():
        groups.setdefault((entry["arm"], entry.get("batch_size")), []).append(entry.get("provenance") or {})
    problems = []
    for (arm, batch), records in sorted(groups.items(), key=str):
        for field in ("train_data_sha256", "train_code_sha256"):
            seen = {r.get(field) for r in records if r.get(field)}
            if len(seen) > 1:
                problems.append(f"{arm} at batch {batch}: {len(seen)} different {field} over its {len(records)} runs")
        mixed = [r for r in records if r.get("eval_code_sha256") and r.get("train_code_sha256")
                 and r["eval_code_sha256"] != r["train_code_sha256"]]  # fmt: skip
        if mixed:
            problems.append(f"{arm} at batch {batch}: {len(mixed)} runs evaluated by other code than trained them")
    return problems
