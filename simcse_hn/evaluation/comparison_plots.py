"""The charts of eval/compare.py: STS by group (means and t-intervals over seeds), each group's difference to the
baseline with its paired interval, and the alignment/uniformity geometry of every run or checkpoint."""

from __future__ import annotations

import os

import numpy as np

from simcse_hn.evaluation import plots
from simcse_hn.evaluation.plots import MARKERS, legend_below, new_figure, paper_style, plot_results, save_figure, wrap


def plot_groups(runs: list[dict], comparison: dict, path: str, title: str | None) -> None:
    """Group means with their 95% t-intervals when some group has several seeds, else every run."""
    groups = comparison["groups"]
    if all(len(g["runs"]) == 1 for g in groups.values()):
        plot_results([(r["label"], r["results"]) for r in runs], path, title=title)
        return
    template = runs[0]["results"]
    means, intervals = [], {}
    for name, group in groups.items():
        scores = group["scores"]
        tasks = {c: {"spearman": s["mean"]} for c, s in scores.items() if c != "Avg." and np.isfinite(s["mean"])}
        means.append((name, {**template, "tasks": tasks, "average": scores["Avg."]["mean"]}))
        intervals[name] = {c: (s["low"], s["high"]) for c, s in scores.items() if s["n"] > 1}
    seeds = sorted({len(g["runs"]) for g in groups.values()})
    label = f"95% t-interval over {'/'.join(map(str, seeds))} seeds"
    plot_results(means, path, title=title or "STS, mean over seeds", intervals=intervals, interval_label=label)


def plot_deltas(comparison: dict, path: str) -> None:
    """Each group minus the baseline per task, with the paired t-interval (or, for one seed, the bootstrap's)."""
    columns = comparison["columns"]
    tests = comparison["tests"]
    with paper_style():
        figure, ax = new_figure(height=2.4)
        width = 0.7 / max(len(tests), 1)
        kinds = set()
        for k, (name, test) in enumerate(tests.items()):
            x, y, low, high = [], [], [], []
            for j, c in enumerate(columns):
                t, b = test["t_test"][c], test["bootstrap"].get(c)
                source = t if t["n"] > 1 else b
                if source is None or not np.isfinite(source["difference"]):
                    continue
                kinds.add("paired t" if source is t else "paired bootstrap")
                x.append(j + (k - (len(tests) - 1) / 2) * width)
                y.append(source["difference"])
                low.append(source["low"] if np.isfinite(source["low"]) else source["difference"])
                high.append(source["high"] if np.isfinite(source["high"]) else source["difference"])
            yerr = np.clip([np.subtract(y, low), np.subtract(high, y)], 0, None)
            ax.errorbar(x, y, yerr=yerr, fmt=MARKERS[k % len(MARKERS)], ms=3.5, capsize=1.5, color=f"C{k % 10}",
                        label=name)  # fmt: skip
        ax.axhline(0, color="0.3", lw=0.7)
        ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
        ax.set_ylabel(f"Δ Spearman x 100 vs {comparison['baseline']}")
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(wrap(f"Difference to {comparison['baseline']}, error bars: 95% {' / '.join(sorted(kinds))} "
                          "interval", 70), loc="left")  # fmt: skip
        legend_below(figure, len(tests), *ax.get_legend_handles_labels())
        save_figure(figure, path)


def checkpoint_step(run: dict) -> int | None:
    name = os.path.basename(os.path.normpath(str(run["results"].get("model", ""))))
    return int(name.split("-", 1)[1]) if name.startswith("checkpoint-") and name[11:].isdigit() else None


def plot_geometry(runs: list[dict], path: str) -> bool:
    """One point per run, a colour per group; a group that is one run's checkpoints is a path in step order."""
    members: dict[str, list[dict]] = {}
    for run in runs:
        if run["results"].get("alignment_uniformity"):
            members.setdefault(run["group"], []).append(run)
    series, connect = [], []
    for group, group_runs in members.items():
        steps = [checkpoint_step(run) for run in group_runs]
        one_run = len(group_runs) > 1 and None not in steps and len({run["seed"] for run in group_runs}) == 1
        if one_run:
            group_runs = [run for _, run in sorted(zip(steps, group_runs), key=lambda pair: pair[0])]
        points = []
        for run in group_runs:
            geometry = run["results"]["alignment_uniformity"]
            tag = (f"step {checkpoint_step(run)}" if one_run else f"seed {run['seed']}" if run["seed"] is not None
                   else run["label"])  # fmt: skip
            points.append((tag, geometry["alignment"], geometry["uniformity"]))
        series.append((group, points))
        connect.append(one_run)
    if not series:
        return False
    caption = "STS-B dev, one point per run or checkpoint (SimCSE protocol)"
    plots.plot_alignment_uniformity(series, path, caption=caption, connect=connect)  # looked up here: tests stand in
    return True
