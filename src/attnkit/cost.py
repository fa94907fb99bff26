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
- KV cache: 2 (keys and values) x layers x Hkv x E x n values.
- For a Transformer encoder-decoder, attention FLOPs and the KV cache cover the decoder's self
  attention only; the encoder's and the cross attention are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models.config import DecoderConfig, EncoderConfig, TransformerConfig

__all__ = ["Cost", "parameter_breakdown", "estimate", "DTYPE_BYTES"]

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


def _attention_params(d_model: int, heads: int, kv_heads: int, head_dim: int, bias: bool) -> int:
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    weights = d_model * q_out + 2 * d_model * kv_out + q_out * d_model
    return weights + ((q_out + 2 * kv_out + d_model) if bias else 0)


def parameter_breakdown(config) -> dict[str, int]:
    """Parameters by part: embeddings, attention, mlp, norms, head (untied output layer, pooler), total."""
    c = config
    if isinstance(c, DecoderConfig):
        norm = c.d_model * (2 if c.norm == "layernorm" else 1)
        if c.mlp == "gelu":
            mlp = 2 * c.d_model * c.d_ff + (c.d_ff + c.d_model if c.bias else 0)
        else:
            mlp = 3 * c.d_model * c.d_ff + (2 * c.d_ff + c.d_model if c.bias else 0)
        parts = {
            "embeddings": c.vocab_size * c.d_model + (c.max_len * c.d_model if c.positional == "learned" else 0),
            "attention": c.num_layers * _attention_params(c.d_model, c.num_heads, c.kv_heads, c.head_dim, c.bias),
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
    else:
        raise TypeError(f"no cost model for {type(c).__name__}")
    parts["total"] = sum(parts.values())
    return parts


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


def _shape(config) -> tuple[int, int, int, int, bool]:
    """(layers with self attention, heads, kv heads, head dim, causal)."""
    c = config
    if isinstance(c, DecoderConfig):
        return c.num_layers, c.num_heads, c.kv_heads, c.head_dim, True
    if isinstance(c, EncoderConfig):
        return c.num_layers, c.num_heads, c.num_heads, c.d_model // c.num_heads, False
    return c.decoder_layers, c.num_heads, c.num_heads, c.d_model // c.num_heads, True


def estimate(config, seq: int, dtype: str = "bf16") -> Cost:
    """The cost of running ``config`` over ``seq`` tokens with values stored in ``dtype``."""
    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    nbytes = DTYPE_BYTES[dtype]
    parts = parameter_breakdown(config)
    layers, heads, kv_heads, head_dim, causal = _shape(config)
    window = getattr(config, "window", None)
    if isinstance(config, TransformerConfig):
        matmul = parts["attention"] + parts["mlp"] + config.target_vocab * config.d_model
    elif isinstance(config, EncoderConfig):
        matmul = parts["attention"] + parts["mlp"]
    else:
        matmul = parts["attention"] + parts["mlp"] + config.vocab_size * config.d_model
    per_context = 4 * layers * heads * head_dim  # attention FLOPs per token per attended position
    contexts = [min(c, window) if window else c for c in (range(1, seq + 1) if causal else [seq] * seq)]
    kv_per_token = 0 if isinstance(config, EncoderConfig) else 2 * layers * kv_heads * head_dim * nbytes
    held = min(seq, window) if window else seq
    return Cost(
        parameters=parts,
        seq=seq,
        dtype_bytes=nbytes,
        flops_per_token_rest=2 * matmul,
        flops_per_token_attention=per_context * contexts[-1],
        flops_per_sequence_rest=2 * matmul * seq,
        flops_per_sequence_attention=per_context * sum(contexts),
        attention_matrix_entries=seq * seq,
        attention_matrix_bytes_per_layer=heads * seq * seq * nbytes,
        kv_cache_bytes=kv_per_token * held,
        kv_cache_bytes_per_token=kv_per_token,
    )
