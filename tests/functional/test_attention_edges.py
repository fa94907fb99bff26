"""attention(): bad input refused by name, and the edges every backend treats alike (a row of -inf bias, no
queries or keys, NaN, the NaN rule's switch, the scale)."""

from __future__ import annotations

import pytest
import torch

import attnkit

from helpers import OpsSeen, randn

BACKENDS = ["reference", "sdpa", "tiled", "auto"]


# Bad input --------------------------------------------------------------------------------------


def _qkv(H=4, Hkv=2, L=5, S=6, E=8):
    return torch.randn(2, H, L, E), torch.randn(2, Hkv, S, E), torch.randn(2, Hkv, S, E)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: (torch.randn(4, 5, 8), *_qkv()[1:]), ValueError, ["q must have 4 dimensions", "(4, 5, 8)"]),
        (lambda: (_qkv()[0], torch.randn(3, 2, 6, 8), _qkv()[2]), ValueError, ["batch sizes differ", "B=3"]),
        (lambda: _qkv(H=4, Hkv=3), ValueError, ["H=4", "Hkv=3"]),
        (lambda: (_qkv()[0], torch.randn(2, 2, 6, 7), _qkv()[2]), ValueError, ["E=8", "E=7"]),
        (lambda: (*_qkv()[:2], torch.randn(2, 2, 9, 8)), ValueError, ["S=6", "S=9"]),
        (lambda: (*_qkv()[:2], torch.randn(2, 2, 6, 8, dtype=torch.float64)), TypeError, ["v has dtype torch.float64"]),
        (lambda: (*_qkv()[:2], torch.randn(2, 2, 6, 8, device="meta")), TypeError, ["v is on meta"]),
    ],
)
def test_bad_qkv_raise_with_names_and_shapes(make, error, words):
    q, k, v = make()
    with pytest.raises(error) as info:
        attnkit.attention(q, k, v)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "mask, error, words",
    [
        (torch.ones(2, 5, 6, dtype=torch.bool), ValueError, ["mask must have shape", "3 dimensions"]),
        (torch.ones(6, dtype=torch.bool), ValueError, ["mask must have shape", "1 dimensions"]),
        (torch.ones((), dtype=torch.bool), ValueError, ["mask must have shape", "0 dimensions"]),
        (torch.ones(5, 7, dtype=torch.bool), ValueError, ["(5, 7)", "(2, 4, 5, 6)"]),
        (torch.ones(2, 3, 5, 6, dtype=torch.bool), ValueError, ["(2, 3, 5, 6)"]),
        (torch.ones(5, 6), TypeError, ["boolean", "torch.float32"]),
        # a mask that fits in every size but sits on another device: the few comparisons compare devices too
        (torch.ones(2, 1, 1, 6, dtype=torch.bool, device="meta"), TypeError, ["mask is on meta", "q is on cpu"]),
    ],
)
def test_masks_that_do_not_broadcast_are_rejected(mask, error, words):
    with pytest.raises(error) as info:
        attnkit.attention(*_qkv(), mask=mask)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"backend": "flash"}, ["backend", "'flash'"]),
        ({"causal_align": "center"}, ["causal_align", "'center'"]),
        ({"window": 0}, ["window", "0"]),
        ({"dropout_p": 1.0}, ["dropout_p", "1.0"]),
        ({"need_weights": [4]}, ["need_weights", "[0, 4)"]),
        ({"bias": torch.ones(5, 6, dtype=torch.float64)}, ["bias has dtype torch.float64"]),
    ],
)
def test_bad_options_are_rejected(kwargs, words):
    with pytest.raises((ValueError, TypeError)) as info:
        attnkit.attention(*_qkv(), **kwargs)
    for word in words:
        assert word in str(info.value)


# -- edges: one semantics in every backend ------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bias_row_of_minus_inf_gives_zeros_and_finite_gradients(backend, small_tiles):
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    bias = torch.zeros(1, 1, 5, 5)
    bias[0, 0, 3] = float("-inf")
    result = attnkit.attention(q, k, v, bias=bias, backend=backend, need_weights=True)
    assert (result.output[:, :, 3] == 0).all() and (result.weights[:, :, 3] == 0).all()
    assert torch.isfinite(result.output).all() and torch.isfinite(result.weights).all()
    result.output.sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert (q.grad[:, :, 3] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L, S", [(4, 0), (0, 6), (0, 0)])
def test_empty_queries_or_keys_give_zeros(backend, L, S):
    q = torch.randn(2, 4, L, 8, requires_grad=True)
    k, v = torch.randn(2, 2, S, 8, requires_grad=True), torch.randn(2, 2, S, 5, requires_grad=True)
    result = attnkit.attention(q, k, v, backend=backend, need_weights=True, is_causal=L > 0)
    assert result.output.shape == (2, 4, L, 5) and result.weights.shape == (2, 4, L, S)
    assert (result.output == 0).all() and (result.weights == 0).all()
    result.output.sum().backward()
    assert q.grad is None or (q.grad == 0).all()


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_propagates_the_same_way_in_every_backend(where, rng, small_tiles, nan_rule_on):
    q, k, v = randn(2, 4, 9, 8, generator=rng), randn(2, 2, 11, 8, generator=rng), randn(2, 2, 11, 8, generator=rng)
    mask = torch.ones(2, 1, 9, 11, dtype=torch.bool)
    mask[:, :, :, 6] = False  # the NaN key/value is masked: it poisons all the same (documented)
    {"q": q, "k": k, "v": v}[where][1, 1, 6, 2] = float("nan")
    expected = torch.zeros(2, 4, 9, dtype=torch.bool)
    if where == "q":
        expected[1, 1, 6] = True
    else:
        expected[1, 2:4] = True  # query heads 2 and 3 read key/value head 1
    for backend in BACKENDS:
        result = attnkit.attention(q, k, v, mask=mask, backend=backend, need_weights=True)
        assert torch.equal(result.output.isnan().any(-1), expected), backend
        assert torch.equal(result.weights.isnan().any(-1), expected), backend
        assert not result.output[~expected].isnan().any(), backend
        assert torch.equal(result.output.isnan(), result.output.isnan().any(-1, keepdim=True).expand_as(result.output))


def test_the_nan_rule_is_off_by_default_on_when_asked_and_restored_on_exit(rng):
    """By default no maxima are taken and a NaN in a masked key changes nothing; nan_rule(True) poisons the key's
    head; the setting is back after the block, also when the block raises; a non-bool is refused by name."""
    q, k, v = randn(1, 2, 3, 4, generator=rng), randn(1, 2, 5, 4, generator=rng), randn(1, 2, 5, 4, generator=rng)
    k[0, 0, 4, 1] = float("nan")
    mask = torch.tensor([True, True, True, True, False]).expand(3, 5)
    with OpsSeen() as ops:
        free = attnkit.attention(q, k, v, mask=mask, backend="reference").output
    assert not any("isnan" in op for op in ops.seen)  # (the backend's lse takes its own amax)
    assert not free.isnan().any()
    torch.testing.assert_close(free, attnkit.attention(q, k[:, :, :4], v[:, :, :4], backend="reference").output)
    with attnkit.nan_rule(True), OpsSeen() as ruled:
        assert attnkit.attention(q, k, v, mask=mask, backend="reference").output[0, 0].isnan().all()
    assert any("isnan" in op for op in ruled.seen)  # what the rule does when on
    with pytest.raises(RuntimeError, match="inside"), attnkit.nan_rule(True):
        raise RuntimeError("inside")
    assert not attnkit.attention(q, k, v, mask=mask, backend="reference").output.isnan().any()  # off again
    with pytest.raises(TypeError, match="nan_rule.*True or False.*int 1"):
        attnkit.nan_rule(1)


def _written_out(q, k, v, mask, scale):
    """softmax(q k^T scale, masked) v in float64, grouped heads repeated: the oracle the rule's gradients are held to."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, torch.finfo(q.dtype).min)
    return torch.softmax(scores, dim=-1) @ v * mask.any(-1, keepdim=True)  # a row with no allowed key: zeros


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["q", "k", "v", "k masked"])
def test_with_the_rule_on_a_poisoned_row_passes_no_gradient(backend, where, rng, small_tiles, nan_rule_on):
    """docs/semantics.md: with the rule on a poisoned row's gradient is zero, a NaN entry gets zero, and every other
    gradient is the one of the call without the NaN entries: held to a float64 oracle (the same call written out,
    NaN entries replaced by 0, the poisoned rows' upstream gradient 0), equal in every backend. A loss that leaves
    the NaN rows out gave NaN in dk and dv of the whole head (and dq of the row in sdpa and tiled) before."""
    q, k, v = (randn(2, 4, 9, 8, generator=rng, dtype=torch.float64), randn(2, 2, 11, 8, generator=rng, dtype=torch.float64),
               randn(2, 2, 11, 8, generator=rng, dtype=torch.float64))
    mask = torch.ones(2, 1, 9, 11, dtype=torch.bool)
    mask[:, :, :, 6] = False
    mask[0, :, 3] = False  # a row with no allowed key
    tensor, key = {"q": (q, 6), "k": (k, 2), "v": (v, 2), "k masked": (k, 6)}[where]
    tensor[1, 1, key, 2] = float("nan")
    upstream = randn(2, 4, 9, 8, generator=rng, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = attnkit.attention(*leaves, mask=mask, backend=backend).output
    (torch.where(out.isnan(), 0.0, out) * upstream).sum().backward()

    poisoned = torch.zeros(2, 4, 9, 1, dtype=torch.bool)
    if where == "q":
        poisoned[1, 1, 6] = True
    else:
        poisoned[1, 2:4] = True  # query heads 2 and 3 read key/value head 1
    assert torch.equal(out.isnan().any(-1, keepdim=True), poisoned)
    clean = [torch.nan_to_num(x, nan=0.0).requires_grad_() for x in (q, k, v)]
    expected = _written_out(*clean, mask, 8 ** -0.5)
    (torch.where(poisoned, 0.0, expected) * upstream).sum().backward()
    for name, got, want in zip("qkv", leaves, clean):
        assert not got.grad.isnan().any(), (backend, name)
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-10, atol=1e-12, msg=f"{backend} d{name}")
    assert (leaves[0].grad[poisoned.expand_as(q)] == 0).all()  # a poisoned row's dq


@pytest.mark.parametrize("backend", ["reference", "tiled", "auto"])
@pytest.mark.parametrize("rule", [False, True], ids=["nan_rule_off", "nan_rule_on"])
def test_a_nan_bias_at_a_masked_key_reaches_no_gradient_through_a_score_mod(backend, rule, rng):
    """A NaN in bias where the mask rules the key out, with a score_mod (softcapping): the output and dq, dk and dv
    are those of the same call with a 0 there (the score_mod's derivative at NaN, times the weight's 0, gave NaN)."""
    q, k, v = (randn(1, 2, 5, 4, generator=rng, dtype=torch.float64), randn(1, 2, 6, 4, generator=rng, dtype=torch.float64),
               randn(1, 2, 6, 4, generator=rng, dtype=torch.float64))
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[:, 4] = False
    results = []
    for poison in (True, False):
        bias = torch.zeros(5, 6, dtype=torch.float64)
        bias[1, 4] = float("nan") if poison else 0.0
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        with attnkit.nan_rule(rule):
            out = attnkit.attention(*leaves, mask=mask, bias=bias, backend=backend,
                                    score_mod=lambda s, b, h, i, j: 30 * torch.tanh(s / 30)).output
        out.sum().backward()
        results.append([out.detach(), *(x.grad for x in leaves)])
    for got, want in zip(*results):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("other", ["nan", "huge"])
def test_a_tiled_examples_numbers_depend_on_that_example_alone(other, rng):
    """The tiled loop asks each query row whether its scores are bounded (its query's norm, its example's keys), never
    the whole batch at once: a NaN or huge numbers in example 1 leave example 0's output bit for bit as it was."""
    q, k, v = (randn(2, 2, 300, 16, generator=rng, dtype=torch.float64) for _ in range(3))
    alone = attnkit.attention(q, k, v, backend="tiled", is_causal=True).output
    q = q.clone()
    if other == "nan":
        q[1, 0, 5, 3] = float("nan")
    else:
        q[1] *= 100  # scores beyond the bound: example 1's rows keep a running maximum
    beside = attnkit.attention(q, k, v, backend="tiled", is_causal=True).output
    assert torch.equal(beside[0], alone[0])


def test_the_rule_is_set_per_thread():
    """nan_rule follows torch.set_grad_enabled: each thread its own setting, every thread starting from the
    environment's (off here); two threads inside their own blocks at once leave the rule off when both are done."""
    import threading

    from attnkit.functional import nan

    inside, done, seen = threading.Barrier(2), threading.Barrier(2), {}

    def blocked(name: str) -> None:
        seen[name, "start"] = nan.on()
        with attnkit.nan_rule(True):
            inside.wait(timeout=30)  # both blocks entered before either leaves
            seen[name, "inside"] = nan.on()
            done.wait(timeout=30)
        seen[name, "after"] = nan.on()

    with attnkit.nan_rule(True):  # the main thread's setting reaches no other thread
        threads = [threading.Thread(target=blocked, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert nan.on()
    assert not nan.on()
    assert seen == {(name, when): when == "inside" for name in "ab" for when in ("start", "inside", "after")}


_SWITCH = "import attnkit; from attnkit.functional import nan; print(nan.on())"


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False), (None, False)])
def test_the_environment_sets_the_rules_default(value, on, monkeypatch):
    """ATTNKIT_NAN_RULE=1 turns the rule on, 0, empty or unset leave it off (what import reads)."""
    from attnkit.functional import nan

    monkeypatch.delenv("ATTNKIT_NAN_RULE", raising=False)
    if value is not None:
        monkeypatch.setenv("ATTNKIT_NAN_RULE", value)
    assert nan._from_environment() is on


@pytest.mark.slow
def test_the_environment_switches_the_rule_on_for_every_thread_from_import_on():
    import os
    import subprocess
    import sys

    script = ("import threading, attnkit; from attnkit.functional import nan; seen = []; "
              "t = threading.Thread(target=lambda: seen.append(nan.on())); t.start(); t.join(); print(nan.on(), seen[0])")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "ATTNKIT_NAN_RULE": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


@pytest.mark.slow  # (five interpreters started)
def test_a_value_the_switch_does_not_take_is_refused_in_one_line():
    """ATTNKIT_NAN_RULE=yes: import raises attnkit's InputError naming the variable and the values it takes; the
    command line says it in one line with exit status 2 (--help included; --version imports nothing of attnkit's)."""
    import os
    import subprocess
    import sys

    for value in (" 1", "1 ", "true"):  # the docs take 1, 0 and empty only: no blanks read away
        env = {**os.environ, "ATTNKIT_NAN_RULE": value}
        done = subprocess.run([sys.executable, "-c", _SWITCH], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and f"InputError: ATTNKIT_NAN_RULE={value!r}: expected 1" in done.stderr
    env = {**os.environ, "ATTNKIT_NAN_RULE": "yes"}
    for flag in ("--help", "tour"):
        cli = subprocess.run([sys.executable, "-c", "import sys, _attnkit_entry; sys.exit(_attnkit_entry.main())",
                              flag], env=env, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 2, cli.stderr
        assert cli.stderr == "attnkit: ATTNKIT_NAN_RULE='yes': expected 1 (the NaN rule on), 0 or empty (off)\n"


@pytest.mark.slow
def test_a_compiled_call_follows_the_nan_rule_setting(rng):
    """torch.compile reads the setting when it traces and guards on it: switching recompiles."""
    q, k, v = randn(1, 2, 3, 4, generator=rng), randn(1, 2, 5, 4, generator=rng), randn(1, 2, 5, 4, generator=rng)
    k[0, 0, 4, 1] = float("nan")
    mask = torch.tensor([True, True, True, True, False]).expand(3, 5)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attnkit.attention(q, k, v, mask=mask, backend="reference").output,
                             backend="eager")
    assert not compiled(q, k, v).isnan().any()
    with attnkit.nan_rule(True):
        assert compiled(q, k, v)[0, 0].isnan().all()
    assert not compiled(q, k, v).isnan().any()


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), "0.5", True])
def test_scale_must_be_a_finite_number(scale):
    with pytest.raises(ValueError, match="scale must be a finite number"):
        attnkit.attention(*_qkv(), scale=scale)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "reference"])
@pytest.mark.parametrize("shape, strides", [((2, 4, 16, 32), (20000, 5000, 1, 1)), ((1, 2, 9, 8), (400, 100, 2, 1))])
def test_a_query_whose_rows_overlap_in_memory_gives_the_contiguous_querys_numbers(shape, strides, backend):
    """An as_strided view with a length stride smaller than a row (rows share elements): torch's CPU SDPA misread
    it (errors of 3 and up to 1e30, NaN); attention() reads it as its contiguous copy, at every backend."""
    base = torch.randn(100000, generator=torch.Generator().manual_seed(0))
    q = base.as_strided(shape, strides)
    k, v = torch.randn(shape), torch.randn(shape)
    want = attnkit.attention(q.contiguous(), k, v, backend="reference").output
    for kwargs in ({}, {"is_causal": True}, {"scale": 0.3}):
        got = attnkit.attention(q, k, v, backend=backend, **kwargs).output
        torch.testing.assert_close(got, attnkit.attention(q.contiguous(), k, v, backend=backend, **kwargs).output)
    torch.testing.assert_close(attnkit.attention(q, k, v, backend=backend).output, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("how", ["vmap", pytest.param("compiled", marks=pytest.mark.slow)])
def test_an_overlapping_query_is_read_as_its_copy_compiled_and_under_vmap(how):
    """The same copy under torch.compile(fullgraph=True) and vmap, where the query's strides settle it (torch's
    overlap question has no batching rule, and SDPA misread the view: NaN compiled, 1e29 under vmap)."""
    base = torch.randn(100000, generator=torch.Generator().manual_seed(0))
    q = base.as_strided((2, 4, 16, 32), (20000, 5000, 1, 1))
    k, v = torch.randn(2, 4, 16, 32), torch.randn(2, 4, 16, 32)
    want = attnkit.attention(q.contiguous(), k, v, backend="reference").output
    if how == "vmap":
        got = torch.vmap(lambda q: attnkit.attention(q, k, v).output)(q.unsqueeze(0).expand(2, *q.shape))[1]
    else:
        torch._dynamo.reset()
        got = torch.compile(lambda q, k, v: attnkit.attention(q, k, v).output, fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_query_that_is_a_slice_or_a_head_split_is_not_copied():
    from attnkit.functional.checks import readable_query

    packed = torch.randn(2, 16, 3 * 4 * 32)
    q, _, _ = packed.view(2, 16, 12, 32).transpose(1, 2).split_with_sizes((4, 4, 4), 1)
    for view in (q, torch.randn(2, 4, 16, 64)[..., :32], torch.randn(2, 16, 4, 32).transpose(1, 2)):
        assert readable_query(view) is view
    overlapping = torch.randn(1000).as_strided((1, 2, 9, 8), (400, 100, 2, 1))
    assert readable_query(overlapping).is_contiguous()


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "tiled"])
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 2}, {"need_weights": True},
                                    {"mask": torch.ones(5, 5, dtype=torch.bool)}], ids=str)
def test_no_head_at_all_gives_torchs_empty_result(backend, kwargs, nan_rule_setting):
    """q, k and v with zero heads: an empty output (torch's SDPA gives one), not a misleading "multiple of the
    key/value heads" error; zero key heads for some query heads is still named."""
    q = torch.randn(2, 0, 5, 8, requires_grad=True)
    result = attnkit.attention(q, q, q, backend=backend, **kwargs)
    assert result.output.shape == (2, 0, 5, 8)
    assert result.weights is None or result.weights.shape == (2, 0, 5, 5)
    with pytest.raises(ValueError, match="got H=2 for q and Hkv=0 for k and v"):
        attnkit.attention(torch.randn(2, 2, 5, 8), q, q)
