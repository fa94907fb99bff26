r"""DeepSeek sparse attention's lightning indexer (DeepSeek-AI 2025, DeepSeek-V3.2): a few small heads score
every earlier token, and each query keeps its top k.

    I_{t,s} = sum_j w_{t,j} ReLU(q_{t,j} . k_s) / sqrt(E_I H_I),   K_t = top-k_s I_{t,s}

q_{t,j} comes from the query latent c_Q (W_QI), k_s from the token itself (W_KI, LayerNorm), w_{t,j} from
the token (W_w); the first ``rope_dim`` dimensions of q and k are rotated (half-split pairs). The
selection is computed a block of queries at a time (:data:`INDEX_ELEMENTS`), never L x S; masked keys (causality, padding) are never chosen (a query with fewer allowed keys than k gets
-1 in the spare slots). What it selects is an index the functional core consumes
(:func:`attnkit.functional.topk.topk_attention`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import masks as _masks
from ..functional.checks import check_int
from .positional import RotaryEmbedding

__all__ = ["LightningIndexer", "INDEX_ELEMENTS"]

INDEX_ELEMENTS = 1 << 24
"""A block of queries is scored at a time, (B, H_I, block, S) scores of about this many numbers (64 MiB in
float32; at least one query)."""


class LightningIndexer(nn.Module):
    """The indexer of DeepSeek sparse attention (module docstring).

    Args:
        d_model: D. q_lora_rank: the width of the query latent it reads.
        num_heads: H_I (DeepSeek-V3.2: 64). head_dim: E_I (128). rope_dim: its rotated dims (64).
        topk: keys each query keeps (2048).
        rotary: the RoPE of the rotated dims (default: base 10000, half-split pairs).

    Parameters (DeepSeek-V3.2's names): ``wq_b`` (q_lora_rank -> H_I E_I), ``wk`` (D -> E_I), ``k_norm``
    (LayerNorm, eps 1e-6), ``weights_proj`` (D -> H_I).
    """

    def __init__(self, d_model: int, q_lora_rank: int, *, num_heads: int, head_dim: int, rope_dim: int, topk: int,
                 rotary: RotaryEmbedding | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("q_lora_rank", q_lora_rank), ("num_heads", num_heads),
                            ("head_dim", head_dim), ("rope_dim", rope_dim), ("topk", topk)):
            check_int(name, value, 1)
        if rope_dim > head_dim:
            raise ValueError(f"rope_dim={rope_dim} must be at most head_dim={head_dim}")
        self.q_lora_rank, self.num_heads, self.head_dim, self.rope_dim, self.topk = (
            q_lora_rank, num_heads, head_dim, rope_dim, topk)
        self.rotary = rotary if rotary is not None else RotaryEmbedding(rope_dim)
        if self.rotary.full_dim != rope_dim:
            raise ValueError(f"rotary.head_dim={self.rotary.full_dim} does not match rope_dim={rope_dim}")
        self.wq_b = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(d_model, num_heads, bias=False)

    def _rotated(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, h, L, E_I) with its first rope_dim dims rotated at positions."""
        rot, rest = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        return torch.cat([self.rotary(rot, positions=positions), rest], dim=-1)

    def keys(self, x: Tensor, positions: Tensor) -> Tensor:
        """The indexer's keys of tokens x (B, L, D) at positions: (B, L, E_I)."""
        return self._rotated(self.k_norm(self.wk(x))[:, None], positions)[:, 0]

    @torch.no_grad()
    def select(self, query_latent: Tensor, x: Tensor, keys: Tensor, positions: Tensor, *, key_mask: Tensor | None = None,
               is_causal: bool = True, causal_align: str = "top-left", mask: Tensor | None = None) -> Tensor:
        """The top-k keys of each query: (B, L, min(topk, S)) key positions, -1 where fewer are allowed.

        ``query_latent`` c_Q (B, L, q_lora_rank) and ``x`` (B, L, D) of the queries at ``positions``; ``keys``
        (B, S, E_I) of every token attended; ``key_mask`` (B, S) True at real tokens; causal with
        ``causal_align`` (bottom-right with a cache); ``mask`` (B|1, 1, L|1, S) True where a query may attend
        (a key it rules out is never selected). No gradient: the selection is a choice, as in the paper
        (the indexer trains by its own loss)."""
        B, L, _ = x.shape
        S = keys.shape[1]
        queries = self._rotated(self.wq_b(query_latent).view(B, L, self.num_heads, self.head_dim).transpose(1, 2),
                                positions)  # (B, H_I, L, E_I)
        weights = self.weights_proj(x).float() * self.num_heads ** -0.5  # (B, L, H_I)
        k = min(self.topk, S)
        offset = _masks.causal_offset(L, S, causal_align)
        chosen = []
        block = max(1, INDEX_ELEMENTS // max(1, B * self.num_heads * S))
        for q0 in range(0, L, block):
            q1 = min(L, q0 + block)
            scores = queries[:, :, q0:q1].float() @ keys.float()[:, None].transpose(-1, -2)  # (B, H_I, b, S)
            scores = torch.relu(scores * self.head_dim ** -0.5)  # in DeepSeek-V3.2's order (ties break alike)
            index = torch.einsum("bqh,bhqs->bqs", weights[:, q0:q1], scores)  # (B, b, S)
            allowed = torch.ones(B, q1 - q0, S, dtype=torch.bool, device=x.device)
            if is_causal:
                allowed = allowed & _masks.causal_block(q0, q1, 0, S, offset, None, device=x.device)
            if key_mask is not None:
                allowed = allowed & key_mask.bool()[:, None, :]
            if mask is not None:
                allowed = allowed & _masks.mask_rows(mask, q0, q1)[:, 0]
            index = index.masked_fill(~allowed, float("-inf"))
            top = index.topk(k, dim=-1)
            chosen.append(top.indices.masked_fill(torch.isneginf(top.values), -1))
        if not chosen:  # no query (a call of no new token): no selection
            return torch.empty(B, 0, k, dtype=torch.long, device=x.device)
        return torch.cat(chosen, dim=1)
