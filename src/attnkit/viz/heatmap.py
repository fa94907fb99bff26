"""Heatmaps of attention weights and alignment matrices with token labels."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import numpy as np

from .picture import Picture, finish, subplots

__all__ = ["plot_heatmap", "plot_heads", "plot_overview", "plot_head_values"]


def _as_array(matrix) -> np.ndarray:
    if hasattr(matrix, "detach"):
        matrix = matrix.detach().float().cpu().numpy()
    return np.asarray(matrix, dtype=np.float64)


def _check_labels(labels: Sequence[str] | None, n: int, axis: str) -> None:
    if labels is not None and len(labels) != n:
        raise ValueError(f"{axis} labels: expected {n}, got {len(labels)}")


def _label_axis(ax, labels: Sequence[str] | None, n: int, axis: str, max_labels: int = 60) -> None:
    _check_labels(labels, n, axis)
    if labels is None:
        return
    step = label_step(n, max_labels)
    ticks = list(range(0, n, step))
    if axis == "x":
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[i] for i in ticks], rotation=90, fontsize=8)
    else:
        ax.set_yticks(ticks)
        ax.set_yticklabels([labels[i] for i in ticks], fontsize=8)


def label_step(n: int, max_labels: int) -> int:
    """Show every ``step``-th label so that at most ``max_labels`` of ``n`` are drawn (readable at 100+ tokens)."""
    return max(1, int(np.ceil(n / max_labels)))


UNLABELLED_INCHES = 8.0
"""The largest side of a heatmap whose rows or columns have no labels (its cells need no room for text)."""


def plot_heatmap(
    matrix,
    path: str | os.PathLike | None = None,
    *,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str = "",
    x_title: str = "keys (source)",
    y_title: str = "queries (target)",
    annotate: bool = False,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
) -> Picture:
    """One (L, S) matrix as a heatmap, written to ``path`` (PNG or SVG by its suffix) if given and
    returned as a :class:`~attnkit.viz.Picture` (shown inline in Jupyter); ``vmin`` / ``vmax`` fix the
    colour scale (default: the data's range).

    Rows are queries (y), columns are keys (x); ``annotate`` writes each value in its cell.
    """
    data = _as_array(matrix)
    if data.ndim != 2:
        raise ValueError(f"matrix must be 2-D (L, S), got shape {data.shape}")
    L, S = data.shape
    # a labelled cell needs room for its label; a matrix without labels is a picture of 8 inches at most
    width = min(16 if x_labels is not None else UNLABELLED_INCHES, 2 + 0.35 * S)
    height = min(16 if y_labels is not None else UNLABELLED_INCHES, 1.5 + 0.35 * L)
    fig, ax = subplots(figsize=(width, height))
    image = ax.imshow(data, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    _label_axis(ax, x_labels, S, "x")
    _label_axis(ax, y_labels, L, "y")
    if annotate:
        if L * S > 900:
            raise ValueError(f"annotate writes every value: at most 900 cells, got {L} x {S} = {L * S}")
        _annotate(ax, data, "{:.2f}", image)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.set_title(title)
    return finish(fig, path)


def plot_heads(
    weights,
    path: str | os.PathLike | None = None,
    *,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str = "",
    per_head_scale: bool = False,
) -> Picture:
    """A grid of (H, L, S) per-head weights, one panel per head (written to ``path`` if given; returned), on one
    colour scale with its bar: [0, the largest weight] in viridis, or, where some entry is negative (a linear or
    state-space layer's implicit attention), a diverging scale symmetric around 0 (red above, blue below). With
    ``per_head_scale`` each panel has its own scale and bar, chosen the same way from its own entries (a layer
    whose implicit-attention heads are orders of magnitude apart, or sit beside softmax heads). NaN cells (a head
    its layer lacks) are left blank.

    Every panel has the same tokens: the keys are labelled under the lowest panel of each column and the
    queries beside the first column only (a label on every panel drew nine times the text and took most of
    ``attnkit inspect``'s time on a 30-layer model; ``benchmarks/heads_grid.py`` times a grid)."""
    data = _as_array(weights)
    if data.ndim != 3:
        raise ValueError(f"weights must be 3-D (H, L, S), got shape {data.shape}")
    H, L, S = data.shape
    columns = min(H, 4)
    rows = int(np.ceil(H / columns))
    fig, axes = subplots(
        rows, columns, figsize=(3.4 * columns + 0.8, 3.4 * rows), squeeze=False, constrained_layout=True
    )
    _check_labels(x_labels, S, "x")
    _check_labels(y_labels, L, "y")
    shared = _colour_scale(data)
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        scale = _colour_scale(data[h]) if per_head_scale else shared
        image = ax.imshow(data[h], aspect="auto", cmap=scale[0], vmin=scale[1], vmax=scale[2])
        if per_head_scale:
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
        ax.set_title(f"head {h}", fontsize=9)
        if h + columns >= H:  # the lowest panel of its column
            _label_axis(ax, x_labels, S, "x", max_labels=20)
        elif x_labels is not None:
            ax.set_xticks([])
        if h % columns == 0:
            _label_axis(ax, y_labels, L, "y", max_labels=20)
        elif y_labels is not None:
            ax.set_yticks([])
    if image is not None and not per_head_scale:
        fig.colorbar(image, ax=axes, fraction=0.046 / columns, pad=0.02,
                     label="entry (signed)" if shared[0] == "RdBu_r" else "attention weight")
    fig.suptitle(title)
    return finish(fig, path)


def _colour_scale(data: np.ndarray) -> tuple[str, float, float]:
    """(colour map, least, greatest) for weights: viridis over [0, the largest], or, with a negative entry, a
    diverging map symmetric around 0."""
    finite = data[np.isfinite(data)]
    largest = max(1e-9, float(np.abs(finite).max())) if finite.size else 1e-9
    if finite.size and finite.min() < 0:
        return "RdBu_r", -largest, largest
    return "viridis", 0.0, largest


def text_colour(rgba) -> str:
    """"w" or "k", whichever contrasts more with a background of this colour (WCAG relative
    luminance: black text above 0.179, where the two contrast ratios are equal)."""
    channels = np.asarray(rgba, dtype=np.float64)[..., :3]
    linear = np.where(channels <= 0.04045, channels / 12.92, ((channels + 0.055) / 1.055) ** 2.4)
    luminance = linear @ np.array([0.2126, 0.7152, 0.0722])
    return "k" if luminance > 0.179 else "w"


def _annotate(ax, data: np.ndarray, fmt: str, image) -> None:
    """Write each value in its cell, in the colour that reads best on the cell's rendered colour
    (for any colormap: dark cells get white text, light cells black)."""
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not np.isfinite(data[i, j]):  # (a head its layer lacks, or a quantity not defined there: blank)
                continue
            ax.text(j, i, fmt.format(data[i, j]), ha="center", va="center", fontsize=6,
                    color=text_colour(image.cmap(image.norm(data[i, j]))))


def plot_overview(
    attentions,
    path: str | os.PathLike | None = None,
    *,
    title: str = "",
    layer_names: Sequence[str] | None = None,
) -> Picture:
    """A layer x head overview: one small heatmap per head, layers down, heads across.

    ``attentions`` is (layers, H, L, S), or a list of per-layer (H, L, S) tensors; each thumbnail
    has its own colour scale (its least value darkest, its greatest brightest) so that the pattern
    (diagonal, stripes, broad) shows; NaN cells are left blank. The thumbnails are drawn as one image
    with blank gaps between them (one image draws in a fraction of the time of one axes a head).
    """
    from matplotlib import colormaps

    layers = [_as_array(a) for a in attentions]
    if not layers or any(a.ndim != 3 for a in layers) or len({a.shape for a in layers}) != 1:
        raise ValueError(f"attentions must be per-layer (H, L, S) arrays of one shape, got shapes {[a.shape for a in layers]}")
    if layer_names is not None and len(layer_names) != len(layers):
        raise ValueError(f"layer_names: expected {len(layers)}, got {len(layer_names)}")
    H, L, S = layers[0].shape
    if not (H and L and S):
        raise ValueError(f"attentions must have at least one head, query and key to draw, got (H, L, S) = {(H, L, S)}")
    stack = np.stack(layers).astype(np.float64)  # (layers, H, L, S)
    with warnings.catch_warnings():  # a thumbnail of NaN only: its least and greatest are NaN, and it stays blank
        warnings.simplefilter("ignore", RuntimeWarning)
        low = np.nanmin(stack, axis=(2, 3), keepdims=True)
        span = np.nanmax(stack, axis=(2, 3), keepdims=True) - low
    scaled = (stack - low) / np.where(span > 0, span, 1.0)  # each thumbnail on [0, 1]; a flat one all 0
    gap = max(1, round(0.06 * max(L, S)))  # the gap between thumbnails, in cells
    mosaic = np.full((len(layers) * (L + gap) - gap, H * (S + gap) - gap), np.nan)  # NaN: the gaps, left blank
    for l in range(len(layers)):
        for h in range(H):
            mosaic[l * (L + gap):l * (L + gap) + L, h * (S + gap):h * (S + gap) + S] = scaled[l, h]
    size = 1.1 if H > 8 else 1.5
    fig, ax = subplots(1, 1, figsize=(0.6 + size * H, 0.4 + size * len(layers)))
    colours = colormaps["viridis"].with_extremes(bad="white")
    ax.imshow(mosaic, cmap=colours, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks([h * (S + gap) + (S - 1) / 2 for h in range(H)], [f"head {h}" for h in range(H)], fontsize=8)
    ax.set_yticks([l * (L + gap) + (L - 1) / 2 for l in range(len(layers))],
                  list(layer_names) if layer_names else [f"layer {l}" for l in range(len(layers))], fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    return finish(fig, path)


def plot_head_values(
    values: dict[str, np.ndarray],
    path: str | os.PathLike | None = None,
    *,
    title: str = "",
    fmt: str = "{:.2f}",
    vmax: dict[str, float] | None = None,
) -> Picture:
    """One annotated (layers, heads) panel per named quantity (e.g. each head role's share and the entropy)."""
    if not values:
        raise ValueError("values is empty")
    arrays = {name: _as_array(v) for name, v in values.items()}
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"every value must be one (layers, heads) array, got shapes {sorted(shapes)}")
    layers, heads = next(iter(shapes))
    columns = min(len(arrays), 2)
    rows = int(np.ceil(len(arrays) / columns))
    fig, axes = subplots(rows, columns, figsize=(0.7 + 0.45 * heads * columns + 1.2 * columns, 0.8 + (0.35 * layers + 0.8) * rows),
                             squeeze=False, constrained_layout=True)
    for ax, (name, data) in zip(axes.flat, arrays.items()):
        top = (vmax or {}).get(name)
        largest = float(np.nanmax(data)) if np.isfinite(data).any() else 0.0
        image = ax.imshow(data, cmap="magma", aspect="auto", vmin=0, vmax=top if top is not None else max(1e-9, largest))
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
        _annotate(ax, data, fmt, image)
        ax.set_xticks(range(heads))
        ax.set_yticks(range(layers))
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(arrays):]:
        ax.axis("off")
    fig.suptitle(title)
    return finish(fig, path)
