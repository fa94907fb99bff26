r"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", section 2.1), with DeepSeek sparse
attention (DSA; DeepSeek-V3.2) as an option.

    c_Q = RMSNorm(x W_DQ),  [q_C ; q_R] = c_Q W_UQ    (or x W_Q without a query latent)
    c_KV = RMSNorm(x W_DKV),  k_R = x W_KR            (one rotary key per token, shared by the heads)
    [k_C,h ; v_h] = c_KV W_UKV,h                      (each head's key and value, up from the latent)
    o_h = softmax((q_C,h . k_C,h + RoPE(q_R,h) . RoPE(k_R)) scale) v_h,   out = [o_1 ... o_H] W_O

Only c_KV and RoPE(k_R) are cached: (kv_lora_rank + qk_rope_head_dim) numbers per token and layer
(:class:`LatentCache`), against 2 H E for multi-head attention. Two exact ways to attend:

- **naive**: each head's key and value formed from the latent (any backend, any length);
- **absorbed** (decoding): q_C,h . (c_KV W_UK,h) = (q_C,h W_UK,h^T) . c_KV, so the query absorbs W_UK,h
  and the heads attend the latent itself, multi-query attention over keys [c_KV ; k_R] and values c_KV
  (one key head of kv_lora_rank + qk_rope_head_dim); W_UV,h then maps each head's output. No per-head
  key or value exists: a decoding step reads the latent cache once for all heads.

With a :class:`~attnkit.layers.indexer.LightningIndexer`, each query attends only the top-k keys the
indexer selects (:func:`attnkit.functional.topk.topk_attention`), in either way.

Shape legend: B batch, L new tokens, S tokens attended (cached + new), D model dim, H heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..functional.attention import BACKEND_NAMES, AttentionOutput, attention
from ..functional.checks import check_int, check_rank
from ..functional.heads import merge_heads, split_heads
from ..functional.topk import topk_attention
from .attending import AttentionCall
from .cache import KVCache
from .indexer import LightningIndexer
from .positional import RotaryEmbedding

__all__ = ["LatentAttention", "LatentCache", "Latents"]


class Latents(NamedTuple):
    """What attention reads of the tokens it attends: ``latent`` c_KV (B, 1, S, kv_lora_rank), ``rope_key``
    RoPE(k_R) (B, 1, S, qk_rope_head_dim), ``index_key`` the indexer's keys (B, S, index_head_dim) or None."""

    latent: Tensor
    rope_key: Tensor
    index_key: Tensor | None = None


class LatentAttention(nn.Module):
    """Multi-head latent attention (module docstring), batch first: (B, L, D) -> (B, L, D).

    Args:
        d_model: D. num_heads: H.
        kv_lora_rank: the latent's width (DeepSeek-V3: 512).
        qk_nope_head_dim, qk_rope_head_dim: the parts of a query or key head without and with RoPE (128, 64).
        v_head_dim: a value head's width (128).
        q_lora_rank: the query latent's width (1536), or None for a plain query projection (DeepSeek-V2-Lite).
        bias: biases on the down projections (DeepSeek's ``attention_bias``).
        rotary: the RoPE of the rotary parts (default: base 10000, interleaved pairs as DeepSeek-V3).
        rope: False for no rotation at all (NoPE: Kimi Linear's latent attention keeps the shared key part of
            qk_rope_head_dim and rotates nothing; positions then only order the causal mask).
        scale: multiplies the scores (default 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim); YaRN models
            multiply it by mscale^2).
        norm_eps: the latents' RMSNorm epsilon.
        backend: attention backend (:func:`attnkit.attention`).
        indexer: a :class:`~attnkit.layers.indexer.LightningIndexer`: DeepSeek sparse attention.

    Parameters (DeepSeek's names): ``q_proj`` or ``q_a_proj`` / ``q_a_norm`` / ``q_b_proj``; ``kv_a_proj``
    (D -> kv_lora_rank + qk_rope_head_dim), ``kv_a_norm``, ``kv_b_proj`` (kv_lora_rank -> H (qk_nope +
    v_head_dim)), ``out_proj`` (H v_head_dim -> D), and the ``indexer``'s.
    """

    def __init__(self, d_model: int, num_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None, bias: bool = False,
                 rotary: RotaryEmbedding | None = None, scale: float | None = None, norm_eps: float = 1e-6,
                 backend: str = "auto", indexer: LightningIndexer | None = None, rope: bool = True):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("kv_lora_rank", kv_lora_rank),
                            ("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim),
                            ("v_head_dim", v_head_dim)):
            check_int(name, value, 1)
        check_int("q_lora_rank", q_lora_rank, 1, optional=True)
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
        if not rope and rotary is not None:
            raise ValueError("rope=False rotates nothing: pass no rotary")
        rotary = rotary if rotary is not None or not rope else RotaryEmbedding(qk_rope_head_dim, interleaved=True)
        if rotary is not None and rotary.full_dim != qk_rope_head_dim:
            raise ValueError(f"rotary.head_dim={rotary.full_dim} does not match qk_rope_head_dim={qk_rope_head_dim}")
        self.d_model, self.num_heads = d_model, num_heads
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.scale = scale if scale is not None else (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
        self.backend = backend
        self.rotary: RotaryEmbedding | None = rotary
        query_width = num_heads * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, query_width, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, q_lora_rank, bias=bias)
            self.q_a_norm = nn.RMSNorm(q_lora_rank, eps=norm_eps)
            self.q_b_proj = nn.Linear(q_lora_rank, query_width, bias=False)
        self.kv_a_proj = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_a_norm = nn.RMSNorm(kv_lora_rank, eps=norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.out_proj = nn.Linear(num_heads * v_head_dim, d_model, bias=bias)
        if indexer is not None and (q_lora_rank is None or indexer.q_lora_rank != q_lora_rank):
            raise ValueError("indexer: DeepSeek sparse attention's indexer reads the query latent; give the layer a "
                             f"q_lora_rank equal to the indexer's (got {q_lora_rank} and {getattr(indexer, 'q_lora_rank', None)})")
        self.indexer = indexer

    def forward(self, x: Tensor, *, mask: Tensor | None = None, key_mask: Tensor | None = None, is_causal: bool = True,
                positions: Tensor | None = None, cache: LatentCache | None = None, need_weights: bool | Sequence[int] = False,
                absorbed: bool | None = None) -> AttentionOutput:
        """Attend from x (B, L, D) to itself (and to what ``cache`` holds).

        ``mask`` boolean (B|1, 1|H, L, S), True = may attend; ``key_mask`` (B, S) True at real tokens (S counts
        cached tokens too); ``is_causal`` causal attention, aligned bottom-right with a cache; ``positions``
        (L,) or (B, L) the RoPE positions of the new tokens (default: the cache's position onwards);
        ``absorbed``: attend the latent directly (module docstring); default: with a cache (decoding).
        Returns :class:`AttentionOutput`: output (B, L, D), weights (B, H, L, S) when asked."""
        check_rank("x", x, 3, "(B, L, D)")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have last dim d_model={self.d_model}, got shape {tuple(x.shape)}")
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"cache must be a LatentCache (it holds the latents), got {type(cache).__name__}")
        if self.q_lora_rank is None:
            query_latent = None
            q = self.q_proj(x)
        else:
            query_latent = self.q_a_norm(self.q_a_proj(x))  # c_Q (B, L, q_lora_rank)
            q = self.q_b_proj(query_latent)
        q = split_heads(q, self.num_heads)  # (B, H, L, qk_nope + qk_rope), the rotary part unrotated
        call = AttentionCall(mask=mask, is_causal=is_causal, need_weights=need_weights, positions=positions,
                             key_mask=key_mask)
        absorbed = cache is not None if absorbed is None else absorbed
        strategy = cache if cache is not None else _PLAIN_LATENT
        result = strategy.attend_latent(self, q, x, _LatentCall(call, query_latent, absorbed))
        return AttentionOutput(self.out_proj(merge_heads(result.output)), result.weights, result.lse)

    def new_latents(self, x: Tensor, positions: Tensor) -> Latents:
        """The latents of new tokens x (B, L, D) at ``positions`` (L,) or (B, L): c_KV normalised, k_R rotated,
        the indexer's keys."""
        compressed = self.kv_a_proj(x)
        latent, rope_key = compressed.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_norm(latent)[:, None]  # (B, 1, L, kv_lora_rank)
        rope_key = rope_key[:, None]  # (B, 1, L, qk_rope_head_dim)
        if self.rotary is not None:
            rope_key = self.rotary(rope_key, positions=positions)
        index_key = None if self.indexer is None else self.indexer.keys(x, positions)
        return Latents(latent, rope_key, index_key)

    def attend_latents(self, q: Tensor, latents: Latents, positions: Tensor, x: Tensor, latent_call: _LatentCall,
                       causal_align: str) -> AttentionOutput:
        """Heads' output (B, H, L, v_head_dim) of queries q (B, H, L, qk_nope + qk_rope, unrotated, at
        ``positions``) over ``latents`` of all S tokens: naive or absorbed, dense or DSA's top-k."""
        call = latent_call.call
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        if self.rotary is not None:
            q_rope = self.rotary(q_rope, positions=positions)
        B, S = x.shape[0], latents.latent.shape[2]
        head_weights = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim,
                                                  self.kv_lora_rank)
        key_up, value_up = head_weights.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)  # (H, ., r)
        if latent_call.absorbed:  # multi-query attention over the latent itself
            query = torch.cat([q_nope @ key_up, q_rope], dim=-1)  # (B, H, L, r + qk_rope)
            key = torch.cat([latents.latent, latents.rope_key], dim=-1)  # (B, 1, S, r + qk_rope)
            value = key[..., :self.kv_lora_rank]  # (B, 1, S, r), a view: DSA's gather then reads each key once
        else:  # each head's key and value formed from the latent
            # (B, H, S, qk_nope + v): one (B S, r) x (r, H c) product, as einsum("bosr,hcr->bhsc") computes it; written
            # out, its view's strides are plain to torch.export (einsum's trip a guard on S under a dynamic length)
            width = self.qk_nope_head_dim + self.v_head_dim  # (named: a call of no token has 0 elements to infer from)
            up = (latents.latent.reshape(B * S, self.kv_lora_rank) @ head_weights.reshape(-1, self.kv_lora_rank).T
                  ).view(B, S, self.num_heads, width).transpose(1, 2)
            key_nope, value = up.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            key = torch.cat([key_nope, latents.rope_key.expand(-1, self.num_heads, -1, -1)], dim=-1)
            query = torch.cat([q_nope, q_rope], dim=-1)
        if self.indexer is not None:
            assert latents.index_key is not None and latent_call.query_latent is not None  # set with an indexer
            mask = _shared_mask(call.mask)
            indices = self.indexer.select(latent_call.query_latent, x, latents.index_key, positions,
                                          key_mask=call.key_mask, is_causal=call.is_causal, causal_align=causal_align,
                                          mask=mask)
            result = topk_attention(query, key, value, indices, key_mask=_bool(call.key_mask), is_causal=call.is_causal,
                                    causal_align=causal_align, scale=self.scale, need_weights=call.need_weights,
                                    mask=mask)
        else:
            result = attention(query, key, value, mask=call.mask_for(B, S), is_causal=call.is_causal,
                               causal_align=causal_align, scale=self.scale, backend=self.backend,
                               need_weights=call.need_weights)
        output = result.output @ value_up.transpose(-1, -2) if latent_call.absorbed else result.output  # (B, H, L, v)
        return AttentionOutput(output, result.weights, result.lse)


def _shared_mask(mask: object) -> Tensor | None:
    """The call's ``mask`` as DSA takes it, boolean (B|1, 1, L|1, S): applied in the indexer's selection and in
    the attention alike. A mask per head is refused by name (the indexer selects for every head at once)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() not in (2, 4):
        got = (mask.dtype, tuple(mask.shape)) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be boolean (L, S) or (B|1, 1, L|1, S) with DeepSeek sparse attention, got {got}")
    if mask.dim() == 2:
        return mask[None, None]
    if mask.shape[1] != 1:
        raise ValueError(f"mask of shape {tuple(mask.shape)}: DeepSeek sparse attention's indexer selects the same keys "
                         "for every head, so the mask must be shared by the heads, (B|1, 1, L|1, S)")
    return mask


def _bool(key_mask: Tensor | None) -> Tensor | None:
    return None if key_mask is None else key_mask.bool()


class _LatentCall(NamedTuple):
    """One call of a latent layer: the options, the query latent (the indexer's input), absorbed or naive."""

    call: AttentionCall
    query_latent: Tensor | None
    absorbed: bool


class _PlainLatent:
    """No cache: the call's own tokens, at ``call.positions`` (default 0 .. L-1)."""

    def attend_latent(self, layer: LatentAttention, q: Tensor, x: Tensor, latent_call: _LatentCall) -> AttentionOutput:
        positions = latent_call.call.positions
        positions = torch.arange(x.shape[1], device=x.device) if positions is None else positions
        return layer.attend_latents(q, layer.new_latents(x, positions), positions, x, latent_call, "top-left")


_PLAIN_LATENT = _PlainLatent()


class LatentCache(KVCache):
    """The cache of a :class:`LatentAttention` layer: per token the latent c_KV and the rotated k_R (and
    DSA's indexer key), nothing per head: (kv_lora_rank + qk_rope_head_dim [+ index_head_dim]) numbers a
    token. Stored as a :class:`~attnkit.layers.KVCache` whose "keys" are the latents and "values" the
    rotary keys (one key head), grown by doubling; the indexer's keys in a second one."""

    def __init__(self) -> None:
        super().__init__()
        self._index = KVCache()

    def reset(self) -> None:
        super().reset()
        self._index.reset()

    def reorder(self, index: Tensor) -> None:
        super().reorder(index)
        self._index.reorder(index)

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        """Refused: a latent cache holds latents, not a layer's keys and values."""
        raise TypeError(f"cache: a LatentCache serves LatentAttention layers only; {type(layer).__name__} takes a "
                        "KVCache")

    def attend_latent(self, layer: LatentAttention, q: Tensor, x: Tensor, latent_call: _LatentCall) -> AttentionOutput:
        """The new tokens' latents appended (at ``position`` onwards, unless the call's positions say), then
        attended with bottom-right causal alignment."""
        L = x.shape[1]
        positions = latent_call.call.positions
        positions = torch.arange(self.position, self.position + L, device=x.device) if positions is None else positions
        new = layer.new_latents(x, positions)
        latent, rope_key = self._append(new.latent, new.rope_key)
        index_key = None
        if new.index_key is not None:
            index_key = self._index._append(new.index_key[:, None], new.index_key[:, None, :, :0])[0][:, 0]
        return layer.attend_latents(q, Latents(latent, rope_key, index_key), positions, x, latent_call, "bottom-right")

    def numbers_per_token(self) -> int:
        """Numbers held per token: kv_lora_rank + qk_rope_head_dim (+ the indexer's key width)."""
        if self._keys is None or self._values is None:
            return 0
        index = 0 if self._index._keys is None else self._index._keys.shape[-1]
        return self._keys.shape[-1] + self._values.shape[-1] + index
