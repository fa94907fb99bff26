"""attention(), the layers and a model traced into one graph on CUDA (marker ``gpu``): torch.export,
torch.compile(fullgraph=True) and torch.func, written and tested on the CPU (tests/functional/test_one_graph.py,
test_transforms.py), on the device. Every test runs with the NaN rule on, so that a traced graph is seen to keep
the rule's rows: against eager CUDA calls (float32, the rule's rows compared exactly):

- each kind of call exported gives eager numbers, NaN rows included: with static shapes, with dynamic lengths at
  other lengths (float32 over grouped keys), and a bf16 plain or causal call with dynamic lengths (flash's grouped
  heads);
- compiled with Inductor (its generated CUDA code) and fullgraph=True: eager numbers and NaN rows;
- vmap over a leading dimension gives the loop's numbers and rows;
- a CUDA graph captures a window call and a block-mask call, built afresh during capture, and replays them; eager
  calls afterwards (whose structures are kept) agree;
- ExportableDecoderLM's exported step on CUDA gives one full forward's logits.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.export import Dim
from torch.func import vmap

import attnkit
from attnkit import masks
from attnkit.functional.backends import common
from attnkit.models import DecoderLM, ExportableDecoderLM
from attnkit.models.config import DecoderConfig

pytestmark = pytest.mark.usefixtures("nan_rule_on")
CUDA = "cuda"
B, H, Hkv, E = 2, 4, 2, 32
TOL = {"rtol": 2e-5, "atol": 2e-5}  # float32; exported and eager calls may take different SDPA kernels


class Call(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, mask=None):
        options = dict(self.options)
        if mask is not None:
            options["mask"] = mask
        return attnkit.attention(q, k, v, **options).output


def _qkv(L: int, S: int, seed: int, poison: bool = True) -> tuple[torch.Tensor, ...]:
    """float32 CUDA q, k, v; with ``poison``, a NaN in one query row (batch 0, head 1, row L // 2) and in the last key
    of batch 1's key head 0 (which poisons that batch's query heads 0 and 1 under every mask)."""
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    q = torch.randn(B, H, L, E, device=CUDA, generator=generator)
    k, v = (torch.randn(B, Hkv, S, E, device=CUDA, generator=generator) for _ in range(2))
    if poison:
        q[0, 1, L // 2, 3] = math.nan
        k[1, 0, S - 1, 0] = math.nan
    return q, k, v


def _extras(name: str, S: int) -> tuple[torch.Tensor, ...]:
    return (masks.padding(torch.tensor([max(1, S - 3), S]), S).to(CUDA),) if name == "padding" else ()


CALLS = {
    "dense": {},
    "causal": {"is_causal": True},
    "window": {"window": 5},
    "padding": {},
    "sinks": {"sinks": torch.linspace(-1, 1, H)},
    "score_mod": {"score_mod": lambda score, b, h, q_idx, kv_idx: 5 * torch.tanh(score / 5)},
}


def _same(got: torch.Tensor, want: torch.Tensor, poisoned: bool = True) -> None:
    assert torch.equal(got.isnan(), want.isnan()), "the NaN rule's rows differ"
    if poisoned:
        assert got.isnan().any(-1)[0, 1].any() and got.isnan().any(-1)[1, :2].all()
    torch.testing.assert_close(got.nan_to_num(7.0), want.nan_to_num(7.0), **TOL)


def _on_cuda(options: dict) -> dict:
    return {key: value.to(CUDA) if isinstance(value, torch.Tensor) else value for key, value in options.items()}


def _export(module, args, dynamic: bool, padded: bool = False):
    shapes = None
    if dynamic:
        L, S = Dim("L", min=2, max=4096), Dim("S", min=2, max=4096)
        shapes = [{2: L}, {2: S}, {2: S}] + ([{3: S}] if padded else [])
    return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_exported_call_on_cuda_gives_eager_numbers(name):
    """Static shapes, every kind of call, on any torch."""
    module = Call(**_on_cuda(CALLS[name]))
    args = (*_qkv(40, 45, 0), *_extras(name, 45))
    _same(_export(module, args, dynamic=False).module()(*args), module(*args))


@pytest.mark.parametrize("name", list(CALLS))
def test_an_exported_call_on_cuda_gives_eager_numbers_at_other_lengths(name):
    """Dynamic lengths, every kind of call, float32 over grouped keys: attnkit repeats the keys itself there (by a
    gather under export, never folding a symbolic length), so torch's own grouped float32 path, which torch 2.11
    cannot export, is not taken."""
    module = Call(**_on_cuda(CALLS[name]))
    program = _export(module, (*_qkv(9, 11, 0), *_extras(name, 11)), dynamic=True, padded=name == "padding")
    for n in (9, 40, 300):
        args = (*_qkv(n, n + 5, n), *_extras(name, n + 5))
        _same(program.module()(*args), module(*args))


@pytest.mark.parametrize("name", ["dense", "causal"])
def test_a_bf16_call_on_cuda_exports_with_dynamic_lengths(name):
    """bf16 over grouped keys (SDPA's flash kernel, which takes them as they are), on torch 2.11 too: the NaN rule's
    rows are written so that torch 2.11 adds no guard over the length (it did for a view after a broadcast)."""
    module = Call(**CALLS[name])
    program = _export(module, tuple(x.bfloat16() for x in _qkv(9, 11, 0)), dynamic=True)
    for n in (9, 40, 300):
        args = tuple(x.bfloat16() for x in _qkv(n, n + 5, n))
        got, want = program.module()(*args), module(*args)
        assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any(-1)[1, :2].all()
        torch.testing.assert_close(got.nan_to_num(7.0), want.nan_to_num(7.0), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", ["dense", "causal", "padding"])
def test_inductor_compiles_a_cuda_call_into_one_graph(name):
    module = Call(**_on_cuda(CALLS[name]))
    args = (*_qkv(40, 45, 1), *_extras(name, 45))
    torch._dynamo.reset()
    _same(torch.compile(module, fullgraph=True)(*args), module(*args))


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's own vmap fallback
def test_vmap_gives_the_loops_numbers_and_rows():
    q, k, v = (torch.stack(xs) for xs in zip(*(_qkv(7, 9, seed) for seed in range(3))))
    call = lambda q, k, v: attnkit.attention(q, k, v).output  # noqa: E731
    want = torch.stack([call(q[i], k[i], v[i]) for i in range(3)])
    got = vmap(call)(q, k, v)
    _same(got[0], want[0])
    _same(got, want, poisoned=False)


def test_a_cuda_graph_captures_window_and_block_mask_calls_built_afresh():
    """During capture nothing is kept (tracing.may_keep): the window's structure and the block mask's dense form
    are the captured call's own. The replay gives eager numbers, and so do eager calls afterwards, which keep
    their own; a replay over new inputs follows them."""
    blocks = masks.block_mask(masks.window_mod(4), None, None, 24, 24, block=8, device=CUDA)
    calls = [Call(window=3), Call(mask=blocks)]
    q, k, v = _qkv(24, 24, 5)
    static = [x.clone() for x in (q, k, v)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up as torch's CUDA graph notes ask, keeping no structure of these calls:
        attnkit.attention(q, k, v)  # SDPA's kernels loaded for these dtypes and head sizes,
        attnkit.attention(q, k, v, mask=torch.ones(24, 24, dtype=torch.bool, device=CUDA).tril())  # a masked SDPA
    torch.cuda.current_stream().wait_stream(stream)
    common._structures.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = [call(*static) for call in calls]
    torch.cuda.current_stream().wait_stream(stream)
    assert not common._structures and blocks._dense is None, "a structure built during capture was kept"
    graph.replay()
    torch.cuda.synchronize()
    for call, got in zip(calls, captured):
        reference = attnkit.attention(q, k, v, backend="reference", **call.options).output
        _same(got, reference)
        _same(call(q, k, v), reference)  # eager, after capture: builds and keeps its own
    assert common._structures and blocks._dense is not None
    for x, fresh in zip(static, _qkv(24, 24, 6)):
        x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    for call, got in zip(calls, captured):
        _same(got, call(*static))


@pytest.mark.filterwarnings("ignore:No complete tensor found in the group:UserWarning")
def test_an_exported_decoding_step_on_cuda_gives_the_full_forwards_logits():
    config = DecoderConfig(vocab_size=50, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_len=32,
                           positional="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    torch.manual_seed(0)
    model = DecoderLM(config).to(CUDA).eval()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0)).to(CUDA)
    with torch.no_grad():
        want = model(ids).logits
        step = torch.export.export(ExportableDecoderLM(model, 2, 12), (ids[:, :1],), strict=False).module()
        got = torch.cat([step(ids[:, i:i + 1]) for i in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
