"""How big and how responsive the HTML attention viewer is, in Debian's headless Chromium.

For each (tokens L, layers, heads, top_k), with random attention (rows of a Dirichlet-like
spread, so that the kept top-k holds a realistic share of the mass), it measures:
- writing the file from Python (encoding and top-k), and the file's size next to what the full
  float32 weights would take;
- in Chromium: the time from navigation to the page being ready (data decoded, thumbnails and
  heatmap drawn), the mean time to switch head (redraw heatmap, tokens, overview selection), and
  the mean time to react to hovering a token in each direction ("attends to": one row; "attended
  by": a scan of the head's kept entries). Times inside the page come from performance.now().

Usage:
    python benchmarks/viewer.py
    python benchmarks/viewer.py --sizes 512 --top-k 4 16 64 --minilm
    python benchmarks/viewer.py --sizes 2048 --causal --out benchmarks/results/viewer_decoder.json
Prints a table and writes JSON (default benchmarks/results/viewer.json).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.viz import AttentionView, write_viewer

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

SWITCH = """() => {
  const t0 = performance.now();
  for (let r = 0; r < 24; r++) { state.layer = r % DATA.views[0].layers; state.head = (5 * r) % DATA.views[0].heads; render(false); }
  return (performance.now() - t0) / 24;
}"""
HOVER = """(direction) => {
  document.getElementById("direction").value = direction;
  const list = spans.q, t0 = performance.now();
  for (let r = 0; r < 50; r++) { const s = list[(r * 37) % list.length]; s.dispatchEvent(new MouseEvent("mouseenter")); s.dispatchEvent(new MouseEvent("mouseleave")); }
  return (performance.now() - t0) / 50;
}"""


def random_weights(L: int, layers: int, heads: int, *, causal: bool = False) -> tuple[np.ndarray, list[str]]:
    """Random attention; ``causal``: a decoder's, each query's weights on keys up to itself only."""
    rng = np.random.default_rng(0)
    weights = np.empty((layers, heads, L, L), dtype=np.float32)
    below = np.tril(np.ones((L, L), dtype=bool)) if causal else None
    for layer in range(layers):  # one layer at a time: float64 draws for all layers would need 2x the memory
        draw = rng.gamma(0.1, size=(heads, L, L)).astype(np.float32)
        if causal:
            draw *= below
        weights[layer] = draw / draw.sum(-1, keepdims=True)
    return weights, [f"tok{i}" for i in range(L)]


def minilm_weights(L: int) -> tuple[np.ndarray, list[str]]:
    """Real attention: all-MiniLM-L6-v2 (6 layers x 12 heads) on the first L tokens of bundled English verses."""
    import torch

    from attnkit.data import bible_corpus
    from attnkit.inspect import encoder_attentions
    from attnkit.models.pretrained import load_minilm

    model, tokenizer = load_minilm()
    text, verses = "", iter(bible_corpus("test"))
    while len(tokenizer.encode(text).ids) < L:
        text += " " + next(verses).source
    ids = tokenizer.encode(text).ids[: L - 1]
    text = tokenizer.decode(ids[1:])  # [CLS] ... without the cut-off [SEP], re-encoded with one
    with torch.no_grad():
        attentions, tokens = encoder_attentions(model, tokenizer, [text])
    return torch.stack(attentions[0]).numpy(), tokens[0]


def measure(browser, L: int, layers: int, heads: int, top_k: int, folder: Path, *, real: bool = False,
            causal: bool = False) -> dict:
    weights, tokens = minilm_weights(L) if real else random_weights(L, layers, heads, causal=causal)
    layers, heads, L = weights.shape[:3]
    path = folder / f"viewer-{L}-{layers}x{heads}-k{top_k}.html"
    started = time.perf_counter()
    write_viewer(path, [AttentionView("self", tokens, weights)], top_k=top_k)
    write_seconds = time.perf_counter() - started
    kept = np.sort(weights, -1)[..., -top_k:].sum(-1).mean()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=120_000)
    load_ms = page.evaluate("performance.now()")
    switch_ms = page.evaluate(SWITCH)
    hover_to_ms = page.evaluate(HOVER, "to")
    hover_from_ms = page.evaluate(HOVER, "from")
    page.close()
    return {"weights": "MiniLM" if real else ("causal" if causal else "random"), "tokens": L, "layers": layers, "heads": heads, "top_k": top_k, "write_s": write_seconds,
            "file_mb": path.stat().st_size / 1e6, "float32_mb": weights.nbytes / 1e6, "kept_mass": float(kept),
            "load_ms": load_ms, "switch_head_ms": switch_ms, "hover_attends_to_ms": hover_to_ms,
            "hover_attended_by_ms": hover_from_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--top-k", type=int, nargs="+", default=[16])
    parser.add_argument("--minilm", action="store_true",
                        help="also real all-MiniLM-L6-v2 attention (6 x 12 heads) at each size up to 512 tokens")
    parser.add_argument("--causal", action="store_true", help="random attention of a decoder (keys up to the query)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/viewer.json"))
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    rows = []
    header = f"{'weights':>7} {'tokens':>6} {'LxH':>6} {'top_k':>5} {'write s':>8} {'file MB':>8} {'fp32 MB':>8} {'kept':>5} {'load ms':>8} {'switch ms':>9} {'hover to':>9} {'hover by':>9}"
    print(header)
    with sync_playwright() as p, tempfile.TemporaryDirectory() as tmp:
        browser = p.chromium.launch(executable_path=args.chromium, args=FLAGS)
        cases = [(L, k, False) for L in args.sizes for k in args.top_k]
        cases += [(L, k, True) for L in args.sizes if args.minilm and L <= 512 for k in args.top_k]
        for L, k, real in cases:
            r = measure(browser, L, args.layers, args.heads, k, Path(tmp), real=real, causal=args.causal and not real)
            rows.append(r)
            print(f"{r['weights']:>7} {r['tokens']:>6} {r['layers']:>3}x{r['heads']:<2} {k:>5} {r['write_s']:>8.2f} {r['file_mb']:>8.2f} {r['float32_mb']:>8.1f} "
                  f"{r['kept_mass']:>5.2f} {r['load_ms']:>8.0f} {r['switch_head_ms']:>9.1f} {r['hover_attends_to_ms']:>9.2f} "
                  f"{r['hover_attended_by_ms']:>9.2f}")
            write_json(args.out, {"machine": machine_info(), "chromium": browser.version, "results": rows})
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
