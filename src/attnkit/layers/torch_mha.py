"""``torch.nn.MultiheadAttention`` in attnkit and back: its weights both ways, and a drop-in module
with its constructor, calling convention and return value running attnkit's attention.

- :func:`from_torch_mha`: an attnkit :class:`MultiHeadAttention` with a torch module's
  weights (packed ``in_proj_weight`` or separate ``q/k/v_proj_weight``, ``in_proj_bias``,
  ``out_proj``, dropout); ``bias_k``/``bias_v`` (``add_bias_kv``) and ``add_zero_attn`` are refused by
  name (attnkit has no extra learned key).
- :func:`to_torch_mha`: the reverse, where torch's module can hold
  the layer (as many key as query heads, no rotary, the default scale, all biases or none).
- :class:`TorchMultiheadAttention`: ``nn.MultiheadAttention``'s constructor (``add_bias_kv`` and
  ``add_zero_attn`` included), parameters, state dict and ``forward(query, key, value,
  key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True, is_causal=False) ->
  (output, weights)``, ``batch_first`` both ways and unbatched inputs, running attnkit's attention on the
  heads. Masks keep torch's meaning (True = NOT allowed, floats added).

Where it deliberately differs from torch (docs/api.md): a query with no key it may attend gets a zero
output (torch's gives NaN); the weights returned in training with dropout are those before dropout
(torch's after).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.attention import BACKEND_NAMES, attention
from ..functional.heads import merge_heads, split_heads
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


def _torch_projections(module: nn.MultiheadAttention | TorchMultiheadAttention) -> tuple[
        tuple[Tensor, Tensor, Tensor], tuple[Tensor | None, Tensor | None, Tensor | None]]:
    """The query, key and value projections' weights and biases of ``module``, an ``nn.MultiheadAttention`` or
    a :class:`TorchMultiheadAttention` (torch's parameter names): the packed ``in_proj_weight`` split, or the
    separate ``q/k/v_proj_weight`` (other ``kdim``/``vdim``); the biases None without ``in_proj_bias``."""
    weights: tuple
    if module.in_proj_weight is not None:  # embed_dim = kdim = vdim: torch's packed weight
        weights = module.in_proj_weight.chunk(3)
    else:
        weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
    biases = (None, None, None) if module.in_proj_bias is None else module.in_proj_bias.chunk(3)
    return weights, biases  # type: ignore[return-value]


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
    weights, _ = _torch_projections(module)
    with torch.no_grad():
        for projection, w in zip((layer.q_proj, layer.k_proj, layer.v_proj), weights):
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

    The constructor takes torch's arguments, ``add_bias_kv`` (a learned key and value appended to every
    sequence) and ``add_zero_attn`` (a zero key and value appended after the projections) among them, and
    builds torch's parameters under torch's names, initialised as torch initialises them (the same seed, the
    same weights): ``in_proj_weight`` (or ``q/k/v_proj_weight`` with other ``kdim``/``vdim``),
    ``in_proj_bias``, ``bias_k``, ``bias_v``, ``out_proj``. Its state dict is torch's module's, both ways.
    ``forward`` takes torch's arguments and returns ``(attn_output, attn_weights)``: weights averaged over the
    heads (N, L, S) by default, per head (N, H, L, S) with ``average_attn_weights=False``, None without
    ``need_weights``; S counts the appended keys, as torch's does. :meth:`to_attnkit` gives the equivalent
    :class:`MultiHeadAttention` where one exists (no appended keys)."""

    in_proj_weight: nn.Parameter | None
    q_proj_weight: nn.Parameter | None
    k_proj_weight: nn.Parameter | None
    v_proj_weight: nn.Parameter | None
    in_proj_bias: nn.Parameter | None
    bias_k: nn.Parameter | None
    bias_v: nn.Parameter | None
    out_proj: nn.Linear

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None, *, backend: str = "auto"):
        super().__init__()
        # torch's own module builds and initialises the parameters (its order of random draws), then hands
        # them over: the drop-in holds torch's tensors under torch's names
        self._adopt(nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim,
                                          batch_first, device=device, dtype=dtype), backend)

    def _adopt(self, module: nn.MultiheadAttention, backend: str) -> None:
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
        self.embed_dim, self.num_heads, self.head_dim = module.embed_dim, module.num_heads, module.head_dim
        self.kdim, self.vdim, self._qkv_same_embed_dim = module.kdim, module.vdim, module._qkv_same_embed_dim
        self.dropout, self.batch_first, self.add_zero_attn = module.dropout, module.batch_first, module.add_zero_attn
        self.backend = backend
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            self.register_parameter(name, getattr(module, name))
        self.out_proj = module.out_proj
        for name in ("bias_k", "bias_v"):  # Parameters or None (torch annotates them as tensors)
            self.register_parameter(name, getattr(module, name))

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, *, backend: str = "auto") -> TorchMultiheadAttention:
        """The drop-in for ``module``: a copy of its parameters, its settings (no random draws)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
        wrapper = cls.__new__(cls)
        nn.Module.__init__(wrapper)
        wrapper._adopt(copy.deepcopy(module), backend)
        return wrapper.train(module.training)

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention`` with a copy of these parameters and settings."""
        weight = self.out_proj.weight
        module = nn.MultiheadAttention(self.embed_dim, self.num_heads, self.dropout, self.in_proj_bias is not None,
                                       self.bias_k is not None, self.add_zero_attn, self.kdim, self.vdim,
                                       self.batch_first, device=weight.device, dtype=weight.dtype)
        module.load_state_dict(self.state_dict())
        return module.train(self.training)

    def to_attnkit(self) -> MultiHeadAttention:
        """attnkit's :class:`MultiHeadAttention` with these weights (refused by name with ``add_bias_kv`` or
        ``add_zero_attn``, which it has no place for)."""
        return from_torch_mha(self.to_torch(), backend=self.backend)

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
        _check_masks(key_padding_mask, attn_mask, N, self.num_heads, L, S)
        (w_q, w_k, w_v), (b_q, b_k, b_v) = _torch_projections(self)
        q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        if self.bias_k is not None and self.bias_v is not None:  # a learned key and value after every sequence
            k = torch.cat([k, self.bias_k.expand(N, 1, -1)], dim=1)
            v = torch.cat([v, self.bias_v.expand(N, 1, -1)], dim=1)
            key_padding_mask, attn_mask = _one_more_key(key_padding_mask, attn_mask)
        q, k, v = (split_heads(x, self.num_heads) for x in (q, k, v))  # (N, H, ., head_dim)
        if self.add_zero_attn:  # a zero key and value, after the projections (torch's order)
            k, v = (torch.cat([x, x.new_zeros(N, self.num_heads, 1, self.head_dim)], dim=2) for x in (k, v))
            key_padding_mask, attn_mask = _one_more_key(key_padding_mask, attn_mask)
        mask, bias = _attnkit_masks(key_padding_mask, attn_mask, N, self.num_heads, L, k.shape[2], query.dtype)
        result = attention(q, k, v, mask=mask, bias=bias, dropout_p=self.dropout if self.training else 0.0,
                           backend=self.backend, need_weights=bool(need_weights))
        output = self.out_proj(merge_heads(result.output))
        weights = result.weights
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if unbatched:
            return output[0], None if weights is None else weights[0]
        if not self.batch_first:
            output = output.transpose(0, 1)
        return output, weights


def _one_more_key(key_padding_mask: Tensor | None, attn_mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """torch's masks for one more key at the end, which every query may attend (torch pads with 0: False /
    0.0)."""
    return tuple(None if m is None else F.pad(m, (0, 1)) for m in (key_padding_mask, attn_mask))  # type: ignore[return-value]


def _check_masks(key_padding_mask: Tensor | None, attn_mask: Tensor | None, N: int, H: int, L: int, S: int) -> None:
    if key_padding_mask is not None:
        _check_shape("key_padding_mask", key_padding_mask, (N, S))
    if attn_mask is not None:
        _check_shape("attn_mask", attn_mask, (L, S), (N * H, L, S))


def _attnkit_masks(key_padding_mask: Tensor | None, attn_mask: Tensor | None, N: int, H: int, L: int, S: int,
                   dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """torch's ``key_padding_mask`` (N, S) and ``attn_mask`` (L, S) or (N H, L, S), boolean True = not
    allowed or float added, as attnkit's ``mask`` (True = may attend) and ``bias`` (added); their shapes
    already checked (:func:`_check_masks`, before any key is appended)."""
    mask = bias = None
    if key_padding_mask is not None:
        if key_padding_mask.is_floating_point():
            bias = key_padding_mask.to(dtype)[:, None, None, :]
        elif key_padding_mask.dtype == torch.bool:
            mask = from_key_padding_mask(key_padding_mask)  # (N, 1, 1, S), True = may attend
        else:
            raise TypeError(f"key_padding_mask must be boolean (True = ignore) or float (added), got dtype "
                            f"{key_padding_mask.dtype}")
    if attn_mask is not None:
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
