"""attention()'s shortcut for a plain call whose q, k and v share batch, heads and head dim (self-attention's and a
decoding step's; nothing else asked, on the CPU, uncompiled, the NaN rule off): SDPA's output, without check_qkv,
whose questions a few comparisons of sizes and SDPA's own checks stand for. Held to the long way's numbers and
errors; with the NaN rule on, the checked path gives the rule's rows."""

from __future__ import annotations

import importlib
import re

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit.functional.checks import check_qkv

from helpers import randn

module = importlib.import_module("attnkit.functional.attention")
shortcut = importlib.import_module("attnkit.functional.plain")


CALLS = [  # (B, H, L, S, E), is_causal, causal_align
    ((1, 4, 16, 16, 32), False, "top-left"), ((1, 4, 16, 16, 32), True, "top-left"),
    ((2, 3, 5, 5, 8), True, "bottom-right"), ((1, 1, 1, 1, 16), False, "top-left"),
    ((2, 2, 40, 40, 64), True, "top-left"),
    ((2, 2, 1, 40, 16), True, "bottom-right"),  # a decoding step: sees every key
    ((1, 2, 1, 9, 8), False, "bottom-right"), ((2, 3, 7, 30, 16), False, "top-left"),  # cross-attention
    ((1, 2, 6, 20, 16), True, "top-left"),  # keys no query sees: the rule reads q, k and v
    ((1, 2, 20, 12, 8), True, "top-left"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape, is_causal, causal_align", CALLS, ids=str)
def test_a_call_of_one_head_shape_skips_check_qkv_and_gives_sdpas_numbers_and_the_rules_rows(
        shape, is_causal, causal_align, dtype, monkeypatch):
    """Without check_qkv (it fails the test if asked): the float64 oracle's numbers within the dtype's tolerance
    (the causal mask aligned as asked); with the NaN rule on and a NaN in q, k or v (below and above a vector's width
    of keys) exactly the rule's rows: the query's own row, or every row of the head reading the key or value."""
    for where in (module, shortcut):
        monkeypatch.setattr(where, "check_qkv", lambda *args: pytest.fail("check_qkv was asked"))
    B, H, L, S, E = shape
    generator = torch.Generator().manual_seed(sum(shape))
    q, k, v = (randn(B, H, n, E, dtype=dtype, generator=generator) for n in (L, S, S))
    got = attnkit.attention(q, k, v, is_causal=is_causal, causal_align=causal_align).output
    offset = S - L if causal_align == "bottom-right" else 0
    allowed = torch.arange(S) <= torch.arange(L)[:, None] + offset if is_causal else None
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=allowed)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)

    monkeypatch.undo()  # the rule's calls take the checked path
    for where in "qkv":
        x, y, z = (t.clone() for t in (q, k, v))
        target = {"q": x, "k": y, "v": z}[where]
        target[-1, -1, target.shape[2] // 2, 0] = float("nan")
        rows = torch.zeros(B, H, L, dtype=torch.bool)
        if where == "q":
            rows[-1, -1, L // 2] = True
        else:
            rows[-1, -1] = True  # every row of the head reading the key or value, whether it sees it or not
        with attnkit.nan_rule(True):
            out = attnkit.attention(x, y, z, is_causal=is_causal, causal_align=causal_align).output
        assert torch.equal(out.isnan().any(-1), rows), where
        assert torch.equal(out.isnan().all(-1), rows), where  # a poisoned row is NaN throughout
        torch.testing.assert_close(out[~rows], got[~rows], rtol=0, atol=0)


REFUSED = {
    "an integer dtype": lambda: (torch.ones(1, 2, 16, 8, dtype=torch.long),) * 3,
    "a complex dtype": lambda: (torch.ones(1, 2, 16, 8, dtype=torch.complex64),) * 3,
    "two dtypes": lambda: (torch.ones(1, 2, 16, 8), torch.ones(1, 2, 16, 8, dtype=torch.float64),
                           torch.ones(1, 2, 16, 8)),
    "two devices": lambda: (torch.ones(1, 2, 16, 8), torch.ones(1, 2, 16, 8), torch.ones(1, 2, 16, 8, device="meta")),
    "rank 3": lambda: (torch.ones(2, 16, 8),) * 3,
    "not tensors": lambda: ([[1.0]],) * 3,
}


@pytest.mark.parametrize("case", REFUSED)
def test_an_input_the_shortcut_cannot_take_gets_check_qkvs_named_error(case):
    """Where SDPA refuses q, k and v of one shape (a dtype, a device) or the shortcut does not apply (another rank,
    not tensors), the error is check_qkv's, naming the argument, and not SDPA's."""
    q, k, v = REFUSED[case]()
    with pytest.raises((TypeError, ValueError)) as named:
        check_qkv(q, k, v)
    with pytest.raises(type(named.value), match=re.escape(str(named.value))):
        attnkit.attention(q, k, v)


@pytest.mark.parametrize("kwargs, L", [({"scale": 0.5}, 12), ({"is_causal": 1}, 12), ({"backend": "reference"}, 12),
                                       ({"need_weights": True}, 12), ({"is_causal": True, "causal_align": "bottom-right"}, 5)],
                         ids=str)
def test_any_other_call_takes_the_checked_path(kwargs, L, monkeypatch):
    """The shortcut is the default call's: a scale, a causal flag that is not a bool, another backend, weights, or
    a bottom-right causal call with 1 < L < S (it needs a mask) go through check_qkv, with the same numbers."""
    asked = []
    monkeypatch.setattr(module, "check_qkv", lambda *args: asked.append(1) or check_qkv(*args))
    q, k, v = torch.randn(1, 2, L, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    got = attnkit.attention(q, k, v, **kwargs).output
    assert asked == [1]
    allowed = torch.arange(12) <= torch.arange(L)[:, None] + 12 - L if "causal_align" in kwargs else None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=kwargs.get("is_causal") == 1
                                          and allowed is None, scale=kwargs.get("scale"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_while_compiling_the_shortcut_asks_no_size(monkeypatch):
    """Under torch.compile or torch.export the shortcut steps aside before comparing shapes (a comparison of q's
    length with k's would tie two dynamic sizes): the checked path runs."""
    asked = []
    monkeypatch.setattr(module, "check_qkv", lambda *args: asked.append(1) or check_qkv(*args))
    for where in (module, shortcut):
        monkeypatch.setattr(where, "is_compiling", lambda: True)
    q = torch.randn(1, 2, 12, 8)
    attnkit.attention(q, q, q)
    assert asked == [1]
