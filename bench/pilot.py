"""The pilots of the hard-negative study (bench/results/pilot/pilot*.json, each after its plan*.md): every committed
pilot's verdicts from its runs' last windows, by the package's checks (simcse_hn.study.pilot), and its page
(`python -m bench.report bench/results/pilot/pilot5.json`). Regimes: `random`, `topic-k<clusters>-s<share>`, `mined`,
`queue-k<size>-m<momentum>`; `<objective>@key=value` is an objective at another setting. A pilot of today is
`simcse-hn-study pilot` (docs/studies.md).
"""

from __future__ import annotations

import math

from bench.common import environment_line
from simcse_hn.study import pilot as study_pilot

SATURATED_LOSS = 0.0025  # InfoNCE's last-window loss at batch 64 in the saturated regime (bench/results/quality)
LOSS_RATIO, SHARE_RATIO, CLAMP_BELOW = 10, 2, 0.5  # plan.md's go criterion
KEYS = ("loss", "pos_sim", "neg_sim", "harder_than_positive", "top1pct_weight_share", "neg_weight_max", "clamp_frac")


def is_mined(regime: str) -> bool:
    return regime == "mined" or regime.startswith("mined-")


def queue_of(regime: str) -> tuple[int, float] | None:
    """`queue-k<K>-m<momentum>` (random batches and a queue of K entries, plan4.md) -> (K, momentum); else None."""
    parts = regime.split("-")
    return (int(parts[1][1:]), float(parts[2][1:])) if parts[0] == "queue" else None


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
