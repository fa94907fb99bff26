"""``"attnkit"`` as transformers' attention implementation: the attention function and :func:`register`.

Every attention call of a model loaded with ``attn_implementation="attnkit"`` runs
:func:`attnkit.attention` (``backend="auto"``): grouped-query heads without repeating K/V, T5's
``position_bias`` as an additive bias, Gemma 2's softcapping as a ``score_mod``, gpt-oss's learned
sinks as ``sinks``. With ``output_attentions=True`` the exact weights come back while the output
stays on the fast backend. A query row with no allowed key gets what eager gives it (the uniform
average of every key, with its gradients; :mod:`attnkit.hf.rows`), not attnkit's own zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .. import masks
from ..functional.attention import attention
from ..functional.block_mask import ScoreMod
from ..functional.devices import device_type
from ..functional.masks import selected
from . import families
from .families import IMPLEMENTATION, UnsupportedFeature, check_family, install_guard, model_type, permitted
from .keywords import check_keywords
from .masks import StructuredMask, _masking_utils, attnkit_mask
from .record import recording_now
from .rows import as_eager, mask_empty_rows

__all__ = ["register", "attnkit_attention_forward", "attend", "weights_requested"]


def register(*, allow_unverified: Sequence[str] = ()) -> None:
    """Register ``"attnkit"`` with transformers' attention and mask interfaces (idempotent), and
    guard every route to it: a model whose ``model_type`` is not in :data:`VERIFIED_FAMILIES` raises
    :class:`UnverifiedFamily` when it is built with ``attn_implementation="attnkit"``
    (``from_pretrained``, ``from_config``, ``set_attn_implementation`` with a string or a dict, the
    sub-models of a composite) or when one of its attention modules is called. Families named in
    ``allow_unverified`` load with an :class:`UnverifiedFamilyWarning` instead: their numbers are
    nobody's promise."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    families.allow(allow_unverified)
    AttentionInterface.register(IMPLEMENTATION, attnkit_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, attnkit_mask)
    _masking_utils()  # kept now, before any model (compiled or not) asks attnkit_mask for a mask
    install_guard()


def _softcap(cap: float, bias: Tensor | None = None) -> ScoreMod:
    """Gemma 2's attention logit softcapping as a score_mod, in eager's order: cap * tanh(score / cap),
    then an additive mask ``bias`` ((B|1, H|1, L|1, S) or (L, S)) if given, indexed with
    FlexAttention's broadcast index tensors."""
    if bias is None:
        return lambda score, b, h, q_idx, kv_idx: torch.tanh(score / cap) * cap
    bias = bias if bias.dim() == 4 else bias[None, None]

    def softcap_then_add(score, b, h, q_idx, kv_idx):
        index = [x if size > 1 else torch.zeros_like(x) for x, size in zip((b, h, q_idx), bias.shape[:3])]
        return torch.tanh(score / cap) * cap + bias[index[0], index[1], index[2], kv_idx].to(score.dtype)

    return softcap_then_add


def _keys_mismatch(owner: str, covered: int, S: int, window: int | None) -> str:
    """Why a structured mask does not fit the keys attention got, named by its cause."""
    if window is not None and window == 1 and S > covered:
        return (f"{owner}: a sliding window of 1 key: transformers' sliding-window cache keeps window - 1 = 0 keys, "
                f"which its slice cannot express (it keeps them all), so its mask covers {covered} key(s) and attention "
                f"got {S}; eager would broadcast that mask over all {S} keys, which is no window. Use a window of at "
                "least 2")
    if covered == 1 and S > 1 and window is None:
        return (f"{owner}: transformers sized this layer's mask for 1 key where its cache passed {S} (it reads the "
                "cache's length from a layer that counts none: MiniMax with a linear layer 0). A query without padding "
                "attends every key there, which attnkit follows; with padding, eager would attend the padded keys too, "
                "so attnkit refuses: generate unpadded prompts one at a time, or load the folder natively "
                "(attnkit.models.pretrained.load_hf_folder), whose padded batches are exact")
    if S > covered:
        return (f"{owner}: the cache passed {S} keys to attention but transformers sized this layer's mask for "
                f"{covered}{f' (a sliding window of {window})' if window is not None else ''}: the cache holds more "
                "keys than its mask describes, so attnkit cannot tell which of them are allowed")
    return (f"{owner}: the cache is too short: it passed {S} keys to attention where transformers sized this layer's mask "
            f"for {covered}; give the cache room for every position (a larger max_cache_len)")


def _check_module(module: nn.Module) -> None:
    """The guard at the call: an attention module whose config names a family attnkit may not run in
    (a sub-model a route around the load-time guard reached) is refused by name."""
    family = model_type(getattr(module, "config", None))
    if family is not None and not permitted(family):
        check_family(module.config, type(module).__name__)


def attnkit_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature: query (B, H, L, E), key/value (B, Hkv, S, E),
    ``attention_mask`` boolean (True = attend) or additive float, broadcastable to (B, H, L, S);
    returns the output as (B, L, H, Ev) and the weights (B, H, L, S) when ``output_attentions``.

    The mask decides the structure: a :class:`StructuredMask` from :func:`attnkit_mask` carries
    proved causality, window and padding; any other mask (transformers' own, or a user's 4D mask
    of any shape) is applied exactly as given, with nothing added; no mask at all means what it
    means to transformers' SDPA function (causal top-left if the module is causal and L > 1).
    ``softcap`` (Gemma 2) becomes a score_mod; ``s_aux`` / ``sinks`` (gpt-oss) attnkit's sinks.
    Rows with no allowed key follow eager (:mod:`attnkit.hf.rows`). A model made context-parallel
    (:func:`attnkit.hf.context_parallel`) attends over the whole sequence split across its processes."""
    _check_module(module)
    parallel = module.__dict__.get("_attnkit_context_parallel")  # (no nn.Module.__getattr__ miss per call)
    if parallel is not None:
        output = parallel.attend(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
        return output.transpose(1, 2).contiguous(), None
    output, weights = attend(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    return output.transpose(1, 2).contiguous(), weights


def attend(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
           dropout: float, scaling: float | None, is_causal: bool | None, kwargs: dict) -> tuple[Tensor, Tensor | None]:
    """:func:`attnkit_attention_forward` on one process: the output (B, H, L, Ev) and the weights."""
    if torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(device_type(query.device)):
        # SDPA's casts (RoPE leaves q and k in float32 there)
        dtype = torch.get_autocast_dtype(device_type(query.device))
        query, key, value = (x.to(dtype) if x.dtype != torch.float64 else x for x in (query, key, value))
    S = key.shape[2]
    owner = type(module).__name__
    check_keywords(owner, kwargs)
    selection = _selection(module, kwargs, query.shape[1], S)
    mask, bias, empty, causal, window, align = _read_mask(module, attention_mask, query, S, is_causal, selection)
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:  # T5: relative position bias, (1|B, H, L, S), added to the scores
        position_bias = position_bias[..., :S].to(query.dtype)
        added = position_bias
        if mask is not None:
            added = position_bias.masked_fill(~mask, float("-inf"))
            mask = None
        bias = added if bias is None else bias + added
    score_mod = None
    softcap = kwargs.get("softcap")
    if softcap:
        if bias is not None:  # eager adds an additive mask after the cap: so does the score_mod, and the
            keys = ~(bias <= torch.finfo(bias.dtype).min / 2)  # keys it masks stay masked after it
            mask = keys if mask is None else mask & keys
        score_mod = _softcap(float(softcap), bias)
        bias = None
    sinks = kwargs.get("s_aux")
    sinks = kwargs.get("sinks") if sinks is None else sinks
    recording = recording_now()
    recorded = recording.heads_of(module) if recording is not None else None
    requested = weights_requested(kwargs)
    # The model's own attentions (every head) when it asked for them, the recorded heads cut from them;
    # else only the recorded heads are computed.
    wanted = None if requested or recorded is None else recorded
    result = attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=causal,
        causal_align=align,
        window=window,
        scale=scaling,
        dropout_p=dropout if module.training else 0.0,
        need_weights=wanted if wanted is not None else requested,
        score_mod=score_mod,
        sinks=None if sinks is None else sinks.to(query.dtype if query.dtype == torch.float64 else torch.float32),
    )
    output, weights = result.output, result.weights
    if empty is not None and sinks is None:  # with sinks eager's row is zeros too: the sink takes it all
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        learned = position_bias if position_bias is not None and position_bias.requires_grad else None
        output, weights = as_eager(output, weights, empty, query, key, value, scale,
                                   softcap=float(softcap) if softcap else None, bias=learned, heads=wanted)
    if recorded is not None and recording is not None and weights is not None:
        recording.store(module, weights if wanted is not None else weights[:, recorded])
        weights = weights if requested else None
    return output, weights


def _selection(module: nn.Module, kwargs: dict, H: int, S: int) -> Tensor | None:
    """The keys a sparse attention selected for each query, as a (B, 1|H, L, S) boolean mask, or None:
    DeepSeek-V3.2's (and hy_v4's) top-k key ``indices`` (B, L, k), MiniMax-M3's top-k ``block_indices``
    (B, Hkv, L, k) over blocks of ``module.indexer.block_size`` keys. Eager folds the same selection into
    its mask; it is refused by name where attnkit cannot read it."""
    if "indices" not in kwargs and "block_indices" not in kwargs:  # (every layer call of every other family)
        return None
    owner = type(module).__name__
    indices, blocks = kwargs.get("indices"), kwargs.get("block_indices")
    for name, value in (("indices", indices), ("block_indices", blocks)):
        if isinstance(value, StructuredMask):
            raise UnsupportedFeature(f"{owner}: {name} were computed from attnkit's structured mask, which holds the "
                                     "padding alone: the model reads the mask itself (an indexer scoring against it), so "
                                     "its selection is not eager's. attnkit.hf.masks.MASK_READING_FAMILIES must name "
                                     f"model_type {getattr(getattr(module, 'config', None), 'model_type', None)!r}")
    if indices is not None and blocks is not None:
        raise UnsupportedFeature(f"{owner}: both indices and block_indices were given; attnkit applies one selection")
    if indices is not None:
        return selected(indices, S)
    if blocks is None:
        return None
    block_size = getattr(getattr(module, "indexer", None), "block_size", None)
    if not isinstance(block_size, int) or block_size < 1:
        raise UnsupportedFeature(f"{owner}: block_indices without module.indexer.block_size: attnkit cannot tell how many "
                                 "keys a selected block holds")
    return selected(blocks, S, block_size=block_size, heads=H)


def _read_mask(module: nn.Module, attention_mask: Tensor | None, query: Tensor, S: int, is_causal: bool | None,
               selection: Tensor | None = None):
    """What the call's ``attention_mask`` (and a sparse ``selection``, (B, 1|H, L, S)) mean to attnkit:
    (mask, bias, empty rows, is_causal, window, causal_align), as :func:`attnkit_attention_forward`
    describes. A selection joins the mask as eager joins it: ANDed to a boolean mask, ``finfo.min`` in an
    additive one, and the structure of a structured mask written out beside it."""
    owner, L = type(module).__name__, query.shape[2]
    mask = bias = empty = None
    causal, window, align = False, None, "top-left"
    if isinstance(attention_mask, StructuredMask):
        structure = attention_mask.structure
        if structure is None:
            raise UnsupportedFeature(f"{owner}: the model changed the mask attnkit built before passing it to attention "
                                     "(sliced, combined or concatenated it), so attnkit cannot prove what it holds")
        if attention_mask.keys != S:
            if attention_mask.keys == 1 and L == 1 and not structure.padded and structure.window is None:
                # transformers sized this layer's mask from a cache that counts no keys (MiniMax with a linear layer
                # 0 reads layer 0's): one query without padding attends every key, as eager's broadcast of the one
                # column gives
                return None, None, None, False, None, "top-left"
            raise UnsupportedFeature(_keys_mismatch(owner, attention_mask.shape[-1], S, structure.window))
        mask = attention_mask.padding if structure.padded else None
        causal, window, align = structure.is_causal, structure.window, structure.causal_align
        if selection is None:
            return mask, bias, attention_mask.empty_rows(L, S), causal, window, align
        if causal:  # the structure written out beside the selection (eager's mask holds both)
            dense = masks.sliding_window(L, S, window, causal_align=align, device=query.device) if window else \
                masks.causal(L, S, causal_align=align, device=query.device)
            mask = dense if mask is None else mask & dense
        causal, window, align = False, None, "top-left"
        mask = selection if mask is None else mask & selection
        return mask, bias, mask_empty_rows(mask, None), causal, window, align
    if attention_mask is not None:
        if attention_mask.shape[-1] < S:
            raise UnsupportedFeature(f"{owner}: a mask over {attention_mask.shape[-1]} keys for {S} keys")
        attention_mask = attention_mask[..., :S]  # as eager: a mask as long as a static cache is cut to the keys
        if attention_mask.dtype == torch.bool:
            mask = attention_mask if selection is None else attention_mask & selection
        else:
            given = attention_mask if selection is None else \
                attention_mask.masked_fill(~selection, torch.finfo(attention_mask.dtype).min)
            empty = mask_empty_rows(None, given)  # read in the mask's own dtype, as eager's type promotion does
            bias = _in_dtype(given, query.dtype)
            return mask, bias, empty, causal, window, align
        return mask, bias, mask_empty_rows(mask, None), causal, window, align
    # transformers' SDPA semantics for "no mask": causal (top-left) where the module is
    causal = L > 1 and bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if selection is not None:
        mask = selection if not causal else selection & masks.causal(L, S, device=query.device)
        return mask, bias, mask_empty_rows(mask, None), False, None, "top-left"
    return mask, bias, empty, causal, window, align


def _in_dtype(bias: Tensor, dtype: torch.dtype) -> Tensor:
    """An additive mask in the queries' dtype, its values below that dtype's range at its lowest finite value
    (a float32 ``finfo.min`` is -inf in bfloat16; clamped, it stays a masked key the rows above know)."""
    if bias.dtype == dtype:
        return bias
    return bias.clamp(min=torch.finfo(dtype).min).to(dtype) if torch.finfo(bias.dtype).min < torch.finfo(dtype).min \
        else bias.to(dtype)


def weights_requested(kwargs: dict) -> bool:
    """Whether the caller asked for attention weights: ``output_attentions`` in the call, or
    transformers' output collector gathering attentions (some families, GPT-2 among them, drop the
    keyword before it reaches the attention function)."""
    if kwargs.get("output_attentions"):
        return True
    collector = _output_collector()
    if collector is None:  # an older or newer transformers without the collector: only the keyword counts
        return False
    collected = collector.get()
    return bool(collected) and any(key.endswith("attentions") for key in collected)


@functools.cache
def _output_collector():
    """transformers' output collector (a ``ContextVar``), imported once, not on every layer call (an import
    statement is a lookup through the import machinery); None where this transformers has none."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    return _active_collector


