"""A self-contained interactive attention viewer: one HTML file, no CDN, no network, works offline.

Choose the attention kind (encoder self, decoder self, cross), layer and head; hover a token to
see what it attends to and what attends to it (click pins it); a model overview shows every
head as a thumbnail (click one to select it); the selected head is drawn as a heatmap.

What is embedded, to stay small and fast at 512 tokens x 12 layers x 12 heads:
- per query row only the ``top_k`` largest weights (their key indices as uint16, the weights
  quantised to uint8 steps of 1/255); the share of each head's mass kept is shown;
- per head a thumbnail of at most 32 x 32 average-pooled cells (uint8, scaled to its maximum).
Both travel as base64 inside a ``<script type="application/json">`` block.

Every piece of user text (tokens, title, names) reaches the page as JSON data, with ``<``, ``>``
and ``&`` written as ``\\u`` escapes so that nothing can close the script block, and is put on the
page with ``textContent`` only: a token such as ``<script>alert(1)</script>`` shows as text.

The page itself lives as package data beside this module: ``viewer/viewer.html`` (the skeleton),
``viewer/viewer.css`` and ``viewer/viewer.js``, read and inlined at render time.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .._files import atomic_path

__all__ = ["AttentionView", "Viewer", "viewer", "write_viewer", "encode_view"]

THUMBNAIL = 32


@dataclass(frozen=True)
class AttentionView:
    """One kind of attention to show: per-layer (H, L, S) weights, L query and S key tokens.

    ``keys`` is None for self-attention (the queries are the keys)."""

    name: str
    queries: Sequence[str]
    weights: object  # (layers, H, L, S) array/tensor or a list of (H, L, S)
    keys: Sequence[str] | None = None


def _as_array(weights) -> np.ndarray:
    if isinstance(weights, (list, tuple)):
        weights = [w.detach().float().cpu().numpy() if hasattr(w, "detach") else np.asarray(w) for w in weights]
        if len({w.shape for w in weights}) > 1:
            raise ValueError(f"every layer's weights must have one shape, got {[w.shape for w in weights]}")
        return np.stack(weights).astype(np.float32)
    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=np.float32)


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def _pool(matrix: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Average-pool (..., L, S) to (..., rows, cols) with bins of near-equal size."""
    L, S = matrix.shape[-2:]
    row_edges = np.linspace(0, L, rows + 1).round().astype(int)
    col_edges = np.linspace(0, S, cols + 1).round().astype(int)
    by_rows = np.add.reduceat(matrix, row_edges[:-1], axis=-2) / np.diff(row_edges)[:, None]
    return np.add.reduceat(by_rows, col_edges[:-1], axis=-1) / np.diff(col_edges)


def encode_view(view: AttentionView, *, top_k: int = 16) -> dict:
    """The JSON-ready payload of one view (see the module docstring for the encoding)."""
    w = _as_array(view.weights)
    if w.ndim != 4:
        raise ValueError(f"{view.name}: weights must be (layers, H, L, S), got shape {w.shape}")
    layers, H, L, S = w.shape
    keys = view.queries if view.keys is None else view.keys
    if view.keys is None and L != S:
        raise ValueError(f"{view.name}: self-attention needs L == S, got L={L}, S={S}; pass keys= for cross attention")
    if len(view.queries) != L or len(keys) != S:
        raise ValueError(f"{view.name}: weights of shape {w.shape} need {L} query and {S} key tokens, "
                         f"got {len(view.queries)} and {len(keys)}")
    if S > 65535:
        raise ValueError(f"{view.name}: at most 65,535 key tokens, got {S}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    k = min(top_k, S)
    index = np.argpartition(-w, k - 1, axis=-1)[..., :k] if k < S else np.broadcast_to(np.arange(S), w.shape).copy()
    kept = np.take_along_axis(w, index, -1)
    order = np.argsort(-kept, axis=-1, kind="stable")  # largest first within each row
    index, kept = np.take_along_axis(index, order, -1), np.take_along_axis(kept, order, -1)
    quantised = np.clip(np.rint(kept * 255), 0, 255).astype(np.uint8)
    coverage = (quantised.astype(np.float64) / 255).sum(-1).mean(-1)  # (layers, H): mean kept mass per row
    tq, tk = min(L, THUMBNAIL), min(S, THUMBNAIL)
    pooled = _pool(w.astype(np.float64), tq, tk)  # (layers, H, tq, tk)
    peak = pooled.max(axis=(-2, -1), keepdims=True)
    thumbs = np.rint(255 * pooled / np.where(peak > 0, peak, 1)).astype(np.uint8)
    return {
        "name": view.name, "self": view.keys is None, "queries": [str(t) for t in view.queries],
        "keys": [str(t) for t in keys], "layers": layers, "heads": H, "L": L, "S": S, "k": k,
        "index": _b64(index.astype("<u2")), "weight": _b64(quantised), "thumb": _b64(thumbs), "tq": tq, "tk": tk,
        "coverage": np.round(coverage, 4).ravel().tolist(),
    }


def _script_json(payload) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' characters survive."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(title_html: str, data_json: str) -> str:
    """The viewer page: viewer.html with viewer.css, viewer.js (package data, read at render time),
    the escaped title and the payload put in, each placeholder once (inserted text is never scanned
    again, so a title holding "__DATA__" stays text)."""
    folder = resources.files("attnkit.viz") / "viewer"
    parts = {
        "STYLE": (folder / "viewer.css").read_text(encoding="utf-8"),
        "SCRIPT": (folder / "viewer.js").read_text(encoding="utf-8"),
        "TITLE": title_html,
        "DATA": data_json,
    }
    template = (folder / "viewer.html").read_text(encoding="utf-8")
    return re.sub(r"__(STYLE|SCRIPT|TITLE|DATA)__", lambda match: parts[match.group(1)], template)


class Viewer:
    """The viewer of some views as one self-contained page: ``html`` (the page), ``save(path)``
    (atomically), and ``_repr_html_`` so that a notebook shows it inline: the page inside an iframe's
    ``srcdoc`` (HTML-escaped), which needs no file, server or network and keeps the page's script and
    style apart from the notebook's."""

    def __init__(self, page: str, *, height: int = 720):
        self.html = page
        self.height = height

    def save(self, path: str | os.PathLike) -> Viewer:
        with atomic_path(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.html)
        return self

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width: 100%; height: {int(self.height)}px;'
                ' border: 1px solid #ddd;" sandbox="allow-scripts"></iframe>')

    def __repr__(self) -> str:
        return f"Viewer({len(self.html):,} characters of HTML)"


def viewer(views: Sequence[AttentionView], *, title: str = "attnkit attention viewer", top_k: int = 16,
           height: int = 720) -> Viewer:
    """The viewer for ``views`` (at least one): shown inline in a notebook, or ``.save(path)`` as one HTML file."""
    if not views:
        raise ValueError("views is empty: pass at least one AttentionView")
    payload = {"title": str(title), "views": [encode_view(v, top_k=top_k) for v in views]}
    return Viewer(render_page(html.escape(str(title)), _script_json(payload)), height=height)


def write_viewer(path: str | os.PathLike, views: Sequence[AttentionView], *, title: str = "attnkit attention viewer",
                 top_k: int = 16) -> Viewer:
    """Write the viewer for ``views`` (at least one) to ``path`` as one self-contained HTML file."""
    return viewer(views, title=title, top_k=top_k).save(path)
