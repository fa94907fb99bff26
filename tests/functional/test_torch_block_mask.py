"""torch's FlexAttention types in attnkit and back, judged by torch's own flex_attention.

- a ``torch.nn.attention.flex_attention.BlockMask`` from ``create_block_mask`` passed to
  :func:`attnkit.attention` (every backend) and to :class:`MultiHeadAttention` gives flex_attention's
  numbers, forward and backward, on causal, sliding-window, document and random masks whose tiles are
  partial and full;
- ``masks.to_torch_block_mask(mask)`` runs in torch's flex_attention unchanged (and ``masks.from_torch_block_mask`` round-trips);
- torch's ``and_masks`` / ``or_masks`` / ``noop_mask`` and score_mods written for flex work unchanged;
- a block mask built from tables by hand means what torch's compiled kernel makes of it (its tiles
  rule, not only its mask_mod; torch's eager fallback reads the mask_mod alone).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional.backends import flex
from attnkit.layers import MultiHeadAttention
from attnkit.masks import BlockMask, block_mask

from helpers import slow

fa = pytest.importorskip("torch.nn.attention.flex_attention")

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, H, L, E = 2, 3, 300, 16  # 300: a ragged last tile of 44 rows and keys
BACKENDS = ("reference", "sdpa", "tiled", "flex")


@pytest.fixture(autouse=True)
def _eager_flex(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)  # attnkit's flex backend through torch's eager path


def _qkv(dtype, seed=0, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, E, generator=generator, dtype=dtype).requires_grad_(requires_grad) for _ in range(3)]


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _window(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).abs() <= 200


_DOCS = torch.tensor([[0] * 260 + [1] * 40, [0] * 90 + [1] * 150 + [2] * 60])  # the first: one full tile


def _document(b, h, q_idx, kv_idx):
    return (_DOCS[b, q_idx] == _DOCS[b, kv_idx]) & (q_idx >= kv_idx)


_RANDOM = torch.rand(B, H, L, L, generator=torch.Generator().manual_seed(5)) < 0.3
_RANDOM[:, :, :128, :128] = True  # a full tile among partial ones


def _random(b, h, q_idx, kv_idx):
    return _RANDOM[b, h, q_idx, kv_idx]


MASKS = {  # name -> (mask_mod, B, H) as create_block_mask takes them
    "causal": (_causal, None, None),
    "sliding window": (_window, None, None),
    "document": (_document, B, None),
    "random per head": (_random, B, H),
}


def _torch_mask(name):
    mask_mod, b, h = MASKS[name]
    return fa.create_block_mask(mask_mod, b, h, L, L, device="cpu")


@pytest.mark.parametrize("name", list(MASKS))
def test_create_block_masks_have_partial_and_full_tiles(name):
    tiles = masks.from_torch_block_mask(_torch_mask(name)).counts()
    assert tiles["partial"] > 0 and tiles["full"] > 0, tiles


@pytest.mark.parametrize("dtype", [torch.float64, slow(torch.float32, "dtype1")])
@pytest.mark.parametrize("backend", [*BACKENDS[:3], slow("flex")])
@pytest.mark.parametrize("name", [name if i == 0 else slow(name) for i, name in enumerate(MASKS)])
def test_torch_block_mask_in_attention_gives_flex_attentions_numbers(name, backend, dtype):
    q, k, v = _qkv(dtype)
    mask = _torch_mask(name)
    expected = fa.flex_attention(q, k, v, block_mask=mask)
    out = attnkit.attention(q, k, v, mask=mask, backend=backend).output
    tolerance = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)


def _dense(mask_mod) -> torch.Tensor:
    """The mask_mod evaluated on every (b, h, q, kv): the oracle's mask."""
    index = torch.arange(L)
    return mask_mod(torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None],
                    index[:, None], index[None, :]).expand(B, H, L, L)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
def test_gradients_through_a_torch_block_mask_equal_a_float64_oracles(backend):
    """torch's flex_attention has no backward on the CPU: the oracle is the written-out softmax."""
    q, k, v = _qkv(torch.float64, requires_grad=True)
    scores = (q @ k.transpose(-1, -2) * E**-0.5).masked_fill(~_dense(_document), float("-inf"))
    (torch.softmax(scores, -1) @ v).square().sum().backward()
    expected = [t.grad for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    attnkit.attention(q2, k2, v2, mask=_torch_mask("document"), backend=backend).output.square().sum().backward()
    for got, want in zip((q2.grad, k2.grad, v2.grad), expected):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", [name if i == 0 else slow(name) for i, name in enumerate(MASKS)])
def test_attnkit_block_mask_runs_in_torch_flex_attention(name):
    """attnkit masks of another tile size (64) and from a dense tensor, handed to torch's flex_attention."""
    mask_mod, b, h = MASKS[name]
    q, k, v = _qkv(torch.float64, seed=1)
    expected = fa.flex_attention(q, k, v, block_mask=_torch_mask(name))
    ours = block_mask(mask_mod, b, h, L, L, block=64)
    dense = BlockMask.from_dense(ours.to_dense())
    for mask in (ours, dense):
        torch_mask = masks.to_torch_block_mask(mask)
        assert type(torch_mask) is fa.BlockMask and torch_mask.shape == mask.shape
        torch.testing.assert_close(fa.flex_attention(q, k, v, block_mask=torch_mask), expected, atol=1e-12, rtol=1e-12)


def test_from_torch_round_trips_and_converts_once():
    torch_mask = _torch_mask("causal")
    converted = masks.from_torch_block_mask(torch_mask)
    assert masks.to_torch_block_mask(converted) is torch_mask
    assert masks.from_torch_block_mask(torch_mask) is converted  # every layer of a model: one conversion
    assert converted.shape == (1, 1, L, L) and converted.block_size == (128, 128)
    assert torch.equal(converted.to_dense()[0, 0], torch.ones(L, L, dtype=torch.bool).tril())


@pytest.mark.slow  # compiles flex
def test_hand_built_tables_mean_what_torchs_kernel_makes_of_them():
    """``BlockMask.from_kv_blocks`` with the default noop_mask: the tables alone say which tiles are
    attended. torch's compiled CPU kernel follows them; attnkit does on every backend."""
    counts = torch.tensor([[[1, 2, 1]]], dtype=torch.int32)
    indices = torch.tensor([[[[0, 0, 0], [0, 1, 0], [2, 0, 0]]]], dtype=torch.int32)
    torch_mask = fa.BlockMask.from_kv_blocks(counts, indices, seq_lengths=(L, L))
    tiles = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    allowed = tiles.repeat_interleave(128, 0).repeat_interleave(128, 1)[:L, :L]
    q, k, v = _qkv(torch.float64, seed=2)
    oracle = torch.softmax((q @ k.transpose(-1, -2) * E**-0.5).masked_fill(~allowed, float("-inf")), -1) @ v
    for backend in BACKENDS[:3]:
        torch.testing.assert_close(attnkit.attention(q, k, v, mask=torch_mask, backend=backend).output, oracle)
    torch._dynamo.reset()  # past torch's recompile limit (earlier tests compile flex too) it would run eager,
    with torch.no_grad():  # whose unfused path reads the mask_mod alone
        compiled = torch.compile(fa.flex_attention)(q.float(), k.float(), v.float(), block_mask=torch_mask)
    torch.testing.assert_close(compiled.double(), oracle, atol=2e-5, rtol=2e-5)


@pytest.mark.slow
def test_torchs_mask_combinators_work_in_attnkit_block_masks():
    q, k, v = _qkv(torch.float64, seed=3)
    for mask_mod in (fa.and_masks(_causal, _window), fa.or_masks(_causal, _window), fa.noop_mask):
        expected = fa.flex_attention(q, k, v, block_mask=fa.create_block_mask(mask_mod, None, None, L, L, device="cpu"))
        for backend in ("reference", "tiled"):
            ours = block_mask(mask_mod, None, None, L, L)
            torch.testing.assert_close(attnkit.attention(q, k, v, mask=ours, backend=backend).output, expected)


_SLOPES = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)
SCORE_MODS = {  # written as flex_attention's documentation writes them
    "relative bias": lambda score, b, h, q_idx, kv_idx: score + (q_idx - kv_idx) * 0.01,
    "alibi": lambda score, b, h, q_idx, kv_idx: score + _SLOPES[h] * (kv_idx - q_idx),
    "softcap": lambda score, b, h, q_idx, kv_idx: 2.0 * torch.tanh(score / 2.0),
    "causal by score": lambda score, b, h, q_idx, kv_idx: torch.where(q_idx >= kv_idx, score, -float("inf")),
}


@pytest.mark.parametrize("backend", ["reference", "tiled", slow("flex")])
@pytest.mark.parametrize("name", [name if i == 0 else slow(name) for i, name in enumerate(SCORE_MODS)])
def test_flex_score_mods_work_unchanged(name, backend):
    q, k, v = _qkv(torch.float64, seed=4)
    torch_mask = _torch_mask("sliding window")
    expected = fa.flex_attention(q, k, v, score_mod=SCORE_MODS[name], block_mask=torch_mask)
    out = attnkit.attention(q, k, v, mask=torch_mask, score_mod=SCORE_MODS[name], backend=backend).output
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


def test_multi_head_attention_takes_a_torch_block_mask():
    torch.manual_seed(0)
    layer = MultiHeadAttention(48, H).double().eval()
    x = torch.randn(B, L, 48, dtype=torch.float64)
    expected = layer(x, mask=_dense(_document)[:, :1]).output
    torch.testing.assert_close(layer(x, mask=_torch_mask("document")).output, expected)


def test_a_torch_block_mask_of_other_lengths_is_named():
    q, k, v = _qkv(torch.float64)
    small = fa.create_block_mask(_causal, None, None, 256, 256, device="cpu")
    with pytest.raises(ValueError, match="mask"):
        attnkit.attention(q, k, v, mask=small)
    with pytest.raises(TypeError, match="flex_attention.BlockMask"), warnings.catch_warnings():
        masks.from_torch_block_mask(torch.ones(2, 2, dtype=torch.bool))
