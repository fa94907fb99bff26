"""Input validation, public: the functional core checks its inputs with these at its entry, and
layers and models use them for theirs (``from attnkit.functional.checks import check_rank``).

Every check raises ``ValueError`` (shapes, values) or ``TypeError`` (dtypes, devices, types)
with a message that names the argument, what was expected and what was received. Nothing is
silently broadcast: a mask or bias must already have one of the documented shapes.
"""

from __future__ import annotations

from functools import partial
from typing import Literal, NamedTuple, overload

import torch
from torch import Tensor

from .tracing import traced

__all__ = ["Dims", "check_int", "check_qkv", "check_mask", "check_block_mask", "check_bias", "check_same", "check_rank",
           "check_sinks", "readable_query"]


_INTS = (int, torch.SymInt)
"""An int, or a size that is a symbol (traced with dynamic shapes: a comparison with a bound is then a guard)."""


@overload
def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, *,
              optional: Literal[False] = False) -> int: ...


@overload
def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, *,
              optional: bool) -> int | None: ...


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, *,
              optional: bool = False) -> int | None:
    """``value`` if it is an int (a bool is not) within [minimum, maximum]; None too when
    ``optional``. Otherwise ``ValueError`` naming ``name``, what was expected and ``value``: the one
    check behind every integer option (lengths, windows, block sizes, head sizes)."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, _INTS) or (minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        if minimum is not None and maximum is not None:
            expected = f"an int in [{minimum:,}, {maximum:,}]"
        elif minimum == 1:
            expected = "a positive int"
        elif minimum == 0:
            expected = "a non-negative int"
        elif minimum is not None:
            expected = f"an int >= {minimum:,}"
        else:
            expected = "an int"
        raise ValueError(f"{name} must be {expected}{' or None' if optional else ''}, got {value!r}")
    return value  # type: ignore[return-value]  # (an int, or a SymInt standing for one)


class Dims(NamedTuple):
    """Sizes of one attention call (see the shape legend in :mod:`attnkit`)."""

    B: int
    H: int
    Hkv: int
    L: int
    S: int
    E: int
    Ev: int

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1 for MHA, H for MQA; 1 for a call of no head at all)."""
        return self.H // self.Hkv if self.Hkv else 1


make_dims = partial(tuple.__new__, Dims)
"""``make_dims((B, H, Hkv, L, S, E, Ev))``: a :class:`Dims` built by tuple's own constructor, for the checks that
run on every attention call. A NamedTuple's ``__new__`` is generated Python and costs ten times as much."""


def check_rank(name: str, x: Tensor, rank: int, layout: str) -> None:
    """Raise unless ``x`` is a tensor of the given rank; ``layout`` spells the expected shape."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(
            f"{name} must have {rank} dimensions {layout}, got {x.dim()} with shape {tuple(x.shape)}"
        )


def check_same(reference_name: str, reference: Tensor, **others: Tensor | None) -> None:
    """Raise ``TypeError`` unless every tensor in ``others`` has the dtype and device of ``reference``."""
    for name, x in others.items():
        if x is None:
            continue
        if x.dtype != reference.dtype:
            raise TypeError(
                f"{name} has dtype {x.dtype} but {reference_name} has dtype {reference.dtype}; "
                "cast them to one dtype"
            )
        if x.device != reference.device:
            raise TypeError(
                f"{name} is on {x.device} but {reference_name} is on {reference.device}; "
                "move them to one device"
            )


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> Dims:
    """Validate q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) and return their sizes.

    The common case, three consistent floating tensors, is settled by a few comparisons (it runs on
    every attention call); anything else goes through the checks that name what is wrong."""
    try:
        B, H, L, E = q.shape
        Bk, Hkv, S, Ek = k.shape
        Bv, Hv, Sv, Ev = v.shape
        dtype = q.dtype  # dtypes are singletons; is_cpu is a flag, a device comparison builds objects
        if (B == Bk == Bv and Hkv == Hv and S == Sv and E == Ek and Hkv and not H % Hkv and k.dtype is dtype
                and v.dtype is dtype and q.is_floating_point()
                and ((q.is_cpu and k.is_cpu and v.is_cpu) or q.device == k.device == v.device)):
            return make_dims((B, H, Hkv, L, S, E, Ev))
    except (AttributeError, TypeError, ValueError, RuntimeError):  # not tensors, not of rank 4, nested: named below
        pass
    return _checked_qkv(q, k, v)


def _checked_qkv(q: Tensor, k: Tensor, v: Tensor) -> Dims:
    """:func:`check_qkv` the long way: every check, each naming the argument and what it got."""
    check_rank("q", q, 4, "(B, H, L, E)")
    check_rank("k", k, 4, "(B, Hkv, S, E)")
    check_rank("v", v, 4, "(B, Hkv, S, Ev)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.is_nested:
            raise TypeError(f"{name} is a nested tensor of layout {x.layout}: attention() takes dense tensors, or q, k "
                            "and v all nested in the jagged layout (torch.nested.nested_tensor(sequences, "
                            "layout=torch.jagged), docs/api.md)")
    if not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor, got dtype {q.dtype}")
    check_same("q", q, k=k, v=v)
    B, H, L, E = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(
            f"batch sizes differ: q has B={B}, k has B={k.shape[0]}, v has B={v.shape[0]}"
        )
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"k and v must have the same number of heads, got Hkv={k.shape[1]} for k "
            f"and Hkv={v.shape[1]} for v"
        )
    Hkv = k.shape[1]
    if (Hkv == 0 and H != 0) or (Hkv and H % Hkv != 0):  # (no head at all: an empty result, as torch gives)
        raise ValueError(
            f"the number of query heads must be a multiple of the key/value heads, "
            f"got H={H} for q and Hkv={Hkv} for k and v" + (" (k and v have no head for q's)" if Hkv == 0 else "")
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(
            f"k and v must have the same length, got S={k.shape[2]} for k and S={v.shape[2]} for v"
        )
    if k.shape[3] != E:
        raise ValueError(f"q and k must have the same head dim, got E={E} for q and E={k.shape[3]} for k")
    return Dims(B=B, H=H, Hkv=Hkv, L=L, S=k.shape[2], E=E, Ev=v.shape[3])


def _check_broadcastable(name: str, x: Tensor, dims: Dims) -> None:
    """Accept (L, S), (L|1, S) or (B|1, H|1, L|1, S): the shapes that broadcast to (B, H, L, S)."""
    expected = "(L, S) or (B|1, H|1, L|1, S)"
    if x.dim() == 2:
        allowed = ((1, dims.L), (dims.S,))
    elif x.dim() == 4:
        allowed = ((1, dims.B), (1, dims.H), (1, dims.L), (dims.S,))  # type: ignore[assignment]  # one tuple per dim
    else:
        raise ValueError(
            f"{name} must have shape {expected} with B={dims.B}, H={dims.H}, L={dims.L}, "
            f"S={dims.S}, got {x.dim()} dimensions with shape {tuple(x.shape)}"
        )
    for size, ok in zip(x.shape, allowed):
        if size not in ok:
            raise ValueError(
                f"{name} of shape {tuple(x.shape)} does not broadcast to (B, H, L, S) = "
                f"({dims.B}, {dims.H}, {dims.L}, {dims.S}); expected {expected}"
            )


def check_mask(mask: Tensor | None, dims: Dims, device: torch.device, name: str = "mask") -> None:
    """Validate a boolean mask (True = may attend) against the sizes of the call. The common case, a boolean
    (B|1, H|1, L|1, S) mask on the inputs' device, is settled by a few comparisons (every masked call runs it;
    devices are compared as objects: ``device.type`` builds its string through a C++ stream on every read, 4.6 us
    inside a layer call, benchmarks/overhead.py); anything else goes through the checks
    that name what is wrong."""
    if mask is None:
        return
    try:
        shape = mask.shape
        if len(shape) == 4:  # (asked, not unpacked into an error: torch 2.11's Dynamo cannot trace the error)
            Bm, Hm, Lm, Sm = shape
            if (mask.dtype is torch.bool and Sm == dims.S and Bm in (1, dims.B) and Hm in (1, dims.H)
                    and Lm in (1, dims.L) and mask.device == device):
                return
    except (AttributeError, TypeError):  # not a tensor: named below
        pass
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be boolean (True = may attend), got dtype {mask.dtype}; convert additive "
            "float masks with attnkit.masks.from_additive or pass them as bias="
        )
    if mask.device != device:
        raise TypeError(f"{name} is on {mask.device} but q is on {device}")
    _check_broadcastable(name, mask, dims)


def check_bias(bias: Tensor | None, dims: Dims, q: Tensor, name: str = "bias") -> None:
    """Validate an additive float bias (e.g. ALiBi) against the sizes of the call."""
    if bias is None:
        return
    if not isinstance(bias, Tensor):
        raise TypeError(f"{name} must be a float torch.Tensor, got {type(bias).__name__}")
    if not bias.is_floating_point():
        raise TypeError(f"{name} must be a float tensor added to the scores, got dtype {bias.dtype}")
    check_same("q", q, **{name: bias})
    _check_broadcastable(name, bias, dims)


def check_block_mask(mask, dims: Dims, device: torch.device, name: str = "mask") -> None:
    """Validate a :class:`~attnkit.functional.block_mask.BlockMask` against the sizes of the call:
    shape (B|1, H|1, L, S), on q's device."""
    B, H, L, S = mask.shape
    if B not in (1, dims.B) or H not in (1, dims.H) or L != dims.L or S != dims.S:
        raise ValueError(
            f"{name}: block mask of shape {mask.shape} does not fit (B, H, L, S) = "
            f"({dims.B}, {dims.H}, {dims.L}, {dims.S}); expected (B|1, H|1, L, S)"
        )
    if mask.device != device:
        raise TypeError(f"{name}: block mask is on {mask.device} but q is on {device}")


def check_window(window) -> None:
    """A sliding window: a positive int, or None for none."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")


def check_sinks(sinks: Tensor | None, dims: Dims, q: Tensor) -> None:
    """Learned sink logits: a floating (H,) tensor on q's device, one logit per query head."""
    if sinks is None:
        return
    if not isinstance(sinks, Tensor):
        raise TypeError(f"sinks must be a tensor of shape (H,) = ({dims.H},), got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be a floating tensor (one logit per query head), got dtype {sinks.dtype}")
    if tuple(sinks.shape) != (dims.H,):
        raise ValueError(f"sinks must have shape (H,) = ({dims.H},), one logit per query head, "
                         f"got {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise TypeError(f"sinks is on {sinks.device} but q is on {q.device}; move them to one device")


def readable_query(q: Tensor) -> Tensor:
    """``q`` as it is, or a contiguous copy where its elements may overlap in memory (an ``as_strided`` view whose
    length stride is smaller than a row: several rows share elements). torch's CPU SDPA misreads such a query
    (errors up to 1e30 and NaN, different every run; keys and values it reads right), while the written-out
    softmax is right. The caller asks only for a query that is not contiguous, so an ordinary call pays one flag
    read; a view torch cannot settle (a slice, a head split of a packed projection) is settled by its strides:
    sorted by stride, each must pass the span of those below it. The same, compiled and under ``vmap`` (whose
    per-sample loop hands SDPA the overlapping view)."""
    # 0: none; 1: overlaps; 2: torch cannot tell. Traced (compiling, or under a torch.func transform, where the
    # query is a per-sample view with no batching rule for the question) the strides alone settle it.
    overlap = 2 if traced() else torch._debug_has_internal_overlap(q)
    if overlap == 0:
        return q
    if overlap == 2:
        span = 0
        for stride, size in sorted((q.stride(d), q.shape[d]) for d in range(q.dim()) if q.shape[d] > 1):
            if stride <= span:
                break
            span += stride * (size - 1)
        else:
            return q
    return q.contiguous()
