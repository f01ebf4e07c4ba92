"""Charts, one paper column wide (matplotlib, Agg): the shared style (`paper_style`, `new_figure`, `save_figure`,
`legend_below`), the STS results chart (`plot_results`) and the alignment/uniformity chart
(`plot_alignment_uniformity`, SimCSE figure 2)."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Sequence

import numpy as np
from torch import Tensor

from simcse_hn.evaluation.reports import protocol, task_columns

logger = logging.getLogger(__name__)

EncodeFn = Callable[[list[str]], Tensor]


# Charts are drawn one paper column wide (3.4 in; ACL and ICML columns are 3.25-3.3 in) at 300 dpi, in 6-7 pt type,
# with the Agg canvas, so that no pyplot state or display backend is touched.
COLUMN_WIDTH = 3.4
PAPER_RC = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "legend.fontsize": 6.5,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.0,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def paper_style():
    import matplotlib  # matplotlib: only where a chart is drawn

    return matplotlib.rc_context(PAPER_RC)


def new_figure(width: float = COLUMN_WIDTH, height: float = 2.4, nrows: int = 1, ncols: int = 1):
    """-> (figure, axes): one Axes, or an (nrows, ncols) array of them; constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib: only where a chart is drawn
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    if nrows == ncols == 1:
        return figure, figure.add_subplot()
    return figure, figure.subplots(nrows, ncols, squeeze=False)


def save_figure(figure, path: str) -> None:
    figure.savefig(path, dpi=300, bbox_inches="tight", pad_inches=0.03)


def legend_below(figure_or_ax, entries: int, handles=None, labels=None) -> None:
    """A legend under the axes (it never covers data); nothing for a single entry (the title names it)."""
    if entries < 2:
        return
    from matplotlib.figure import Figure  # matplotlib: only where a chart is drawn

    kwargs = {"ncol": min(entries, 3), "frameon": False}
    if handles is not None:
        kwargs.update(handles=handles, labels=labels)
    if isinstance(figure_or_ax, Figure):
        figure_or_ax.legend(loc="outside lower center", **kwargs)
    else:
        figure_or_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), **kwargs)


def fitted_limits(lows: Sequence[float], highs: Sequence[float], top_room: float = 0.0) -> tuple[float, float]:
    """y limits around the data (not 0-100): differences of tenths stay visible. `top_room` adds a share of the
    span above, for value labels."""
    finite = [v for v in list(lows) + list(highs) if np.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    span = max(high - low, 0.2)
    return low - 0.12 * span, high + (0.12 + top_room) * span


def wrap(text: str, width: int = 72) -> str:
    return "\n".join(textwrap.wrap(text, width))


def plot_results(
    runs: Sequence[tuple[str, dict]],
    path: str,
    title: str | None = None,
    intervals: dict[str, dict[str, tuple[float, float]]] | None = None,
    interval_label: str | None = None,
) -> None:
    """STS scores as points (Spearman x 100), the protocol in the title, y fitted to the data.

    One run: the tasks and their average on one axis, each point labelled with its value. Several runs: one panel
    per task (and Avg.), each with its own fitted axis and the runs side by side in the same colour and marker in
    every panel, the legend under the panels. `intervals` {label: {task or "Avg.": (low, high)}} draws error bars,
    described by `interval_label` (e.g. "95% t-interval over 3 seeds").
    """
    columns = task_columns(runs) + ["Avg."]
    sickr_all = any(r.get("sickr_pairs") == "all" for _, r in runs)
    names = {c: c + (" (all)" if c == "SICK-R" and sickr_all else "") for c in columns}

    def value(results, column):
        if column == "Avg.":
            return results["average"]
        return results["tasks"][column]["spearman"] if column in results["tasks"] else np.nan

    def interval(label, column, v):
        low, high = (intervals or {}).get(label, {}).get(column, (v, v))
        return low, high

    heading = title or (runs[0][0] if len(runs) == 1 else "STS")
    caption = f"{heading}: Spearman x 100 of cosines; {'; '.join(sorted({protocol(r) for _, r in runs}))}"
    if interval_label:
        caption += f"; error bars: {interval_label}"
    with paper_style():
        if len(runs) == 1:
            label, results = runs[0]
            figure, ax = new_figure(height=2.3)
            x = np.arange(len(columns))
            values = [value(results, c) for c in columns]
            bounds = [interval(label, c, v) for c, v in zip(columns, values)]
            ax.errorbar(x, values, yerr=_yerr(values, bounds), fmt="o", ms=4, capsize=2, color="C0")
            for xi, v, (_, high) in zip(x, values, bounds):
                if np.isfinite(v):
                    ax.annotate(f"{v:.2f}", (xi, high), xytext=(0, 3), textcoords="offset points", ha="center",
                                fontsize=5.5)  # fmt: skip
            ax.axvline(len(columns) - 1.5, color="0.6", lw=0.6, ls=":")  # the average is not a task
            ax.set_xticks(x, [names[c] for c in columns], rotation=30, ha="right")
            ax.set_ylim(*fitted_limits([b[0] for b in bounds], [b[1] for b in bounds], top_room=0.12))
            ax.set_ylabel("Spearman x 100")
            ax.grid(axis="y", alpha=0.3)
            ax.set_title(wrap(caption), loc="left")
        else:
            ncols = 2
            nrows = -(-len(columns) // ncols)
            figure, axes = new_figure(height=1.05 * nrows + 0.7, nrows=nrows, ncols=ncols)
            handles = []
            for k, column in enumerate(columns):
                ax = axes[k // ncols][k % ncols]
                values = [value(r, column) for _, r in runs]
                bounds = [interval(label, column, v) for (label, _), v in zip(runs, values)]
                for j, ((label, _), v, b) in enumerate(zip(runs, values, bounds)):
                    handle = ax.errorbar([j], [v], yerr=_yerr([v], [b]), fmt=MARKERS[j % len(MARKERS)], ms=3.5,
                                         capsize=1.5, color=f"C{j % 10}", label=label)  # fmt: skip
                    if k == 0:
                        handles.append(handle)
                ax.set_xlim(-0.7, len(runs) - 0.3)
                ax.set_xticks([])
                ax.set_ylim(*fitted_limits([b[0] for b in bounds], [b[1] for b in bounds]))
                ax.yaxis.set_major_locator(_locator())
                ax.grid(axis="y", alpha=0.3)
                ax.set_title(names[column], pad=2)
            for k in range(len(columns), nrows * ncols):
                axes[k // ncols][k % ncols].set_visible(False)
            figure.supylabel("Spearman x 100", fontsize=7)
            figure.suptitle(wrap(caption, 80), fontsize=7, x=0.02, ha="left")
            legend_below(figure, len(runs), handles, [label for label, _ in runs])
        save_figure(figure, path)


def _yerr(values, bounds) -> np.ndarray:
    """(2, n) distances below and above each value, as errorbar wants them (0 where there is no interval)."""
    v = np.asarray(values, dtype=float)
    return np.stack([v - np.asarray([b[0] for b in bounds]), np.asarray([b[1] for b in bounds]) - v]).clip(min=0)


def _locator():
    from matplotlib.ticker import MaxNLocator  # matplotlib: only where a chart is drawn

    return MaxNLocator(nbins=4, min_n_ticks=3)


# --- the SimCSE-style chart: uniformity on x, alignment on y, lower left is better ---


def plot_alignment_uniformity(
    series: Sequence[tuple[str, Sequence[tuple[str, float, float]]]],
    path: str,
    caption: str | None = None,
    connect: bool | Sequence[bool] = True,
) -> None:
    """One marker per checkpoint or run, written as a PNG one paper column wide.

    series: [(label, [(point tag, alignment, uniformity), ...]), ...]. With `connect` (one flag, or one per series),
    a series of several points
    (one run's checkpoints, in step order) is a path from a hollow first marker to a filled last one, its first and
    last tags written beside them; without it (runs of one objective, several seeds) its points are separate
    markers of one colour, each tagged. A single point carries its tag when that differs from the label.
    """
    with paper_style():
        figure, ax = new_figure(height=3.0)
        flags = [connect] * len(series) if isinstance(connect, bool) else list(connect)
        for k, ((label, points), path_of_points) in enumerate(zip(series, flags)):
            color = f"C{k % 10}"
            u, a = [p[2] for p in points], [p[1] for p in points]
            if len(points) > 1 and not path_of_points:
                ax.plot(u, a, "o", ms=4, color=color, label=label)
                tagged = range(len(points))
            elif len(points) > 1:
                ax.plot(u, a, "-", color=color, lw=1.0, alpha=0.6, marker="o", ms=2.5, label=label)
                ax.plot(u[0], a[0], "o", ms=5, mfc="white", color=color)
                ax.plot(u[-1], a[-1], "o", ms=5, color=color)
                tagged = (0, len(points) - 1)
            elif points:
                ax.plot(u, a, "o", ms=5, color=color, label=label)
                tagged = (0,) if points[0][0] and points[0][0] != label else ()
            else:
                continue
            for i in tagged:  # a path's last tag below its marker, off the line that arrives from above
                offset = (4, -9) if path_of_points and len(points) > 1 and i == len(points) - 1 else (3, 3)
                ax.annotate(points[i][0], (u[i], a[i]), xytext=offset, textcoords="offset points", color=color,
                            fontsize="x-small")  # fmt: skip
        ax.set_xlabel(r"uniformity  $\log\,\mathbb{E}\,e^{-2\|\hat{x}-\hat{y}\|^2}$  (all dev sentence pairs)")
        ax.set_ylabel(r"alignment  $\mathbb{E}\,\|\hat{x}-\hat{y}\|^2$  (positive pairs)")
        ax.margins(0.15)
        bottom, top = ax.get_ylim()
        if bottom < 0:  # alignment is a squared distance: no room below 0 beyond the marker's
            ax.set_ylim(-0.05 * max(top, 1e-3), top)
        ax.grid(alpha=0.3)
        caption = caption or "STS-B dev, SimCSE protocol (positives: gold > 4)"
        if len(series) == 1:  # no legend for one series: its name goes in the title
            caption = f"{series[0][0]}: {caption}"
        ax.set_title(wrap(f"{caption}; lower left is better", 70), loc="left")
        legend_below(ax, len(series))
        save_figure(figure, path)
