"""flash-linear-attention's Triton kernels behind attnkit's linear functions.

On a GPU, attnkit's chunked form is PyTorch's matrix products, one launch at a time; flash-linear-attention
(fla-core, the field's own kernels, which transformers' linear models use too) computes the same recurrences
in fused Triton kernels. :func:`.delta.gated_delta_rule`, :func:`.delta.gated_linear_attention` and
:func:`.ssd.ssd` take ``backend=``:

- ``"auto"`` (the default): fla's kernels where fla-core is installed (``pip install attnkit[fla]``) and the call
  is one they compute as attnkit would: q on CUDA, q, k and v all float16 or all bfloat16, more than one token,
  and ``chunk_size`` > 1 (``chunk_size=1`` asks for the token-by-token recurrence). Anything else runs attnkit's
  chunked form: the CPU; float32, whose products fla's kernels take in TF32 on recent GPUs (about 1e-3 apart,
  where PyTorch's float32 matrix products are exact to float32 unless told otherwise); float64 (the oracle's
  dtype); a decoding step (one token: a handful of small products, :func:`.delta._step`); and a call that needs
  gradients where fla's own guard would refuse its backward (a Hopper GPU with Triton 3.4 to 3.7.0 and no
  TileLang: a miscompilation there, fla #640), found out only in the backward, too late to turn back.
- ``"torch"``: always attnkit's own forms.
- ``"fla"``: always fla's kernels, refused by name where they cannot run: without fla-core, a dtype they do not
  take, or the CPU unless Triton's interpreter is on (``TRITON_INTERPRET=1``: how the tests run them without a
  GPU).

Which kernel computes what (attnkit's layout (B, H, L, .) is fla's (B, L, H, .) transposed):

==========================================  ==============================
call                                        fla kernel
==========================================  ==============================
gated delta rule, a decay a head; none      ``chunk_gated_delta_rule``
gated delta rule, a decay a key channel     ``chunk_kda``
gated linear attention, a decay a head;     ``chunk_simple_gla``
the SSD; none (a running sum)
gated linear attention, a decay a channel   ``chunk_gla``
==========================================  ==============================

The arguments are attnkit's (checked by :func:`.delta._check` first) and so are the semantics: ``key_mask``
zeroes a padded token's q, k, v, beta and decay before either form (no write, no decay) and its output after, the
final state comes back in float32, the output in v's dtype. The kernels keep grouped key heads shared where fla's
kernel does (the delta rules); the others get them repeated.
"""

from __future__ import annotations

import os
from functools import cache
from importlib.util import find_spec

import torch
from torch import Tensor

__all__ = ["BACKENDS", "FLA_DTYPES", "AUTO_DTYPES", "fla_installed", "fla_backward_refused", "check_backend", "uses_fla"]

BACKENDS = ("auto", "torch", "fla")
"""The values of the linear functions' ``backend=`` (module docstring)."""
FLA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The dtypes fla's kernels take (``backend="fla"``); ``"auto"`` hands them the half types only."""
AUTO_DTYPES = (torch.float16, torch.bfloat16)
"""The dtypes ``backend="auto"`` hands to fla's kernels on CUDA (module docstring: float32 stays exact)."""


@cache
def fla_installed() -> bool:
    """Whether fla-core is installed (found without importing it: importing fla loads Triton)."""
    return find_spec("fla") is not None


def _interpreting() -> bool:
    """Triton's interpreter is on: its kernels run on the CPU (slowly), as the tests run them."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_backend(backend: str) -> str:
    """``backend``, refused by name unless one of :data:`BACKENDS`."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


@cache
def fla_backward_refused() -> bool:
    """Whether fla's own guard refuses its gated backward on this machine (a Hopper GPU, Triton 3.4 to 3.7.0, no
    TileLang for fla to take instead: fla #640). Imports fla: call it only where fla would run."""
    import fla.utils

    guarded = (getattr(fla.utils, "IS_NVIDIA_HOPPER", False) and getattr(fla.utils, "TRITON_ABOVE_3_4_0", False)
               and not getattr(fla.utils, "TRITON_ABOVE_3_7_1", True))
    return bool(guarded) and find_spec("tilelang") is None


def uses_fla(backend: str, q: Tensor, k: Tensor, v: Tensor, chunk_size: int, *others: Tensor | None) -> bool:
    """Whether a call with these inputs (``others``: its g, beta and initial state, for whether it needs
    gradients) runs fla's kernels under ``backend`` (module docstring); ``"fla"`` on a call they cannot run is
    refused by name."""
    if check_backend(backend) == "torch":
        return False
    one_dtype = q.dtype == k.dtype == v.dtype
    if backend == "auto":
        if not (q.is_cuda and one_dtype and q.dtype in AUTO_DTYPES and q.shape[2] > 1 and chunk_size > 1
                and fla_installed()):
            return False
        needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, *others))
        return not (needs_grad and fla_backward_refused())
    if not fla_installed():
        raise ImportError("backend='fla' needs flash-linear-attention's kernels: pip install 'attnkit[fla]' "
                          "(fla-core), or backend='torch' for attnkit's chunked form")
    if not one_dtype or q.dtype not in FLA_DTYPES:
        raise ValueError(f"backend='fla' takes q, k and v of one dtype among float16, bfloat16 and float32, got "
                         f"{q.dtype}, {k.dtype} and {v.dtype}; backend='torch' computes any")
    if not q.is_cuda and not _interpreting():
        raise ValueError(f"backend='fla' runs Triton kernels: q must be on a CUDA device, got {q.device} (on the CPU "
                         "only under Triton's interpreter, TRITON_INTERPRET=1); backend='torch' runs anywhere")
    return True


def fla_linear(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, *, scale: float,
               initial_state: Tensor | None, output_final_state: bool,
               use_qk_l2norm: bool) -> tuple[Tensor, Tensor | None]:
    """(output (B, H, L, V), final state (B, H, K, V) float32 or None) from fla's kernel for the call (module
    docstring's table): the delta rules with ``beta``, gated linear attention without. Arguments as
    :func:`.delta.gated_delta_rule`'s, already checked, padded tokens already selected away by the caller (which
    zeroes their outputs after)."""
    Hk, H = q.shape[1], v.shape[1]
    # fla's layout (B, L, H, .): a transpose, free where the caller's (B, H, L, .) is itself a transposed view
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g = None if g is None else g.transpose(1, 2).float()  # log-decays in float32, as fla's layers give them
    beta = None if beta is None else beta.transpose(1, 2).to(v.dtype)
    state = None if initial_state is None else initial_state.float()
    options = dict(scale=scale, initial_state=state, output_final_state=output_final_state)
    if beta is not None:  # the delta rules: grouped key heads stay shared (fla's GVA)
        if g is None or g.dim() == 3:  # (no decay: log-decays of 0; fla's chunk_delta_rule refuses float32)
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            g = v.new_zeros(v.shape[:3], dtype=torch.float32) if g is None else g
            out, final = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=use_qk_l2norm, **options)
        else:
            from fla.ops.kda import chunk_kda

            out, final = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=use_qk_l2norm, **options)
    else:  # gated linear attention: fla's kernels take one key head a value head
        if Hk != H:
            q, k = (x.repeat_interleave(H // Hk, dim=2) for x in (q, k))
        if g is None or g.dim() == 3:
            from fla.ops.simple_gla import chunk_simple_gla

            out, final = chunk_simple_gla(q, k, v, g, **options)
        else:
            from fla.ops.gla import chunk_gla

            out, final = chunk_gla(q, k, v, g, **options)
    return out.transpose(1, 2), final if output_final_state else None
