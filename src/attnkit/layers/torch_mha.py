"""``torch.nn.MultiheadAttention`` in attnkit and back: its weights both ways, and a drop-in module
with its constructor, calling convention and return value running attnkit's attention.

- :func:`from_torch_mha` (``MultiHeadAttention.from_torch``): an attnkit layer with a torch module's
  weights (packed ``in_proj_weight`` or separate ``q/k/v_proj_weight``, ``in_proj_bias``,
  ``out_proj``, dropout); ``bias_k``/``bias_v`` (``add_bias_kv``) and ``add_zero_attn`` are refused by
  name (attnkit has no extra learned key).
- :func:`to_torch_mha` (``MultiHeadAttention.to_torch``): the reverse, where torch's module can hold
  the layer (as many key as query heads, no rotary, the default scale, all biases or none).
- :class:`TorchMultiheadAttention`: ``nn.MultiheadAttention``'s constructor and ``forward(query, key,
  value, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
  is_causal=False) -> (output, weights)``, ``batch_first`` both ways and unbatched inputs, loading
  torch's state dicts as they are. Masks keep torch's meaning (True = NOT allowed, floats added).

Where it deliberately differs from torch (docs/api.md): a query with no key it may attend gets a zero
output (torch's gives NaN); the weights returned in training with dropout are those before dropout
(torch's after).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional.attention import BACKEND_NAMES
from ..functional.masks import from_key_padding_mask
from .multihead import MultiHeadAttention

__all__ = ["TorchMultiheadAttention", "from_torch_mha", "to_torch_mha"]


def _refuse_extras(module: nn.MultiheadAttention) -> None:
    if module.bias_k is not None or module.bias_v is not None:
        raise ValueError("nn.MultiheadAttention with add_bias_kv=True (bias_k, bias_v): attnkit has no learned extra "
                         "key and value; convert a module built without them")
    if module.add_zero_attn:
        raise ValueError("nn.MultiheadAttention with add_zero_attn=True: attnkit adds no zero key; convert a module "
                         "built without it")


def from_torch_mha(module: nn.MultiheadAttention, *, backend: str = "auto") -> MultiHeadAttention:
    """An attnkit :class:`MultiHeadAttention` with ``module``'s weights (copies), dtype and device: the
    same outputs for the same inputs (batch first; ``module.batch_first`` tells how to call torch's)."""
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
    _refuse_extras(module)
    D, H = module.embed_dim, module.num_heads
    bias = module.in_proj_bias is not None
    weight = module.out_proj.weight
    layer = MultiHeadAttention(D, H, kdim=module.kdim, vdim=module.vdim, bias=bias, dropout=module.dropout,
                               backend=backend).to(device=weight.device, dtype=weight.dtype)
    if module._qkv_same_embed_dim:
        w_q, w_k, w_v = module.in_proj_weight.chunk(3)
    else:
        w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
    with torch.no_grad():
        for projection, w in ((layer.q_proj, w_q), (layer.k_proj, w_k), (layer.v_proj, w_v)):
            projection.weight.copy_(w)
        if bias:
            for projection, b in zip((layer.q_proj, layer.k_proj, layer.v_proj), module.in_proj_bias.chunk(3)):
                projection.bias.copy_(b)
            layer.out_proj.bias.copy_(module.out_proj.bias)
        layer.out_proj.weight.copy_(weight)
    return layer.train(module.training)


def to_torch_mha(layer: MultiHeadAttention, *, batch_first: bool = True) -> nn.MultiheadAttention:
    """A ``torch.nn.MultiheadAttention`` with ``layer``'s weights (copies), refused by name where
    torch's module cannot hold the layer."""
    D, H = layer.d_model, layer.num_heads
    refusals = []
    if layer.num_kv_heads != H:
        refusals.append(f"num_kv_heads={layer.num_kv_heads} (torch's module has as many key as query heads, {H})")
    if layer.rotary is not None:
        refusals.append("rotary embeddings")
    if layer.head_dim * H != D:
        refusals.append(f"head_dim={layer.head_dim} (torch's is d_model / num_heads = {D / H:g})")
    if layer.scale is not None and not math.isclose(layer.scale, layer.head_dim**-0.5):
        refusals.append(f"scale={layer.scale} (torch's is 1/sqrt(head_dim))")
    biases = [p.bias is not None for p in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj)]
    if len(set(biases)) > 1:
        refusals.append("biases in some projections only (torch's module has all four or none)")
    if refusals:
        raise ValueError(f"nn.MultiheadAttention cannot hold this layer: {'; '.join(refusals)}")
    weight = layer.out_proj.weight
    module = nn.MultiheadAttention(D, H, dropout=layer.dropout, bias=biases[0], kdim=layer.kdim, vdim=layer.vdim,
                                   batch_first=batch_first, device=weight.device, dtype=weight.dtype)
    weights = [layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]
    with torch.no_grad():
        if module._qkv_same_embed_dim:
            module.in_proj_weight.copy_(torch.cat(weights))
        else:
            for target, w in zip((module.q_proj_weight, module.k_proj_weight, module.v_proj_weight), weights):
                target.copy_(w)
        if biases[0]:
            module.in_proj_bias.copy_(torch.cat([layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias]))
            module.out_proj.bias.copy_(layer.out_proj.bias)
        module.out_proj.weight.copy_(weight)
    return module.train(layer.training)


class TorchMultiheadAttention(nn.Module):
    """``torch.nn.MultiheadAttention``, drop-in, running attnkit's attention (``backend``).

    The constructor takes torch's arguments (``add_bias_kv`` and ``add_zero_attn`` only as False);
    ``forward`` torch's, returning ``(attn_output, attn_weights)``: weights averaged over the heads
    (N, L, S) by default, per head (N, H, L, S) with ``average_attn_weights=False``, None without
    ``need_weights``. ``load_state_dict`` takes torch's module's state dict as it is; the module's own
    is attnkit's (``attention.q_proj.weight``, ...). ``self.attention`` is the attnkit layer."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None, *, backend: str = "auto"):
        super().__init__()
        if add_bias_kv or add_zero_attn:
            name = "add_bias_kv" if add_bias_kv else "add_zero_attn"
            raise ValueError(f"{name}=True: attnkit has no extra learned or zero key; leave it False")
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
        self._hold(MultiHeadAttention(embed_dim, num_heads, kdim=kdim, vdim=vdim, bias=bias, dropout=dropout,
                                      backend=backend).to(device=device, dtype=dtype), batch_first)

    def _hold(self, attention: MultiHeadAttention, batch_first: bool) -> None:
        """Keep ``attention`` as the layer that runs, with torch's attribute names beside it."""
        self.embed_dim, self.num_heads, self.batch_first = attention.d_model, attention.num_heads, batch_first
        self.attention = attention
        self.register_load_state_dict_pre_hook(_torch_state_dict)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, *, backend: str = "auto") -> TorchMultiheadAttention:
        """The drop-in for ``module``: its weights, its ``batch_first`` (no layer of its own is built first)."""
        wrapper = cls.__new__(cls)
        nn.Module.__init__(wrapper)
        wrapper._hold(from_torch_mha(module, backend=backend), module.batch_first)
        return wrapper.train(module.training)

    def to_torch(self) -> nn.MultiheadAttention:
        return to_torch_mha(self.attention, batch_first=self.batch_first)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        if is_causal and attn_mask is None:
            raise ValueError("is_causal=True is a hint that attn_mask is the causal mask: pass attn_mask too "
                             "(torch's module refuses the hint alone as well)")
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, Tensor) or x.dim() not in (2, 3):
                got = f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"{name} must be (L, E) unbatched or {'(N, L, E)' if self.batch_first else '(L, N, E)'}"
                                 f" batched, got {got}")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query[None], key[None], value[None]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        N, L, _ = query.shape
        S = key.shape[1]
        mask, bias = _attnkit_masks(key_padding_mask, attn_mask, N, self.num_heads, L, S, query.dtype)
        result = self.attention(query, key, value, mask=mask, bias=bias, need_weights=bool(need_weights))
        output, weights = result.output, result.weights
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if unbatched:
            return output[0], None if weights is None else weights[0]
        if not self.batch_first:
            output = output.transpose(0, 1)
        return output, weights


def _attnkit_masks(key_padding_mask: Tensor | None, attn_mask: Tensor | None, N: int, H: int, L: int, S: int,
                   dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """torch's ``key_padding_mask`` (N, S) and ``attn_mask`` (L, S) or (N H, L, S), boolean True = not
    allowed or float added, as attnkit's ``mask`` (True = may attend) and ``bias`` (added)."""
    mask = bias = None
    if key_padding_mask is not None:
        _check_shape("key_padding_mask", key_padding_mask, (N, S))
        if key_padding_mask.is_floating_point():
            bias = key_padding_mask.to(dtype)[:, None, None, :]
        elif key_padding_mask.dtype == torch.bool:
            mask = from_key_padding_mask(key_padding_mask)  # (N, 1, 1, S), True = may attend
        else:
            raise TypeError(f"key_padding_mask must be boolean (True = ignore) or float (added), got dtype "
                            f"{key_padding_mask.dtype}")
    if attn_mask is not None:
        _check_shape("attn_mask", attn_mask, (L, S), (N * H, L, S))
        shaped = attn_mask.view(N, H, L, S) if attn_mask.dim() == 3 else attn_mask
        if shaped.is_floating_point():
            bias = shaped.to(dtype) if bias is None else bias + shaped.to(dtype)
        elif shaped.dtype == torch.bool:
            mask = ~shaped if mask is None else mask & ~shaped
        else:
            raise TypeError(f"attn_mask must be boolean (True = not allowed) or float (added), got dtype {attn_mask.dtype}")
    return mask, bias


def _check_shape(name: str, given, *shapes: tuple[int, ...]) -> None:
    if not isinstance(given, Tensor) or tuple(given.shape) not in shapes:
        got = tuple(given.shape) if isinstance(given, Tensor) else type(given).__name__
        raise ValueError(f"{name} must have shape {' or '.join(map(str, shapes))}, got {got}")


def _torch_state_dict(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """Rename a torch module's state dict (``in_proj_weight``, ``q_proj_weight``, ``in_proj_bias``,
    ``out_proj.*``) to the wrapper's own keys, in place, before loading."""
    inner = prefix + "attention."
    if prefix + "in_proj_weight" in state_dict:
        for name, w in zip("qkv", state_dict.pop(prefix + "in_proj_weight").chunk(3)):
            state_dict[f"{inner}{name}_proj.weight"] = w
    for name in "qkv":
        if prefix + f"{name}_proj_weight" in state_dict:
            state_dict[f"{inner}{name}_proj.weight"] = state_dict.pop(prefix + f"{name}_proj_weight")
    if prefix + "in_proj_bias" in state_dict:
        for name, b in zip("qkv", state_dict.pop(prefix + "in_proj_bias").chunk(3)):
            state_dict[f"{inner}{name}_proj.bias"] = b
    for name in ("weight", "bias"):
        if prefix + f"out_proj.{name}" in state_dict:
            state_dict[f"{inner}out_proj.{name}"] = state_dict.pop(prefix + f"out_proj.{name}")
    for name in ("bias_k", "bias_v"):
        if state_dict.get(prefix + name) is not None:
            error_msgs.append(f"{prefix}{name}: attnkit has no extra learned key and value (add_bias_kv)")
