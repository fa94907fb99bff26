"""Ulysses (Jacobs et al. 2023, DeepSpeed): an all-to-all turns sequence shards into head shards
(each rank gets H / W heads of the whole sequence), attention runs locally with any attnkit backend,
and a second all-to-all turns the result back; autograd through torch's functional all-to-all
(:func:`.group.exchanged`). It needs W to divide the heads (key/value
heads are repeated when W does not divide them) and moves q, k, v and the output once each."""

from __future__ import annotations

import torch
from torch import Tensor
from torch import distributed as dist

from ..functional.attention import attention
from ..functional.heads import repeat_kv
from .group import exchanged

__all__ = ["ulysses_attention", "seq_to_heads", "heads_to_seq"]


def seq_to_heads(x: Tensor, world: int, group) -> Tensor:
    """(B, H, Lr, E) sequence shard -> (B, H / W, W * Lr, E): my head group, every rank's shard in rank order."""
    B, H, L, E = x.shape
    chunks = x.reshape(B, world, H // world, L, E).permute(1, 0, 2, 3, 4).contiguous()
    received = exchanged(chunks, group)
    return received.permute(1, 2, 0, 3, 4).reshape(B, H // world, world * L, E)


def heads_to_seq(x: Tensor, world: int, group) -> Tensor:
    """Inverse of :func:`seq_to_heads`: (B, H / W, W * Lr, E) -> (B, H, Lr, E)."""
    B, h, n, E = x.shape
    L = n // world
    chunks = x.reshape(B, h, world, L, E).permute(2, 0, 1, 3, 4).contiguous()
    received = exchanged(chunks, group)
    return received.permute(1, 0, 2, 3, 4).reshape(B, world * h, L, E)


def ulysses_attention(q, k, v, positions, scale, is_causal, window, group, backend, key_mask):
    world = dist.get_world_size(group)
    H, Hkv = q.shape[1], k.shape[1]
    if H % world:
        raise ValueError(f"method='ulysses' needs the {world} processes to divide the {H} query heads; use method='ring'")
    if Hkv % world:  # repeat key/value heads so that every rank gets whole groups
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
    gathered = [torch.empty_like(positions) for _ in range(world)]
    dist.all_gather(gathered, positions, group=group)
    order = torch.argsort(torch.cat(gathered))  # rank-concatenated order -> global order
    inverse = torch.argsort(order)
    qh, kh, vh = (seq_to_heads(x, world, group).index_select(2, order) for x in (q, k, v))
    mask = None
    if key_mask is not None:  # every rank needs every key's mask: (B, n) in global order
        masks = [torch.empty_like(key_mask) for _ in range(world)]
        dist.all_gather(masks, key_mask.contiguous(), group=group)
        mask = torch.cat(masks, dim=1).index_select(1, order).bool()[:, None, None, :]
    out = attention(qh, kh, vh, mask=mask, is_causal=is_causal, window=window, scale=scale, backend=backend).output
    return heads_to_seq(out.index_select(2, inverse).contiguous(), world, group)
