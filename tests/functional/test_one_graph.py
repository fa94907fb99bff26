"""attention(), the layers and a model traced into one graph: torch.export, static and with dynamic shapes, and
torch.compile(fullgraph=True).

The exported program gives eager attnkit's numbers (the NaN rule's rows included) at the length it was traced at
and at lengths on both sides of every size auto routes by. Under export ``auto`` asks no size and looks at no value
(attnkit.functional.tracing.one_graph): SDPA, or the reference softmax for a score_mod or an lse, so a declared
range of lengths is kept whole; the tiled loop and flex are refused by name; and nothing built while tracing (a
fake tensor) is kept for a later eager call (tracing.may_keep). Compiled with fullgraph=True, every kind of call
traces without a break: auto reads no mask on the host, and the tiled loop neither asks a block whether it is
bounded nor skips a fully masked block by looking at it."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch.export import Dim
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention.flex_attention import create_block_mask

import attnkit
from attnkit import masks
from attnkit.functional import tracing
from attnkit.functional.backends import common
from attnkit.layers import MultiHeadAttention
from attnkit.models import DecoderLM
from attnkit.models.config import DecoderConfig

from helpers import OpsSeen, layer_families, randn, slow

B, H, Hkv, E = 2, 4, 2, 8
TRACED_AT = 9
OTHER_LENGTHS = (3, 40, 300)
"""Lengths the exported programs run at besides the one they were traced at: below SDPA's vector width (the NaN
look's threshold, 8 keys), past auto's tiled window (S >= 8 windows) and past its score_mod and sinks sizes
(64 x 64 and 256 x 256 scores) that route eager calls to other backends."""


def _fake(x) -> bool:
    return isinstance(x, torch._subclasses.fake_tensor.FakeTensor)


class Call(torch.nn.Module):
    """attention(q, k, v, mask=..., bias=..., **options).output as a module (what torch.export takes)."""

    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, q, k, v, mask=None, bias=None):
        options = dict(self.options)
        if mask is not None:
            options["mask"] = mask
        if bias is not None:
            options["bias"] = bias
        return attnkit.attention(q, k, v, **options).output


def _qkv(L: int, S: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return (randn(B, H, L, E, dtype=torch.float64, generator=generator),
            randn(B, Hkv, S, E, dtype=torch.float64, generator=generator),
            randn(B, Hkv, S, E, dtype=torch.float64, generator=generator))


def _extras(name: str, L: int, S: int) -> tuple[torch.Tensor, ...]:
    """The mask or bias argument a call kind takes at lengths L, S (none for the others)."""
    if name == "padding":
        return (masks.padding(torch.tensor([max(1, S - 2), S]), S),)
    if name == "bias":
        return (None, randn(L, S, dtype=torch.float64, generator=torch.Generator().manual_seed(L * 1000 + S)))
    return ()


CALLS = {
    "dense": {},
    "causal": {"is_causal": True},
    "causal bottom-right": {"is_causal": True, "causal_align": "bottom-right"},
    "window": {"window": 3},
    "scale": {"scale": 0.3},
    "sinks": {"sinks": torch.randn(H, dtype=torch.float64, generator=torch.Generator().manual_seed(5))},
    "score_mod": {"score_mod": lambda score, b, h, q_idx, kv_idx: 5 * torch.tanh(score / 5) - 0.1 * (q_idx - kv_idx)},
    "weights of one head": {"need_weights": [1]},
    "causal weights": {"is_causal": True, "need_weights": True},
    "padding": {},
    "bias": {},
    "reference": {"backend": "reference"},
    "sdpa window": {"backend": "sdpa", "window": 3},
}


def _export(module, args, dynamic: bool, strict: bool = False):
    """torch.export of ``module`` at ``args``; with ``dynamic``, q's length and k's and v's (and a mask's or a
    bias's) as two symbols over [2, 4096]."""
    shapes = None
    if dynamic:
        L, S = Dim("L", min=2, max=4096), Dim("S", min=2, max=4096)
        shapes = [{2: L}, {2: S}, {2: S}]
        if len(args) > 3:
            shapes.append(None if args[3] is None else {3: S})
        if len(args) > 4:
            shapes.append({0: L, 1: S})
    return torch.export.export(module, tuple(args), strict=strict, dynamic_shapes=shapes)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_exported_call_gives_eager_numbers(name):
    """Each kind of call, exported with static shapes, gives eager attention()'s output."""
    module = Call(**CALLS[name])
    args = (*_qkv(TRACED_AT, TRACED_AT + 2), *_extras(name, TRACED_AT, TRACED_AT + 2))
    if name == "causal bottom-right":
        args = (*_qkv(TRACED_AT, TRACED_AT), *args[3:])
    program = _export(module, args, dynamic=False)
    torch.testing.assert_close(program.module()(*args), module(*args), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CALLS))
def test_an_exported_call_keeps_its_declared_lengths_whole(name):
    """With q's and the keys' lengths as symbols over [2, 4096], export succeeds (nothing narrows the range: a
    size compared by auto's routing or the NaN look would be a guard that does) and the one program gives eager
    attention()'s numbers at lengths where eager auto takes other paths (the look, the tiled loop, reference)."""
    module = Call(**CALLS[name])
    bottom_right = name == "causal bottom-right"
    program = _export(module, (*_qkv(TRACED_AT, TRACED_AT + 2), *_extras(name, TRACED_AT, TRACED_AT + 2)),
                      dynamic=True)
    for n in OTHER_LENGTHS:
        L, S = (n, n + 5) if not bottom_right else (max(2, n // 2), n)
        args = (*_qkv(L, S, seed=n), *_extras(name, L, S))
        torch.testing.assert_close(program.module()(*args), module(*args), rtol=1e-10, atol=1e-12,
                                   msg=lambda m: f"L={L}, S={S}: {m}")


def test_a_dense_call_exported_with_dynamic_lengths_runs_at_any_length():
    """The quick tier's dynamic case: a plain call, whose NaN look (from 8 keys on eager) must not become a
    guard S >= 8 that refuses a declared minimum of 2."""
    module = Call()
    program = _export(module, _qkv(TRACED_AT, TRACED_AT + 2), dynamic=True)
    for L, S in ((2, 3), (40, 41)):
        args = _qkv(L, S, seed=L)
        torch.testing.assert_close(program.module()(*args), module(*args), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_exported_call_applies_the_nan_rule(dynamic):
    """The rule holds in the exported graph: a NaN query row poisons its row, a NaN key every row of the query
    heads reading its key head; everything else stays finite and equal to eager."""
    module = Call(window=3)
    program = _export(module, _qkv(TRACED_AT, TRACED_AT), dynamic=dynamic)
    for n in (TRACED_AT,) + ((40,) if dynamic else ()):
        q, k, v = _qkv(n, n, seed=n)
        q[0, 1, 2, 3] = math.nan
        k[1, 0, n - 1, 0] = math.nan  # a key row 0 may not attend (window 3): poisons heads 0 and 1 of batch 1
        want = module(q, k, v)
        got = program.module()(q, k, v)
        assert torch.equal(got.isnan(), want.isnan())
        assert got[0, 1, 2].isnan().all() and got[1, :2].isnan().all() and not got[1, 2:].isnan().any()
        torch.testing.assert_close(got.nan_to_num(7.0), want.nan_to_num(7.0), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["strict dense", "strict window"])
def test_strict_export_gives_eager_numbers(name):
    """TorchDynamo's strict export too."""
    module = Call(window=3) if "window" in name else Call()
    args = _qkv(TRACED_AT, TRACED_AT)
    program = _export(module, args, dynamic=False, strict=True)
    torch.testing.assert_close(program.module()(*args), module(*args), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["tiled", "flex"])
def test_the_tiled_and_flex_backends_are_refused_by_name(backend):
    """Both keep state between calls and look at tiles on the host, which an exported graph cannot: named."""
    with pytest.raises(ValueError, match=f"backend='{backend}' cannot be exported"):
        _export(Call(backend=backend), _qkv(TRACED_AT, TRACED_AT), dynamic=False)


@pytest.mark.slow
def test_nothing_traced_is_kept_for_an_eager_call():
    """Exporting builds fake tensors: the structure of a window kept per shape, a block mask's dense mask and a
    torch BlockMask's conversion are not kept from it, so the next eager call at that shape runs on real ones
    (it raised DataDependentOutputException on a fake mask before)."""
    args = _qkv(16, 16)
    blocks = masks.block_mask(masks.window_mod(4), None, None, 16, 16, block=4)
    torch_blocks = create_block_mask(lambda b, h, i, j: j <= i, None, None, 16, 16, device="cpu", BLOCK_SIZE=8)
    for module in (Call(window=5), Call(mask=blocks), Call(mask=torch_blocks)):
        _export(module, args, dynamic=False)  # traced first: built afresh from fake tensors, not kept
        torch.testing.assert_close(module(*args), attnkit.attention(*args, backend="reference",
                                                                    **module.options).output, rtol=1e-12, atol=1e-12)
    assert not any(_fake(x) for x in common._structures.values())
    assert not _fake(blocks._dense)
    for module in (Call(window=5), Call(mask=blocks)):  # kept by the eager calls first: a static export reads them
        program = _export(module, args, dynamic=False)
        torch.testing.assert_close(program.module()(*args), module(*args), rtol=1e-12, atol=1e-12)
    assert not hasattr(torch_blocks, "_attnkit_block_mask") or not _fake(torch_blocks._attnkit_block_mask[1].kinds)


@pytest.mark.slow
def test_exporting_is_asked_of_export_alone():
    """tracing.exporting: True while torch.export traces (strict or not), False under torch.compile. TorchDynamo
    before torch 2.13 folds torch.compiler.is_exporting() to True under any compile (torch 2.11: plain compile then
    refused the tiled backend, flex and Longformer as if exporting); the flag is read as it is."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            return x + (1 if tracing.exporting() else 0)

    probe = Probe()
    torch._dynamo.reset()
    seen.append(torch.compile(probe, fullgraph=True, backend="eager")(torch.zeros(1)).item())
    for strict in (False, True):
        seen.append(torch.export.export(probe, (torch.zeros(1),), strict=strict).module()(torch.zeros(1)).item())
    assert seen == [0, 1, 1] and not tracing.exporting()


@pytest.mark.parametrize("backend", [slow("tiled"), "reference"])
def test_an_explicit_backend_compiles(backend):
    """Compiled with fullgraph=True (not exported), an explicit backend runs: the tiled loop is refused under export
    alone."""
    q, k, v = _qkv(20, 20, seed=3)
    function = lambda q, k, v: attnkit.attention(q, k, v, backend=backend, window=4).output  # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(function, fullgraph=True, backend="eager")(q, k, v), function(q, k, v),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_grouped_heads_are_folded_under_export_only_at_a_static_length():
    """sdpa.foldable (CUDA's grouped calls fold a group's query heads into rows of its key head): not under export
    with a dynamic query length, whose folded view torch refuses (the keys are repeated there, by a gather:
    heads.repeat_kv), but with a static one; and the gather exports with dynamic lengths."""
    from attnkit.functional.backends import sdpa
    from attnkit.functional.heads import repeat_kv

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, q, k, v):
            seen.append(sdpa.foldable(q, None, False))
            return torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2))

    args = _qkv(TRACED_AT, TRACED_AT + 2)
    _export(Probe(), args, dynamic=False)
    program = _export(Probe(), args, dynamic=True)
    assert seen == [True, False] and sdpa.foldable(args[0], None, False)
    longer = _qkv(40, 45, seed=4)
    torch.testing.assert_close(program.module()(*longer), Probe()(*longer), rtol=1e-12, atol=1e-12)


def test_nothing_is_kept_while_tracing():
    """tracing.may_keep: no while exporting, under a fake tensor mode or under make_fx's tracer; yes in eager
    code."""
    assert tracing.may_keep(torch.device("cpu"))
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(tracing.may_keep(x.device))
            return x + 1

    torch.export.export(Probe(), (torch.zeros(2),), strict=False)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        seen.append(tracing.may_keep(torch.device("cpu")))
    make_fx(Probe())(torch.zeros(2))  # a proxy tracer over real tensors
    assert seen == [False, False, False]


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["MHA", "GQA"])
def test_an_exported_multihead_layer_runs_at_other_lengths(kv_heads):
    layer = MultiHeadAttention(32, 4, num_kv_heads=kv_heads).double().eval()
    x = randn(2, TRACED_AT, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    program = torch.export.export(layer, (x,), dynamic_shapes=({1: Dim("L", min=2, max=4096)},), strict=False)
    for n in (2, 40):
        x = randn(2, n, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(program.module()(x)[0], layer(x).output, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:No complete tensor found in the group:UserWarning")  # torch's save, tied weights
@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_an_exported_language_model_runs_at_other_lengths_and_round_trips(positional):
    """A DecoderLM (rotary or learned positions, grouped keys, a sliding window, a padding mask) exported with a
    dynamic length gives eager logits at other lengths, after torch.export.save and load too, and leaves its
    rotary table unfaked for eager calls."""
    config = DecoderConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_len=64,
                           positional=positional, norm="rmsnorm", mlp="swiglu", bias=False, window=6)
    torch.manual_seed(0)
    model = DecoderLM(config).double().eval()
    generator = torch.Generator().manual_seed(3)

    def inputs(n):
        ids = torch.randint(0, 50, (2, n), generator=generator)
        mask = torch.ones(2, n, dtype=torch.bool)
        mask[1, : n // 3] = False
        return ids, mask

    n = Dim("n", min=2, max=64)
    program = torch.export.export(model, inputs(TRACED_AT), dynamic_shapes=({1: n}, {1: n}), strict=False)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    for length in (3, 40):
        args = inputs(length)
        want = model(*args).logits
        real = want[args[1]]  # padded positions' logits are whatever the model gives them; compare the real ones
        for exported in (program, loaded):
            got = exported.module()(*args)
            torch.testing.assert_close(got[0][args[1]] if isinstance(got, tuple) else got.logits[args[1]], real,
                                       rtol=1e-10, atol=1e-10)
    rotary = [m for m in model.modules() if hasattr(m, "_last_slice")]
    assert all(not _fake(t) for m in rotary for t in (m._cached or ()))


def test_an_op_counter_keeps_what_eager_code_keeps(rng):
    """A dispatch mode that sees real tensors (an op counter, a profiler) is not tracing: a window call under it
    keeps its structure and gives the same output."""
    q = randn(1, 2, 5, 4, dtype=torch.float64, generator=rng)
    common._structures.clear()
    with OpsSeen():
        assert tracing.may_keep(q.device)
        out = attnkit.attention(q, q, q, window=2).output
    assert common._structures and not any(_fake(x) for x in common._structures.values())
    torch.testing.assert_close(out, attnkit.attention(q, q, q, window=2, backend="reference").output)


def _compiled(fn):
    """fn compiled into one graph (TorchDynamo's capture; the "eager" backend runs the captured graph as it is, so
    the test checks the capture, not Inductor's code)."""
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")


@pytest.mark.slow
@pytest.mark.parametrize("n", OTHER_LENGTHS[1:])
@pytest.mark.parametrize("name", list(CALLS))
def test_a_call_compiles_into_one_graph(name, n):
    """Each kind of call at lengths where eager auto runs the tiled loop (a window over 8 windows, sinks over
    256 x 256 scores, a score_mod over 64 x 64) or SDPA, compiled with fullgraph=True: eager's numbers."""
    module = Call(**CALLS[name])
    L, S = (n, n + 5) if name != "causal bottom-right" else (n // 2, n)
    args = (*_qkv(L, S, seed=n), *_extras(name, L, S))
    torch.testing.assert_close(_compiled(module)(*args), module(*args), rtol=1e-10, atol=1e-12)


PADDED = masks.padding(torch.tensor([0, 100]), 300)  # row 0 has no key at all; keys 128.. are masked in both rows
COMPILED_MASKS = {
    "tiled, padding": {"backend": "tiled", "mask": PADDED},
    "tiled, random mask": {"backend": "tiled",
                           "mask": torch.rand(300, 305, generator=torch.Generator().manual_seed(4)) < 0.3},
    "auto, sparse block mask": {"mask": masks.block_mask(masks.window_mod(16), None, None, 300, 305, block=32)},
    "tiled, window and padding": {"backend": "tiled", "window": 20, "mask": PADDED},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMPILED_MASKS))
def test_masked_tiled_calls_compile_into_one_graph(name):
    """The tiled loop under a mask (a fully masked block, a row with no key), and auto with a block mask sparse
    enough for the loop eager, compiled with fullgraph=True: eager's numbers, zeros for the empty row. (The tiled
    loop's walk over a block mask's tiles reads its table on the host: docs/semantics.md.)"""
    options = COMPILED_MASKS[name]
    q, k, v = _qkv(300, 305 if "padding" not in name else 300, seed=7)
    if "padding" in name:
        options = {**options, "mask": PADDED}
    function = lambda q, k, v: attnkit.attention(q, k, v, **options).output  # noqa: E731
    got = _compiled(function)(q, k, v)
    torch.testing.assert_close(got, function(q, k, v), rtol=1e-10, atol=1e-12)
    if "padding" in name:
        assert torch.equal(got[0], torch.zeros_like(got[0]))


@pytest.mark.slow
def test_a_large_mask_compiles_into_one_graph_without_being_classified():
    """Eager auto classifies a mask of 4M entries into tiles (a host read); compiled it hands SDPA the mask."""
    generator = torch.Generator().manual_seed(8)
    q = randn(1, 2, 2048, 8, generator=generator)
    mask = torch.rand(2048, 2048, generator=generator) < 0.02
    function = lambda q: attnkit.attention(q, q, q, mask=mask).output  # noqa: E731
    torch.testing.assert_close(_compiled(function)(q), function(q), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_tiled_walk_over_a_block_mask_compiles_once_it_is_kept():
    """backend='tiled' with a block mask reads the mask's tile table on the host to walk its tiles: compiled
    first, fullgraph=True refuses the read (torch's error); once an eager call has kept the walk, it compiles."""
    blocks = masks.block_mask(masks.window_mod(16), None, None, 300, 305, block=32)
    q, k, v = _qkv(300, 305, seed=9)
    function = lambda q, k, v: attnkit.attention(q, k, v, mask=blocks, backend="tiled").output  # noqa: E731
    with pytest.raises(Exception, match="data-dependent"):
        _compiled(function)(q, k, v)
    want = function(q, k, v)
    torch.testing.assert_close(_compiled(function)(q, k, v), want, rtol=1e-12, atol=1e-12)


class _Layer(torch.nn.Module):
    """A layer family's call on x (B, L, 32), its output tensor only (what torch.export and compile take)."""

    def __init__(self, name: str, L: int):
        super().__init__()
        torch.manual_seed(0)
        layer, self.call = layer_families(L)[name]
        self.layer = layer.double().eval()

    def forward(self, x):
        result = self.call(self.layer, x)
        return result if isinstance(result, torch.Tensor) else result[0]


DATA_DEPENDENT_LAYERS = {"Longformer"}
"""How many global tokens a batch has sizes LongformerSelfAttention's global pass, and its block mask is classified
on the host: compiled it breaks its graph, and export refuses it by name."""
LENGTH_SPECIALISED_LAYERS = {"GatedDeltaNet", "KimiDeltaAttention", "LightningAttention", "Linformer"}
"""Exported, these keep the length they were traced at (docs/semantics.md): the delta rules and lightning attention
loop over chunks in Python, and Linformer projects a fixed length."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(layer_families(TRACED_AT)) - DATA_DEPENDENT_LAYERS))
def test_every_layer_family_compiles_into_one_graph_and_exports(name):
    """Each layer family (as under torch.func in test_transforms.py), compiled with fullgraph=True and exported:
    eager's numbers in float64; exported with a dynamic length, those that keep it whole run at another length."""
    layer = _Layer(name, TRACED_AT)
    x = randn(2, TRACED_AT, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = layer(x)
        torch.testing.assert_close(_compiled(layer)(x), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.export.export(layer, (x,), strict=False).module()(x), want,
                                   rtol=1e-12, atol=1e-12)
        if name in LENGTH_SPECIALISED_LAYERS:
            return
        program = torch.export.export(layer, (x,), dynamic_shapes=({1: Dim("L", min=2, max=4096)},), strict=False)
        longer = randn(2, 40, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(program.module()(longer), layer(longer), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_longformer_compiles_with_breaks_and_export_refuses_it_by_name():
    layer = _Layer("Longformer", TRACED_AT)
    x = randn(2, TRACED_AT, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(layer, backend="eager")(x), layer(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="LongformerSelfAttention cannot be exported"):
        torch.export.export(layer, (x,), strict=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["window", "padding", "score_mod"])
def test_inductor_compiles_a_call_into_one_graph(name):
    """The default backend too (Inductor's generated CPU code, not only the captured graph): eager's numbers where
    eager auto runs the tiled loop (a window past 8 windows), SDPA under a mask, or the reference score_mod."""
    module = Call(**CALLS[name])
    args = (*_qkv(40, 45, seed=40), *_extras(name, 40, 45))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(module, fullgraph=True)(*args), module(*args), rtol=1e-10, atol=1e-12)
