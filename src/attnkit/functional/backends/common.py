"""What every backend shares: the description of one call, masks by block, weights on demand."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple, overload

import torch
from torch import Tensor

from .. import masks as _masks
from ..block_mask import INDEX_DTYPE, BlockMask, ScoreMod, index_grids
from ..checks import Dims
from ..devices import device_type
from ..precision import compute_dtype
from ..tracing import may_keep, transformed

__all__ = [
    "Problem", "BackendResult", "group_heads", "slice_block", "head_weights", "score_mod_needs_grad",
    "apply_sinks", "needs_grad", "lse_unresolved", "LSE_RESOLVED_BOUND",
]


class BackendResult(NamedTuple):
    """What a backend returns: output (B, H, L, Ev); lse (B, H, L) and weights (B, H, L, S) if it has them."""

    output: Tensor
    lse: Tensor | None = None
    weights: Tensor | None = None


@dataclass(eq=False, slots=True)
class Problem:
    """One validated attention call, minus q, k, v: read, never changed (a slotted, non-frozen
    dataclass, because a frozen one costs microseconds per call to build).

    ``mask`` and ``bias`` have one of the shapes accepted by :func:`attnkit.attention`:
    (L, S) or (B|1, H|1, L|1, S). ``is_causal`` / ``window`` are the structural masks, which the
    tiled backend evaluates block by block instead of materialising; so is ``block_mask`` (a
    :class:`BlockMask` given as ``attention(mask=...)``; then ``mask`` is None). ``score_mod``
    rewrites the scaled (and biased) scores before masking. ``sinks`` (H,) are learned per-head sink
    logits: each row's normaliser also counts exp(sink), which attends no value. Backends that return
    the lse leave the sinks to :func:`apply_sinks`; the others (sdpa) apply them themselves.
    """

    dims: Dims
    scale: float
    mask: Tensor | None = None
    bias: Tensor | None = None
    is_causal: bool = False
    causal_align: str = "top-left"
    window: int | None = None
    dropout_p: float = 0.0
    block_mask: BlockMask | None = None
    score_mod: ScoreMod | None = None
    sinks: Tensor | None = None  # (H,) learned sink logits, in the backends' accumulation dtype's terms
    device: torch.device = torch.device("cpu")  # q's device and dtype: "auto" routes by them
    dtype: torch.dtype = torch.float32
    offset: int = field(init=False, default=0)  # key index aligned with query 0 (attnkit.masks.causal_offset)

    def __post_init__(self) -> None:
        # Computed once per call; the tiled backend reads it per block without validating again.
        self.offset = _masks.causal_offset(self.dims.L, self.dims.S, self.causal_align)

    @property
    def device_type(self) -> str:
        return device_type(self.device)

    @property
    def structured(self) -> bool:
        return self.is_causal or self.window is not None


    def key_range(self, q0: int, q1: int) -> tuple[int, int]:
        """[lo, hi): the keys that some query in [q0, q1) may attend under the structural mask."""
        S = self.dims.S
        if not self.structured:
            return 0, S
        hi = max(0, min(S, q1 + self.offset))
        lo = 0 if self.window is None else max(0, q0 + self.offset - self.window + 1)
        return min(lo, hi), hi

    def structural_block(self, q0: int, q1: int, k0: int, k1: int, device) -> Tensor | None:
        """(q1-q0, k1-k0) structural mask of a block, or None if it allows every pair."""
        if not self.structured:
            return None
        return structural_block(q0, q1, k0, k1, self.offset, self.window, device)

    def dense_mask(self, device) -> Tensor | None:
        """The whole boolean mask, user mask and structure combined; None if nothing is masked."""
        parts = [m for m in (self.mask, self._whole_structure(device)) if m is not None]
        if self.block_mask is not None:
            parts.append(self.block_mask.to_dense())
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else _masks.and_masks(*parts)

    def _whole_structure(self, device) -> Tensor | None:
        if not self.structured:
            return None
        return whole_structure(self.dims.L, self.dims.S, self.offset, self.window, device)

    def modify_scores(self, scores: Tensor, q0: int, k0: int, heads: Tensor | None = None) -> Tensor:
        """Apply ``score_mod`` to scores (B, H', bq, bk) of rows q0.. and keys k0.. (H' = all heads,
        or those in ``heads``), with FlexAttention's broadcast indices; returns the new scores."""
        B, H, bq, bk = scores.shape
        b, h, q_idx, kv_idx = index_grids(B, H, q0, q0 + bq, k0, k0 + bk, scores.device)
        if heads is not None:
            h = heads.to(INDEX_DTYPE).view(1, H, 1, 1)
        assert self.score_mod is not None  # called only for a call with a score_mod
        out = self.score_mod(scores, b, h, q_idx, kv_idx)
        if not isinstance(out, Tensor) or out.shape != scores.shape:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"score_mod must return a tensor of the score's shape {tuple(scores.shape)}, got {got}")
        return out


def structural_block(q0: int, q1: int, k0: int, k1: int, offset: int, window: int | None, device) -> Tensor | None:
    """(q1-q0, k1-k0) causal (and sliding-window) mask of a block whose key j is allowed for query i where
    i + offset - window < j <= i + offset, or None if it allows every pair."""
    fully_past = k1 - 1 <= q0 + offset
    inside_window = window is None or k0 > q1 - 1 + offset - window
    if fully_past and inside_window:
        return None
    return _masks.causal_block(q0, q1, k0, k1, offset, window, device=device)


def whole_structure(L: int, S: int, offset: int, window: int | None, device) -> Tensor | None:
    """The causal (and window) mask of a whole (L, S) call, or None; small ones (decoding steps, short prefills,
    where a call costs microseconds) built once per shape and kept (read-only). Nothing is kept where nothing
    built may be (:func:`..tracing.may_keep`: compiling, exporting, a fake tensor mode, CUDA-graph capture), and
    sizes that are symbols (exported or compiled with dynamic shapes) are neither looked up nor compared."""
    key = (L, S, offset, window, device)
    if type(L) is int and type(S) is int:  # a hit first: the call that costs microseconds asks nothing more
        found = _structures.get(key, _MISSING)
        if found is not _MISSING:
            _structures.move_to_end(key)
            return found
    built = structural_block(0, L, 0, S, offset, window, device)
    if may_keep(device) and L * S <= STRUCTURE_CACHE_ENTRIES:
        _structures[key] = built
        if len(_structures) > STRUCTURE_CACHE_SIZE:
            _structures.popitem(last=False)
    return built


STRUCTURE_CACHE_ENTRIES = 1 << 20
"""Whole structural masks up to this many entries (1 MiB of booleans) are kept for reuse."""
STRUCTURE_CACHE_SIZE = 32
"""At most this many kept (a bounded LRU: 32 MiB at most)."""
_structures: OrderedDict = OrderedDict()
_MISSING = object()


@overload
def group_heads(x: Tensor, dims: Dims) -> Tensor: ...


@overload
def group_heads(x: None, dims: Dims) -> None: ...


def group_heads(x: Tensor | None, dims: Dims) -> Tensor | None:
    """View a (B, H, ...) tensor, or a mask/bias of shape (L, S) or (B|1, H|1, L|1, S), as
    (B|1, Hkv|1, G|1, L|1, S) so that it lines up with queries grouped per key/value head."""
    if x is None:
        return None
    if x.dim() == 2:
        return x[None, None, None]
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.view(x.shape[0], dims.Hkv, dims.groups, *x.shape[2:])  # one dim split: always a view (unflatten's
    # Python wrapper cost a microsecond more)


def slice_block(x: Tensor, q0: int, q1: int, k0: int, k1: int) -> Tensor:
    """Rows [q0, q1) and columns [k0, k1) of a mask or bias whose row dim may be 1 (broadcast)."""
    rows = slice(None) if x.shape[-2] == 1 else slice(q0, q1)
    return x[..., rows, k0:k1]


def _select_heads(x: Tensor | None, heads: list[int]) -> Tensor | None:
    """Pick heads from a (B|1, H|1, L|1, S) mask or bias; 2-D and head-broadcast ones pass through."""
    if x is None or x.dim() == 2 or x.shape[1] == 1:
        return x
    return x[:, heads]


HEAD_WEIGHTS_BLOCK_ELEMENTS = 1 << 20
"""Scores per block when recomputing weights for chosen heads."""


def head_weights(q: Tensor, k: Tensor, problem: Problem, heads: list[int]) -> Tensor:
    """Exact attention weights (B, len(heads), L, S) for the chosen query heads only.

    The output path is left alone: each block of queries' scores are normalised on their own,
    softmax with the row maximum subtracted first (a row's sink logit, with ``sinks``, joins the
    normaliser and the maximum), so that the weights stay exact where the scores are huge (a bias
    of -1e30 everywhere, which an lse of -1e30 + log S could not resolve). Work and memory are
    proportional to the number of heads asked for; the only memory beyond the returned weights is
    one block of about a million scores.
    """
    dims = problem.dims
    acc = compute_dtype(q.dtype)
    index = torch.tensor(heads, device=q.device)
    q_sel = q.index_select(1, index)  # (B, h, L, E)
    k_sel = k.index_select(1, torch.div(index, dims.groups, rounding_mode="floor")).to(acc)  # (B, h, S, E)
    mask = _select_heads(problem.mask, heads)
    bias = _select_heads(problem.bias, heads)
    block_mask = problem.block_mask
    sinks = None if problem.sinks is None else problem.sinks.index_select(0, index).to(acc)[None, :, None]
    # Under a torch.func transform (.tracing) a block's weights may be batched where a buffer made here is not:
    # the blocks are joined instead of written into one, and nothing is done in place.
    joined = transformed()
    out = None if joined else torch.empty(dims.B, len(heads), dims.L, dims.S, dtype=q.dtype, device=q.device)
    blocks: list[Tensor] = []
    if type(dims.L) is int and type(dims.S) is int:
        block = max(1, HEAD_WEIGHTS_BLOCK_ELEMENTS // max(1, dims.B * len(heads) * dims.S))
        spans = [(q0, min(dims.L, q0 + block)) for q0 in range(0, dims.L, block)]
    else:  # sizes that are symbols (exported or compiled with dynamic shapes): one block, no guard on a length
        spans = [(0, dims.L)]
    k_t = k_sel.transpose(-1, -2)
    # In place saves a block's worth of memory, but autograd needs exp's output untouched: weights
    # that will be differentiated (guided alignment training) take the out-of-place path.
    in_place = not joined and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                                (bias is not None and bias.requires_grad) or
                                                                (sinks is not None and sinks.requires_grad)))
    for q0, q1 in spans:
        scores = (q_sel[:, :, q0:q1].to(acc) * problem.scale) @ k_t
        if bias is not None:
            scores = scores + slice_block(bias, q0, q1, 0, dims.S).to(acc)
        if problem.score_mod is not None:
            scores = problem.modify_scores(scores, q0, 0, heads=index)
        allowed = problem.structural_block(q0, q1, 0, dims.S, q.device)
        if mask is not None:
            user = slice_block(mask, q0, q1, 0, dims.S)
            allowed = user if allowed is None else user & allowed
        if block_mask is not None:
            tile = _select_heads(block_mask.tile(q0, q1, 0, dims.S), heads)
            if tile is not None:
                allowed = tile if allowed is None else tile & allowed
        if allowed is not None:
            scores = scores.masked_fill_(~allowed, float("-inf")) if in_place else scores.masked_fill(~allowed, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        if sinks is not None:
            row_max = torch.maximum(row_max, sinks[..., None].expand_as(row_max))
        # A row with no allowed key (and no sink) has maximum -inf: shift it by 0, so exp gives 0, not NaN.
        row_max = row_max.masked_fill(torch.isinf(row_max), 0.0).detach()
        weights = scores.sub_(row_max).exp_() if in_place else (scores - row_max).exp()
        total = weights.sum(dim=-1, keepdim=True)
        if sinks is not None:
            total = total + (sinks[..., None] - row_max).exp()
        total = total.masked_fill(total == 0, 1.0)
        if out is None:
            blocks.append(weights / total)
        else:
            out[:, :, q0:q1] = weights.div_(total) if in_place else weights / total
    return torch.cat(blocks, dim=2) if out is None else out


def apply_sinks(result: BackendResult, sinks: Tensor) -> BackendResult:
    """Fold learned sink logits (H,) into a backend's result that has the lse: every row's normaliser
    gains exp(sink), so output and weights shrink by exp(lse - lse') with lse' = logaddexp(lse, sink).
    Differentiable in q, k, v (through the lse) and in the sinks. A row with no allowed key keeps a
    zero output; its lse becomes the sink."""
    lse = result.lse
    if lse is None:
        raise ValueError("apply_sinks needs a backend result with its log-sum-exp")
    sink = sinks.to(lse.dtype)[None, :, None]
    # A row with no key whose head has no sink (-inf) has nothing to normalise: its factor is 0 and its lse
    # -inf, computed on finite stand-ins so that no NaN reaches the values or the gradients.
    nothing = (lse == float("-inf")) & (sink == float("-inf"))
    lse_part, sink_part = lse.masked_fill(nothing, 0.0), sink.masked_fill(nothing, 0.0)
    total = torch.logaddexp(lse_part, sink_part)
    factor = torch.exp(lse_part - total).masked_fill(nothing, 0.0)  # (B, H, L); 0 where lse = -inf
    total = total.masked_fill(nothing, float("-inf"))
    output = result.output * factor[..., None].to(result.output.dtype)
    weights = None if result.weights is None else result.weights * factor[..., None].to(result.weights.dtype)
    return BackendResult(output=output, lse=total, weights=weights)


def score_mod_needs_grad(score_mod: ScoreMod, device: torch.device | str = "cpu") -> bool:
    """Whether ``score_mod`` reads tensors that require gradients (a learned bias table): probed
    once on a single score under autograd, on the call's device (a score_mod may read tables that
    live there). The tiled backend gives gradients for q, k and v only."""
    zero = torch.zeros(1, 1, 1, 1, dtype=INDEX_DTYPE, device=device)
    with torch.enable_grad():
        out = score_mod(torch.zeros(1, 1, 1, 1, device=device), zero, zero, zero, zero)
    return isinstance(out, Tensor) and out.requires_grad


def needs_grad(q: Tensor, k: Tensor, v: Tensor, problem: Problem) -> bool:
    """Whether autograd will differentiate this call (q, k, v, the bias or the sinks require it)."""
    tensors = [q, k, v] + [x for x in (problem.bias, problem.sinks) if x is not None]
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


LSE_RESOLVED_BOUND = 64.0
"""Fused kernels (SDPA's, FlexAttention's) keep one float32 number per row for their backward, the
log-sum-exp m + log l, and take p = exp(s - lse) from it. Its rounding, half a unit in the last place
of the row maximum m, is p's relative error: 4e-6 where |m| = 64, 6e-5 at 1e3, and at 1e9 (a bias of
-1e9 on every key of a row) m + log S rounds to m and every p of the row is 1 instead of 1/S. A call
whose bias puts some row's largest allowed entry beyond this bound is differentiated exactly instead
(:func:`lse_unresolved`)."""


def lse_unresolved(problem: Problem, device) -> bool:
    """Whether some query row's largest allowed bias entry lies beyond +-:data:`LSE_RESOLVED_BOUND`, so
    that a fused kernel's backward would misread the row (a row of -1e9 gets S times its gradient).
    One look at the bias (a device sync off the CPU), taken only for calls autograd differentiates."""
    bias = problem.bias
    if bias is None:
        return False
    allowed = problem.dense_mask(device)
    top = (bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))).amax(dim=-1)
    return bool(beyond_resolution(top).any())


def beyond_resolution(top: Tensor) -> Tensor:
    """True where a row's largest allowed bias entry ``top`` is finite and beyond +-:data:`LSE_RESOLVED_BOUND`
    (-inf: a row with no key, which every backend and merge handles exactly)."""
    return (top.abs() > LSE_RESOLVED_BOUND) & torch.isfinite(top)
