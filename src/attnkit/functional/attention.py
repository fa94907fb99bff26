"""``attention()``: scaled dot-product attention with interchangeable exact backends.

The one place where a backend is chosen. Layers call this function and never branch on backends.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import masks as _masks
from . import nan as _nan
from . import nested as _nested
from .backends import BACKENDS, reference, sdpa
from .backends.common import Problem, apply_sinks, head_weights, whole_structure
from .block_mask import BlockMask, ScoreMod
from .checks import (
    Dims,
    check_bias,
    check_block_mask,
    check_mask,
    check_qkv,
    check_sinks,
    check_window,
    make_dims,
    readable_query,
)
from .devices import under_autocast
from .plain import one_head_shape, plain, plain_causal
from .routing import (  # auto's rules (choose_backend and lse_backend re-exported)
    AUTO_CLASSIFY_MIN_ENTRIES,
    AUTO_TILED_MAX_OCCUPANCY,
    AUTO_TILED_MIN_KEYS_PER_WINDOW,
    choose_backend,
    classified,
    lse_backend,
)
from .sdpa_names import causal_bias_alignment, check_enable_gqa, is_causal_bias, sdpa_mask, unexpected_keywords
from .softmax import masked_softmax
from .torch_block_mask import as_block_mask
from .tracing import exportable, exporting, is_compiling, one_graph, traced, transformed

__all__ = ["AttentionOutput", "make_output", "attention", "attention_trusted", "attend", "choose_backend", "lse_backend",
           "BACKEND_NAMES"]

BACKEND_NAMES = ("auto", *BACKENDS)

@exportable
class AttentionOutput(NamedTuple):
    """Result of :func:`attention` (and of the attention layers).

    Attributes:
        output: (B, H, L, Ev) from :func:`attention`; (B, L, D) from the layers.
        weights: (B, H, L, S) attention weights if asked for, else None. With
            ``need_weights=[h0, h1, ...]`` only those heads: (B, len(heads), L, S).
        lse: (B, H, L) log-sum-exp of the scaled, masked scores, where the backend has it
            (reference, tiled), else None; -inf for a fully masked row. ``auto`` returns it where
            ``return_lse=True`` asks or its backend computed it anyway; a small score_mod call it
            writes out (the reference backend) leaves it out unless asked.
    """

    output: Tensor
    weights: Tensor | None = None
    lse: Tensor | None = None


make_output = partial(tuple.__new__, AttentionOutput)
"""``make_output((output, weights, lse))``: an :class:`AttentionOutput` built by tuple's own constructor, for the
paths every call takes (the plain call, the layers' return). A NamedTuple's ``__new__`` is generated Python and
costs a quarter of a microsecond more (benchmarks/overhead.py)."""


def attend(
    scores: Tensor,
    values: Tensor,
    *,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    dropout_p: float = 0.0,
    prior: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Normalise and combine: weights = masked_softmax(scores / temperature), context = weights @ values.

    The last two steps of every mechanism, used by the Bahdanau and Luong layers whatever their
    score function.

    Args:
        scores: (..., L, S). values: (..., S, Dv). mask: boolean, broadcastable to scores.
        prior: optional (..., L, S) factor multiplying the normalised weights (Luong local-p's
            Gaussian); the weights are not renormalised after it, as in the paper.

    Returns:
        context (..., L, Dv) and weights (..., L, S) (before dropout).
    """
    weights = masked_softmax(scores, mask, temperature=temperature)
    if prior is not None:
        weights = weights * prior
    attended = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return attended @ values, weights


def _heads(need_weights: bool | Sequence[int], H: int) -> list[int] | None:
    if isinstance(need_weights, bool):
        return list(range(H)) if need_weights else None
    if not isinstance(need_weights, Sequence) or isinstance(need_weights, str):
        raise TypeError(f"need_weights must be True, False or a sequence of head indices in [0, {H}), got "
                        f"{type(need_weights).__name__} {need_weights!r}")
    heads = list(need_weights)
    bad = [h for h in heads if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < H]
    if not heads or bad:
        raise ValueError(
            f"need_weights must be a bool or a non-empty sequence of head indices in [0, {H}), "
            f"got {need_weights!r}"
        )
    return heads


def _with_bias_keys(mask: Tensor | None, bias: Tensor) -> Tensor | None:
    """``mask`` and the keys ``bias`` allows: a bias entry of -inf or at most finfo.min / 2 (what
    additive float masks hold, transformers' and x-transformers' finfo.min among them) is a masked
    key, as :func:`attnkit.masks.from_additive` reads it. Masked keys are ruled out after
    ``score_mod``, and a row of them has no allowed key (zeros) in every backend. A NaN stays
    allowed: it propagates. On the CPU a bias that masks nothing (one look) leaves the mask as it is."""
    keys = ~(bias <= torch.finfo(bias.dtype).min / 2)
    if bias.is_cpu and not traced() and bool(keys.all()):
        return mask
    return keys if mask is None else _masks.and_masks(mask, keys)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | BlockMask | None = None,
    is_causal: bool = False,
    causal_align: str = "top-left",
    window: int | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    need_weights: bool | Sequence[int] = False,
    score_mod: ScoreMod | None = None,
    sinks: Tensor | None = None,
    attn_mask: Tensor | None = None,
    enable_gqa: bool | None = None,
    return_lse: bool = False,
    **unknown,
) -> AttentionOutput:
    r"""Scaled dot-product attention, softmax(q k^T * scale + bias, masked) v (Vaswani et al. 2017).

    Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0: MHA when equal,
    GQA in between, MQA when Hkv == 1), L query length, S key length, E head dim, Ev value dim.

    Args:
        q: (B, H, L, E) queries.
        k: (B, Hkv, S, E) keys. Each group of H / Hkv consecutive query heads shares one key head;
            no copies are made where the backend can avoid them.
        v: (B, Hkv, S, Ev) values. q, k and v may instead be jagged nested tensors (``torch.nested``,
            layout=torch.jagged, ragged in the length), as torch's SDPA takes them: each sequence is attended
            as it would be alone and the output keeps q's offsets (:mod:`attnkit.functional.nested`).
        mask: boolean, True = may attend; shape (L, S) or (B|1, H|1, L|1, S). Nothing else is
            broadcast. Or a :class:`~attnkit.masks.BlockMask` (from a ``mask_mod``, e.g. a
            Longformer or document pattern): the tiled backend skips its empty tiles and does no
            mask work on its full ones; reference and sdpa materialise it. See :mod:`attnkit.masks`.
            torch's ``flex_attention`` BlockMask (``create_block_mask``) too, with flex_attention's
            meaning (:func:`attnkit.masks.from_torch_block_mask`), on every backend.
        is_causal: query i attends keys j <= i + offset, offset given by ``causal_align``.
        causal_align: ``"top-left"`` (offset 0, PyTorch's ``is_causal``) or ``"bottom-right"``
            (offset S - L, for decoding with a KV cache).
        window: causal sliding window (Mistral): query i attends only keys
            ``i + offset - window < j <= i + offset``. Implies causal.
        bias: float, added to the scaled scores (ALiBi, relative positions); same shapes as mask.
        scale: multiplies q k^T; default 1 / sqrt(E).
        dropout_p: dropout on the attention weights; pass 0 in evaluation.
        backend: ``"reference"`` (plain, materialises weights), ``"sdpa"`` (PyTorch fused),
            ``"tiled"`` (exact online softmax in plain PyTorch, memory linear in length, skips
            masked blocks), ``"flex"`` (PyTorch's compiled FlexAttention with attnkit's tiles and
            semantics; CUDA, or a CPU forward without gradients) or ``"auto"`` (the fastest exact
            one for these inputs and this device; on CUDA only fused kernels). All give the same
            numbers.
        need_weights: False, True (all heads) or a sequence of head indices. Weights are exact
            whatever the backend: fast backends keep their output path and recompute the weights
            of the asked-for heads only.
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` (FlexAttention's semantics)
            applied to the scaled scores (plus ``bias``) before masking: ALiBi, tanh softcapping,
            relative position bias. Index tensors broadcast as (B,1,1,1), (1,H,1,1), (1,1,L',1),
            (1,1,1,S'). Runs in the tiled and flex backends (gradients for q, k, v) and the
            reference backend (also gradients for tensors the function reads); not in sdpa.
        sinks: (H,) learned attention-sink logits, one per query head (gpt-oss; Xiao et al. 2023's
            "off-by-one" softmax): each row is normalised over exp(scores) and exp(sink), and the
            sink attends no value, so a row may give less than all its weight to the keys. Every
            backend; gradients reach the sinks. The returned lse includes the sink; a row with no
            allowed key still gets a zero output (its lse is the sink).
        attn_mask, enable_gqa: PyTorch SDPA's names, with its meaning (:mod:`.sdpa_names`): a boolean
            ``attn_mask`` is ``mask`` (True = may attend), a float one ``bias``, torch's ``CausalBias``
            (``causal_upper_left`` / ``causal_lower_right``) ``is_causal=True`` with its alignment; ``enable_gqa=False``
            refuses fewer key than query heads (None, the default, and True take them).
        return_lse: the lse is returned whatever the backend: ``auto`` picks one that computes it
            (tiled on the CPU, flex on CUDA where it fits) instead of SDPA; ``backend="sdpa"`` is refused.

    Returns:
        :class:`AttentionOutput` (output (B, H, L, Ev), weights or None, lse or None).
        A query row with no allowed key gets zero weights and a zero output, never NaN.
        The returned weights are those before dropout.
    """
    tensors = type(q) is Tensor and type(k) is Tensor and type(v) is Tensor  # (not a subclass, nested or not)
    if not tensors and _nested.any_nested(q, k, v):
        if attn_mask is not None or enable_gqa is not None or unknown:
            if unknown:
                raise unexpected_keywords("attention", unknown, _KEYWORDS)
            if is_causal_bias(attn_mask):
                causal_bias_alignment(attn_mask, is_causal, causal_align, q, k)  # (of fixed lengths: named)
            check_enable_gqa(enable_gqa, q, k)
        return _nested.attention(attention, q, k, v, is_causal=is_causal, causal_align=causal_align, window=window,
                                 options=dict(mask=mask, attn_mask=attn_mask, bias=bias, scale=scale,
                                              dropout_p=dropout_p, backend=backend, need_weights=need_weights,
                                              score_mod=score_mod, sinks=sinks, return_lse=return_lse))
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in _PLAIN_BACKENDS):
        if not _nan._state.on and not _any_autocast():  # (compiling, the shortcut steps aside: .plain)
            output = one_head_shape(q, k, v, is_causal, causal_align)  # settled before any other check
            if output is not None:
                return make_output((output, None, None))
    if attn_mask is not None or enable_gqa is not None or unknown:  # SDPA's names, or a wrong one
        if unknown:
            raise unexpected_keywords("attention", unknown, _KEYWORDS)
        if is_causal_bias(attn_mask):  # torch's causal_upper_left / causal_lower_right
            causal_align = causal_bias_alignment(attn_mask, is_causal, causal_align, q, k)
            is_causal, attn_mask = True, None
        if attn_mask is not None:
            mask, bias = sdpa_mask(attn_mask, mask, bias)
        check_enable_gqa(enable_gqa, q, k)
    if _any_autocast():
        return under_autocast(attention, q, k, v, bias, dict(
            mask=mask, is_causal=is_causal, causal_align=causal_align, window=window, scale=scale, dropout_p=dropout_p,
            backend=backend, need_weights=need_weights, score_mod=score_mod, sinks=sinks, return_lse=return_lse))
    dims = check_qkv(q, k, v)
    if not q.is_contiguous():  # a query whose rows overlap in memory: copied (torch misreads it)
        q = readable_query(q)
    return _attention(q, k, v, dims, mask, is_causal, causal_align, window, bias, scale, dropout_p, backend,
                      need_weights, score_mod, sinks, return_lse)


_KEYWORDS = tuple(name for name, parameter in inspect.signature(attention).parameters.items()
                  if parameter.kind is inspect.Parameter.KEYWORD_ONLY)
"""The keywords :func:`attention` takes, read from its signature (a wrong one is named with the closest)."""


_any_autocast = torch._C._is_any_autocast_enabled  # one flag read per call (0.2 us; a device's flag takes 0.4)


def attention_trusted(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | BlockMask | None = None,
                      is_causal: bool = False, causal_align: str = "top-left", window: int | None = None,
                      bias: Tensor | None = None, scale: float | None = None, dropout_p: float = 0.0,
                      backend: str = "auto", need_weights: bool | Sequence[int] = False,
                      score_mod: ScoreMod | None = None, sinks: Tensor | None = None) -> AttentionOutput:
    """:func:`attention` for callers that built q, k and v themselves from inputs they checked (the
    layers' attention strategies): the shapes, dtypes and devices of q, k and v are not checked again;
    every other argument is. The arguments may go by position, in this order (a layer's call costs
    microseconds, and keywords a quarter of one each). Under ``torch.autocast``, :func:`attention`'s
    casts (the layer's projections and rotary embeddings may leave q, k and v in two dtypes there)."""
    if _any_autocast():
        return under_autocast(attention, q, k, v, bias, dict(
            mask=mask, is_causal=is_causal, causal_align=causal_align, window=window, scale=scale, dropout_p=dropout_p,
            backend=backend, need_weights=need_weights, score_mod=score_mod, sinks=sinks))
    B, H, L, E = q.shape
    dims = make_dims((B, H, k.shape[1], L, k.shape[2], E, v.shape[3]))
    return _attention(q, k, v, dims, mask, is_causal, causal_align, window, bias, scale, dropout_p, backend,
                      need_weights, score_mod, sinks)


def _attention(q: Tensor, k: Tensor, v: Tensor, dims: Dims, mask, is_causal, causal_align, window, bias, scale,
               dropout_p, backend, need_weights, score_mod, sinks, return_lse: bool = False) -> AttentionOutput:
    """:func:`attention` once q, k and v are known to fit ``dims``; with the NaN rule on, run on q, k and v without
    their NaN and the rule's rows set after (:func:`.nan.guarded`)."""
    if not _nan.on():
        return _computed(q, k, v, dims, mask, is_causal, causal_align, window, bias, scale, dropout_p, backend,
                         need_weights, score_mod, sinks, return_lse)
    q, k, v, poisoned = _nan.guarded(q, k, v, dims.groups)
    output, weights, lse = _computed(q, k, v, dims, mask, is_causal, causal_align, window, bias, scale, dropout_p,
                                     backend, need_weights, score_mod, sinks, return_lse)
    output, lse, weights = _nan.marked(poisoned, output, lse, weights, _heads(need_weights, dims.H))
    return AttentionOutput(output=output, weights=weights, lse=lse)


def _computed(q: Tensor, k: Tensor, v: Tensor, dims: Dims, mask, is_causal, causal_align, window, bias, scale,
              dropout_p, backend, need_weights, score_mod, sinks, return_lse: bool) -> AttentionOutput:
    """The backend's result for a call the NaN rule has settled (:func:`_attention`)."""
    if scale is not None and not (type(scale) is float and abs(scale) * (dims.E or 1) <= _LARGEST.get(q.dtype, 0.0)):
        scale = _checked_scale(scale, dims, q.dtype)  # (the line above: a finite float that cannot overflow, as is)
    if (mask is None and bias is None and score_mod is None and sinks is None and window is None
            and need_weights is False and dropout_p == 0 and backend in _PLAIN_BACKENDS and dims.L and dims.S
            and not return_lse):
        causal = (False if not is_causal and causal_align == "top-left"  # the commonest call, decided inline
                  else plain_causal(bool(is_causal), causal_align, dims.L, dims.S))
        if causal is not None:  # a plain call, what auto hands SDPA anyway: no Problem, no routing, one kernel
            output = plain(q, k, v, dims, scale, causal)
            return make_output((output, None, None))
    elif (q.is_cpu and bias is None and score_mod is None and sinks is None and need_weights is False and dropout_p == 0
          and backend in _PLAIN_BACKENDS and dims.L and dims.S and dims.Ev and not return_lse
          and causal_align in _masks.ALIGNMENTS):
        direct = _direct_mask(q, dims, mask, is_causal, causal_align, window, backend)
        if direct is not _GENERAL:  # what auto hands SDPA anyway (:func:`.backends.sdpa.masked`), no Problem, no routing
            # what sdpa.masked would call, as it is (compiled, it fills empty rows: the probe is no graph's)
            if (dims.Ev >= dims.E and not torch.compiler.is_compiling() and not transformed()  # traced(), inline
                    and sdpa.cpu_returns_masked_rows_as_zeros(q.dtype)):
                if dims.H == dims.Hkv:  # (a keyword costs SDPA's argument parser a quarter of a microsecond)
                    output = F.scaled_dot_product_attention(q, k, v, attn_mask=direct, scale=scale)
                else:
                    output = F.scaled_dot_product_attention(q, k, v, attn_mask=direct, scale=scale, enable_gqa=True)
                return make_output((output, None, None))
            options = {"dropout_p": 0.0, "scale": _default_scale(dims.E) if scale is None else scale,
                       "enable_gqa": dims.H != dims.Hkv}
            output = sdpa.masked(q, k, v, direct, None, options)
            return make_output((output, None, None))
    if scale is None:
        scale = _default_scale(dims.E)
    problem, heads = _problem(q, dims, mask, is_causal, causal_align, window, bias, scale, dropout_p, backend,
                              need_weights, score_mod, sinks)
    if backend == "auto":
        if one_graph():  # a transform or torch.export (.tracing): no look at the mask, no question of sizes
            name = "reference" if problem.score_mod is not None or return_lse else "sdpa"
        else:
            problem = classified(problem)  # (classifying looks at the mask on the host)
            name = choose_backend(problem)
            if return_lse and name == "sdpa":  # SDPA's kernels keep their lse to themselves
                learned_bias = problem.bias is not None and problem.bias.requires_grad and torch.is_grad_enabled()
                # the lse backends take no bias gradients: the written-out softmax does, and has the lse
                name = "reference" if learned_bias else lse_backend(q, problem.dropout_p)
    else:
        name = backend
        if return_lse and name == "sdpa":
            raise ValueError("return_lse=True: backend='sdpa' returns no log-sum-exp (torch's SDPA keeps it); use "
                             "backend='auto', 'tiled', 'reference' or 'flex'")
    if dims.S == 0 or dims.L == 0 or dims.Ev == 0 or dims.H == 0:
        name = "reference"  # nothing to tile or fuse: zeros (no key) or empty outputs, in one place
    if name == "reference" and backend == "auto" and not return_lse and sinks is None:
        result = reference.forward(q, k, v, problem, lse=False)  # auto's lse is "where asked or free": not here
    else:
        result = BACKENDS[name](q, k, v, problem)
    if return_lse and result.lse is None:
        raise ValueError(f"return_lse=True: backend={name!r} returned no log-sum-exp for this call (flex's compiled "
                         "CPU forward has none); use backend='auto', 'tiled' or 'reference'")
    if sinks is not None and result.lse is not None:  # backends with an lse leave the sinks to it
        result = apply_sinks(result, sinks)
    weights = None
    if heads is not None:
        if result.weights is not None:
            weights = result.weights if heads == list(range(dims.H)) else result.weights[:, heads]
        else:
            weights = head_weights(q, k, problem, heads)
    return AttentionOutput(output=result.output, weights=weights, lse=result.lse)


_PLAIN_BACKENDS = ("auto", "sdpa")
_GENERAL = object()
"""What :func:`_direct_mask` answers for a call that takes the general path."""


def _direct_mask(q: Tensor, dims: Dims, mask, is_causal, causal_align: str, window, backend: str):
    """For a CPU call with nothing but a boolean mask, a block mask or a sliding window (the caller checked the
    rest): the boolean mask SDPA takes for it, where ``auto`` would hand it to SDPA anyway; else :data:`_GENERAL`.
    A mask alone below the size auto classifies into tiles (AUTO_CLASSIFY_MIN_ENTRIES); a block mask (attnkit's
    or torch's) too full for auto to tile it (occupancy above AUTO_TILED_MAX_OCCUPANCY), as the dense mask it
    keeps; a window alone where auto would not tile it (S < AUTO_TILED_MIN_KEYS_PER_WINDOW windows), its
    structure kept per shape."""
    if mask is not None and not is_causal and window is None:
        if type(mask) is Tensor:
            check_mask(mask, dims, q.device)  # first: a mask of another rank is named, not indexed
            if is_compiling() or mask.shape[-2] * dims.S < AUTO_CLASSIFY_MIN_ENTRIES:  # (traced: no look at the mask,
                return mask  # no size compared: exported sizes may be symbols)
            return _GENERAL
        blocks = mask if type(mask) is BlockMask else as_block_mask(mask)  # torch's BlockMask: converted once
        if type(blocks) is not BlockMask:
            return _GENERAL  # (a subclass, or not a mask: the general path names it)
        check_block_mask(blocks, dims, q.device)
        if backend == "sdpa" or is_compiling() or blocks.occupancy() > AUTO_TILED_MAX_OCCUPANCY:
            return blocks.to_dense()  # what the sdpa backend materialises, kept with the block mask
        return _GENERAL
    if (mask is None and type(window) is int and window >= 1
            and (backend == "sdpa" or exporting() or dims.S < AUTO_TILED_MIN_KEYS_PER_WINDOW * window)):
        return whole_structure(dims.L, dims.S, _masks.causal_offset(dims.L, dims.S, causal_align), window, q.device)
    return _GENERAL
"""Backends under which a plain call (no mask, bias, window, score_mod, sinks, weights or dropout) goes
straight to SDPA: ``auto`` picks it for such a call on every device."""


def _default_scale(E: int) -> float:
    return 1.0 / math.sqrt(E) if E > 0 else 1.0


_LARGEST = {dtype: torch.finfo(dtype).max for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}
"""The largest finite value of the usual dtypes: a layer passes its scale on every call, where reading
``torch.finfo`` and the checks below cost 3.2 us inside a transformers layer call
(benchmarks/overhead.py). A float scale s with |s| x E at most that is
finite (NaN and inf fail the comparison) and cannot overflow: :func:`_checked_scale`'s answer, which every other
scale goes through."""


def _checked_scale(scale, dims: Dims, dtype: torch.dtype) -> float:
    """The call's scale: 1/sqrt(E) by default; a given one finite (0 and negative ones too, as torch's SDPA
    takes them) and not overflowing the dtype."""
    if scale is None:
        return _default_scale(dims.E)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number (or None for 1/sqrt(E)), got {scale!r}")
    if abs(scale) * max(1, dims.E) > torch.finfo(dtype).max:
        raise ValueError(f"scale={scale!r} overflows {dtype}: scale x E = {scale * dims.E:.3g} is beyond its largest "
                         f"value {torch.finfo(dtype).max:.3g}, so the scores of unit-size q and k would be inf")
    return float(scale)


def _problem(q: Tensor, dims: Dims, mask, is_causal, causal_align, window, bias, scale: float, dropout_p, backend,
             need_weights, score_mod, sinks) -> tuple[Problem, list[int] | None]:
    """Every other argument of :func:`attention` validated (each error names it), as a :class:`Problem`
    and the heads whose weights are asked for."""
    block_mask = None
    if mask is not None and not isinstance(mask, Tensor):
        mask = as_block_mask(mask)  # torch's flex_attention BlockMask: converted once
    if isinstance(mask, BlockMask):
        check_block_mask(mask, dims, q.device)
        block_mask, mask = mask, None
    check_mask(mask, dims, q.device)
    if score_mod is not None and not callable(score_mod):
        raise TypeError(f"score_mod must be callable (score, b, h, q_idx, kv_idx) -> score, got {type(score_mod).__name__}")
    check_bias(bias, dims, q)
    check_sinks(sinks, dims, q)
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
    if causal_align not in _masks.ALIGNMENTS:
        raise ValueError(f"causal_align must be one of {_masks.ALIGNMENTS}, got {causal_align!r}")
    check_window(window)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if bias is not None:
        mask = _with_bias_keys(mask, bias)
    problem = Problem(dims=dims, scale=scale, mask=mask, bias=bias, is_causal=bool(is_causal) or window is not None,
                      causal_align=causal_align, window=window, dropout_p=float(dropout_p), block_mask=block_mask,
                      score_mod=score_mod, sinks=sinks, device=q.device, dtype=q.dtype)
    return problem, _heads(need_weights, dims.H)
