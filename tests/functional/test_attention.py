"""attention(): every backend against the float64 oracle, PyTorch SDPA, and each other."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks, reference
from attnkit.functional.attention import choose_backend
from attnkit.functional.backends.common import Problem
from attnkit.functional.checks import Dims

from helpers import DTYPES, assert_close, numpy, randn

BACKENDS = ["reference", "sdpa", "tiled", "auto"]

# (B, H, Hkv, L, S, E, Ev): MHA with odd head dim and length 97; GQA with L != S; MQA with L > S.
CASES = {
    "mha-97-e59": (2, 4, 4, 97, 97, 59, 59),
    "gqa-33x97": (2, 6, 2, 33, 97, 64, 48),
    "mqa-97x50": (1, 4, 1, 97, 50, 16, 16),
}
MASKINGS = [
    "none",
    "causal-top-left",
    "causal-bottom-right",
    "window-top-left",
    "window-bottom-right",
    "padding",
    "random",
    "bias+padding",
    "additive-mask",
]


def make_call(case: str, masking: str, dtype: torch.dtype, generator: torch.Generator):
    """Random q, k, v and attention() keyword arguments for one case and one masking."""
    B, H, Hkv, L, S, E, Ev = CASES[case]
    q, k, v = randn(B, H, L, E, dtype=dtype, generator=generator), randn(B, Hkv, S, E, dtype=dtype, generator=generator), randn(B, Hkv, S, Ev, dtype=dtype, generator=generator)
    kwargs: dict = {}
    if masking.startswith("causal"):
        kwargs = {"is_causal": True, "causal_align": masking.removeprefix("causal-")}
    elif masking.startswith("window"):
        kwargs = {"window": 7, "causal_align": masking.removeprefix("window-")}
    elif masking == "padding":
        lengths = torch.tensor([S - 5, 0][:B] if B == 2 else [S // 3])  # B=2: one example fully padded
        kwargs = {"mask": masks.padding(lengths, S)}
    elif masking == "random":
        mask = torch.rand(B, H, L, S, generator=generator) < 0.7
        mask[:, :, 3] = False  # a fully masked query row in every head
        kwargs = {"mask": mask}
    elif masking == "additive-mask":  # a float mask: 0 or -inf, with a row that is -inf everywhere
        bias = torch.zeros(B, 1, L, S, dtype=dtype).masked_fill(torch.rand(B, 1, L, S, generator=generator) < 0.3,
                                                               float("-inf"))
        bias[:, :, 2] = float("-inf")
        kwargs = {"bias": bias}
    elif masking == "bias+padding":
        kwargs = {
            "bias": randn(1, H, L, S, dtype=dtype, generator=generator),
            "mask": masks.padding(torch.tensor([S - 1] * B), S),
        }
    return q, k, v, kwargs


def oracle(q, k, v, kwargs):
    numpy_kwargs = {name: numpy(x) if isinstance(x, torch.Tensor) else x for name, x in kwargs.items()}
    return reference.attention(numpy(q), numpy(k), numpy(v), **numpy_kwargs)


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_float64_oracle(backend, dtype, case, masking, rng, small_tiles):
    q, k, v, kwargs = make_call(case, masking, dtype, rng)
    result = attnkit.attention(q, k, v, backend=backend, need_weights=True, **kwargs)
    expected_out, expected_weights, expected_lse = oracle(q, k, v, kwargs)
    assert result.output.dtype == dtype and result.weights.dtype == dtype
    assert_close(result.output, expected_out, dtype, "output")
    assert_close(result.weights, expected_weights, dtype, "weights")
    if result.lse is not None:
        lse = numpy(result.lse)
        assert (np.isneginf(lse) == np.isneginf(expected_lse)).all(), "lse is -inf exactly on fully masked rows"
        finite = np.isfinite(expected_lse)
        assert np.allclose(lse[finite], expected_lse[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_for_chosen_heads_only(backend, rng, small_tiles):
    q, k, v, kwargs = make_call("gqa-33x97", "random", torch.float64, rng)
    full = attnkit.attention(q, k, v, backend="reference", need_weights=True, **kwargs)
    some = attnkit.attention(q, k, v, backend=backend, need_weights=[4, 1], **kwargs)
    assert some.weights.shape == (2, 2, 33, 97)
    torch.testing.assert_close(some.weights, full.weights[:, [4, 1]])
    torch.testing.assert_close(some.output, full.output)
    assert attnkit.attention(q, k, v, backend=backend, **kwargs).weights is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_weights_carry_exact_gradients(backend, rng, small_tiles):
    """Training through the weights (guided alignment) differentiates them: every backend gives
    float64 autograd's gradients of the reference weights, fully masked rows included (the fast
    backends recompute the weights; the call's lse carries no gradient and is not used then)."""
    q, k, v, kwargs = make_call("gqa-33x97", "random", torch.float64, rng)  # row 3 fully masked
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    direction = torch.randn(2, 2, 33, 97, generator=rng, dtype=torch.float64)

    def grads(name):
        result = attnkit.attention(q, k, v, backend=name, need_weights=[4, 1], **kwargs)
        return torch.autograd.grad((result.weights * direction).sum() + result.output.sum(), (q, k, v))

    for got, want in zip(grads(backend), grads("reference")):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zero_output_and_finite_gradients(backend, small_tiles):
    q = torch.randn(2, 2, 5, 8, requires_grad=True)
    k = torch.randn(2, 2, 6, 8, requires_grad=True)
    v = torch.randn(2, 2, 6, 8, requires_grad=True)
    mask = torch.ones(2, 1, 5, 6, dtype=torch.bool)
    mask[0, :, 2] = False
    mask[1] = False
    result = attnkit.attention(q, k, v, mask=mask, backend=backend, need_weights=True)
    assert (result.output[0, :, 2] == 0).all() and (result.output[1] == 0).all()
    assert (result.weights[0, :, 2] == 0).all() and (result.weights[1] == 0).all()
    result.output.sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert (q.grad[1] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"is_causal": True}, {"mask": "bool"}, {"scale": 0.3}, {"gqa": True}],
    ids=["dense", "causal", "bool-mask", "scale", "gqa"],
)
def test_equals_torch_sdpa_where_both_apply(backend, kwargs, rng, small_tiles):
    kwargs = dict(kwargs)
    Hkv = 2 if kwargs.pop("gqa", False) else 4
    q, k, v = randn(2, 4, 37, 24, generator=rng), randn(2, Hkv, 45, 24, generator=rng), randn(2, Hkv, 45, 24, generator=rng)
    if kwargs.get("mask") == "bool":
        kwargs["mask"] = torch.rand(2, 4, 37, 45, generator=rng) < 0.8
    torch_kwargs = {"attn_mask" if name == "mask" else name: x for name, x in kwargs.items()}
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=Hkv != 4, **torch_kwargs)
    got = attnkit.attention(q, k, v, backend=backend, **kwargs).output
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"mask": "bool"}, {"gqa": True}],
                         ids=["plain", "causal", "bool-mask", "gqa"])
def test_narrower_values_reach_torch_sdpa_as_wide_as_the_queries_on_the_cpu(kwargs, rng, monkeypatch):
    """Ev < E: the values padded with zeros to E (PyTorch's fused CPU kernel takes equal widths only, else
    its math path materialises the scores); the output and its gradients are the plain call's."""
    kwargs = dict(kwargs)
    Hkv = 2 if kwargs.pop("gqa", False) else 4
    leaves = [randn(2, 4, 37, 24, generator=rng), randn(2, Hkv, 45, 24, generator=rng), randn(2, Hkv, 45, 10, generator=rng)]
    leaves = [x.requires_grad_() for x in leaves]
    if kwargs.get("mask") == "bool":
        kwargs["mask"] = torch.rand(2, 4, 37, 45, generator=rng) < 0.8
    torch_kwargs = {"attn_mask" if name == "mask" else name: x for name, x in kwargs.items()}
    expected = F.scaled_dot_product_attention(*leaves, enable_gqa=Hkv != 4, **torch_kwargs)
    want = torch.autograd.grad(expected.square().sum(), leaves)
    widths = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, **options: widths.append((q.shape[-2], v.shape[-1])) or real(q, k, v, **options))
    got = attnkit.attention(*leaves, backend="sdpa", **kwargs).output
    assert [width for rows, width in widths if rows == 37] == [24] and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(got.square().sum(), leaves), want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masking", ["none", "causal-bottom-right", "window-top-left", "random", "bias+padding"])
@pytest.mark.parametrize("backend", ["sdpa", "tiled"])
def test_gradients_match_reference_backend(backend, masking, rng, small_tiles):
    q, k, v, kwargs = make_call("gqa-33x97", masking, torch.float64, rng)
    grads = {}
    for name in ("reference", backend):
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = attnkit.attention(*inputs, backend=name, **kwargs).output
        out.backward(torch.sin(torch.arange(out.numel(), dtype=out.dtype)).view_as(out))
        grads[name] = [x.grad for x in inputs]
    for got, expected in zip(grads[backend], grads["reference"]):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("magnitude", [0.5, 2.5, 12.0], ids=["small", "near-bound", "past-bound"])
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"mask": "random"}], ids=["dense", "causal", "mask"])
def test_tiled_is_exact_whether_or_not_it_can_skip_the_running_max(magnitude, kwargs, rng, small_tiles):
    """Scores up to ~+-10 (no shift needed), ~+-30 (bound just holds) and ~+-500 (e^s would
    overflow float32 without the running max): float32 output against the float64 oracle."""
    q, k, v = (randn(2, 4, 45, 16, generator=rng) for _ in range(3))
    q, k = q * magnitude, k * magnitude
    kwargs = dict(kwargs)
    if kwargs.get("mask") == "random":
        kwargs["mask"] = torch.rand(2, 4, 45, 45, generator=rng) < 0.6
    out = attnkit.attention(q, k, v, backend="tiled", **kwargs).output
    expected, _, _ = oracle(q, k, v, kwargs)
    # Scores of size ~m^2 carry float32 rounding ~1e-7 m^2 into the exponent.
    rtol = max(1e-5, 1e-6 * magnitude**2 * 16)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(numpy(out), expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"is_causal": True, "causal_align": "bottom-right"}, {"window": 3}, {"mask": "padding"}, {"bias": True}],
    ids=["dense", "causal-br", "window", "padding", "bias"],
)
@pytest.mark.slow
def test_tiled_backward_gradcheck(kwargs, small_tiles):
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 9, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    k = torch.randn(1, 2, 11, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    v = torch.randn(1, 2, 11, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    kwargs = dict(kwargs)
    if kwargs.get("mask") == "padding":
        kwargs["mask"] = masks.padding(torch.tensor([6]), 11)
    if kwargs.get("bias"):
        kwargs["bias"] = torch.randn(9, 11, dtype=torch.float64, generator=generator)
    assert torch.autograd.gradcheck(lambda q, k, v: attnkit.attention(q, k, v, backend="tiled", **kwargs).output, (q, k, v))


@pytest.mark.slow
def test_tiled_backward_with_dropout_gradcheck(small_tiles):
    """The backward regenerates the forward's dropout masks block by block."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 10, 4, dtype=torch.float64, generator=generator, requires_grad=True) for _ in range(3))

    def run(q, k, v):
        torch.manual_seed(11)  # same dropout masks on every evaluation
        return attnkit.attention(q, k, v, backend="tiled", dropout_p=0.4, is_causal=True).output

    assert torch.autograd.gradcheck(run, (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_is_unbiased_and_random(backend, small_tiles):
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    exact = attnkit.attention(q, k, v, backend=backend).output
    first = attnkit.attention(q, k, v, backend=backend, dropout_p=0.5).output
    second = attnkit.attention(q, k, v, backend=backend, dropout_p=0.5).output
    assert not torch.allclose(first, second)
    samples = 3000  # independent dropout draws, one per batch row
    many = attnkit.attention(*(x.expand(samples, -1, -1, -1) for x in (q, k, v)), backend=backend, dropout_p=0.5)
    torch.testing.assert_close(many.output.mean(0, keepdim=True), exact, atol=0.06, rtol=0)


# Invariants -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_sum_to_one_and_masked_keys_get_exactly_zero(backend, rng, small_tiles):
    q, k, v, kwargs = make_call("mha-97-e59", "random", torch.float32, rng)
    weights = attnkit.attention(q, k, v, backend=backend, need_weights=True, **kwargs).weights
    mask = kwargs["mask"]
    assert (weights[~mask] == 0).all()
    sums = weights.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all()


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_future_tokens_leaves_causal_outputs_unchanged(backend, align, rng, small_tiles):
    q, k, v = randn(1, 2, 40, 16, generator=rng), randn(1, 2, 50, 16, generator=rng), randn(1, 2, 50, 16, generator=rng)
    before = attnkit.attention(q, k, v, is_causal=True, causal_align=align, backend=backend).output
    cut = 20 + (10 if align == "bottom-right" else 0)  # query 20 is aligned with key `cut`
    k2, v2 = k.clone(), v.clone()
    k2[:, :, cut + 1 :] = torch.randn_like(k2[:, :, cut + 1 :]) * 5
    v2[:, :, cut + 1 :] = torch.randn_like(v2[:, :, cut + 1 :]) * 5
    after = attnkit.attention(q, k2, v2, is_causal=True, causal_align=align, backend=backend).output
    torch.testing.assert_close(after[:, :, :21], before[:, :, :21], rtol=0, atol=0)
    assert not torch.allclose(after[:, :, 21:], before[:, :, 21:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_is_a_convex_combination_of_values(backend, rng, small_tiles):
    q, k, v, kwargs = make_call("gqa-33x97", "window-bottom-right", torch.float64, rng)
    out = attnkit.attention(q, k, v, backend=backend, **kwargs).output
    v_per_head = v.repeat_interleave(3, dim=1)  # (B, H, S, Ev)
    low, high = v_per_head.amin(2, keepdim=True), v_per_head.amax(2, keepdim=True)
    assert ((out >= low - 1e-12) & (out <= high + 1e-12)).all()


# Property tests across backends -----------------------------------------------------------------


@st.composite
def attention_calls(draw):
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 3))
    H = Hkv * draw(st.integers(1, 3))
    L, S = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    E, Ev = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    structure = draw(st.sampled_from(["none", "causal", "window", "mask"]))
    align = draw(st.sampled_from(["top-left", "bottom-right"]))
    window = draw(st.integers(1, 10))
    return B, H, Hkv, L, S, E, Ev, seed, structure, align, window


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=attention_calls())
def test_all_backends_agree_with_the_oracle_on_random_shapes(call, small_tiles):
    B, H, Hkv, L, S, E, Ev, seed, structure, align, window = call
    generator = torch.Generator().manual_seed(seed)
    q = randn(B, H, L, E, dtype=torch.float64, generator=generator)
    k = randn(B, Hkv, S, E, dtype=torch.float64, generator=generator)
    v = randn(B, Hkv, S, Ev, dtype=torch.float64, generator=generator)
    kwargs = {
        "none": {},
        "causal": {"is_causal": True, "causal_align": align},
        "window": {"window": window, "causal_align": align},
        "mask": {"mask": torch.rand(B, 1, L, S, generator=generator) < 0.5},
    }[structure]
    expected_out, expected_weights, _ = oracle(q, k, v, kwargs)
    for backend in BACKENDS:
        result = attnkit.attention(q, k, v, backend=backend, need_weights=True, **kwargs)
        assert_close(result.output, expected_out, torch.float64, backend)
        assert_close(result.weights, expected_weights, torch.float64, backend)


# Backend choice ---------------------------------------------------------------------------------


def _problem(S, window=None):
    return Problem(dims=Dims(1, 8, 8, S, S, 64, 64), scale=0.125, is_causal=window is not None, window=window)


def test_auto_prefers_tiled_only_for_long_sliding_windows():
    assert choose_backend(_problem(16384)) == "sdpa"
    assert choose_backend(_problem(16384, window=256)) == "tiled"
    assert choose_backend(_problem(1024, window=256)) == "sdpa"
    assert choose_backend(_problem(2048, window=256)) == "tiled"


def test_auto_writes_a_small_score_mod_call_out_and_tiles_a_larger_one():
    """routing.AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES: up to 64 x 64 scores the reference backend's written-out softmax,
    above the tiled loop (benchmarks/score_mod_routing.py); both exact (the oracle sweeps above)."""
    from attnkit.functional.routing import AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES

    def cap(score, b, h, q_idx, kv_idx):
        return 30 * torch.tanh(score / 30)

    def problem(L, S):
        return Problem(dims=Dims(1, 4, 4, L, S, 32, 32), scale=0.125, score_mod=cap)

    assert AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES == 64 * 64
    with torch.no_grad():
        assert choose_backend(problem(64, 64)) == "reference"
        assert choose_backend(problem(1, 4096)) == "reference"
        assert choose_backend(problem(65, 64)) == "tiled"
        assert choose_backend(problem(128, 128)) == "tiled"


def test_a_small_score_mod_call_returns_its_lse_only_when_asked(rng):
    """auto's written-out score_mod call leaves the log-sum-exp out unless return_lse=True (a quarter of its ops):
    the same output and weights as the reference backend, and with return_lse the same lse."""
    def cap(score, b, h, q_idx, kv_idx):
        return 30 * torch.tanh(score / 30)

    q, k, v = (randn(2, 4, 9, 8, dtype=torch.float64, generator=rng) for _ in range(3))
    want = attnkit.attention(q, k, v, score_mod=cap, is_causal=True, backend="reference", need_weights=True)
    got = attnkit.attention(q, k, v, score_mod=cap, is_causal=True, need_weights=True)
    assert got.lse is None and want.lse is not None
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=0)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=0)
    with_lse = attnkit.attention(q, k, v, score_mod=cap, is_causal=True, return_lse=True)
    torch.testing.assert_close(with_lse.lse, want.lse, rtol=0, atol=0)
    torch.testing.assert_close(with_lse.output, want.output, rtol=0, atol=0)
    sinks = randn(4, dtype=torch.float64, generator=rng)  # the sinks are folded in through the lse: still exact
    torch.testing.assert_close(attnkit.attention(q, k, v, score_mod=cap, sinks=sinks).output,
                               attnkit.attention(q, k, v, score_mod=cap, sinks=sinks, backend="reference").output,
                               rtol=0, atol=0)


@pytest.mark.parametrize("masking", ["none", "causal-bottom-right", "padding"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_error_at_most_twice_plain_pytorch_in_bfloat16(backend, masking, rng, small_tiles):
    """FlashAttention's rule: a low-precision result may be at most twice as far from the exact
    answer as the plain three-line implementation computed in the same dtype."""
    q, k, v, kwargs = make_call("gqa-33x97", masking, torch.bfloat16, rng)
    exact, _, _ = oracle(q, k, v, kwargs)
    mask = kwargs.get("mask")
    if kwargs.get("is_causal"):
        mask = masks.causal(33, 97, causal_align=kwargs["causal_align"])
    k_heads, v_heads = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    scores = (q @ k_heads.transpose(-1, -2)) / 8.0  # all in bfloat16, E = 64
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    plain = torch.nan_to_num(torch.softmax(scores, dim=-1)) @ v_heads
    plain_error = np.abs(numpy(plain) - exact).max()
    error = np.abs(numpy(attnkit.attention(q, k, v, backend=backend, **kwargs).output) - exact).max()
    assert error <= 2 * plain_error, f"{backend}: {error:.3g} vs plain bfloat16 {plain_error:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [0.0, -0.7])
def test_a_zero_or_negative_scale_is_taken_as_torch_takes_it(scale, backend, rng):
    """scale 0 averages the allowed values; a negative one prefers the least similar keys (torch's SDPA takes
    both): every backend equals the float64 oracle."""
    q, k, v, kwargs = make_call("gqa-33x97", "padding", torch.float64, rng)
    got = attnkit.attention(q, k, v, scale=scale, backend=backend, **kwargs).output
    torch.testing.assert_close(got, torch.from_numpy(oracle(q, k, v, kwargs | {"scale": scale})[0]), rtol=1e-10,
                               atol=1e-10)
