"""Line plots: loss curves and scores by source length, one line per model."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .heatmap import _pyplot, _save

__all__ = ["plot_lines"]


def plot_lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | os.PathLike,
    *,
    x_title: str,
    y_title: str,
    title: str = "",
    x_ticks: Sequence[str] | None = None,
    markers: bool = True,
    styles: Mapping[str, dict] | None = None,
    log_x: bool = False,
    log_y: bool = False,
) -> None:
    """One line per ``label: (xs, ys)``; ``x_ticks`` labels the positions 0, 1, ... instead of numbers;
    ``styles`` maps a label to matplotlib line options (color, linestyle, ...)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        style = {"marker": "o" if markers else None, "markersize": 4, "linewidth": 1.5} | dict((styles or {}).get(label, {}))
        ax.plot(list(xs), list(ys), label=label, **style)
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
    _save(fig, path)
