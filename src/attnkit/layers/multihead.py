"""Multi-head attention (Vaswani et al. 2017) with grouped-query (Ainslie et al. 2023) and
multi-query (Shazeer 2019) heads, self and cross attention, and a KV cache.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O,  head_h = Attention(Q W_Q^h, K W_K^g(h), V W_V^g(h))

where query head h uses key/value head g(h) = h // (H / Hkv).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..functional.attention import BACKEND_NAMES, AttentionOutput, make_output
from ..functional.block_mask import BlockMask
from ..functional.checks import check_rank
from ..functional.heads import merge_heads, split_heads
from ..functional.torch_block_mask import as_block_mask
from .attending import Attending, make_call, strategy
from .calls import Packed, pack, packed_projection, project_by_name
from .positional import RotaryEmbedding

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention over (B, L, D) inputs, batch first.

    Args:
        d_model: D, the model dim (queries' feature size and the output size).
        num_heads: H query heads; D must be divisible by H (head dim E = D / H).
        num_kv_heads: Hkv key/value heads, dividing H (default H; 1 is multi-query attention).
        kdim, vdim: feature sizes of keys and values for cross attention (default D).
        bias: bias in all four projections.
        dropout: dropout on the attention weights in training mode.
        backend: attention backend, see :func:`attnkit.attention`.
        rotary: a :class:`RotaryEmbedding` applied to queries and keys after projection (Llama).
        head_dim: E when it is not D / H (then D need not be divisible by H).
        out_bias: bias in ``out_proj`` (default: ``bias``); Qwen2 has q/k/v biases only.
        scale: multiplies q k^T (default 1 / sqrt(E)).

    Parameters: ``q_proj`` (D -> H E), ``k_proj`` (kdim -> Hkv E), ``v_proj`` (vdim -> Hkv E),
    ``out_proj`` (H E -> D). For self attention the first three are packed: their weights (and biases) are
    consecutive rows of one tensor, each still its own Parameter and state-dict entry, and one call projects
    queries, keys and values where no weight gradient is wanted (:func:`.calls.pack`, as
    ``nn.MultiheadAttention``'s ``in_proj_weight``, with the same numbers).
    """

    _packed_qkv: Packed | None = None  # (class defaults: a layer unpickled from before packing has none)
    _pack_when_materialised: bool = False

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "auto",
        rotary: RotaryEmbedding | None = None,
        *,
        head_dim: int | None = None,
        out_bias: bool | None = None,
        scale: float | None = None,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1):
            raise ValueError(f"head_dim must be a positive int or None, got {head_dim!r}")
        if d_model < 1 or num_heads < 1 or (head_dim is None and d_model % num_heads):
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads must be divisible by num_kv_heads, got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        self.scale = scale
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        self.backend = backend
        if rotary is not None and rotary.full_dim != self.head_dim:
            raise ValueError(f"rotary.head_dim={rotary.full_dim} does not match head_dim={self.head_dim}")
        self.rotary = rotary
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, kv_width, bias=bias)
        self.v_proj = nn.Linear(self.vdim, kv_width, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias if out_bias is None else out_bias)
        self._packed_qkv = self._pack_qkv()
        self._pack_when_materialised = self._packed_qkv is None and self._packs_qkv() and self.q_proj.weight.is_meta

    def _packs_qkv(self) -> bool:
        """Whether self attention may project queries, keys and values in one packed call (:func:`.calls.pack`):
        all three read the model's width, and :meth:`queries` and :meth:`project_kv` are this class's own."""
        cls = type(self)
        return (self.kdim == self.vdim == self.d_model and cls.queries is MultiHeadAttention.queries
                and cls.project_kv is MultiHeadAttention.project_kv)

    def _pack_qkv(self) -> Packed | None:
        """The projections packed (:func:`.calls.pack`) where this layer packs them, else None."""
        return pack(self._qkv()) if self._packs_qkv() else None

    @property
    def rotary(self) -> RotaryEmbedding | None:
        """The rotary embedding of queries and keys, or None: a submodule like any other (``layer.rotary = ...``
        replaces it; ``state_dict``, ``.to()`` and hooks see it), read from the module registry, as
        ``nn.Module.__getattr__`` took a microsecond a read, three reads a layer call when decoding."""
        return self._modules.get("rotary")  # type: ignore[return-value]

    @rotary.setter
    def rotary(self, value: RotaryEmbedding | None) -> None:
        # nn.Module.__setattr__ registers a module itself (and None where one is registered): here come the rest
        if value is not None:
            raise TypeError(f"rotary must be a RotaryEmbedding or None, got {type(value).__name__}")
        self._modules["rotary"] = None

    def _qkv(self) -> tuple[nn.Module | None, ...]:
        modules = self._modules
        return modules["q_proj"], modules["k_proj"], modules["v_proj"]

    def _apply(self, fn, recurse=True):
        # A cast or a move gives each projection new memory: packed again there, so that self attention keeps
        # one projection call (what nn.MultiheadAttention's in_proj_weight does); so does materialising a
        # layer built on the meta device (to_empty), or moved there and materialised again. A conversion that kept
        # the tensors keeps the packing as it is, and projections re-seated before (a weight assigned,
        # load_state_dict(assign=True)) are left alone.
        packed = self._packed_qkv
        was_packed = packed is not None and packed.holds(self._qkv())
        super()._apply(fn, recurse)
        if ((was_packed and packed is not None and not packed.holds(self._qkv()))
                or (self._pack_when_materialised and not self.q_proj.weight.is_meta)):
            self._packed_qkv = self._pack_qkv()  # (None on the meta device: packed when materialised)
            self._pack_when_materialised = self._packed_qkv is None and self._packs_qkv() and self.q_proj.weight.is_meta
        return self

    def __setstate__(self, state):
        # copy.deepcopy clones each Parameter on its own (Parameter.__deepcopy__): the copy is packed again, before
        # anything can hold its tensors. An unpickled layer keeps its packing (pickle keeps shared storage).
        super().__setstate__(state)
        if "rotary" in self.__dict__:  # pickled before the property: a None rotary was a plain attribute
            self._modules["rotary"] = self.__dict__.pop("rotary")
        packed = self._packed_qkv
        if packed is not None and not packed.holds(self._qkv()):
            self._packed_qkv = self._pack_qkv()

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        try:  # the common case in a few comparisons; anything else gets the checks that name it
            B, _, D = query.shape
            Bk, S, Dk = key.shape
            Bv, Sv, Dv = value.shape
            if B == Bk == Bv and S == Sv and D == self.d_model and Dk == self.kdim and Dv == self.vdim:
                return
        except (AttributeError, TypeError, ValueError):
            pass
        check_rank("query", query, 3, "(B, L, D)")
        check_rank("key", key, 3, "(B, S, kdim)")
        check_rank("value", value, 3, "(B, S, vdim)")
        for name, x, width in (("query", query, self.d_model), ("key", key, self.kdim), ("value", value, self.vdim)):
            if x.shape[-1] != width:
                raise ValueError(f"{name} must have last dim {width}, got shape {tuple(x.shape)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"batch sizes differ: query {query.shape[0]}, key {key.shape[0]}, value {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value lengths differ: S={key.shape[1]} and S={value.shape[1]}")

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (B, Hkv, S, E) and values (B, Hkv, S, E) from the inputs (B, S, kdim|vdim): what an
        attention strategy calls when it needs new ones."""
        return (split_heads(project_by_name(self, "k_proj", key), self.num_kv_heads),
                split_heads(project_by_name(self, "v_proj", value), self.num_kv_heads))

    def attention_options(self) -> dict:
        """The keyword arguments of :func:`attnkit.attention` this layer fixes: scale, dropout (in
        training mode), backend."""
        return dict(scale=self.scale, dropout_p=self.dropout if self.training else 0.0, backend=self.backend)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | BlockMask | None = None,
        key_mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        bias: Tensor | None = None,
        need_weights: bool | Sequence[int] = False,
        cache: Attending | None = None,
        causal_align: str | None = None,
        positions: Tensor | None = None,
        context_parallel: Attending | None = None,
    ) -> AttentionOutput:
        """Attend from query (B, L, D) to key (B, S, kdim) / value (B, S, vdim).

        Self attention when ``key`` and ``value`` are omitted; ``value`` defaults to ``key``.
        ``mask`` (a boolean tensor or a :class:`~attnkit.masks.BlockMask` of any sparse pattern, or
        torch's flex_attention BlockMask),
        ``is_causal``, ``window``, ``bias`` and ``need_weights`` are as in :func:`attnkit.attention`;
        ``key_mask`` (B, S) True (or 1) at real keys, S counting cached keys too (joined to ``mask``).
        ``cache``: a KV cache (:mod:`attnkit.layers.cache`); the new keys are appended and causal masks
        are aligned bottom-right unless ``causal_align`` says otherwise (S counts cached keys too).
        ``positions`` (L,) or (B, L): the rotary positions of the new tokens (default: the cache's
        position onwards), e.g. per row after left padding.
        ``context_parallel`` (:class:`attnkit.distributed.ContextParallel`): self attention over a
        sequence split across processes; ``query`` is this process's shard, ``positions`` (L,) its
        global positions (default: the layout's), ``key_mask`` (B, L) the shard's padding; no mask,
        cache, bias, weights or attention dropout.

        One path whatever the cache or strategy (:mod:`attnkit.layers.attending`): project the
        queries, let the strategy attend, project the heads back.

        Returns:
            :class:`AttentionOutput` with output (B, L, D), per-head weights (B, H, L, S) or None
            (average over dim 1 for ``nn.MultiheadAttention``'s averaged weights), lse or None.
        """
        self_attention = key is None
        if key is None:
            if value is not None:
                raise ValueError("value was given without key; pass both for cross attention")
            key = value = query
        elif value is None:
            value = key
        self._check_inputs(query, key, value)
        if mask is not None and not isinstance(mask, Tensor):
            mask = as_block_mask(mask)  # torch's flex_attention BlockMask: converted once
        attending = strategy(cache, context_parallel)
        try:
            packed = self._packed_qkv
            qkv = None if packed is None or not self_attention else packed_projection(packed, self._qkv(), query)
            if qkv is None:
                if (packed is not None and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
                        and not packed.holds(self._qkv())):  # (looked at where the packed call was possible)
                    self._packed_qkv = None  # a projection re-seated: its old memory is not kept for nothing
                q, kept = self.queries(query)  # (B, H, L, E)
                kv = qk = None
            else:  # one projection for the three (B, L, (H + 2 Hkv) E), split by heads
                B, L, _ = query.shape
                H, Hkv = self.num_heads, self.num_kv_heads
                heads = qkv.view(B, L, H + 2 * Hkv, self.head_dim).transpose(1, 2)
                if self.rotary is None:
                    q, k, v = heads.split_with_sizes((H, Hkv, Hkv), 1)  # (Tensor.split's Python wrapper: 5 us more)
                    qk = None
                else:  # q and k side by side as well: a strategy rotates them in one call (attending.rotated)
                    qk, v = heads.split_with_sizes((H + Hkv, Hkv), 1)
                    q, k = qk.split_with_sizes((H, Hkv), 1)
                kept, kv = None, (k, v)
            call = make_call((mask, is_causal, window, bias, need_weights, causal_align, positions, self_attention,
                              key_mask, kv, qk))
            result = attending.attend(self, q, key, value, call)
        except RuntimeError as error:  # torch's "mat1 and mat2 must have the same dtype" names no argument
            mismatch = self._dtype_mismatch(query=query, key=key, value=value)
            if mismatch is None:
                raise
            raise mismatch from error
        output = project_by_name(self, "out_proj", self.combine(result.output, kept))  # (B, L, D)
        return make_output((output, result.weights, result.lse))

    def queries(self, query: Tensor) -> tuple[Tensor, Tensor | None]:
        """The heads' queries (B, H, L, E) from the input (B, L, D), and what :meth:`combine` needs of the
        input besides (None here; a gate in :class:`~attnkit.layers.GatedAttention`). The query heads
        are not rotated: the attention strategy rotates them at the positions it knows."""
        return split_heads(project_by_name(self, "q_proj", query), self.num_heads), None

    def combine(self, heads: Tensor, kept: Tensor | None) -> Tensor:
        """The heads' outputs (B, H, L, Ev) as the output projection's input (B, L, H Ev)."""
        return merge_heads(heads)

    def _dtype_mismatch(self, **inputs: Tensor) -> TypeError | None:
        """A TypeError naming the input whose dtype is not the layer's (outside autocast, which casts)."""
        weight = self.q_proj.weight
        if torch.is_autocast_enabled(weight.device.type):
            return None
        for name, x in inputs.items():
            if x.dtype != weight.dtype:
                return TypeError(f"{name} has dtype {x.dtype} but this MultiHeadAttention's weights are {weight.dtype}: "
                                 f"cast the input ({name}.to({weight.dtype})) or the layer (.to({x.dtype}))")
        return None
