"""``attnkit tour``: every mechanism of the library run once on one sentence pair.

The inputs are the first sentence pair of Bahdanau et al. (2014), figure 3, embedded with seeded
word vectors; each French word's vector is its English counterpart's plus noise, so that the
content-based scores (dot, general, scaled dot) find the real word alignment even untrained. The
parametrised mechanisms (additive, concat, local-p) are untrained and show their raw prior.

Each step yields a :class:`Stop` that the CLI prints; each writes one heatmap PNG.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from . import functional as AF
from .functional import masks
from .layers import (
    ALiBi,
    BahdanauAttention,
    KVCache,
    LuongAttention,
    MultiHeadAttention,
    RotaryEmbedding,
    SelfAttention,
    sinusoidal_table,
)
from .viz import plot_heads, plot_heatmap

__all__ = ["Stop", "run_tour", "SOURCE", "TARGET"]

SOURCE = "the agreement on the european economic area was signed in august 1992 .".split()
TARGET = "l' accord sur la zone économique européenne a été signé en août 1992 .".split()
# target word -> the source word it translates (the gold alignment of Bahdanau et al.'s figure 3)
GOLD = {
    "l'": "the", "accord": "agreement", "sur": "on", "la": "the", "zone": "area",
    "économique": "economic", "européenne": "european", "a": "was", "été": "was",
    "signé": "signed", "en": "in", "août": "august", "1992": "1992", ".": ".",
}
DIM = 32


@dataclass
class Stop:
    """One mechanism of the tour: what it printed and the picture it wrote."""

    name: str
    facts: dict[str, object] = field(default_factory=dict)
    picture: Path | None = None


def _word_vector(word: str) -> Tensor:
    generator = torch.Generator().manual_seed(zlib.crc32(word.encode()))
    return torch.randn(DIM, generator=generator)


def _embed(words: list[str], counterpart: dict[str, str] | None = None, noise: float = 0.3) -> Tensor:
    rows = []
    for index, word in enumerate(words):
        vector = _word_vector(counterpart[word]) if counterpart else _word_vector(word)
        if counterpart:
            vector = vector + noise * _word_vector(f"{word}#{index}")
        rows.append(vector)
    return torch.stack(rows)[None]  # (1, len, DIM)


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _weights(result) -> Tensor:
    """The weights of a call made with need_weights=True (never None there)."""
    assert result.weights is not None, "asked for weights"
    return result.weights


def _sums(weights: Tensor) -> str:
    sums = weights.sum(-1).flatten()
    return f"min {sums.min().item():.4f} max {sums.max().item():.4f}"


def run_tour(out_dir: str | Path, seed: int = 0) -> Iterator[Stop]:
    """Run every mechanism and write its heatmap into ``out_dir``; yields one :class:`Stop` each."""
    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    src = _embed(SOURCE)  # (1, S, D) encoder states h_j
    tgt = _embed(TARGET, GOLD)  # (1, L, D) decoder states
    labels: dict[str, Any] = {"x_labels": SOURCE, "y_labels": TARGET}

    def picture(name: str) -> Path:
        return out_dir / f"{name}.png"

    with torch.no_grad():
        yield from _alignment_stops(src, tgt, picture, labels)
        yield from _self_attention_stops(src, picture)


def _alignment_stops(src: Tensor, tgt: Tensor, picture: Callable[[str], Path], labels: dict[str, Any]) -> Iterator[Stop]:
    """Target words attending to source words: scaled dot-product (every backend), Bahdanau, Luong."""
    L = tgt.shape[1]
    # Scaled dot-product attention, every backend.
    q, k = tgt[:, None], src[:, None]  # (B=1, H=1, L, E), (1, 1, S, E)
    results = {b: AF.attention(q, k, k, backend=b, need_weights=True) for b in ("reference", "sdpa", "tiled")}
    weights = _weights(results["reference"])[0, 0]
    spread = max((r.output - results["reference"].output).abs().max().item() for r in results.values())
    plot_heatmap(weights, picture("01_scaled_dot"), title="scaled dot-product attention", **labels)
    yield Stop("scaled dot-product attention", {
        "q": tuple(q.shape), "k": tuple(k.shape), "weights": tuple(weights.shape),
        "weight sums": _sums(weights), "max |backend - reference|": f"{spread:.2e}",
        "argmax = gold alignment": f"{_agreement(weights)}/{L}",
    }, picture("01_scaled_dot"))

    bahdanau = BahdanauAttention(DIM, DIM, 16)
    projected = bahdanau.project_keys(src)
    steps = [bahdanau(tgt[:, t], src, projected_keys=projected) for t in range(L)]
    contexts = [step.output for step in steps]
    weights = torch.stack([_weights(step) for step in steps], 1)[0]
    plot_heatmap(weights, picture("02_bahdanau"), title="Bahdanau (additive), untrained", **labels)
    yield Stop("Bahdanau additive attention", {
        "parameters": _params(bahdanau), "context per step": tuple(contexts[0].shape),
        "weights": tuple(weights.shape), "weight sums": _sums(weights),
    }, picture("02_bahdanau"))

    for index, (score, mode) in enumerate(
        [("dot", "global"), ("general", "global"), ("concat", "global"), ("dot", "local-m"), ("dot", "local-p")], 3
    ):
        luong = LuongAttention(DIM, score=score, mode=mode, half_width=2)
        if score == "general":
            nn.init.eye_(luong.score_weight.weight)  # start from the dot score
        weights = _weights(luong(tgt, src))
        name = f"{index:02d}_luong_{score}_{mode}"
        plot_heatmap(weights[0], picture(name), title=f"Luong {score}, {mode}", **labels)
        facts = {"parameters": _params(luong), "weights": tuple(weights.shape), "weight sums": _sums(weights)}
        if mode == "global" and score != "concat":
            facts["argmax = gold alignment"] = f"{_agreement(weights[0])}/{L}"
        yield Stop(f"Luong {score} ({mode})", facts, picture(name))


def _self_attention_stops(src: Tensor, picture: Callable[[str], Path]) -> Iterator[Stop]:
    """A sentence attending to itself: one head, many heads with a cache, a window, padding, positions."""
    S = src.shape[1]
    k = src[:, None]
    self_attention = SelfAttention(DIM, 16)
    result = self_attention(src, is_causal=True, need_weights=True)
    result_weights = _weights(result)
    plot_heatmap(result_weights[0], picture("08_self_attention_causal"), title="single-head causal self attention",
                 x_labels=SOURCE, y_labels=SOURCE, x_title="keys", y_title="queries")
    yield Stop("single-head causal self attention", {
        "parameters": _params(self_attention), "output": tuple(result.output.shape),
        "weight sums": _sums(result_weights), "future weight": result_weights[0].triu(1).sum().item(),
    }, picture("08_self_attention_causal"))

    mha = MultiHeadAttention(DIM, 8, num_kv_heads=2, rotary=RotaryEmbedding(DIM // 8)).eval()
    full = mha(src, is_causal=True, need_weights=True)
    cache = KVCache()
    decoded = torch.cat([mha(src[:, t : t + 1], is_causal=True, cache=cache).output for t in range(S)], 1)
    full_weights = _weights(full)
    plot_heads(full_weights[0], picture("09_multihead_gqa_rope"), x_labels=SOURCE, y_labels=SOURCE,
               title="8 query heads sharing 2 key/value heads, RoPE, causal")
    yield Stop("multi-head attention (GQA 8/2, RoPE, KV cache)", {
        "parameters": _params(mha), "weights": tuple(full_weights.shape), "weight sums": _sums(full_weights),
        "cached keys": tuple(cache.keys.shape) if cache.keys is not None else None,
        "max |cached decoding - full|": f"{(decoded - full.output).abs().max().item():.2e}",
    }, picture("09_multihead_gqa_rope"))

    window = AF.attention(k, k, k, window=4, backend="tiled", need_weights=True)
    window_weights = _weights(window)
    plot_heatmap(window_weights[0, 0], picture("10_sliding_window"), title="sliding window 4 (tiled backend)",
                 x_labels=SOURCE, y_labels=SOURCE, x_title="keys", y_title="queries")
    yield Stop("sliding-window attention (window 4, tiled)", {
        "keys per query": window_weights[0, 0].count_nonzero(-1).tolist(),
        "weight sums": _sums(window_weights),
    }, picture("10_sliding_window"))

    padded = masks.and_masks(masks.causal(S, S), masks.padding(torch.tensor([8]), S))
    result = AF.attention(k, k, k, mask=padded, need_weights=True)
    padded_weights = _weights(result)
    plot_heatmap(padded_weights[0, 0], picture("11_causal_padding"), title="causal + padding after 8 tokens",
                 x_labels=SOURCE, y_labels=SOURCE, x_title="keys", y_title="queries")
    yield Stop("causal + padding mask", {
        "mask": tuple(padded.shape), "weight on padding": padded_weights[0, 0, :, 8:].sum().item(),
    }, picture("11_causal_padding"))

    table = sinusoidal_table(64, DIM)
    plot_heatmap(table, picture("12_sinusoidal"), title="sinusoidal positions (64 x 32)",
                 x_title="feature", y_title="position", cmap="RdBu")
    yield Stop("sinusoidal positional encoding", {
        "table": tuple(table.shape), "range": f"[{table.min().item():.3f}, {table.max().item():.3f}]",
    }, picture("12_sinusoidal"))

    alibi = ALiBi(8)
    bias = alibi(S, S)
    result = AF.attention(k.expand(1, 8, S, DIM), k, k, bias=bias, is_causal=True, need_weights=True)
    alibi_weights = _weights(result)
    plot_heads(alibi_weights[0], picture("13_alibi"), x_labels=SOURCE, y_labels=SOURCE,
               title="ALiBi: one slope per head, causal")
    yield Stop("ALiBi attention bias", {
        "slopes": [round(s, 4) for s in alibi.slopes.tolist()], "bias": tuple(bias.shape),
        "weight sums": _sums(alibi_weights),
    }, picture("13_alibi"))


def _agreement(weights: Tensor) -> int:
    """How many target words put their largest weight on a source word that is their gold translation."""
    predicted = weights.argmax(-1).tolist()
    return sum(SOURCE[j] == GOLD[TARGET[i]] for i, j in enumerate(predicted))
