"""The delta rule family (``attnkit.functional.linear``) against an independent float64 recurrence written here
in NumPy (1e-10), against transformers' own torch functions (Qwen3-Next's ``torch_recurrent_gated_delta_rule``
and ``torch_chunk_gated_delta_rule``, Kimi Linear's ``recurrent_kimi_delta_attention`` and
``chunk_kimi_delta_attention``: float32, to their rounding), and to its own promises: chunked equals
recurrent, a carried state equals one whole pass, a padded token leaves the state untouched, the implicit
matrix reproduces the output, gradients of the chunked form equal those of the recurrence, wrong input is
named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.functional.linear import (
    delta_rule,
    gated_delta_rule,
    gated_linear_attention,
    implicit_attention,
    l2norm,
)

from helpers import OpsSeen

DECAYS = ["none", "per-head", "per-channel"]


def _inputs(rng, B=2, Hk=2, H=4, L=45, K=8, V=6, decay="per-head", dtype=torch.float64):
    def randn(*shape):
        return torch.randn(*shape, generator=rng, dtype=torch.float64)

    q, k, v = randn(B, Hk, L, K), randn(B, Hk, L, K), randn(B, H, L, V)
    beta = torch.rand(B, H, L, generator=rng, dtype=torch.float64)
    g = {"none": None, "per-head": -torch.rand(B, H, L, generator=rng, dtype=torch.float64),
         "per-channel": -torch.rand(B, H, L, K, generator=rng, dtype=torch.float64)}[decay]
    cast = (lambda x: None if x is None else x.to(dtype))  # noqa: E731
    return cast(q), cast(k), cast(v), cast(g), cast(beta)


def _oracle(q, k, v, g, beta, *, scale=None, state=None, normalise=False, delta=True):
    """The recurrence of the papers, one head and one token at a time, in float64 NumPy."""
    q, k, v = (x.double().numpy() for x in (q, k, v))
    B, Hk, L, K = q.shape
    H, V = v.shape[1], v.shape[3]
    g = None if g is None else g.double().numpy()
    beta = beta.double().numpy()
    out = np.zeros((B, H, L, V))
    final = np.zeros((B, H, K, V))
    for b in range(B):
        for h in range(H):
            S = np.zeros((K, V)) if state is None else state[b, h].double().numpy().copy()
            for t in range(L):
                qt, kt = q[b, h // (H // Hk), t], k[b, h // (H // Hk), t]
                if normalise:
                    qt, kt = qt / np.sqrt((qt * qt).sum() + 1e-6), kt / np.sqrt((kt * kt).sum() + 1e-6)
                qt = qt * (K**-0.5 if scale is None else scale)
                if g is not None:
                    a = np.exp(g[b, h, t])
                    S = (a[:, None] if np.ndim(a) else a) * S
                update = beta[b, h, t] * (v[b, h, t] - S.T @ kt) if delta else v[b, h, t]
                S = S + np.outer(kt, update)
                out[b, h, t] = S.T @ qt
            final[b, h] = S
    return out, final


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
def test_every_form_equals_the_float64_recurrence(decay, chunk_size, rng):
    q, k, v, g, beta = _inputs(rng, decay=decay)
    state = torch.randn(2, 4, 8, 6, generator=rng, dtype=torch.float64)
    got = gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size, initial_state=state, output_final_state=True,
                           use_qk_l2norm=True, scale=0.7)
    want_out, want_state = _oracle(q, k, v, g, beta, scale=0.7, state=state, normalise=True)
    np.testing.assert_allclose(got.output.numpy(), want_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.final_state.numpy(), want_state, rtol=1e-10, atol=1e-10)
    gla = gated_linear_attention(q, k, v, g, chunk_size=chunk_size, initial_state=state, output_final_state=True)
    want_out, want_state = _oracle(q, k, v, g, torch.ones_like(beta), state=state, delta=False)
    np.testing.assert_allclose(gla.output.numpy(), want_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gla.final_state.numpy(), want_state, rtol=1e-10, atol=1e-10)
    if decay == "none":
        torch.testing.assert_close(delta_rule(q, k, v, beta, chunk_size=chunk_size).output,
                                   gated_delta_rule(q, k, v, None, beta, chunk_size=chunk_size).output)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("carried", [False, True], ids=["from-zero", "carried"])
def test_one_token_equals_the_float64_recurrence(decay, carried, rng):
    """A call of one token (a decoding step: its own path, _step) against the NumPy recurrence, with and without a
    carried state, grouped heads, the delta rule and gated linear attention."""
    q, k, v, g, beta = _inputs(rng, L=1, decay=decay)
    state = torch.randn(2, 4, 8, 6, generator=rng, dtype=torch.float64) if carried else None
    got = gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True, use_qk_l2norm=True)
    want_out, want_state = _oracle(q, k, v, g, beta, state=state, normalise=True)
    np.testing.assert_allclose(got.output.numpy(), want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.final_state.numpy(), want_state, rtol=1e-12, atol=1e-12)
    gla = gated_linear_attention(q, k, v, g, initial_state=state, output_final_state=True, scale=0.5)
    want_out, want_state = _oracle(q, k, v, g, torch.ones_like(beta), scale=0.5, state=state, delta=False)
    np.testing.assert_allclose(gla.output.numpy(), want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gla.final_state.numpy(), want_state, rtol=1e-12, atol=1e-12)


def test_check_values_false_takes_g_and_beta_as_given_without_a_look(rng):
    """check_values=False: no look at g's and beta's values (no host wait), so an out-of-range value is taken as it
    is, and the numbers are those of the checked call where the values are in range."""
    q, k, v, g, beta = _inputs(rng, L=1)
    with OpsSeen() as checked:
        want = gated_delta_rule(q, k, v, g, beta)
    with OpsSeen() as unchecked:
        got = gated_delta_rule(q, k, v, g, beta, check_values=False)
    assert "aten._local_scalar_dense.default" in checked.seen
    assert "aten._local_scalar_dense.default" not in unchecked.seen
    assert torch.equal(got.output, want.output)
    gated_delta_rule(q, k, v, -g + 0.1, beta + 2, check_values=False)  # refused only where it looks
    with pytest.raises(TypeError, match="check_values must be True or False"):
        gated_linear_attention(q, k, v, g, check_values=1)


def _transformers(module_name):
    pytest.importorskip("transformers")
    import importlib

    return importlib.import_module(f"transformers.models.{module_name}")


@pytest.mark.parametrize("way", ["recurrent", "chunk"])
@pytest.mark.parametrize("normalise", [False, True])
def test_equal_to_qwen3_nexts_own_torch_functions_in_float32(way, normalise, rng):
    m = _transformers("qwen3_next.modeling_qwen3_next")
    q, k, v, g, beta = _inputs(rng, L=70, K=16, V=8, dtype=torch.float32)
    state = torch.randn(2, 4, 16, 8, generator=rng)
    theirs = getattr(m, f"torch_{way}_gated_delta_rule")
    t = lambda x: x.transpose(1, 2)  # noqa: E731  # attnkit (B, H, L, .) <-> transformers (B, L, H, .)
    want, want_state = theirs(t(q), t(k), t(v), t(g), t(beta), initial_state=state, output_final_state=True,
                              use_qk_l2norm_in_kernel=normalise)
    got = gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True, use_qk_l2norm=normalise,
                           chunk_size=1 if way == "recurrent" else 64)
    # Unnormalised keys leave the chunked form's triangular solve ill-conditioned: there two float32 computations
    # of it part by up to 3e-4 of an output's size (2.5e-4 seen on an AVX2 CPU, under 2e-4 on AVX-512), so each is
    # also held to the float64 oracle, ours no further from it than twice transformers' own float32 result
    loose = way == "chunk" and not normalise
    torch.testing.assert_close(got.output, t(want), rtol=5e-4 if loose else 2e-4, atol=2e-4)
    torch.testing.assert_close(got.final_state, want_state, rtol=5e-4 if loose else 2e-4, atol=2e-4)
    oracle, oracle_state = _oracle(q, k, v, g, beta, state=state, normalise=normalise)
    for ours, theirs, exact in ((got.output, t(want), oracle), (got.final_state, want_state, oracle_state)):
        ours_off, theirs_off = (np.abs(x.double().numpy() - exact).max() for x in (ours, theirs))
        assert ours_off <= max(2 * theirs_off, 1e-5), (ours_off, theirs_off)


@pytest.mark.parametrize("way", ["recurrent", "chunk"])
def test_equal_to_kimi_linears_own_torch_functions_in_float32(way, rng):
    m = _transformers("kimi_linear.modeling_kimi_linear")
    q, k, v, g, beta = _inputs(rng, Hk=4, L=70, K=16, V=8, decay="per-channel", dtype=torch.float32)
    theirs = getattr(m, f"{way}_kimi_delta_attention")
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    want, want_state = theirs(t(q), t(k), t(v), t(g), t(beta), initial_state=None, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
    got = gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True)
    torch.testing.assert_close(got.output, t(want), rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(got.final_state, want_state, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("decay", DECAYS)
def test_a_carried_state_prefill_then_token_by_token_equals_one_pass(decay, rng):
    q, k, v, g, beta = _inputs(rng, decay=decay)
    whole = gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    cut = 20
    part = gated_delta_rule(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], None if g is None else g[:, :, :cut],
                            beta[:, :, :cut], output_final_state=True, chunk_size=16)
    outputs, state = [part.output], part.final_state
    for t in range(cut, q.shape[2]):
        step = gated_delta_rule(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                None if g is None else g[:, :, t:t + 1], beta[:, :, t:t + 1], initial_state=state,
                                output_final_state=True)
        outputs.append(step.output)
        state = step.final_state
    torch.testing.assert_close(torch.cat(outputs, dim=2), whole.output, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, whole.final_state, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("decay", DECAYS)
def test_a_padded_token_leaves_the_state_untouched(decay, rng):
    """Left padding (the first 7 tokens of row 1): its real tokens' outputs and the final state equal the row
    run without the padding; padded tokens get zeros."""
    q, k, v, g, beta = _inputs(rng, decay=decay)
    real = torch.ones(2, 45, dtype=torch.bool)
    real[1, :7] = False
    got = gated_delta_rule(q, k, v, g, beta, key_mask=real, output_final_state=True, chunk_size=16)
    alone = gated_delta_rule(q[1:, :, 7:], k[1:, :, 7:], v[1:, :, 7:], None if g is None else g[1:, :, 7:],
                             beta[1:, :, 7:], output_final_state=True)
    torch.testing.assert_close(got.output[1, :, 7:], alone.output[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.final_state[1], alone.final_state[0], rtol=1e-10, atol=1e-10)
    assert (got.output[1, :, :7] == 0).all()


@pytest.mark.parametrize("form", ["gated linear attention", "implicit attention", "gated delta rule"])
@pytest.mark.parametrize("decay", DECAYS)
def test_padding_writes_nothing_and_its_nan_reaches_nothing(form, decay, rng):
    """Two left pads in row 1 (gated linear attention and implicit_attention without beta too, whose padded tokens
    wrote k v^T into the state): the real tokens' outputs equal the row run alone, in the chunked and the
    recurrent form; a NaN or inf in a padded token's q, k, v, g or beta reaches no real output (padding selects,
    it does not multiply by 0)."""
    q, k, v, g, beta = _inputs(rng, decay=decay, L=20)
    real = torch.ones(2, 20, dtype=torch.bool)
    real[1, :2] = False

    def run(q, k, v, g, beta, key_mask=None, chunk_size=8):
        if form == "gated linear attention":
            return gated_linear_attention(q, k, v, g, key_mask=key_mask, chunk_size=chunk_size, check_values=False).output
        if form == "implicit attention":  # (v is not its input: the clean values read its matrix)
            clean = v if key_mask is None else torch.where(key_mask[:, None, :, None], v, 0.0)
            return implicit_attention(q, k, g, None, key_mask=key_mask, num_heads=v.shape[1], chunk_size=chunk_size) @ clean
        return gated_delta_rule(q, k, v, g, beta, key_mask=key_mask, chunk_size=chunk_size, check_values=False).output

    alone = run(q[1:, :, 2:], k[1:, :, 2:], v[1:, :, 2:], None if g is None else g[1:, :, 2:], beta[1:, :, 2:])
    for chunk_size in (1, 8):
        got = run(q, k, v, g, beta, real, chunk_size)
        torch.testing.assert_close(got[1, :, 2:], alone[0], rtol=1e-10, atol=1e-10)
        assert (got[1, :, :2] == 0).all()
    poisoned = [None if x is None else x.clone() for x in (q, k, v, g, beta)]
    for x in poisoned:
        if x is not None:
            x[1, :, 0] = float("nan")
            x[1, :, 1] = float("inf")
    got = run(*poisoned, real)
    assert not got.isnan().any() and not got.isinf().any()
    torch.testing.assert_close(got[1, :, 2:], alone[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("decay", ["per-head", "per-channel"])
def test_training_scale_decays_give_finite_gradients_equal_to_float64s(decay, dtype, rng):
    """Decays of -1.5 a token over chunks of 64 (a chunk's total decay of ~96, past float32's exp range; a fresh
    GatedDeltaNet's are of that size): the chunked form's gradients are finite and equal float64's within the
    dtype's tolerance (an upper-triangle exp overflowed to inf and gave NaN gradients)."""
    B, Hk, H, L, K, V = 1, 2, 2, 128, 16, 16
    q, k = (torch.randn(B, Hk, L, K, generator=rng, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, L, V, generator=rng, dtype=torch.float64)
    shape = (B, H, L) if decay == "per-head" else (B, H, L, K)
    g = -1.5 - 0.5 * torch.rand(*shape, generator=rng, dtype=torch.float64)
    beta = torch.rand(B, H, L, generator=rng, dtype=torch.float64)
    grads = {}
    for name, cast in (("float64", torch.float64), ("low", dtype)):
        leaves = [x.to(cast).detach().requires_grad_() for x in (q, k, v, g, beta)]
        out = gated_delta_rule(*leaves, use_qk_l2norm=True, chunk_size=64).output
        out.double().square().sum().backward()
        grads[name] = [x.grad.double() for x in leaves]
    tolerance = 2e-4 if dtype == torch.float32 else 5e-2
    for name, low, high in zip(["q", "k", "v", "g", "beta"], grads["low"], grads["float64"]):
        assert torch.isfinite(low).all(), name
        assert (low - high).abs().max() <= tolerance * max(1.0, high.abs().max()), name


def test_a_full_reset_is_refused_by_name_and_a_large_finite_decay_resets(rng):
    """g = -inf (a full reset) and NaN in g or beta are refused by name (the chunked form cannot take -inf:
    -inf - -inf is NaN); -100 resets as the recurrence's -inf does, in every form, within float32's rounding of
    the chunk's running log-decay past -100 (5e-5)."""
    q, k, v, g, beta = _inputs(rng, L=40, dtype=torch.float32)
    for bad, name in ((-torch.inf, "g must be finite"), (float("nan"), "g must be finite")):
        worse = g.clone()
        worse[0, 1, 20] = bad
        with pytest.raises(ValueError, match=name):
            gated_delta_rule(q, k, v, worse, beta)
    nan_beta = beta.clone()
    nan_beta[0, 0, 3] = float("nan")
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\], got nan"):
        gated_delta_rule(q, k, v, g, nan_beta)
    reset, large = g.clone(), g.clone()
    reset[:, :, 20], large[:, :, 20] = -torch.inf, -100.0
    want = gated_delta_rule(q, k, v, reset, beta, chunk_size=1, check_values=False).output  # the recurrence
    assert torch.isfinite(want).all()
    for chunk_size in (1, 16, 64):
        got = gated_delta_rule(q, k, v, large, beta, chunk_size=chunk_size).output
        torch.testing.assert_close(got, want, rtol=5e-5, atol=5e-5)


@pytest.mark.parametrize("case", ["int v", "complex g", "K = 0", "scale 'x'", "scale inf", "list v", "int q"])
def test_inputs_of_another_kind_are_named(case, rng):
    q, k, v, g, beta = _inputs(rng, L=6)
    kwargs = {}
    if case == "int v":
        v, match = v.long(), "v must be a real floating-point tensor, got torch.int64"
    elif case == "int q":
        q, match = q.long(), "q must be a real floating-point tensor"
    elif case == "complex g":
        g, match = g.to(torch.complex128), "g must be a real floating-point tensor"
    elif case == "K = 0":
        q, k, match = q[..., :0], k[..., :0], "key dim K >= 1"
    elif case == "list v":
        v, match = v.tolist(), "v must be a 4-D tensor"
    else:
        kwargs["scale"], match = {"scale 'x'": "x", "scale inf": float("inf")}[case], "scale must be a finite number"
    error = TypeError if "floating" in match else ValueError
    for call in (lambda: gated_delta_rule(q, k, v, g, beta, **kwargs),
                 lambda: gated_linear_attention(q, k, v, g, **kwargs)):
        with pytest.raises(error, match=match):
            call()


@pytest.mark.parametrize("learned", ["q", "k", "v", "g", "beta", "x", "dt", "A", "B", "C"])
def test_no_token_keeps_the_output_in_the_graph_of_each_input(rng, learned):
    """L = 0: the empty output and the state are in the graph of whichever input requires grad, alone (a backward
    gives zero gradients, as an empty attention() output does, not "does not require grad"): the delta rule, gated
    linear attention and the SSD."""
    from attnkit.functional.linear import ssd

    if learned in ("x", "dt", "A", "B", "C"):
        inputs = {"x": torch.randn(1, 2, 0, 3), "dt": torch.randn(1, 2, 0), "A": -torch.rand(2),
                  "B": torch.randn(1, 1, 0, 4), "C": torch.randn(1, 1, 0, 4)}
        inputs[learned].requires_grad_()
        calls = [lambda: ssd(**inputs, D=torch.ones(2), output_final_state=True)]
    else:
        q, k, v, g, beta = _inputs(rng, L=0)
        named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
        named[learned].requires_grad_()
        calls = [lambda: gated_delta_rule(q, k, v, g, beta, output_final_state=True)]
        if learned != "beta":
            calls.append(lambda: gated_linear_attention(q, k, v, g, output_final_state=True))
        inputs = named
    for call in calls:
        out = call()
        assert out.output.requires_grad and out.final_state.requires_grad
        (out.output.sum() + out.final_state.sum()).backward()
        grad = inputs[learned].grad
        assert grad is not None and not grad.any()
        inputs[learned].grad = None


def test_linear_attention_refuses_a_chunk_below_one_and_selects_its_padding(rng):
    from attnkit.functional.linear import elu_feature_map, linear_attention

    phi_q, phi_k = (elu_feature_map(torch.randn(1, 2, 6, 4, generator=rng, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(1, 2, 6, 3, generator=rng, dtype=torch.float64)
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        linear_attention(phi_q, phi_k, v, is_causal=True, chunk=0)
    real = torch.tensor([[True] * 5 + [False]])
    want = linear_attention(phi_q, phi_k, v, key_mask=real)
    phi_k, v = phi_k.clone(), v.clone()
    phi_k[0, :, 5], v[0, :, 5] = float("nan"), float("inf")
    torch.testing.assert_close(linear_attention(phi_q, phi_k, v, key_mask=real), want)


@pytest.mark.parametrize("decay", DECAYS)
def test_the_implicit_attention_matrix_reproduces_the_output(decay, rng):
    q, k, v, g, beta = _inputs(rng, decay=decay, L=30)
    q, k = l2norm(q), l2norm(k)  # bounded states: the check compares numbers of order one
    A = implicit_attention(q, k, g, beta)
    assert A.shape == (2, 4, 30, 30) and (A.triu(1) == 0).all()
    torch.testing.assert_close(A @ v, gated_delta_rule(q, k, v, g, beta).output, rtol=1e-10, atol=1e-10)
    A = implicit_attention(q, k, g, None, num_heads=4)
    torch.testing.assert_close(A @ v, gated_linear_attention(q, k, v, g).output, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("decay", DECAYS)
def test_gradients_of_the_chunked_form_equal_those_of_the_recurrence(decay, rng):
    inputs = [x for x in _inputs(rng, decay=decay, L=21)]
    grads = []
    for chunk_size in (1, 8):
        leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
        state = torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64,
                            requires_grad=True)
        out = gated_delta_rule(*leaves, initial_state=state, output_final_state=True, chunk_size=chunk_size,
                               use_qk_l2norm=True)
        (out.output.square().sum() + out.final_state.sum()).backward()
        grads.append([x.grad for x in [*leaves, state] if x is not None])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_bfloat16_inputs_keep_a_float32_state_within_bfloat16s_tolerance(rng):
    q, k, v, g, beta = _inputs(rng, L=64)
    want = gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True).output
    got = gated_delta_rule(*(x.bfloat16() for x in (q, k, v, g, beta)), use_qk_l2norm=True, output_final_state=True)
    assert got.output.dtype == torch.bfloat16 and got.final_state.dtype == torch.float32
    assert (got.output.double() - want).abs().max() / want.abs().max() < 3e-2


@pytest.mark.parametrize("chunk_size", [1, 64])
def test_no_token_gives_an_empty_output_and_leaves_the_state_as_it_was(chunk_size, rng):
    """L = 0 (an empty prompt, a decoding call with nothing new): an empty output, and the carried state (zeros
    without one) as the final state, as attention() gives an empty output; every form alike."""
    q, k, v, g, beta = _inputs(rng, L=0)
    state = torch.randn(2, 4, 8, 6, generator=rng, dtype=torch.float64)
    for form in (lambda **o: gated_delta_rule(q, k, v, g, beta, **o), lambda **o: delta_rule(q, k, v, beta, **o),
                 lambda **o: gated_linear_attention(q, k, v, g, **o)):
        carried = form(initial_state=state, output_final_state=True, chunk_size=chunk_size)
        fresh = form(output_final_state=True, chunk_size=chunk_size)
        assert carried.output.shape == (2, 4, 0, 6) and fresh.output.shape == (2, 4, 0, 6)
        assert torch.equal(carried.final_state, state) and not fresh.final_state.any()


def test_wrong_input_is_named(rng):
    q, k, v, g, beta = _inputs(rng)
    with pytest.raises(ValueError, match="g must be finite and <= 0"):
        gated_delta_rule(q, k, v, -g + 0.1, beta)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        gated_delta_rule(q, k, v, g, beta + 2)
    with pytest.raises(ValueError, match="must be a multiple of q's and k's heads"):
        gated_delta_rule(q, k, v[:, :3], g[:, :3], beta[:, :3])
    with pytest.raises(ValueError, match="k must have q's shape"):
        gated_delta_rule(q, k[:, :, :5], v, g, beta)
    with pytest.raises(ValueError, match="initial_state must have shape"):
        gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(2, 4, 8, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="g must have shape"):
        gated_delta_rule(q, k, v, g[..., None].expand(-1, -1, -1, 3), beta)
    with pytest.raises(ValueError, match="must be a 4-D tensor"):
        gated_delta_rule(q[0], k, v, g, beta)
    with pytest.raises(ValueError, match="chunk_size must be an int"):
        gated_delta_rule(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError, match="key_mask must be boolean"):
        gated_delta_rule(q, k, v, g, beta, key_mask=torch.ones(2, 44, dtype=torch.bool))
