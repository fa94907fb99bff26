"""One sequence across processes for a transformers model: context parallelism through the bridge.

    cp = attnkit.hf.context_parallel(model, layout="zigzag", method="ring")   # every rank, same options
    batch = cp.shard(input_ids, labels=labels, attention_mask=mask)           # the whole batch on every rank
    loss = model(**batch).loss            # this rank's part of the global mean loss
    loss.backward()
    cp.all_reduce_gradients()             # every parameter's gradient summed over the ranks: the global one

Each rank runs the model on its shard of the sequence (:mod:`attnkit.distributed.layouts`); everything
but attention works per token, and every attention call becomes exact attention over the whole
sequence (:mod:`attnkit.distributed`): the structure (causal, a causal sliding window, per layer) and
the padding come from the :class:`~attnkit.hf.StructuredMask` transformers asks attnkit for, the
positions from ``position_ids`` (:meth:`HFContextParallel.shard` gives the global ones). The loss:
the labels are shifted over the whole sequence before sharding (transformers' ``shift_labels``) and
each rank divides its sum by the global count of labels (``num_items_in_batch``), so the ranks'
losses add up to the single-process loss and their gradients to its gradients.

- ``method="ring"``: the keys and values travel the ring; rows with no key (left padding) get eager's
  uniform average over the whole sequence with its gradients (one all-reduce of two small sums).
  Softcapping and learned sinks are refused by name (the ring's kernels take neither).
- ``method="ulysses"``: an all-to-all gives each rank whole sequences of H / W heads, which then run
  the bridge's own single-process attention (softcapping, sinks of those heads, eager's empty rows);
  W must divide the query heads.

Refused by name at the call: a KV cache (generation), attention weights, attention dropout while
training, T5's position bias, a mask that is not structure plus padding, a family not in
:data:`CONTEXT_PARALLEL_FAMILIES`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch import distributed as dist

from ..distributed.group import summed
from ..distributed.layouts import check_layout, shard_positions
from ..distributed.strategy import ContextParallel, context_parallel_attention
from ..distributed.training import all_reduce_gradients
from ..distributed.ulysses import heads_to_seq, seq_to_heads
from ..functional.heads import repeat_kv
from .families import IMPLEMENTATION, UnsupportedFeature
from .interface import attend, weights_requested
from .keywords import check_keywords
from .masks import StructuredMask, _Structure, _structured
from .record import recording_now
from .rows import structured_empty_rows

__all__ = ["context_parallel", "HFContextParallel", "CONTEXT_PARALLEL_FAMILIES"]

CONTEXT_PARALLEL_FAMILIES = (
    "apertus", "arcee", "cohere", "exaone4", "gemma", "gemma2", "gemma3_text", "glm", "glm4", "gpt2", "gpt_bigcode",
    "gpt_neox", "gpt_oss", "granite", "helium", "internlm3", "llama", "ministral", "mistral", "mixtral", "olmo",
    "olmo2", "olmo3", "phi", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "stablelm",
    "starcoder2",
)
"""Decoder families whose loss and every gradient under :func:`context_parallel` equal one process's
(fp32 1e-5, fp64 1e-10; W = 2, 3, 4; every layout, both methods; left and right padding):
tests/external/test_hf_context_parallel.py, which runs this list. Softcapping (Gemma 2) and learned
sinks (gpt-oss) run with ``method="ulysses"``; the ring refuses them by name."""


def context_parallel(model: nn.Module, group=None, *, layout: str = "zigzag", method: str = "ring") -> HFContextParallel:
    """Make ``model`` (loaded with ``attn_implementation="attnkit"``) context-parallel over ``group``
    (default: the world): every rank calls this with the same options and then runs the model on its
    shard (:meth:`HFContextParallel.shard`). Returns the handle; :meth:`HFContextParallel.remove`
    turns it off."""
    strategy = ContextParallel(layout=layout, method=method, group=group)  # checks layout and method
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in CONTEXT_PARALLEL_FAMILIES:
        raise UnsupportedFeature(f"context parallelism is verified for {', '.join(CONTEXT_PARALLEL_FAMILIES)}; "
                                 f"not for {family!r}")
    if getattr(config, "_attn_implementation", None) != IMPLEMENTATION:
        raise UnsupportedFeature(f"context parallelism runs through attnkit's attention: load the model with "
                                 f"attn_implementation={IMPLEMENTATION!r} (after attnkit.hf.register()); this one has "
                                 f"{getattr(config, '_attn_implementation', None)!r}")
    parallel = HFContextParallel(model, strategy)
    for module in model.modules():
        module.__dict__["_attnkit_context_parallel"] = parallel  # a plain attribute, not a submodule
    return parallel


@dataclass(frozen=True, eq=False)
class HFContextParallel:
    """A model made context-parallel by :func:`context_parallel`: the model and its
    :class:`~attnkit.distributed.ContextParallel` (layout, method, group; ``world`` and ``rank``)."""

    model: nn.Module
    strategy: ContextParallel

    @property
    def layout(self) -> str:
        return self.strategy.layout

    @property
    def method(self) -> str:
        return self.strategy.method

    @property
    def group(self):
        return self.strategy.group

    @property
    def world(self) -> int:
        return self.strategy.world

    @property
    def rank(self) -> int:
        return self.strategy.rank

    def remove(self) -> None:
        """The model attends on one process again."""
        for module in self.model.modules():
            module.__dict__.pop("_attnkit_context_parallel", None)  # set by context_parallel()

    def shard(self, input_ids: Tensor, *, labels: Tensor | None = None, attention_mask: Tensor | None = None,
              position_ids: Tensor | None = None, ignore_index: int = -100) -> dict:
        """This rank's part of a whole batch (B, n), as keyword arguments of the model: ``input_ids``,
        ``attention_mask`` (default: all ones) and ``position_ids`` (default: 0 .. n - 1, as one process
        would use) sharded
        by the layout; with ``labels``, the labels shifted over the whole sequence and sharded
        (``labels`` and ``shift_labels``) and ``num_items_in_batch``, the global count of labels that
        are not ``ignore_index``; ``use_cache=False``. n must be a multiple of W (2W for zigzag)."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (B, n) tensor of the whole batch, got "
                             f"{type(input_ids).__name__} {tuple(getattr(input_ids, 'shape', ()))}")
        B, n = input_ids.shape
        check_layout(n, self.world, self.layout)

        def part(x: Tensor) -> Tensor:
            if tuple(x.shape) != (B, n):
                raise ValueError(f"every tensor of the batch must be (B, n) = ({B}, {n}) like input_ids, got {tuple(x.shape)}")
            return self.strategy.shard(x, dim=1)

        if position_ids is None:
            position_ids = torch.arange(n, device=input_ids.device).expand(B, n)
        if attention_mask is None:  # always one: without it transformers reads a shard's positions (not
            attention_mask = torch.ones_like(input_ids)  # consecutive under zigzag or striped) as packed sequences
        batch = {"input_ids": part(input_ids), "position_ids": part(position_ids), "use_cache": False,
                 "attention_mask": part(attention_mask)}
        if labels is not None:
            part(labels)  # checks its shape
            shifted = torch.full_like(labels, ignore_index)
            shifted[:, :-1] = labels[:, 1:]
            batch["labels"] = batch["shift_labels"] = part(shifted)
            batch["num_items_in_batch"] = int((shifted != ignore_index).sum())
        return batch

    def all_reduce_gradients(self) -> None:
        """Every parameter's gradient summed over the group: each rank's loss is its part of the global
        loss, so the sum is the single-process gradient."""
        all_reduce_gradients(self.model.parameters(), self.group)

    def all_reduce_loss(self, loss: Tensor) -> Tensor:
        """The global loss from this rank's part (a copy, summed over the group; no gradient)."""
        total = loss.detach().clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total, group=self.group)
        return total

    def attend(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float,
               scaling: float | None, is_causal: bool | None, kwargs: dict) -> Tensor:
        """One attention call of the model, over the whole sequence: output (B, H, L, Ev)."""
        owner = type(module).__name__
        check_keywords(owner, kwargs)
        L = query.shape[2]
        for name in ("indices", "block_indices"):
            if kwargs.get(name) is not None:
                raise UnsupportedFeature(f"{owner}: a sparse attention's selection ({name}) is not supported under "
                                         "context parallelism")
        if key.shape[2] != L:
            raise UnsupportedFeature(f"{owner}: {key.shape[2]} keys for {L} queries: a KV cache (generation) is not "
                                     "supported under context parallelism; call remove() first")
        if weights_requested(kwargs) or recording_now() is not None:
            raise UnsupportedFeature(f"{owner}: attention weights are not available under context parallelism")
        if module.training and dropout > 0:
            raise UnsupportedFeature(f"{owner}: attention dropout {dropout} while training: each rank would drop "
                                     "different keys; set the config's attention dropout to 0")
        if kwargs.get("position_bias") is not None:
            raise UnsupportedFeature(f"{owner}: a relative position bias (T5) is not supported under context parallelism")
        structure = self._structure(module, attention_mask, owner)
        n = L * self.world
        padding = self._global_padding(attention_mask, query.shape[0], L, n, query.device)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if self.method == "ulysses" and self.world > 1:
            return self._ulysses(module, query, key, value, structure, padding, dropout, scale, kwargs)
        for name in ("softcap", "s_aux", "sinks"):
            if kwargs.get(name) is not None and kwargs.get(name) is not False:
                raise UnsupportedFeature(f"{owner}: {name} is not supported by method='ring' (its kernels take no "
                                         "score_mod or sinks); use method='ulysses'")
        key_mask = self.strategy.shard(padding, dim=1)
        output = context_parallel_attention(query, key, value, is_causal=structure.is_causal, window=structure.window,
                                            layout=self.layout, method="ring", scale=scale, group=self.group,
                                            key_mask=key_mask).output
        empty = structured_empty_rows(padding[:, None, None, :], n, n, causal=structure.is_causal,
                                      window=structure.window, offset=0)
        if empty is None or not bool(empty.rows.any()):  # the same answer on every rank: the global padding
            return output
        mine = empty.rows.index_select(-1, shard_positions(n, self.world, self.rank, self.layout).to(query.device))
        uniform = _uniform_rows(query, key, value, scale, n, self.group)
        return torch.where(mine[..., None], uniform.to(output.dtype), output)

    def _structure(self, module: nn.Module, attention_mask, owner: str) -> _Structure:
        """The whole sequence's structure: what the mask function proved (local lengths, the same
        structure), or for no mask at all the module's causality; anything else is refused."""
        if isinstance(attention_mask, StructuredMask) and attention_mask.structure is not None:
            structure = attention_mask.structure
            if structure.causal_align != "top-left":
                raise UnsupportedFeature(f"{owner}: a bottom-right causal mask (a cache) under context parallelism")
            return structure
        if attention_mask is None and getattr(module, "sliding_window", None) is None:
            return _Structure(is_causal=bool(getattr(module, "is_causal", True)), window=None, causal_align="top-left",
                              padded=False)
        raise UnsupportedFeature(f"{owner}: context parallelism needs a mask attnkit reads as structure plus padding; "
                                 f"this call has {type(attention_mask).__name__} "
                                 f"{tuple(getattr(attention_mask, 'shape', ()))} (packed sequences, a 4D mask of "
                                 "your own or an unusual mask function)")

    def _global_padding(self, attention_mask, B: int, L: int, n: int, device) -> Tensor:
        """(B, n) True at real tokens of the whole sequence in global order, gathered from every rank
        (whatever their shard holds, so that the ranks take the same collective calls), once per mask:
        every layer of a forward receives the same StructuredMask and reads the gathered padding kept on it."""
        structured = isinstance(attention_mask, StructuredMask) and attention_mask.structure is not None
        key = ("context_parallel_padding", self.layout, self.world, id(self.group), B, n)
        if structured and key in attention_mask.__dict__:
            return attention_mask.__dict__[key]
        local = torch.ones(B, L, dtype=torch.uint8, device=device)
        if structured and attention_mask.structure.padded:
            local = attention_mask.as_subclass(Tensor)[:, 0, 0, :].expand(B, L).to(torch.uint8)
        if self.world == 1 or not (dist.is_available() and dist.is_initialized()):
            padding = local.bool()
        else:
            parts = [torch.empty_like(local) for _ in range(self.world)]
            dist.all_gather(parts, local.contiguous(), group=self.group)
            order = torch.cat([shard_positions(n, self.world, r, self.layout) for r in range(self.world)])
            padding = torch.cat(parts, dim=1).index_select(1, torch.argsort(order).to(device)).bool()
        if structured:
            attention_mask.__dict__[key] = padding
        return padding

    def _ulysses(self, module, query, key, value, structure: _Structure, padding: Tensor, dropout: float,
                 scale: float, kwargs: dict) -> Tensor:
        """Whole sequences of H / W heads on each rank, attended by the bridge's single-process path."""
        world, rank = self.world, self.rank
        H, Hkv, L = query.shape[1], key.shape[1], query.shape[2]
        if H % world:
            raise UnsupportedFeature(f"{type(module).__name__}: method='ulysses' needs the {world} processes to divide "
                                     f"the {H} query heads; use method='ring'")
        if Hkv % world:  # whole groups on every rank
            key, value = repeat_kv(key, H // Hkv), repeat_kv(value, H // Hkv)
        n = L * world
        order = torch.argsort(torch.cat([shard_positions(n, world, r, self.layout) for r in range(world)]))
        order = order.to(query.device)
        qh, kh, vh = (seq_to_heads(x, world, self.group).index_select(2, order) for x in (query, key, value))
        padded = not bool(padding.all())  # the same on every rank; without padding no mask reaches SDPA (linear memory)
        mask = _structured(padding[:, None, None, :] if padded else padding[:1, None, None, :],
                           _Structure(structure.is_causal, structure.window, "top-left", padded=padded))
        heads = slice(rank * (H // world), (rank + 1) * (H // world))
        local = dict(kwargs)
        for name in ("s_aux", "sinks"):
            if local.get(name) is not None:
                local[name] = local[name][heads]  # this rank's heads' sinks
        out, _ = attend(module, qh, kh, vh, mask, dropout, scale, None, local)
        return heads_to_seq(out.index_select(2, torch.argsort(order)).contiguous(), world, self.group)


def _uniform_rows(query: Tensor, key: Tensor, value: Tensor, scale: float, n: int, group) -> Tensor:
    """(B, H, L, Ev): every local row as eager computes a row with no allowed key over the whole
    sequence (n keys across the group): mean_j v_j + scale (q M - sg(q M)), M = sum_j k_j sg(v_j -
    mean v)^T / n (:mod:`attnkit.hf.rows`), the two sums over keys all-reduced with their gradients."""
    distributed = dist.is_available() and dist.is_initialized()

    def total(x: Tensor) -> Tensor:  # differentiable: its gradient is the summed gradient, as the sum is
        return summed(x, group) if distributed else x

    B, H, L, _ = query.shape
    Hkv = key.shape[1]
    mean = total(value.sum(dim=2, keepdim=True)) / n  # (B, Hkv, 1, Ev)
    moment = total(key.transpose(-1, -2) @ (value - mean).detach()) / n  # (B, Hkv, E, Ev)
    t = (query.unflatten(1, (Hkv, H // Hkv)) @ moment[:, :, None]) * scale  # (B, Hkv, G, L, Ev)
    return (mean[:, :, None] + (t - t.detach())).flatten(1, 2)
