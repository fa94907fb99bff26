"""A seeded randomized sweep over backends x masks x dtypes x NaN placements, and over caches, each
held to a float64 oracle written here and in :mod:`attnkit.reference` (NumPy), not to another
backend: so that the next per-call cut cannot drop a rule (the NaN rule, empty rows, masked keys
after a score_mod, huge bias rows) without a case here failing.

Every case runs twice: with the NaN rule on (its NaN placements, the rule's rows expected), and with the rule off,
the default, on the same inputs without their NaN (a backend's own NaN is its kernel's, nothing to compare).
Every case is drawn from its own seed (its id is the seed and the rule's setting): a failure reproduces alone.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks
from attnkit import reference as oracle_np
from attnkit.functional.backends import flex

from helpers import numpy, slow

BACKENDS = ["reference", "sdpa", "tiled", "auto", "flex"]
MASK_KINDS = ["none", "causal", "causal-br", "window", "padding", "random", "block", "bias", "bias-inf", "bias-huge",
              "sinks", "score_mod"]
NAN_PLACES = ["q", "k", "v", "k-masked"]
CASES = 4 * len(BACKENDS) * len(MASK_KINDS)
"""Every (backend, mask kind) four times: without NaN; with a NaN in a query, then in a key or value
(small calls without weights, the shapes of decoding steps, where per-call shortcuts live); and with
everything drawn at random."""
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 2.5e-2}


def _softcap(score, b, h, q_idx, kv_idx):
    return 3.0 * torch.tanh(score / 3.0)


def _softcap_np(scores, b, h, i, keys):
    return 3.0 * np.tanh(scores / 3.0)


def _case(seed: int) -> dict:
    """Call ``seed``: its backend and mask kind by turn (CASES), sizes, dtype and the rest drawn from it."""
    r = random.Random(seed)
    backend, kind = BACKENDS[seed % len(BACKENDS)], MASK_KINDS[(seed // len(BACKENDS)) % len(MASK_KINDS)]
    variant = seed // (len(BACKENDS) * len(MASK_KINDS))
    if backend == "sdpa" and kind == "score_mod":
        backend = "auto"  # sdpa refuses a score_mod by name (tested elsewhere)
    Hkv = r.choice([1, 2])
    small = variant in (1, 2)
    groups = [1, 1, r.choice([1, 2]), r.choice([1, 2, 3])][variant]  # MHA first: SDPA runs its fused CPU kernel for it
    case = dict(seed=seed, B=r.choice([1, 2]), H=Hkv * groups, Hkv=Hkv,
                L=r.choice([1, 2] if small else [1, 2, 5, 9, 17]),
                S=r.choice([[1, 3, 8, 13, 21], [1, 3, 5], [1, 3], [1, 3, 8, 13, 21]][variant]),
                E=16 if variant == 0 else r.choice([4, 8, 12, 16]), Ev=r.choice([4, 6, 16]), dtype=r.choice([torch.float32, torch.float64, torch.bfloat16]),
                backend=backend, kind=kind,
                nan=[None, "q", NAN_PLACES[1 + seed % 3], r.choice([None, *NAN_PLACES])][variant],
                weights=False if small else r.choice([False, True, [0]]), grad=r.random() < 0.85)
    if case["backend"] == "flex":
        case["grad"] = False  # flex computes no gradients on the CPU (refused by name, tested elsewhere)
    if case["nan"] is not None:
        case["grad"] = False
    return case


def _inputs(case: dict, generator: torch.Generator):
    B, H, Hkv, L, S, E, Ev = (case[n] for n in ("B", "H", "Hkv", "L", "S", "E", "Ev"))
    q = torch.randn(B, H, L, E, dtype=torch.float64, generator=generator)
    k = torch.randn(B, Hkv, S, E, dtype=torch.float64, generator=generator)
    v = torch.randn(B, Hkv, S, Ev, dtype=torch.float64, generator=generator)
    kwargs: dict = {}
    np_kwargs: dict = {}
    kind = case["kind"]
    if kind == "causal":
        kwargs["is_causal"] = np_kwargs["is_causal"] = True
    elif kind == "causal-br":
        kwargs.update(is_causal=True, causal_align="bottom-right")
        np_kwargs.update(is_causal=True, causal_align="bottom-right")
    elif kind == "window":
        window = 1 + int(torch.randint(4, (1,), generator=generator))
        kwargs.update(window=window, causal_align="bottom-right")
        np_kwargs.update(window=window, causal_align="bottom-right")
    elif kind == "padding":
        lengths = torch.randint(0, S + 1, (B,), generator=generator)
        lengths[0] = 0  # a fully padded example: its rows have no key
        mask = masks.padding(lengths, S)  # (B, 1, 1, S)
        kwargs["mask"], np_kwargs["mask"] = mask, mask.numpy()
    elif kind in ("random", "block"):
        mask = torch.rand(B, H, L, S, generator=generator) < 0.6
        mask[:, :, 0] = False  # a row with no key
        np_kwargs["mask"] = mask.numpy()
        kwargs["mask"] = mask if kind == "random" else masks.BlockMask.from_dense(mask, block=4)
    elif kind.startswith("bias"):
        bias = torch.randn(B, 1, L, S, dtype=torch.float64, generator=generator)
        if kind == "bias-inf":
            bias = bias.masked_fill(torch.rand(B, 1, L, S, generator=generator) < 0.3, -math.inf)
            bias[:, :, 0] = -math.inf
        if kind == "bias-huge":  # rows of scores so huge that every dtype rounds them to one value
            bias[:, :, 0] = -1e30
            bias[:, :, -1, : (S + 1) // 2] = -1e30
        kwargs["bias"] = bias
        np_kwargs["bias"] = bias
        np_kwargs["masked_at"] = torch.finfo(case["dtype"]).min / 2
    elif kind == "sinks":
        sinks = torch.randn(H, dtype=torch.float64, generator=generator)
        kwargs["is_causal"] = np_kwargs["is_causal"] = True
        if case["seed"] % 2:  # a head without a sink (-inf), and a row with no key
            sinks[0] = -math.inf
            mask = torch.ones(L, S, dtype=torch.bool)
            mask[0] = False
            kwargs["mask"], np_kwargs["mask"] = mask, mask.numpy()
        kwargs["sinks"], np_kwargs["sinks"] = sinks, sinks.numpy()
    elif kind == "score_mod":
        kwargs.update(score_mod=_softcap, is_causal=True)
        np_kwargs.update(score_mod=_softcap_np, is_causal=True)
    nan = case["nan"]
    if nan == "q":
        q[-1, -1, L // 2, 0] = math.nan
    elif nan in ("k", "v"):
        (k if nan == "k" else v)[-1, -1, S // 2, 0] = math.nan
    elif nan == "k-masked":  # a NaN at a key no query may attend: the rule still poisons the head
        k[0, 0, S - 1, 0] = math.nan
        kwargs.setdefault("mask", None)
        if kwargs["mask"] is None and "bias" not in kwargs and kind != "sinks":
            allowed = torch.ones(L, S, dtype=torch.bool)
            allowed[:, S - 1] = S == 1
            kwargs["mask"], np_kwargs["mask"] = allowed, allowed.numpy()
    return q, k, v, kwargs, np_kwargs


def _expected(case: dict, q, k, v, np_kwargs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The float64 oracle plus the NaN rule (docs/semantics.md): a NaN in query row i poisons row i; a NaN
    anywhere in a (batch, key head)'s keys or values poisons every row of the query heads reading it."""
    dtype = case["dtype"]
    rounded = [x.to(dtype).double() for x in (q, k, v)]
    kwargs = dict(np_kwargs)
    if "bias" in kwargs:
        kwargs["bias"] = kwargs["bias"].to(dtype).double().numpy()
    out, weights, lse = oracle_np.attention(*(numpy(x) for x in rounded), **kwargs)
    qn, kn, vn = (x.numpy() for x in rounded)
    groups = case["H"] // case["Hkv"]
    poisoned = np.isnan(qn).any(-1)  # (B, H, L)
    head_nan = (np.isnan(kn).any((2, 3)) | np.isnan(vn).any((2, 3))).repeat(groups, axis=1)  # (B, H)
    poisoned |= head_nan[:, :, None]
    out[poisoned] = math.nan
    weights[poisoned] = math.nan
    lse[poisoned] = math.nan
    return out, weights, lse


def _grad_oracle(case, q, k, v, kwargs, d_out):
    """Gradients of q, k, v by float64 autograd of softmax(q k^T scale + bias) v, written out."""
    dtype = case["dtype"]
    q64, k64, v64 = (x.to(dtype).double().requires_grad_() for x in (q, k, v))
    groups = case["H"] // case["Hkv"]
    kr, vr = k64.repeat_interleave(groups, 1), v64.repeat_interleave(groups, 1)
    L, S, E = case["L"], case["S"], case["E"]
    scores = q64 @ kr.transpose(-1, -2) / math.sqrt(E)
    allowed = torch.ones(case["B"], case["H"], L, S, dtype=torch.bool)
    if "bias" in kwargs:
        bias = kwargs["bias"].to(dtype).double()
        scores = scores + bias
        allowed &= ~(bias <= torch.finfo(dtype).min / 2)
    if kwargs.get("score_mod") is not None:
        scores = 3.0 * torch.tanh(scores / 3.0)
    offset = S - L if kwargs.get("causal_align") == "bottom-right" else 0
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    if kwargs.get("is_causal") or kwargs.get("window"):
        allowed &= j <= i + offset
    if kwargs.get("window"):
        allowed &= j > i + offset - kwargs["window"]
    mask = np_mask = None
    if isinstance(kwargs.get("mask"), torch.Tensor):
        mask = kwargs["mask"]
    elif kwargs.get("mask") is not None:  # a BlockMask
        np_mask = kwargs["mask"].to_dense()
    for m in (mask, np_mask):
        if m is not None:
            allowed &= m
    scores = scores.masked_fill(~allowed, -math.inf)
    if "sinks" in kwargs:
        sink = kwargs["sinks"].double()[None, :, None, None].expand(*scores.shape[:3], 1)
        p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].nan_to_num(0.0)  # no key, no sink
    else:
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
    out = p @ vr
    (out * d_out).sum().backward()
    return q64.grad, k64.grad, v64.grad


def _check(got: torch.Tensor, want: np.ndarray, dtype, what: str) -> None:
    got_np = numpy(got)
    assert got_np.shape == want.shape, f"{what}: shape {got_np.shape} != {want.shape}"
    assert np.array_equal(np.isnan(got_np), np.isnan(want)), f"{what}: NaN at other places than the rule's"
    assert np.array_equal(np.isneginf(got_np), np.isneginf(want)), f"{what}: -inf (rows with no key) elsewhere"
    finite = np.isfinite(want)
    if finite.any():
        scale = max(1.0, float(np.abs(want[finite]).max()))
        error = float(np.abs(got_np[finite] - want[finite]).max()) / scale
        assert error <= TOLERANCE[dtype], f"{what}: max error {error:.3g} (x {scale:.3g})"


# flex on the CPU traces its functions anew for each shape (0.5-1.5 s a case): its cases are the slow tier's
# (test_flex.py's oracle cases stay in the quick tier).
@pytest.mark.parametrize("seed", [slow(seed) if BACKENDS[seed % len(BACKENDS)] == "flex" else seed
                                  for seed in range(CASES)])
def test_sweep_against_the_float64_oracle(seed, nan_rule_setting, monkeypatch):
    monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)  # flex's eager CPU path: the semantics, no compile time
    case = _case(seed)
    if not nan_rule_setting:
        case["nan"] = None
    generator = torch.Generator().manual_seed(seed)
    q, k, v, kwargs, np_kwargs = _inputs(case, generator)
    dtype = case["dtype"]
    want_out, want_weights, want_lse = _expected(case, q, k, v, np_kwargs)
    leaves = [x.to(dtype).requires_grad_(case["grad"]) for x in (q, k, v)]
    call = {name: (x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() and name != "sinks" else x)
            for name, x in kwargs.items()}
    if case["seed"] % 7 == 3:  # served as in production: under inference_mode, masks made inside it (item 1)
        with torch.inference_mode():
            fresh = {name: x.clone() if isinstance(x, torch.Tensor) else x for name, x in call.items()}
            served = attnkit.attention(*(x.detach() for x in leaves), backend=case["backend"], **fresh)
        _check(served.output, want_out, dtype, f"output under inference_mode {case}")
    result = attnkit.attention(*leaves, backend=case["backend"], need_weights=case["weights"], **call)
    _check(result.output, want_out, dtype, f"output {case}")
    if case["weights"] is not False:
        heads = list(range(case["H"])) if case["weights"] is True else case["weights"]
        _check(result.weights, want_weights[:, heads], dtype, f"weights {case}")
    if result.lse is not None:
        _check(result.lse, want_lse, dtype, f"lse {case}")
    if case["grad"]:
        d_out = torch.randn(want_out.shape, dtype=torch.float64, generator=generator)
        (result.output.double() * d_out).sum().backward()
        for name, leaf, want in zip("qkv", leaves, _grad_oracle(case, q, k, v, call, d_out)):
            _check(leaf.grad, want.numpy(), dtype, f"d{name} {case}")


def test_the_sweep_reaches_every_backend_mask_kind_and_nan_placement():
    drawn = [_case(seed) for seed in range(CASES)]
    assert {c["backend"] for c in drawn} == set(BACKENDS)
    assert {c["kind"] for c in drawn} == set(MASK_KINDS)
    assert {c["nan"] for c in drawn} == {None, *NAN_PLACES}
    plain = [c for c in drawn if c["kind"] == "none" and c["backend"] in ("auto", "sdpa") and not c["weights"]]
    assert {c["nan"] for c in plain if c["S"] < 8} >= {"q", "k", "v"}  # the plain call's shortcut, at decoding sizes
    assert {c["dtype"] for c in drawn} == {torch.float32, torch.float64, torch.bfloat16}
    assert any(c["L"] == 1 and c["S"] == 1 for c in drawn)  # a first decoding step
    assert sum(c["grad"] for c in drawn) >= CASES // 10  # the NaN cases and flex take no gradients
