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
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._files import atomic_path

__all__ = ["AttentionView", "write_viewer", "encode_view"]

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


def write_viewer(path: str | os.PathLike, views: Sequence[AttentionView], *, title: str = "attnkit attention viewer",
                 top_k: int = 16) -> None:
    """Write the viewer for ``views`` (at least one) to ``path`` as one self-contained HTML file."""
    if not views:
        raise ValueError("views is empty: pass at least one AttentionView")
    payload = {"title": str(title), "views": [encode_view(v, top_k=top_k) for v in views]}
    page = _PAGE.replace("__TITLE__", html.escape(str(title))).replace("__DATA__", _script_json(payload))
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)


_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
  body { font: 14px/1.5 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
  header { padding: 8px 16px; background: #fff; border-bottom: 1px solid #ddd; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
  header h1 { font-size: 16px; margin: 0 12px 0 0; }
  main { display: grid; grid-template-columns: minmax(320px, 1fr) minmax(300px, 520px); gap: 16px; padding: 16px; }
  section { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; }
  h2 { font-size: 13px; margin: 0 0 6px; color: #555; text-transform: uppercase; letter-spacing: .04em; }
  .tokens { line-height: 2.1; }
  .tok { padding: 2px 3px; margin: 0 1px; border-radius: 3px; cursor: pointer; white-space: pre; border: 1px solid transparent;
         unicode-bidi: isolate; display: inline-block; max-width: 16em; overflow: hidden; text-overflow: ellipsis; vertical-align: bottom; }
  td, code, h2 { unicode-bidi: isolate; overflow-wrap: anywhere; }
  .tok.focus { border-color: #d33; }
  .tok.pinned { border-color: #d33; border-width: 2px; }
  .tok.hl { font-weight: 600; }
  .tok.top { text-decoration: underline; }
  #details table { border-collapse: collapse; font-size: 12px; }
  #details td { padding: 1px 8px 1px 0; }
  #heatmap { width: 100%; max-width: 480px; image-rendering: pixelated; border: 1px solid #ccc; }
  #overview { display: grid; gap: 3px; }
  #overview canvas { width: 100%; image-rendering: pixelated; border: 2px solid transparent; cursor: pointer; }
  #overview canvas.selected { border-color: #d33; }
  .label { font-size: 11px; color: #777; text-align: center; }
  .muted { color: #777; font-size: 12px; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <label>attention <select id="view"></select></label>
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
  <label id="direction-box">colour by
    <select id="direction"><option value="to">what the token attends to</option><option value="from">what attends to the token</option></select>
  </label>
  <span class="muted" id="coverage"></span>
</header>
<main>
  <div>
    <section id="blocks"></section>
    <section id="details"><h2>token</h2><div class="muted">hover a token (click to pin it)</div></section>
  </div>
  <div>
    <section><h2 id="heatmap-title">selected head</h2><canvas id="heatmap"></canvas>
      <div class="muted">rows: queries, columns: keys; darker = more weight, scaled to the head&#39;s largest</div></section>
    <section><h2>model overview (click a head)</h2><div id="overview"></div></section>
  </div>
</main>
<script id="attnkit-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("attnkit-data").textContent);
const $ = (id) => document.getElementById(id);
function bytes(b64) { const s = atob(b64); const out = new Uint8Array(s.length); for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i); return out; }
const VIEWS = DATA.views.map((v) => Object.assign({}, v, {
  indexArr: new Uint16Array(bytes(v.index).buffer), weightArr: bytes(v.weight), thumbArr: bytes(v.thumb),
}));
const state = { view: 0, layer: 0, head: 0, focus: null, pinned: null };
let spans = { q: [], k: [] };

function option(select, value, text) { const o = document.createElement("option"); o.value = value; o.textContent = text; select.appendChild(o); }
function current() { return VIEWS[state.view]; }
function rowEntries(v, layer, head, i) {  // [[key index, weight], ...] largest first
  const base = ((layer * v.heads + head) * v.L + i) * v.k, out = [];
  for (let r = 0; r < v.k; r++) { const w = v.weightArr[base + r] / 255; if (w > 0) out.push([v.indexArr[base + r], w]); }
  return out;
}
function columnEntries(v, layer, head, j) {  // [[query index, weight], ...] largest first
  const out = [], start = (layer * v.heads + head) * v.L * v.k;
  for (let i = 0; i < v.L; i++) {
    const base = start + i * v.k;
    for (let r = 0; r < v.k; r++) if (v.indexArr[base + r] === j) { const w = v.weightArr[base + r] / 255; if (w > 0) out.push([i, w]); break; }
  }
  return out.sort((a, b) => b[1] - a[1]);
}

function buildControls() {
  $("title").textContent = DATA.title;
  VIEWS.forEach((v, i) => option($("view"), i, v.name));
  $("view").onchange = () => { state.view = +$("view").value; state.layer = state.head = 0; state.focus = state.pinned = null; render(true); };
  $("layer").onchange = () => { state.layer = +$("layer").value; render(false); };
  $("head").onchange = () => { state.head = +$("head").value; render(false); };
  $("direction").onchange = () => paint();
}

function tokenBlock(title, tokens, role) {
  const section = document.createElement("div");
  const h = document.createElement("h2"); h.textContent = title; section.appendChild(h);
  const box = document.createElement("div"); box.className = "tokens"; box.dataset.role = role;
  const list = tokens.map((t, i) => {
    const s = document.createElement("span"); s.className = "tok"; s.textContent = t; s.title = t; s.dir = "auto"; s.dataset.index = i; s.dataset.role = role;
    s.addEventListener("mouseenter", () => { state.focus = [role, i]; paint(); });
    s.addEventListener("mouseleave", () => { state.focus = null; paint(); });
    s.addEventListener("click", () => { const p = state.pinned; state.pinned = p && p[0] === role && p[1] === i ? null : [role, i]; paint(); });
    box.appendChild(s); box.appendChild(document.createTextNode(" "));
    return s;
  });
  section.appendChild(box);
  return [section, list];
}

function buildBlocks() {
  const v = current(), blocks = $("blocks");
  blocks.replaceChildren();
  if (v.self) {
    const [section, list] = tokenBlock("tokens", v.queries, "both"); blocks.appendChild(section); spans = { q: list, k: list };
  } else {
    const [ks, kl] = tokenBlock("keys (source)", v.keys, "k"), [qs, ql] = tokenBlock("queries (target)", v.queries, "q");
    blocks.appendChild(ks); blocks.appendChild(qs); spans = { q: ql, k: kl };
  }
  $("direction-box").style.display = v.self ? "" : "none";
}

function paint() {
  const v = current(), active = state.focus || state.pinned;
  for (const list of [spans.q, spans.k]) for (const s of list) { s.style.background = ""; s.classList.remove("hl", "top", "focus", "pinned"); s.removeAttribute("data-weight"); }
  if (state.pinned) { const [role, i] = state.pinned; (role === "k" ? spans.k : spans.q)[i].classList.add("pinned"); }
  if (!active) { showDetails(null); return; }
  const [role, i] = active;
  const asQuery = role === "q" || (role === "both" && $("direction").value === "to");
  const entries = asQuery ? rowEntries(v, state.layer, state.head, i) : columnEntries(v, state.layer, state.head, i);
  const targets = asQuery ? spans.k : spans.q, colour = asQuery ? "33, 102, 204" : "230, 120, 20";
  (role === "k" ? spans.k : spans.q)[i].classList.add("focus");
  entries.forEach(([j, w], r) => {
    const s = targets[j];
    s.style.background = `rgba(${colour}, ${Math.min(1, 0.12 + 0.88 * Math.sqrt(w)).toFixed(3)})`;
    s.dataset.weight = w.toFixed(3);
    if (w >= 0.1) s.classList.add("hl");
    if (r === 0) s.classList.add("top");
  });
  showDetails(active);
}

function table(title, entries, tokens) {
  const wrap = document.createElement("div");
  const h = document.createElement("h2"); h.textContent = title; wrap.appendChild(h);
  const t = document.createElement("table");
  for (const [j, w] of entries.slice(0, 8)) {
    const tr = t.insertRow(); tr.insertCell().textContent = tokens[j]; tr.insertCell().textContent = w.toFixed(3);
  }
  if (!entries.length) { const tr = t.insertRow(); tr.insertCell().textContent = "(nothing in the kept top entries)"; }
  wrap.appendChild(t); return wrap;
}

function showDetails(active) {
  const v = current(), box = $("details");
  box.replaceChildren();
  if (!active) { const h = document.createElement("h2"); h.textContent = "token"; box.appendChild(h);
    const d = document.createElement("div"); d.className = "muted"; d.textContent = "hover a token (click to pin it)"; box.appendChild(d); return; }
  const [role, i] = active;
  const h = document.createElement("h2"); h.textContent = `layer ${state.layer}, head ${state.head}: token ${i} `;
  const name = document.createElement("code"); name.textContent = (role === "k" ? v.keys : v.queries)[i]; h.appendChild(name); box.appendChild(h);
  if (role !== "k") box.appendChild(table("attends to", rowEntries(v, state.layer, state.head, i), v.keys));
  if (role !== "q") box.appendChild(table("attended by", columnEntries(v, state.layer, state.head, i), v.queries));
}

function drawHeatmap() {
  const v = current(), canvas = $("heatmap");
  canvas.width = v.S; canvas.height = v.L;
  const ctx = canvas.getContext("2d"), image = ctx.createImageData(v.S, v.L), px = image.data;
  for (let p = 0; p < px.length; p += 4) { px[p] = px[p + 1] = px[p + 2] = 255; px[p + 3] = 255; }
  const start = (state.layer * v.heads + state.head) * v.L * v.k;
  let peak = 1;  // shade relative to the head's largest kept weight, so diffuse heads still show
  for (let e = start; e < start + v.L * v.k; e++) peak = Math.max(peak, v.weightArr[e]);
  for (let i = 0; i < v.L; i++) for (let r = 0; r < v.k; r++) {
    const w = v.weightArr[start + i * v.k + r]; if (!w) continue;
    const p = 4 * (i * v.S + v.indexArr[start + i * v.k + r]), level = Math.round(255 * w / peak);
    px[p] = px[p + 1] = 255 - level; px[p + 2] = 255 - Math.round(level * 0.3);
  }
  ctx.putImageData(image, 0, 0);
  $("heatmap-title").textContent = `${v.name}: layer ${state.layer}, head ${state.head}`;
  const c = v.coverage[state.layer * v.heads + state.head];
  $("coverage").textContent = `${v.L} x ${v.S} tokens; top ${v.k} entries per row kept, ${(100 * c).toFixed(1)}% of this head's weight`;
}

function buildOverview() {
  const v = current(), box = $("overview");
  box.replaceChildren();
  box.style.gridTemplateColumns = `40px repeat(${v.heads}, 1fr)`;
  box.appendChild(document.createElement("div"));
  for (let h = 0; h < v.heads; h++) { const d = document.createElement("div"); d.className = "label"; d.textContent = `h${h}`; box.appendChild(d); }
  const cells = v.tq * v.tk;
  for (let l = 0; l < v.layers; l++) {
    const d = document.createElement("div"); d.className = "label"; d.textContent = `L${l}`; box.appendChild(d);
    for (let h = 0; h < v.heads; h++) {
      const canvas = document.createElement("canvas"); canvas.width = v.tk; canvas.height = v.tq;
      canvas.dataset.layer = l; canvas.dataset.head = h; canvas.title = `layer ${l}, head ${h}`;
      const ctx = canvas.getContext("2d"), image = ctx.createImageData(v.tk, v.tq), px = image.data, base = (l * v.heads + h) * cells;
      for (let c = 0; c < cells; c++) { const w = v.thumbArr[base + c]; px[4 * c] = px[4 * c + 1] = 255 - w; px[4 * c + 2] = 255 - Math.round(w * 0.3); px[4 * c + 3] = 255; }
      ctx.putImageData(image, 0, 0);
      canvas.addEventListener("click", () => { state.layer = l; state.head = h; render(false); });
      box.appendChild(canvas);
    }
  }
}

function render(rebuild) {
  const v = current();
  if (rebuild) {
    $("view").value = state.view;
    for (const [id, n] of [["layer", v.layers], ["head", v.heads]]) { $(id).replaceChildren(); for (let i = 0; i < n; i++) option($(id), i, i); }
    buildBlocks(); buildOverview();
  }
  $("layer").value = state.layer; $("head").value = state.head;
  for (const c of $("overview").querySelectorAll("canvas")) c.classList.toggle("selected", +c.dataset.layer === state.layer && +c.dataset.head === state.head);
  drawHeatmap(); paint();
  document.body.dataset.ready = "1";
}

buildControls();
render(true);
</script>
</body>
</html>
"""
