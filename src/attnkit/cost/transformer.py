"""What a model costs: parameters, FLOPs per token and per sequence (attention vs the rest),
the attention matrix if materialised, and the KV cache, computed from a config alone.

Conventions (stated so the numbers can be checked by hand):
- A multiply-add is 2 FLOPs; forward pass only; biases, norms, softmax and activations are not
  counted in FLOPs (they are in parameters).
- "rest" FLOPs per token = 2 x (parameters of the layers a token goes through by matrix
  multiplication: attention projections, MLP and output layer, their biases included, as in
  Kaplan et al. 2020's C = 2N; not embeddings that are only looked up, not norms).
- "attention" FLOPs per token at context c = 4 x c x (H x E) per layer (Q K^T and the weighted
  sum of V). A causal sequence of n tokens sums c = 1..n; a bidirectional encoder uses c = n.
- Attention matrix: n x n entries per head per layer (what a plain implementation materialises;
  the fused and tiled backends do not), times H heads for one layer.
- KV cache: 2 (keys and values) x layers x Hkv x E x n values; latent attention (DeepSeek) caches
  (kv_lora_rank + qk_rope_head_dim) values a token and layer, and the output names what multi-head and
  grouped-query attention would cache for the same model.
- A mixture-of-experts model's "rest" FLOPs count the parameters a token goes through: the router, its
  chosen experts and the shared ones (DeepSeek-V3: 37B of 671B).
- For a Transformer encoder-decoder, attention FLOPs and the KV cache cover the decoder's self
  attention only; the encoder's and the cross attention are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..functional.checks import check_int
from ..functional.mask_mods import pattern_options
from ..models.config import DecoderConfig, DeepSeekConfig, EncoderConfig, TransformerConfig

__all__ = ["Cost", "parameter_breakdown", "estimate", "pattern_pairs", "PATTERN_OPTIONS", "DTYPE_BYTES", "bytes_text", "flops_text"]


def bytes_text(n: float) -> str:
    """``n`` bytes in the binary unit that keeps 1-4 digits before the point: "512 B", "3.0 KiB", "64.0 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def flops_text(n: float) -> str:
    """``n`` floating-point operations in the decimal unit that keeps 1-3 digits before the point: "12.3 MFLOP",
    "140.6 TFLOP" (never "0.000 T")."""
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:,.0f} FLOP" if not unit else f"{n:,.1f} {unit}FLOP"
        n /= 1000
    raise AssertionError("unreachable")

MAX_SEQ = 10**12
"""Longest sequence :func:`estimate` answers for (the arithmetic is closed form; beyond this the
figures stop meaning anything)."""
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


def _attention_params(d_model: int, heads: int, kv_heads: int, head_dim: int, bias: bool,
                      out_bias: bool | None = None) -> int:
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    weights = d_model * q_out + 2 * d_model * kv_out + q_out * d_model
    out_bias = bias if out_bias is None else out_bias
    return weights + ((q_out + 2 * kv_out) if bias else 0) + (d_model if out_bias else 0)


def parameter_breakdown(config) -> dict[str, int]:
    """Parameters by part: embeddings, attention, mlp, norms, head (untied output layer, pooler), total."""
    c = config
    if isinstance(c, DecoderConfig):
        norm = c.d_model * (2 if c.norm == "layernorm" else 1)
        mlp_bias = c.has_bias("mlp")
        if c.mlp == "gelu":
            mlp = 2 * c.d_model * c.d_ff + (c.d_ff + c.d_model if mlp_bias else 0)
        else:
            mlp = 3 * c.d_model * c.d_ff + (2 * c.d_ff + c.d_model if mlp_bias else 0)
        parts = {
            "embeddings": c.vocab_size * c.d_model + (c.max_len * c.d_model if c.positional == "learned" else 0),
            "attention": c.num_layers * _attention_params(c.d_model, c.num_heads, c.kv_heads, c.head_dim,
                                                          c.has_bias("qkv"), c.has_bias("out")),
            "mlp": c.num_layers * mlp,
            "norms": (2 * c.num_layers + 1) * norm,
            "head": 0 if c.tie_embeddings else c.vocab_size * c.d_model,
        }
    elif isinstance(c, EncoderConfig):
        E = c.d_model // c.num_heads
        parts = {
            "embeddings": (c.vocab_size + c.max_len + c.type_vocab_size) * c.d_model + 2 * c.d_model,
            "attention": c.num_layers * _attention_params(c.d_model, c.num_heads, c.num_heads, E, True),
            "mlp": c.num_layers * (2 * c.d_model * c.d_ff + c.d_ff + c.d_model),
            "norms": c.num_layers * 4 * c.d_model,
            "head": (c.d_model * c.d_model + c.d_model) if c.pooler else 0,
        }
    elif isinstance(c, TransformerConfig):
        E = c.d_model // c.num_heads
        attention = _attention_params(c.d_model, c.num_heads, c.num_heads, E, c.bias)
        embeddings = c.source_vocab * c.d_model + (0 if c.share_embeddings else c.target_vocab * c.d_model)
        if c.positional == "learned":
            embeddings += 2 * c.max_len * c.d_model
        final_norms = 2 * 2 * c.d_model if c.norm == "pre" else 0
        parts = {
            "embeddings": embeddings,
            "attention": (c.encoder_layers + 2 * c.decoder_layers) * attention,
            "mlp": (c.encoder_layers + c.decoder_layers) * (2 * c.d_model * c.d_ff + c.d_ff + c.d_model),
            "norms": (2 * c.encoder_layers + 3 * c.decoder_layers) * 2 * c.d_model + final_norms,
            "head": (0 if c.share_embeddings else c.target_vocab * c.d_model) + c.target_vocab,
        }
    elif isinstance(c, DeepSeekConfig):
        parts = _latent_parameters(c)
    else:
        raise TypeError(f"no cost model for {type(c).__name__}")
    parts["total"] = sum(parts.values())
    return parts


def _latent_attention_parameters(c: DeepSeekConfig) -> int:
    """One latent-attention layer (and its indexer): the query path, the latent down/up projections, out."""
    H, qk = c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
    query = c.d_model * H * qk if c.q_lora_rank is None else (
        c.d_model * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * H * qk + (c.q_lora_rank if c.attention_bias else 0))
    latent = c.d_model * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank + c.kv_lora_rank * H * (
        c.qk_nope_head_dim + c.v_head_dim)
    out = H * c.v_head_dim * c.d_model
    bias = (c.kv_lora_rank + c.qk_rope_head_dim + c.d_model) if c.attention_bias else 0
    index = 0 if c.index_topk is None or c.q_lora_rank is None else (
        c.q_lora_rank * c.index_heads * c.index_head_dim + c.d_model * c.index_head_dim + 2 * c.index_head_dim
        + c.d_model * c.index_heads)
    return query + latent + out + bias + index


def _latent_parameters(c: DeepSeekConfig) -> dict[str, int]:
    moe_layers = c.num_layers - c.first_dense_layers
    expert = 3 * c.d_model * c.moe_d_ff
    return {
        "embeddings": c.vocab_size * c.d_model,
        "attention": c.num_layers * _latent_attention_parameters(c),
        "mlp": c.first_dense_layers * 3 * c.d_model * c.d_ff
        + moe_layers * (c.num_experts * expert + c.num_experts * c.d_model + c.num_shared_experts * expert),
        "norms": (2 * c.num_layers + 1) * c.d_model,
        "head": 0 if c.tie_embeddings else c.vocab_size * c.d_model,
    }


def _activated_matmul(c: DeepSeekConfig) -> int:
    """Parameters a token multiplies through: attention, the dense MLPs, the router, its chosen and the
    shared experts, the output layer."""
    expert = 3 * c.d_model * c.moe_d_ff
    moe = c.num_experts * c.d_model + (c.experts_per_token + c.num_shared_experts) * expert
    return (c.num_layers * _latent_attention_parameters(c) + c.first_dense_layers * 3 * c.d_model * c.d_ff
            + (c.num_layers - c.first_dense_layers) * moe + c.vocab_size * c.d_model)


@dataclass(frozen=True)
class Cost:
    parameters: dict[str, int]
    seq: int
    dtype_bytes: int
    flops_per_token_rest: int
    flops_per_token_attention: int  # at the last position (context = seq)
    flops_per_sequence_rest: int
    flops_per_sequence_attention: int
    attention_matrix_entries: int  # n x n, one head of one layer
    attention_matrix_bytes_per_layer: int  # all heads of one layer
    kv_cache_bytes: int  # whole sequence, all layers (0 for encoders)
    kv_cache_bytes_per_token: int
    attention_entries_computed: int = 0  # (query, key) pairs one head of one layer scores, window applied
    kv_cache_alternatives: tuple[tuple[str, int], ...] = ()  # (what, bytes per token): the same model's other caches
    notes: tuple[str, ...] = ()  # what the figures assume: trained length exceeded, windows
    pattern: str | None = None  # a sparse pattern from attnkit.masks.PATTERNS, if one was given
    dense_mask_bytes: int = 0  # the (n, n) boolean mask SDPA would need for the pattern
    block_mask_bytes: int = 0  # attnkit's BlockMask tile kinds for it (int8 per 128 x 128 tile)


def _pairs(seq: int, window: int | None, causal: bool) -> tuple[int, int]:
    """(query-key pairs over the sequence, keys seen by the last query), in closed form."""
    if not causal:
        return seq * seq, seq
    if window is None or window >= seq:
        return seq * (seq + 1) // 2, seq
    return window * (window + 1) // 2 + (seq - window) * window, window


PATTERN_OPTIONS: dict[str, dict[str, Any]] = {
    "causal": {},
    "window": {"width": 512},
    "longformer": {"width": 512, "num_global": 16},
    "bigbird": {"window_blocks": 3, "num_global": 1, "random_blocks": 3, "block": 64},
    "prefix-lm": {"prefix": None},
    "documents": {"documents": 8},
    "dilated": {"width": 512, "dilation": 2},
    "sinks": {"sinks": 4, "window": 512},
}
"""Patterns :func:`pattern_pairs` counts in closed form, with the defaults of attnkit.masks.PATTERNS
(prefix None: a quarter of n)."""


def _sum_min(count: int, start: int, cap: int) -> int:
    """sum_{i=0}^{count-1} min(i + start, cap)."""
    linear = max(0, min(count, cap - start + 1))
    return linear * (linear - 1) // 2 + linear * start + (count - linear) * cap


def _sum_excess(count: int, threshold: int) -> int:
    """sum_{i=0}^{count-1} max(i - threshold, 0)."""
    u = max(0, count - 1 - threshold)
    return u * (u + 1) // 2


def _band(n: int, radius: int) -> int:
    """Pairs (i, j) in n x n with |i - j| <= radius."""
    m = min(radius, n - 1)
    return n + 2 * (m * n - m * (m + 1) // 2)


def _dilated_side(n: int, radius: int, dilation: int) -> int:
    """sum_{i<n} min(radius, i // dilation): the keys one side of each query in a dilated window."""
    full = min(n // dilation, radius)
    total = dilation * full * (full - 1) // 2
    return total + (n - full * dilation) * full


_POSITIVE_OPTIONS = frozenset({"block", "dilation", "documents"})
"""Options for which 0 has no meaning (a block of no keys, a dilation of 0, no document)."""


def pattern_pairs(pattern: str, n: int, **options) -> tuple[int, int | None, bool]:
    """(query-key pairs a pattern allows in n x n, keys the last query attends (None: n), exact?) in closed
    form, for the named patterns of :data:`PATTERN_OPTIONS`. BigBird's random blocks may fall on
    its window or globals; its figures are then an upper bound (exact = False)."""
    if pattern not in PATTERN_OPTIONS:
        raise ValueError(f"pattern must be one of {sorted(PATTERN_OPTIONS)}, got {pattern!r}")
    options = pattern_options(pattern, options)  # old option names (window of a band) warn and are honoured
    unknown = set(options) - set(PATTERN_OPTIONS[pattern])
    if unknown:
        raise ValueError(f"pattern {pattern!r} takes options {sorted(PATTERN_OPTIONS[pattern])}, got {sorted(unknown)}")
    o = {**PATTERN_OPTIONS[pattern], **options}
    for name, value in o.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InputError(f"{pattern} option {name} must be a non-negative int, got {value!r}")
        if name in _POSITIVE_OPTIONS and value is not None and value < 1:  # never silently computed as 1
            raise InputError(f"{pattern} option {name} must be >= 1, got {value!r}")
    if pattern == "causal":
        return n * (n + 1) // 2, n, True
    if pattern == "window":
        r = o["width"] // 2
        return _band(n, r), min(n, r + 1), True
    if pattern == "longformer":
        r, g = o["width"] // 2, min(o["num_global"], n)
        rows_in_band = _sum_min(g, r + 1, n) - _sum_excess(g, r)  # band pairs in the global rows
        pairs = _band(n, r) + 2 * g * n - g * g - 2 * rows_in_band + _band(g, r) if g else _band(n, r)
        return pairs, n if g and n - 1 < g else (min(n, r + 1) + (g if n - 1 - r > g else max(0, n - 1 - r))), True
    if pattern == "sinks":
        k, w = o["sinks"], max(1, o["window"])
        pairs = _sum_min(n, 1, w) + _sum_excess(n, w - 1) - _sum_excess(n, w + k - 1)
        return pairs, min(n, w) + max(0, min(k, n - w)), True
    if pattern == "documents":
        d = max(1, min(o["documents"], n))
        q, extra = divmod(n, d)
        return (d - extra) * q * (q + 1) // 2 + extra * (q + 1) * (q + 2) // 2, None, True
    if pattern == "prefix-lm":
        p = min(n, n // 4 if o["prefix"] is None else o["prefix"])
        return n * (n + 1) // 2 + p * (p - 1) // 2, n, True
    if pattern == "dilated":
        r, dilation = o["width"] // 2, max(1, o["dilation"])
        return n + 2 * _dilated_side(n, r, dilation), 1 + min(r, (n - 1) // dilation), True
    # bigbird
    b = max(1, o["block"])
    blocks = -(-n // b)
    g = min(o["num_global"], blocks)
    per_row = min(blocks, 2 * (o["window_blocks"] // 2) + 1 + g + o["random_blocks"])
    global_rows = min(n, g * b)
    return global_rows * n + (n - global_rows) * min(n, per_row * b), min(n, per_row * b), False


def _latent_estimate(c: DeepSeekConfig, seq: int, nbytes: int) -> Cost:
    """:func:`estimate` for latent attention: the cache holds (kv_lora_rank + qk_rope_head_dim) numbers a token
    and layer; attention FLOPs as the naive way computes them (each head's key of qk_nope + qk_rope and value
    of v_head_dim; the absorbed way's are in a note); with DSA each query scores at most index_topk keys, and
    the indexer every earlier one with its small heads."""
    H, qk, layers = c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim, c.num_layers
    per_context = 2 * H * qk + 2 * H * c.v_head_dim
    absorbed = 2 * H * (c.kv_lora_rank + c.qk_rope_head_dim) + 2 * H * c.kv_lora_rank
    full_pairs, _ = _pairs(seq, None, True)
    pairs, last = full_pairs, seq
    notes = [f"absorbed decoding (the latent attended as one key head) takes {absorbed:,} FLOPs per attended "
             f"position and layer against the naive {per_context:,}: it trades FLOPs for reading the cache once"]
    index_flops_last = index_flops_pairs = 0
    if c.index_topk is not None:
        k = c.index_topk
        pairs = sum_min = min(seq, k) * (min(seq, k) + 1) // 2 + max(0, seq - k) * k
        last = min(seq, k)
        index_flops_last = 2 * c.index_heads * c.index_head_dim * seq * layers
        index_flops_pairs = 2 * c.index_heads * c.index_head_dim * full_pairs * layers
        notes.append(f"DeepSeek sparse attention: each query attends at most {k:,} keys ({sum_min:,} of {full_pairs:,} "
                     f"pairs per head per layer); the indexer scores every earlier token with {c.index_heads} heads of "
                     f"{c.index_head_dim}")
    latent = (c.kv_lora_rank + c.qk_rope_head_dim + (c.index_head_dim if c.index_topk is not None else 0)) * nbytes
    mha = H * (qk + c.v_head_dim) * nbytes  # every head's key (qk_nope + qk_rope) and value
    gqa = 8 * (qk + c.v_head_dim) * nbytes
    parts = _latent_parameters(c)
    parts["total"] = sum(parts.values())
    matmul = _activated_matmul(c)
    if seq > c.max_len:
        notes.append(f"seq {seq:,} exceeds the {c.max_len:,}-token context this model was configured for")
    return Cost(parameters=parts, seq=seq, dtype_bytes=nbytes, flops_per_token_rest=2 * matmul,
                flops_per_token_attention=per_context * last * layers + index_flops_last,
                flops_per_sequence_rest=2 * matmul * seq,
                flops_per_sequence_attention=per_context * pairs * layers + index_flops_pairs,
                attention_matrix_entries=seq * seq, attention_matrix_bytes_per_layer=H * seq * seq * nbytes,
                kv_cache_bytes=latent * layers * seq, kv_cache_bytes_per_token=latent * layers,
                attention_entries_computed=pairs, notes=tuple(notes),
                kv_cache_alternatives=(("multi-head attention (keys and values of every head)", mha * layers),
                                       ("grouped-query attention, 8 key/value heads", gqa * layers)))


def _shape(config) -> tuple[int, int, int, int, bool]:
    """(layers with self attention, heads, kv heads, head dim, causal)."""
    c = config
    if isinstance(c, DecoderConfig):
        return c.num_layers, c.num_heads, c.kv_heads, c.head_dim, True
    if isinstance(c, EncoderConfig):
        return c.num_layers, c.num_heads, c.num_heads, c.d_model // c.num_heads, False
    return c.decoder_layers, c.num_heads, c.num_heads, c.d_model // c.num_heads, True


def estimate(config, seq: int, dtype: str = "bf16", pattern: str | None = None, **pattern_options) -> Cost:
    """The cost of running ``config`` over ``seq`` tokens with values stored in ``dtype``; with a
    sparse ``pattern`` (see :data:`PATTERN_OPTIONS`) on every layer, attention FLOPs count only
    the pairs it allows, and the masks' memory is given (dense boolean vs block mask)."""
    check_int("seq", seq, 1, MAX_SEQ)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    nbytes = DTYPE_BYTES[dtype]
    if isinstance(config, DeepSeekConfig):
        if pattern is not None:
            raise ValueError("pattern= is for dense attention; a DeepSeek model's sparsity is its index_topk")
        return _latent_estimate(config, seq, nbytes)
    parts = parameter_breakdown(config)
    layers, heads, kv_heads, head_dim, causal = _shape(config)
    window = getattr(config, "window", None)
    if isinstance(config, TransformerConfig):
        matmul = parts["attention"] + parts["mlp"] + config.target_vocab * config.d_model
    elif isinstance(config, EncoderConfig):
        matmul = parts["attention"] + parts["mlp"]
    else:
        matmul = parts["attention"] + parts["mlp"] + config.vocab_size * config.d_model
    per_context = 4 * heads * head_dim  # attention FLOPs per token per attended position, one layer
    window_layers = layers if window and getattr(config, "window_layers", None) is None else (
        len(config.window_layers) if window else 0)
    full_pairs, full_last = _pairs(seq, None, causal)
    windowed_pairs, windowed_last = _pairs(seq, window, causal) if window else (full_pairs, full_last)
    pairs_total = (layers - window_layers) * full_pairs + window_layers * windowed_pairs
    last_total = (layers - window_layers) * full_last + window_layers * windowed_last
    kv_per_token = 0 if isinstance(config, EncoderConfig) else 2 * kv_heads * head_dim * nbytes
    held = (layers - window_layers) * seq + window_layers * min(seq, window or seq)
    notes = []
    max_len = getattr(config, "max_len", None)
    if max_len is not None and seq > max_len:
        learned = isinstance(config, EncoderConfig) or getattr(config, "positional", "") in ("learned", "sinusoidal")
        notes.append(f"seq {seq:,} exceeds the {max_len:,} positions this model has"
                     + (": it cannot run at this length (learned positions)" if learned
                        else " (trained context): RoPE runs, quality beyond it is not given"))
    if window:
        notes.append(f"sliding window of {window:,} on {window_layers} of {layers} layers: attention FLOPs and the "
                     f"KV cache use it; dense attention would score {full_pairs:,} pairs per head per layer "
                     f"instead of {windowed_pairs:,}")
    extra: dict[str, Any] = {}
    computed = windowed_pairs if window else full_pairs
    if pattern is not None:
        if window:
            raise ValueError("pattern= replaces the model's sliding window; give a config without window")
        pairs, last, exact = pattern_pairs(pattern, seq, **pattern_options)
        computed = pairs
        pairs_total = layers * pairs
        last_total = layers * (seq if last is None else last)
        if pattern == "sinks":
            o = {**PATTERN_OPTIONS["sinks"], **pattern_options}
            held = layers * min(seq, o["sinks"] + o["window"])
        tiles = -(-seq // 128)
        extra = {"pattern": pattern, "dense_mask_bytes": seq * seq, "block_mask_bytes": tiles * tiles}
        notes.append(f"pattern {pattern}: {pairs:,} of {seq * seq:,} pairs per head per layer "
                     f"({100 * pairs / (seq * seq):.3g}%)" + ("" if exact else ", an upper bound (random blocks may overlap)")
                     + f"; as a boolean tensor the mask takes {bytes_text(seq * seq)}, as attnkit's BlockMask "
                     f"{bytes_text(tiles * tiles)}")
    return Cost(
        parameters=parts,
        seq=seq,
        dtype_bytes=nbytes,
        flops_per_token_rest=2 * matmul,
        flops_per_token_attention=per_context * last_total,
        flops_per_sequence_rest=2 * matmul * seq,
        flops_per_sequence_attention=per_context * pairs_total,
        attention_matrix_entries=seq * seq,
        attention_matrix_bytes_per_layer=heads * seq * seq * nbytes,
        kv_cache_bytes=kv_per_token * held,
        kv_cache_bytes_per_token=kv_per_token * layers,
        attention_entries_computed=computed,
        notes=tuple(notes),
        **extra,
    )
