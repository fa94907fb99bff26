"""Float64 NumPy oracle of every mechanism in attnkit, written from the papers' formulas.

Used by the tests as the ground truth. It imports neither torch nor the rest of attnkit, works
one example and one head at a time with explicit loops where that makes the formula plain, and
trades speed for obviousness. Inputs are NumPy arrays; outputs are float64.

Conventions match attnkit's: boolean masks with True = may attend; a query row with no allowed
key has zero weights, zero output and log-sum-exp -inf.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "causal_mask",
    "sliding_window_mask",
    "padding_mask",
    "local_mask",
    "softmax",
    "attention",
    "dot_score",
    "general_score",
    "additive_score",
    "concat_score",
    "bahdanau",
    "luong",
    "multihead",
    "sinusoidal",
    "rope",
    "alibi_slopes",
    "alibi_bias",
]


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _offset(L: int, S: int, align: str) -> int:
    return S - L if align == "bottom-right" else 0


def causal_mask(L: int, S: int, align: str = "top-left") -> np.ndarray:
    """m[i, j] = j <= i + offset."""
    offset = _offset(L, S, align)
    return np.array([[j <= i + offset for j in range(S)] for i in range(L)], dtype=bool)


def sliding_window_mask(L: int, S: int, window: int, align: str = "top-left") -> np.ndarray:
    """m[i, j] = i + offset - window < j <= i + offset."""
    offset = _offset(L, S, align)
    return np.array([[i + offset - window < j <= i + offset for j in range(S)] for i in range(L)], dtype=bool)


def padding_mask(lengths, S: int) -> np.ndarray:
    """(B, S): m[b, j] = j < lengths[b]."""
    return np.array([[j < n for j in range(S)] for n in lengths], dtype=bool)


def local_mask(S: int, centers, width: float) -> np.ndarray:
    """(L, S): m[i, j] = |j - centers[i]| <= width."""
    return np.array([[abs(j - c) <= width for j in range(S)] for c in centers], dtype=bool)


def softmax(scores, mask=None, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of scores / temperature over allowed entries; 0 elsewhere and on empty rows."""
    scores = _f64(scores) / temperature
    mask = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    mask = mask & ~np.isneginf(scores)  # a -inf score counts as masked
    out = np.zeros_like(scores)
    for index in np.ndindex(scores.shape[:-1]):
        allowed = mask[index]
        if not allowed.any():
            continue
        row = scores[index][allowed]
        e = np.exp(row - row.max())
        out[index][allowed] = e / e.sum()
    return out


def _logsumexp(row: np.ndarray) -> float:
    if row.size == 0:
        return -math.inf
    top = row.max()
    return float(top + math.log(np.exp(row - top).sum()))


def attention(
    q,
    k,
    v,
    *,
    mask=None,
    is_causal: bool = False,
    causal_align: str = "top-left",
    window: int | None = None,
    bias=None,
    scale: float | None = None,
    score_mod=None,
    sinks=None,
    masked_at: float = -math.inf,
):
    """Scaled dot-product attention, one example and one head at a time.

    q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev); query head h reads key head h // (H/Hkv).
    mask: boolean broadcastable to (B, H, L, S); bias: float broadcastable to (B, H, L, S).
    score_mod: ``f(scores, b, h, i, keys) -> scores`` on one row's scores (scaled, plus bias) of
    the allowed key indices ``keys``, before the softmax (FlexAttention's score_mod, row-wise).
    sinks: (H,) learned sink logits (gpt-oss): each row's softmax runs over its scores and the
    sink logit of its head, and the sink's share is dropped (it has no value).
    masked_at: a bias at or below it is a masked key (attnkit's rule: -inf or finfo(dtype).min / 2 of
    the inputs' dtype, which float64 cannot see once the bias is converted); masked before score_mod.

    Returns (output (B, H, L, Ev), weights (B, H, L, S), lse (B, H, L)).
    """
    q, k, v = _f64(q), _f64(k), _f64(v)
    B, H, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = H // Hkv
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    allowed = np.ones((B, H, L, S), dtype=bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask, (B, H, L, S))
    if window is not None:
        allowed &= sliding_window_mask(L, S, window, causal_align)
    elif is_causal:
        allowed &= causal_mask(L, S, causal_align)
    bias = np.zeros((B, H, L, S)) if bias is None else np.broadcast_to(_f64(bias), (B, H, L, S))
    allowed &= ~(bias <= masked_at)  # a -inf (or finfo.min) bias, what an additive mask holds, is a masked key
    output = np.zeros((B, H, L, v.shape[3]))
    weights = np.zeros((B, H, L, S))
    lse = np.full((B, H, L), -math.inf)
    sinks = None if sinks is None else _f64(sinks)
    for b in range(B):
        for h in range(H):
            kv = h // group
            for i in range(L):
                keys = np.flatnonzero(allowed[b, h, i])
                if keys.size == 0 and sinks is None:
                    continue
                s = k[b, kv, keys] @ q[b, h, i] * scale + bias[b, h, i, keys]  # scores of allowed keys
                if score_mod is not None and keys.size:
                    s = score_mod(s, b, h, i, keys)
                logits = s if sinks is None else np.append(s, sinks[h])
                lse[b, h, i] = _logsumexp(logits)
                top = logits.max()  # weights from the shifted scores: exp(s - lse) loses them when |lse| is huge
                a = np.exp(s - top) / np.exp(logits - top).sum()
                weights[b, h, i, keys] = a
                output[b, h, i] = a @ v[b, kv, keys]
    return output, weights, lse


def dot_score(q, k) -> np.ndarray:
    """(..., L, D), (..., S, D) -> (..., L, S): q_i . k_j."""
    return _f64(q) @ np.swapaxes(_f64(k), -1, -2)


def general_score(q, k, W) -> np.ndarray:
    """q_i^T W k_j, W (Dq, Dk)."""
    return _f64(q) @ _f64(W) @ np.swapaxes(_f64(k), -1, -2)


def additive_score(q, k, W_q, W_k, v, b_q=None, b_k=None) -> np.ndarray:
    """v^T tanh(W_q q_i + b_q + W_k k_j + b_k); W_q (A, Dq), W_k (A, Dk), v (A,). q (L, Dq), k (S, Dk)."""
    q, k = _f64(q), _f64(k)
    b_q = 0.0 if b_q is None else _f64(b_q)
    b_k = 0.0 if b_k is None else _f64(b_k)
    out = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            out[i, j] = _f64(v) @ np.tanh(_f64(W_q) @ q[i] + b_q + _f64(W_k) @ k[j] + b_k)
    return out


def concat_score(q, k, W, v) -> np.ndarray:
    """v^T tanh(W [q_i; k_j]); W (A, Dq + Dk). q (L, Dq), k (S, Dk)."""
    q, k = _f64(q), _f64(k)
    out = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            out[i, j] = _f64(v) @ np.tanh(_f64(W) @ np.concatenate([q[i], k[j]]))
    return out


def bahdanau(query, keys, values, W_q, W_k, v, mask=None, b_q=None, b_k=None, temperature: float = 1.0):
    """Bahdanau et al. (2014): for query (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), mask (B, S).

    Returns context (B, L, Dv) and weights (B, L, S).
    """
    contexts, all_weights = [], []
    for b in range(len(query)):
        e = additive_score(query[b], keys[b], W_q, W_k, v, b_q, b_k)
        a = softmax(e, None if mask is None else mask[b][None, :], temperature)
        contexts.append(a @ _f64(values[b]))
        all_weights.append(a)
    return np.stack(contexts), np.stack(all_weights)


def luong(
    query,
    keys,
    values,
    *,
    score: str = "dot",
    mode: str = "global",
    window: int = 10,
    W=None,
    v=None,
    W_p=None,
    v_p=None,
    positions=None,
    mask=None,
    temperature: float = 1.0,
):
    """Luong et al. (2015) attention for query (B, L, D), keys (B, S, D), values (B, S, Dv).

    score: dot | general (W (D, D)) | concat (W (D, 2D), v (D,)).
    mode: global | local-m (centres = positions (B, L), default 0..L-1) |
    local-p (p_t = S_b sigmoid(v_p . tanh(W_p h_t)), Gaussian sigma = window / 2, not renormalised).
    mask: (B, S) source padding; S_b = number of allowed positions.

    Returns context (B, L, Dv) and weights (B, L, S).
    """
    contexts, all_weights = [], []
    B, L = len(query), len(query[0])
    S = len(keys[0])
    for b in range(B):
        if score == "dot":
            e = dot_score(query[b], keys[b])
        elif score == "general":
            e = general_score(query[b], keys[b], W)
        else:
            e = concat_score(query[b], keys[b], W, v)
        allowed = np.ones((L, S), dtype=bool) if mask is None else np.tile(mask[b], (L, 1))
        prior = np.ones((L, S))
        if mode == "local-m":
            centers = np.arange(L) if positions is None else _f64(positions[b])
            allowed &= local_mask(S, centers, window)
        elif mode == "local-p":
            length = S if mask is None else int(np.sum(mask[b]))
            h = _f64(query[b])
            centers = np.array([length / (1 + math.exp(-(_f64(v_p) @ np.tanh(_f64(W_p) @ h[i])))) for i in range(L)])
            allowed &= local_mask(S, centers, window)
            sigma = window / 2
            prior = np.array([[math.exp(-((j - c) ** 2) / (2 * sigma**2)) for j in range(S)] for c in centers])
        a = softmax(e, allowed, temperature) * prior
        contexts.append(a @ _f64(values[b]))
        all_weights.append(a)
    return np.stack(contexts), np.stack(all_weights)


def multihead(query, key, value, params: dict, num_heads: int, num_kv_heads: int | None = None, **attention_kwargs):
    """Multi-head attention (Vaswani et al. 2017) with grouped key/value heads.

    query (B, L, D), key (B, S, kdim), value (B, S, vdim). params: W_q (D, D), W_k and W_v
    (Hkv E, kdim / vdim), W_o (D, D) in the (out, in) layout of nn.Linear, optional b_q, b_k, b_v,
    b_o. attention_kwargs go to :func:`attention`.

    Returns output (B, L, D), weights (B, H, L, S).
    """
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    query, key, value = _f64(query), _f64(key), _f64(value)

    def project(x, name):
        y = x @ _f64(params["W_" + name]).T
        return y + _f64(params["b_" + name]) if params.get("b_" + name) is not None else y

    def heads(x, n):
        B, T, width = x.shape
        return x.reshape(B, T, n, width // n).transpose(0, 2, 1, 3)

    q = heads(project(query, "q"), num_heads)
    k = heads(project(key, "k"), num_kv_heads)
    v = heads(project(value, "v"), num_kv_heads)
    out, weights, _ = attention(q, k, v, **attention_kwargs)
    B, H, L, E = out.shape
    merged = out.transpose(0, 2, 1, 3).reshape(B, L, H * E)
    return project(merged, "o"), weights


def sinusoidal(length: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / base^(2i/dim)), PE[pos, 2i+1] = cos(pos / base^(2i/dim))."""
    pe = np.zeros((length, dim))
    for pos in range(length):
        for col in range(dim):
            i2 = col - col % 2
            angle = pos / base ** (i2 / dim)
            pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return pe


def rope(x, positions, base: float = 10000.0, interleaved: bool = False) -> np.ndarray:
    """Rotate x (..., L, E) at positions (L,): pair p of features turns by positions * base^(-2p/E).

    Pairs are (p, p + E/2) by default (GPT-NeoX / Hugging Face), (2p, 2p+1) if interleaved.
    """
    x = _f64(x)
    E = x.shape[-1]
    out = np.empty_like(x)
    for t, pos in enumerate(positions):
        for p in range(E // 2):
            theta = pos * base ** (-2 * p / E)
            a, b = (2 * p, 2 * p + 1) if interleaved else (p, p + E // 2)
            xa, xb = x[..., t, a], x[..., t, b]
            out[..., t, a] = xa * math.cos(theta) - xb * math.sin(theta)
            out[..., t, b] = xa * math.sin(theta) + xb * math.cos(theta)
    return out


def alibi_slopes(n: int) -> np.ndarray:
    """Press et al. (2022): 2^(-8 k / n) for k = 1..n if n is a power of two; else the slopes of the
    closest smaller power of two m, then slopes 1, 3, 5, ... of 2m, n - m of them."""

    def geometric(m: int) -> list[float]:
        return [2.0 ** (-8.0 * (k + 1) / m) for k in range(m)]

    m = 1
    while 2 * m <= n:
        m *= 2
    return np.array(geometric(m) + geometric(2 * m)[0::2][: n - m])


def alibi_bias(slopes, L: int, S: int, causal_align: str = "bottom-right", symmetric: bool = False) -> np.ndarray:
    """(1, H, L, S): -m_h (i + offset - j), or -m_h |i + offset - j| if symmetric."""
    offset = _offset(L, S, causal_align)
    out = np.zeros((1, len(slopes), L, S))
    for h, m in enumerate(slopes):
        for i in range(L):
            for j in range(S):
                d = i + offset - j
                out[0, h, i, j] = -m * (abs(d) if symmetric else d)
    return out
