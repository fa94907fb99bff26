"""Line plots: loss curves and scores by source length, one line per model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .picture import Picture, finish, subplots

__all__ = ["plot_lines", "plot_distributions"]


def plot_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | os.PathLike | None = None,
    *,
    x_title: str,
    y_title: str,
    title: str = "",
    x_ticks: Sequence[str] | None = None,
    markers: bool = True,
    styles: Mapping[str, dict] | None = None,
    log_x: bool = False,
    log_y: bool = False,
    errors: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> Picture:
    """One line per ``label: (xs, ys)``; ``x_ticks`` labels the positions 0, 1, ... instead of numbers;
    ``styles`` maps a label to matplotlib line options (color, linestyle, ...); ``errors`` maps a
    label to (lows, highs) drawn as interval bars at its points, from low to high as given (a
    bootstrap interval need not contain the point estimate; a NaN bound draws no bar)."""
    fig, ax = subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        style = {"marker": "o" if markers else None, "markersize": 4, "linewidth": 1.5} | dict((styles or {}).get(label, {}))
        (line,) = ax.plot(list(xs), list(ys), label=label, **style)
        if errors is not None and label in errors:
            lows, highs = errors[label]
            color = line.get_color()
            ax.vlines(list(xs), list(lows), list(highs), colors=color, linewidth=1.0, alpha=0.8)
            for bound in (lows, highs):
                ax.plot(list(xs), list(bound), linestyle="none", marker="_", markersize=8, color=color)
    if log_x:
        ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    if x_ticks is not None:
        ax.set_xticks(range(len(x_ticks)), list(x_ticks))
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return finish(fig, path)


def plot_scaling(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: str | os.PathLike | None = None,
    *,
    x_title: str,
    y_title: str,
    title: str = "",
    slopes: Sequence[float] = (1.0, 2.0),
) -> Picture:
    """Log-log panels side by side, one line per ``label: (xs, ys)`` in each ``panel title``, with
    dashed reference lines of the given slopes (n, n^2 by default) through each panel's lowest
    first point, so growth rates can be read off by eye."""
    names = list(panels)
    if not names:
        raise ValueError("plot_scaling needs at least one panel")
    fig, axes = subplots(1, len(names), figsize=(4.2 * len(names), 4.2), squeeze=False)
    colors: dict = {}
    for ax, name in zip(axes[0], names):
        series = {label: (list(xs), list(ys)) for label, (xs, ys) in panels[name].items() if len(xs)}
        for label, (xs, ys) in series.items():
            color = colors.setdefault(label, f"C{len(colors) % 10}")
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.4, label=label, color=color)
        if series:
            x0 = min(xs[0] for xs, _ in series.values())
            y0 = min(ys[0] for xs, ys in series.values() if xs[0] == x0)
            x1 = max(xs[-1] for xs, _ in series.values())
            for slope, style in zip(slopes, (":", "--", "-.")):
                ax.plot([x0, x1], [y0, y0 * (x1 / x0) ** slope], style, color="grey", linewidth=1,
                        label=f"slope {slope:g} (grows as n^{slope:g})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel(x_title)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(y_title)
    handles: dict = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(5, len(handles)),
               bbox_to_anchor=(0.5, -0.02 - 0.05 * ((len(handles) - 1) // 5)))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06 + 0.04 * ((len(handles) - 1) // 5), 1, 1))
    return finish(fig, path)


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def plot_distributions(
    samples: Mapping[str, Sequence[float]],
    path: str | os.PathLike | None = None,
    *,
    x_title: str,
    title: str = "",
    limits: tuple[float, float] | None = None,
) -> Picture:
    """One horizontal box plot per ``label: values``, with every value drawn as a dot over its box."""
    import numpy as np

    if not samples or any(len(v) == 0 for v in samples.values()):
        raise ValueError(f"every sample needs at least one value, got sizes {[len(v) for v in samples.values()]}")
    labels = list(samples)
    fig, ax = subplots(figsize=(7.5, 0.6 + 0.55 * len(labels)))
    data = [np.asarray(samples[k], dtype=float) for k in labels]
    import matplotlib

    horizontal = {"orientation": "horizontal"} if _version(matplotlib.__version__) >= (3, 10) else {"vert": False}
    ax.boxplot(data, widths=0.6, showfliers=False, **horizontal)
    jitter = np.random.default_rng(0)
    for i, values in enumerate(data, 1):
        ax.scatter(values, i + jitter.uniform(-0.18, 0.18, len(values)), s=6, alpha=0.45, color="C0")
    ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
    if limits is not None:
        ax.set_xlim(*limits)
    ax.axvline(0, color="0.6", linewidth=0.8)
    ax.set_xlabel(x_title)
    ax.set_title(title)
    fig.tight_layout()
    return finish(fig, path)
