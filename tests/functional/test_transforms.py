"""attention() and the layers under torch.func transforms (vmap, grad, jacrev and their nesting), as PyTorch's
SDPA runs there: the same numbers as a loop over the batch or as autograd, the NaN rule's rows included. Under a
transform no value is read on the host (attnkit.functional.tracing): the rule takes its path without a look, masks
are filled rather than looked at, and auto leaves out the tiled loop and flex; an explicit tiled or flex backend is
refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import grad, vmap

import attnkit
from attnkit import masks
from attnkit.functional import tracing

from helpers import layer_families, randn

N, B, H, Hkv, L, S, E = 3, 2, 4, 2, 6, 9, 8
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's own fallback


def _inputs(generator: torch.Generator, L: int = L, S: int = S, Hkv: int = Hkv) -> tuple[torch.Tensor, ...]:
    """q (N, B, H, L, E), k and v (N, B, Hkv, S, E), float64: N samples to map over."""
    return tuple(randn(N, B, n, m, E, dtype=torch.float64, generator=generator)
                 for n, m in ((H, L), (Hkv, S), (Hkv, S)))


def _looped(fn, *batched):
    """fn over the samples one by one (no transform), stacked."""
    return torch.stack([fn(*(x[i] for x in batched)) for i in range(N)])


CALLS_MASK = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(9)) < 0.5
CALLS = {
    "dense": {},
    "causal": {"is_causal": True},
    "causal bottom-right": {"is_causal": True, "causal_align": "bottom-right"},
    "window": {"window": 3},
    "window, auto's tiled size": {"window": 1},  # S >= 8 windows: auto tiles this outside a transform
    "shared mask": {"mask": torch.rand(L, S, generator=torch.Generator().manual_seed(3)) < 0.6},
    "padding": {"mask": masks.padding(torch.tensor([S - 4, S]), S)},
    "block mask": {"mask": masks.causal_block_mask(L, S, block=2)},
    "bias": {"bias": torch.randn(L, S, dtype=torch.float64, generator=torch.Generator().manual_seed(4))},
    "sinks": {"sinks": torch.randn(H, dtype=torch.float64, generator=torch.Generator().manual_seed(5))},
    "score_mod": {"score_mod": lambda score, b, h, q_idx, kv_idx: 5 * torch.tanh(score / 5)},
    "reference": {"backend": "reference", "need_weights": True},
    "weights of one head": {"need_weights": [1]},  # SDPA's output, the head's weights block by block
    "weights under a mask": {"mask": CALLS_MASK, "need_weights": True},
}


@pytest.mark.parametrize("name", list(CALLS))
def test_vmap_gives_the_loops_numbers(name):
    """vmap over a leading dim of q, k and v gives what a loop over it gives, output and weights, for each kind
    of call (SDPA's direct paths, auto's general path, the reference backend)."""
    q, k, v = _inputs(torch.Generator().manual_seed(1))
    kwargs = CALLS[name]

    def call(a, b, c):
        result = attnkit.attention(a, b, c, **kwargs)
        return result.output if result.weights is None else (result.output, result.weights)

    if name == "window, auto's tiled size":
        assert attnkit.functional.routing.AUTO_TILED_MIN_KEYS_PER_WINDOW * kwargs["window"] <= S
    got, want = vmap(call)(q, k, v), [call(*(x[i] for x in (q, k, v))) for i in range(N)]
    if isinstance(got, tuple):
        for part, wanted in zip(got, zip(*want)):
            torch.testing.assert_close(part, torch.stack(wanted), rtol=1e-12, atol=1e-14)
    else:
        torch.testing.assert_close(got, torch.stack(want), rtol=1e-12, atol=1e-14)


def test_vmap_over_a_mask_per_sample():
    """A mask mapped with q, k and v (each sample its own), a row with no allowed key among them: zeros there."""
    generator = torch.Generator().manual_seed(2)
    q, k, v = _inputs(generator)
    mask = torch.rand(N, B, 1, L, S, generator=generator) < 0.5
    mask[1, 0, 0, 2] = False  # sample 1, sequence 0: row 2 allows no key
    call = lambda a, b, c, m: attnkit.attention(a, b, c, mask=m).output  # noqa: E731
    got = vmap(call)(q, k, v, mask)
    torch.testing.assert_close(got, _looked := _looped(call, q, k, v, mask), rtol=1e-12, atol=1e-14)
    assert not _looked.isnan().any() and (got[1, 0, :, 2] == 0).all()


def test_auto_leaves_the_tiled_loop_out_under_vmap_and_an_explicit_tiled_or_flex_backend_is_refused_by_name():
    """A score_mod call large enough that auto takes the tiled loop outside a transform runs the reference
    backend under vmap (the same numbers as the tiled loop's, sample by sample), and so does a call asking for the
    lse; backend='tiled' under vmap or grad, and backend='flex' under vmap, raise an error that names the backend
    and those that run."""
    generator = torch.Generator().manual_seed(6)
    q, k, v = (randn(N, 1, 2, 80, 8, dtype=torch.float64, generator=generator) for _ in range(3))
    softcap = CALLS["score_mod"]["score_mod"]
    assert attnkit.functional.routing.AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES < 80 * 80  # auto's tiled size
    got = vmap(lambda a, b, c: attnkit.attention(a, b, c, score_mod=softcap).output)(q, k, v)
    tiled = _looped(lambda a, b, c: attnkit.attention(a, b, c, score_mod=softcap, backend="tiled").output, q, k, v)
    torch.testing.assert_close(got, tiled, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"backend='tiled' cannot run under a torch.func transform.*'sdpa'"):
        vmap(lambda a, b, c: attnkit.attention(a, b, c, backend="tiled").output)(q, k, v)
    with pytest.raises(ValueError, match=r"backend='tiled' cannot run under a torch.func transform"):
        grad(lambda a: attnkit.attention(a, k[0], v[0], backend="tiled").output.sum())(q[0])
    with pytest.raises(ValueError, match=r"backend='flex' cannot run under a torch.func transform.*'sdpa'"):
        vmap(lambda a, b, c: attnkit.attention(a, b, c, backend="flex").output)(q, k, v)
    lse = vmap(lambda a, b, c: attnkit.attention(a, b, c, return_lse=True).lse)(q, k, v)  # auto: the reference's
    torch.testing.assert_close(lse, _looped(lambda a, b, c: attnkit.attention(a, b, c, backend="tiled",
                                                                                return_lse=True).lse, q, k, v))


@pytest.mark.parametrize("where", ["q", "k", "v", "masked key"])
def test_the_nan_rule_gives_its_rows_under_vmap(where, nan_rule_on):
    """The rule on, under vmap: a NaN in one sample's query row poisons that row; in a key or value, every row
    of the query heads reading it, a key no query may attend included; the other samples stay finite."""
    generator = torch.Generator().manual_seed(7)
    q, k, v = _inputs(generator)
    mask = torch.ones(L, S, dtype=torch.bool)
    mask[:, -1] = False  # the last key: no query may attend it
    target, index = {"q": (q, (1, 1, 3, 2, 5)), "k": (k, (1, 1, 0, 4, 5)), "v": (v, (1, 1, 0, 4, 5)),
                     "masked key": (k, (1, 1, 0, S - 1, 5))}[where]
    target[index] = math.nan
    got = vmap(lambda a, b, c: attnkit.attention(a, b, c, mask=mask).output)(q, k, v)
    rows = got.isnan().any(-1)
    expected = torch.zeros(N, B, H, L, dtype=torch.bool)
    if where == "q":
        expected[1, 1, 3, 2] = True
    else:  # key head 0 serves query heads 0 and 1
        expected[1, 1, :H // Hkv] = True
    assert torch.equal(rows, expected)
    assert torch.equal(got.isnan(), rows[..., None].expand_as(got))  # whole rows


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 3}, {"mask": CALLS["padding"]["mask"]}],
                         ids=["dense", "causal", "window", "padding"])
def test_grad_and_per_sample_gradients_match_autograd(kwargs):
    """torch.func.grad gives autograd's gradient; vmap(grad(...)), per-sample gradients, gives autograd's
    gradient of each sample."""
    q, k, v = _inputs(torch.Generator().manual_seed(8))
    loss = lambda a, b, c: attnkit.attention(a, b, c, **kwargs).output.square().sum()  # noqa: E731
    per_sample = vmap(grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for i in range(N):
        leaves = [x[i].clone().requires_grad_() for x in (q, k, v)]
        expected = torch.autograd.grad(loss(*leaves), leaves)
        got_one = grad(loss, argnums=(0, 1, 2))(q[i], k[i], v[i])
        for part, one, want in zip(per_sample, got_one, expected):
            torch.testing.assert_close(one, want, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(part[i], want, rtol=1e-12, atol=1e-14)


def test_a_layer_under_vmap_gives_the_loops_numbers():
    """MultiHeadAttention (its packed projection, a key mask) mapped over a leading dim of its input."""
    torch.manual_seed(0)
    layer = attnkit.MultiHeadAttention(32, 4, num_kv_heads=2).double().eval()
    x = torch.randn(N, B, L, 32, dtype=torch.float64)
    key_mask = torch.tensor([[True] * L, [True] * (L - 2) + [False] * 2])
    call = lambda y: layer(y, key_mask=key_mask, is_causal=True).output  # noqa: E731
    torch.testing.assert_close(vmap(call)(x), _looped(call, x), rtol=1e-12, atol=1e-14)


def test_traced_is_true_under_a_transform_and_false_outside():
    """tracing.traced: False in plain code, True inside vmap and grad (what the shortcuts ask before a look)."""
    seen = []

    def probe(x):
        seen.append((tracing.traced(), tracing.transformed()))
        return x.sum()

    probe(torch.ones(2))
    vmap(probe)(torch.ones(2, 2))
    grad(probe)(torch.ones(2))
    assert seen == [(False, False), (True, True), (True, True)]


LAYERS = list(layer_families(L))


@pytest.mark.parametrize("name", LAYERS)
def test_every_kind_of_layer_under_vmap_gives_the_loops_numbers(name):
    """Each layer family (additive, multiplicative local, self, gated, differential, latent, the delta rules and
    lightning attention, the efficient variants, torch's MultiheadAttention's stand-in) mapped over a leading dim
    of its input, in float64."""
    torch.manual_seed(0)
    layer, call = layer_families(L)[name]
    layer = layer.double().eval()
    x = torch.randn(N, B, L, 32, dtype=torch.float64)

    def output(y):
        result = call(layer, y)
        return result if isinstance(result, torch.Tensor) else result[0]

    with torch.no_grad():
        torch.testing.assert_close(vmap(output)(x), _looped(output, x), rtol=1e-12, atol=1e-13)


def test_per_sample_parameter_gradients_of_a_layer_match_autograd_sample_by_sample():
    """torch.func's per-sample-gradient recipe (DP-SGD): vmap(grad(loss)) over functional_call of a
    MultiHeadAttention (packed projection, GQA, causal) gives each sample's parameter gradients as autograd does."""
    from torch.func import functional_call

    torch.manual_seed(0)
    layer = attnkit.MultiHeadAttention(32, 4, 2).double()
    params = {name: p.detach() for name, p in layer.named_parameters()}
    x = torch.randn(N, L, 32, dtype=torch.float64)

    def loss(p, xi):
        return functional_call(layer, p, (xi[None],), {"is_causal": True}).output.square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
    for i in range(N):
        layer.zero_grad()
        layer(x[i:i + 1], is_causal=True).output.square().sum().backward()
        for name, p in layer.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad, rtol=1e-10, atol=1e-12)


def test_jacrev_matches_autograds_jacobian():
    """torch.func.jacrev of a masked call's output with respect to q gives autograd's Jacobian."""
    from torch.func import jacrev

    generator = torch.Generator().manual_seed(10)
    q, k, v = (randn(1, 2, n, 4, dtype=torch.float64, generator=generator) for n in (3, 5, 5))
    mask = torch.tensor([[True, True, False, True, True]] * 3)

    def call(a):
        return attnkit.attention(a, k, v, mask=mask).output

    expected = torch.autograd.functional.jacobian(call, q)
    torch.testing.assert_close(jacrev(call)(q), expected, rtol=1e-12, atol=1e-14)
