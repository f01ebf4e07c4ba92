"""Training curves from what the Trainer writes: the log history of trainer_state.json (in the folder or its newest
complete checkpoint) and TensorBoard event files (under runs/, when the run used `--report_to tensorboard`).

Each metric is a series {step: value}: the training loss and the loss diagnostics every `logging_steps`, the STS-B
dev Spearman (and alignment / uniformity, when the trainer logs them) at every evaluation. trainer_state.json keeps
float64 values and wins where both sources have a step; the event files add what came after the last checkpoint.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simcse_hn.errors import DataError
from simcse_hn.evaluation.plots import (
    MARKERS,
    legend_below,
    new_figure,
    paper_style,
    plot_alignment_uniformity,
    save_figure,
    wrap,
)
from simcse_hn.evaluation.reports import model_label
from simcse_hn.files import checkpoints_by_step, portable_name

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
# the Trainer's end-of-training summary and bookkeeping: one value per run, not a curve
NOT_CURVES = {
    "step", "epoch", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second",
    "train_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
}  # fmt: skip
FIRST = ("loss", "eval_stsb_spearman", "eval_alignment", "eval_uniformity")
LAST = ("grad_norm", "learning_rate", "skipped_steps", "clamped_batches", "nonfinite_fallback")
TITLES = {
    "loss": "training loss",
    "eval_stsb_spearman": "STS-B dev Spearman x 100",
    "eval_alignment": "alignment, STS-B dev (lower is better)",
    "eval_uniformity": "uniformity, STS-B dev (lower is better)",
    "pos_sim": "positive cosine (mean)",
    "neg_sim": "negative cosine (mean)",
    "clamp_frac": "share of anchors clamped",
    "clamped_batches": "batches with every anchor clamped (so far)",
    "grad_norm": "gradient norm",
    "learning_rate": "learning rate",
}


@dataclass
class Curves:
    """One run's metrics: series {key: {step: value}}, the files they came from and the run's folder (when read from
    one)."""

    name: str
    series: dict[str, dict[int, float]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    folder: str | None = None

    def recorded_sources(self) -> list[str]:
        """The sources as a record names them (`files.portable_name`; relative to the run folder's parent)."""
        roots = () if self.folder is None else (os.path.dirname(os.path.abspath(self.folder)),)
        return [portable_name(source, roots) for source in self.sources]

    def steps(self, key: str) -> np.ndarray:
        return np.asarray(sorted(self.series.get(key, {})), dtype=np.int64)

    def values(self, key: str) -> np.ndarray:
        points = self.series.get(key, {})
        return np.asarray([points[s] for s in sorted(points)], dtype=np.float64)


def trainer_state_path(run: str) -> str | None:
    """The folder's own trainer_state.json, else the newest complete checkpoint's (the Trainer does not write one
    beside the final model)."""
    if os.path.isfile(os.path.join(run, TRAINER_STATE)):
        return os.path.join(run, TRAINER_STATE)
    # only reading its history: any checkpoint the Trainer finished writing (its state file comes last) will do
    for _, checkpoint in reversed(checkpoints_by_step(run)):
        if os.path.isfile(os.path.join(checkpoint, TRAINER_STATE)):
            return os.path.join(checkpoint, TRAINER_STATE)
    return None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def read_log_history(path: str) -> dict[str, dict[int, float]]:
    """trainer_state.json -> {key: {step: value}}, numbers only."""
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise DataError(f"{path}: no 'log_history' list; expected a Trainer's trainer_state.json")
    series: dict[str, dict[int, float]] = {}
    for entry in state["log_history"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        for key, value in entry.items():
            if key not in NOT_CURVES and _is_number(value):
                series.setdefault(key, {})[entry["step"]] = float(value)
    return series


def event_folders(run: str) -> list[str]:
    """Folders holding TensorBoard event files under run/runs (the Trainer's default logging dir) or run itself,
    oldest first (a resumed run writes a new one)."""
    files = glob.glob(os.path.join(run, "runs", "**", "events.out.tfevents.*"), recursive=True)
    files += glob.glob(os.path.join(run, "events.out.tfevents.*"))
    folders: dict[str, float] = {}
    for path in files:
        folder = os.path.dirname(path)
        folders[folder] = min(folders.get(folder, float("inf")), os.path.getmtime(path))
    return sorted(folders, key=folders.get)


def tag_key(tag: str) -> str:
    """TensorBoard tag -> log-history key: the Trainer writes 'train/x' for x and 'eval/x' for eval_x."""
    prefix, _, rest = tag.partition("/")
    if prefix == "train" and rest:
        return rest
    if prefix == "eval" and rest:
        return f"eval_{rest}"
    return tag.replace("/", "_")


def read_tensorboard(folder: str) -> dict[str, dict[int, float]]:
    # tensorboard: the dev extra, only for event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    series: dict[str, dict[int, float]] = {}
    for tag in accumulator.Tags().get("scalars", []):
        key = tag_key(tag)
        if key in NOT_CURVES:
            continue
        for event in accumulator.Scalars(tag):
            series.setdefault(key, {})[int(event.step)] = float(event.value)
    return series


def load_curves(run: str, name: str | None = None) -> Curves:
    """A run's curves from its output folder (or one checkpoint folder). DataError when it holds neither source."""
    if not os.path.isdir(run):
        raise DataError(f"{run}: no such folder")
    curves = Curves(name or model_label(run), folder=run)
    folders = event_folders(run)
    if folders:
        try:
            for folder in folders:  # later folders (a resumed run) override the steps they share
                for key, points in read_tensorboard(folder).items():
                    curves.series.setdefault(key, {}).update(points)
                curves.sources.append(folder)
        except ImportError:
            logger.warning("%s: TensorBoard event files found but tensorboard is not installed; skipping them", run)
    state = trainer_state_path(run)
    if state is not None:
        for key, points in read_log_history(state).items():
            curves.series.setdefault(key, {}).update(points)
        curves.sources.append(state)
    if not curves.sources:
        raise DataError(
            f"{run}: no {TRAINER_STATE} (in the folder or a checkpoint-N) and no TensorBoard events under runs/"
        )
    return curves


def ordered_keys(runs: Sequence[Curves]) -> list[str]:
    """Every key of any run: loss and the dev metrics first, the optimiser's bookkeeping last."""
    keys = {key for run in runs for key in run.series}
    middle = sorted(keys - set(FIRST) - set(LAST))
    return [k for k in FIRST if k in keys] + middle + [k for k in LAST if k in keys]


def is_constant(runs: Sequence[Curves], key: str) -> bool:
    values = np.concatenate([run.values(key) for run in runs])
    return values.size > 0 and bool(np.all(values == values[0]))


# --- charts and the summary ---


def _draw(ax, runs: Sequence[Curves], key: str) -> list:
    handles = []
    for k, run in enumerate(runs):
        steps, values = run.steps(key), run.values(key)
        if not steps.size:
            continue
        sparse = steps.size <= 30  # evaluations: a marker on each point
        (line,) = ax.plot(steps, values, color=f"C{k % 10}", marker=MARKERS[k % len(MARKERS)] if sparse else None,
                          ms=2.5, lw=1.0, label=run.name)  # fmt: skip
        handles.append(line)
    from matplotlib.ticker import MaxNLocator  # matplotlib: only where a chart is drawn

    ax.set_title(TITLES.get(key, key), loc="left")
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.grid(alpha=0.3)
    if key == "learning_rate":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    return handles


def plot_curve(runs: Sequence[Curves], key: str, path: str) -> None:
    """One metric over steps, one line per run, one paper column wide."""
    with paper_style():
        figure, ax = new_figure(height=2.1)
        handles = _draw(ax, runs, key)
        if len(runs) == 1:
            ax.set_title(f"{TITLES.get(key, key)}: {runs[0].name}", loc="left")
        legend_below(figure, len(handles), handles, [h.get_label() for h in handles])
        save_figure(figure, path)


def plot_overview(runs: Sequence[Curves], keys: Sequence[str], path: str) -> None:
    """Every metric in `keys` as a grid of panels (three per row, the full width of a page)."""
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    with paper_style():
        figure, axes = new_figure(width=7.0, height=1.7 * nrows + 0.5, nrows=nrows, ncols=ncols)
        axes = axes if nrows * ncols > 1 else [[axes]]  # one metric: new_figure gives a single Axes
        handles = []
        for k, key in enumerate(keys):
            drawn = _draw(axes[k // ncols][k % ncols], runs, key)
            handles = drawn if len(drawn) > len(handles) else handles
        for k in range(len(keys), nrows * ncols):
            axes[k // ncols][k % ncols].set_visible(False)
        figure.suptitle(wrap("Training curves: " + ", ".join(run.name for run in runs), 140), x=0.01, ha="left")
        legend_below(figure, len(handles), handles, [h.get_label() for h in handles])
        save_figure(figure, path)


def plot_alignment_uniformity_steps(runs: Sequence[Curves], path: str) -> bool:
    """The SimCSE-style chart for every evaluation of each run that logged eval_alignment and eval_uniformity;
    False (nothing written) when none did."""
    series = []
    for run in runs:
        a, u = run.series.get("eval_alignment", {}), run.series.get("eval_uniformity", {})
        steps = sorted(set(a) & set(u))
        if steps:
            series.append((run.name, [(f"step {s}", a[s], u[s]) for s in steps]))
    if not series:
        return False
    plot_alignment_uniformity(series, path, caption="STS-B dev at each evaluation (SimCSE protocol)")
    return True


def _fmt(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"


def curves_markdown(
    runs: Sequence[Curves], keys: Sequence[str], constant: Sequence[str], charts: Sequence[str]
) -> str:
    lines = ["# Training curves", ""]
    lines += ["| Run | Last step | Final loss | Best STS-B dev (step) | Last STS-B dev | Sources |"]
    lines += ["|:---|---:|---:|---:|---:|:---|"]
    for run in runs:
        steps = sorted({s for points in run.series.values() for s in points})
        loss = run.values("loss")
        dev = run.series.get("eval_stsb_spearman", {})
        best = max(dev, key=dev.get) if dev else None
        cells = [
            run.name,
            str(steps[-1]) if steps else "–",
            _fmt(loss[-1]) if loss.size else "–",
            f"{dev[best]:.2f} ({best})" if dev else "–",
            f"{dev[max(dev)]:.2f}" if dev else "–",
            ", ".join(f"`{s}`" for s in run.recorded_sources()),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "First -> last logged value, and the range over the run:", ""]
    lines += ["| Metric | " + " | ".join(run.name for run in runs) + " |", "|:---|" + "---:|" * len(runs)]
    for key in keys:
        cells = []
        for run in runs:
            values = run.values(key)
            cells.append(
                f"{_fmt(values[0])} -> {_fmt(values[-1])} ({_fmt(values.min())} to {_fmt(values.max())})"
                if values.size
                else "–"
            )
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if constant:
        values = ", ".join(f"{key} = {_fmt(next(iter(runs[0].series.get(key, {0: 0}).values())))}" for key in constant)
        lines += ["", f"Constant over every logged step (not drawn): {values}."]
    lines += ["", "Charts: " + ", ".join(f"`{c}`" for c in charts) + "."]
    return "\n".join(lines) + "\n"


def _series_record(run: Curves) -> dict[str, dict[str, float]]:
    return {key: {str(step): value for step, value in sorted(points.items())} for key, points in run.series.items()}


def save_record(runs: Sequence[Curves], path: str) -> None:
    """The runs' curves as curves.json: {name: {"sources": [...], "series": {key: {step: value}}}}, what
    `load_record` reads back (a run's curves kept without its training folder)."""
    record = {run.name: {"sources": run.recorded_sources(), "series": _series_record(run)} for run in runs}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


def load_record(path: str) -> list[Curves]:
    """The runs of a curves.json that `save_record` (or eval/curves.py) wrote, under their recorded names."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    runs = []
    for name, run in record.items() if isinstance(record, dict) else ():
        if not isinstance(run, dict) or not isinstance(run.get("series"), dict):
            raise DataError(f"{path}: run {name!r} has no 'series'; expected a curves.json of eval/curves.py")
        series = {key: {int(step): float(v) for step, v in points.items()} for key, points in run["series"].items()}
        runs.append(Curves(name, series, [*run.get("sources", []), path], folder=os.path.dirname(path)))
    if not runs:
        raise DataError(f"{path}: no runs; expected a curves.json of eval/curves.py")
    return runs


def write_curves(runs: Sequence[Curves], output: str, keys: Sequence[str] | None = None) -> list[str]:
    """curves.md, curves.json (every series), curves.png (all metrics) and one curve_<key>.png per metric into
    `output`, plus alignment_uniformity.png when the runs logged both. -> the files written."""
    os.makedirs(output, exist_ok=True)
    every = ordered_keys(runs)
    if keys is not None:
        missing = [k for k in keys if k not in every]
        if missing:
            raise DataError(f"--keys: {', '.join(missing)} not logged by any run; logged: {', '.join(every)}")
    # without a choice of keys, metrics that never moved (no fallback, no skipped step) are listed, not drawn
    constant = [] if keys is not None else [k for k in every if is_constant(runs, k)]
    drawn = [k for k in (keys if keys is not None else every) if k not in constant]
    charts = []
    if drawn:
        plot_overview(runs, drawn, os.path.join(output, "curves.png"))
        charts.append("curves.png")
        for key in drawn:
            name = f"curve_{key.replace('/', '_')}.png"
            plot_curve(runs, key, os.path.join(output, name))
            charts.append(name)
    if plot_alignment_uniformity_steps(runs, os.path.join(output, "alignment_uniformity.png")):
        charts.append("alignment_uniformity.png")
    save_record(runs, os.path.join(output, "curves.json"))
    with open(os.path.join(output, "curves.md"), "w", encoding="utf-8") as f:
        f.write(curves_markdown(runs, drawn, constant, charts))
    return ["curves.md", "curves.json", *charts]
