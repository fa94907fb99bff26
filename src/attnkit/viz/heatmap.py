"""Heatmaps of attention weights and alignment matrices with token labels."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .._files import atomic_path

__all__ = ["plot_heatmap", "plot_heads"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("attnkit.viz needs matplotlib: pip install 'attnkit[viz]'") from error
    return plt


def _as_array(matrix) -> np.ndarray:
    if hasattr(matrix, "detach"):
        matrix = matrix.detach().float().cpu().numpy()
    return np.asarray(matrix, dtype=np.float64)


def _label_axis(ax, labels: Sequence[str] | None, n: int, axis: str, max_labels: int = 60) -> None:
    if labels is None:
        return
    if len(labels) != n:
        raise ValueError(f"{axis} labels: expected {n}, got {len(labels)}")
    step = max(1, int(np.ceil(n / max_labels)))  # thin labels so that long sequences stay readable
    ticks = list(range(0, n, step))
    if axis == "x":
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[i] for i in ticks], rotation=90, fontsize=8)
    else:
        ax.set_yticks(ticks)
        ax.set_yticklabels([labels[i] for i in ticks], fontsize=8)


def _save(fig, path: str | os.PathLike) -> None:
    plt = _pyplot()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format=os.path.splitext(str(path))[1][1:] or "png")
    plt.close(fig)


def plot_heatmap(
    matrix,
    path: str | os.PathLike,
    *,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str = "",
    x_title: str = "keys (source)",
    y_title: str = "queries (target)",
    annotate: bool = False,
    cmap: str = "viridis",
) -> None:
    """Write one (L, S) matrix as a heatmap (PNG or SVG by the path's suffix).

    Rows are queries (y), columns are keys (x); ``annotate`` writes each value in its cell.
    """
    plt = _pyplot()
    data = _as_array(matrix)
    if data.ndim != 2:
        raise ValueError(f"matrix must be 2-D (L, S), got shape {data.shape}")
    L, S = data.shape
    fig, ax = plt.subplots(figsize=(min(16, 2 + 0.35 * S), min(16, 1.5 + 0.35 * L)))
    image = ax.imshow(data, cmap=cmap, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    _label_axis(ax, x_labels, S, "x")
    _label_axis(ax, y_labels, L, "y")
    if annotate and L * S <= 900:
        for i in range(L):
            for j in range(S):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w")
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.set_title(title)
    _save(fig, path)


def plot_heads(
    weights,
    path: str | os.PathLike,
    *,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """Write a grid of (H, L, S) per-head weights, one panel per head."""
    plt = _pyplot()
    data = _as_array(weights)
    if data.ndim != 3:
        raise ValueError(f"weights must be 3-D (H, L, S), got shape {data.shape}")
    H, L, S = data.shape
    columns = min(H, 4)
    rows = int(np.ceil(H / columns))
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.4 * columns, 3.4 * rows), squeeze=False, constrained_layout=True
    )
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(data[h], cmap="viridis", aspect="auto", vmin=0, vmax=max(1e-9, data.max()))
        ax.set_title(f"head {h}", fontsize=9)
        _label_axis(ax, x_labels, S, "x", max_labels=20)
        _label_axis(ax, y_labels, L, "y", max_labels=20)
    fig.suptitle(title)
    _save(fig, path)
