"""MultiHeadAttention's packed q/k/v projection (layers.calls.pack): one F.linear for self attention where
no weight gradient is wanted, the same numbers as three projections, and never a stale weight: every way of
writing or re-seating a projection is seen, because the packed tensor is the projections' own memory."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnkit import MultiHeadAttention
from attnkit.layers import DifferentialAttention, FixedKVCache, GatedAttention, KVCache, RotaryEmbedding, SinkCache
from attnkit.layers.calls import pack, packed_projection

from helpers import assert_close, assert_same_numbers, matmuls, randn, separately


def written_out(layer: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal self attention in float64 from the layer's current parameters, by hand."""
    p = {name: t.detach().double() for name, t in layer.named_parameters()}
    B, L, _ = x.shape
    H, Hkv, E = layer.num_heads, layer.num_kv_heads, layer.head_dim

    def heads(name, n):
        bias = p.get(f"{name}.bias")
        y = x.double() @ p[f"{name}.weight"].T + (0 if bias is None else bias)
        return y.view(B, L, n, E).transpose(1, 2)

    q, k, v = heads("q_proj", H), heads("k_proj", Hkv), heads("v_proj", Hkv)
    k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) * E**-0.5
    scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * E)
    bias = p.get("out_proj.bias")
    return out @ p["out_proj.weight"].T + (0 if bias is None else bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_weights_are_slices_of_one_tensor_and_keep_their_parameters(num_kv_heads, bias):
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 4, num_kv_heads, bias=bias)
    torch.manual_seed(0)
    reference = nn.ModuleList([nn.Linear(32, 32, bias=bias), nn.Linear(32, 8 * num_kv_heads, bias=bias),
                               nn.Linear(32, 8 * num_kv_heads, bias=bias)])  # the same draws, never packed
    packed = layer._packed_qkv
    assert packed is not None
    rows = 0
    for proj, ref in zip((layer.q_proj, layer.k_proj, layer.v_proj), reference):
        assert isinstance(proj.weight, nn.Parameter) and proj.weight.requires_grad
        assert proj.weight.untyped_storage().data_ptr() == packed.weight.untyped_storage().data_ptr()
        assert proj.weight.data_ptr() == packed.weight.data_ptr() + rows * 32 * packed.weight.element_size()
        assert torch.equal(proj.weight, ref.weight)
        if bias:
            assert torch.equal(proj.bias, ref.bias)
        rows += proj.weight.shape[0]
    assert rows == packed.weight.shape[0]
    names = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"}
    assert set(layer.state_dict()) == (names | {n.replace("weight", "bias") for n in names} if bias else names)
    assert len(list(layer.parameters())) == (8 if bias else 4)


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "frozen"])
def test_one_projection_call_and_the_same_numbers(mode, num_kv_heads, rotary, rng):
    layer = MultiHeadAttention(32, 4, num_kv_heads, rotary=RotaryEmbedding(8) if rotary else None).double()
    x = randn(2, 11, 32, dtype=torch.float64, generator=rng)
    want = separately(layer, x, is_causal=True)
    assert matmuls(lambda: separately(layer, x, is_causal=True)) == 4
    if mode == "frozen":  # autograd on, no weight wants a gradient: packed; the input's gradient still flows
        layer.requires_grad_(False)
        x.requires_grad_(True)
        count = matmuls(lambda: layer(x, is_causal=True))
        got = layer(x, is_causal=True).output
        got.sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0
        got = got.detach()
    else:
        context = torch.no_grad if mode == "no_grad" else torch.inference_mode
        with context():
            count = matmuls(lambda: layer(x, is_causal=True))
            got = layer(x, is_causal=True).output
    assert count == 2  # one for q, k and v; one for out_proj
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if not rotary:
        assert_close(got, written_out(layer, x.detach()), dtype=torch.float64)


@pytest.mark.parametrize("make_cache", [lambda: KVCache(), lambda: FixedKVCache(24),
                                        lambda: SinkCache(sinks=2, window=6)],
                         ids=["KVCache", "FixedKVCache", "SinkCache"])
def test_decoding_with_a_cache_equals_the_full_forward(make_cache, rng):
    layer = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8)).double().eval()
    x = randn(1, 9, 32, dtype=torch.float64, generator=rng)
    cache = make_cache()
    with torch.no_grad():
        steps = [layer(x[:, :5], is_causal=True, cache=cache).output]
        steps += [layer(x[:, i : i + 1], is_causal=True, cache=cache).output for i in range(5, 9)]
        assert matmuls(lambda: layer(x[:, :1], is_causal=True, cache=make_cache())) == 2
    got = torch.cat(steps, dim=1)
    if isinstance(cache, SinkCache):  # its own pattern: compare with the same steps projected one by one
        cache = make_cache()
        with torch.enable_grad():
            want = torch.cat([layer(x[:, :5], is_causal=True, cache=cache).output]
                             + [layer(x[:, i : i + 1], is_causal=True, cache=cache).output for i in range(5, 9)], 1)
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    else:
        torch.testing.assert_close(got, separately(layer, x, is_causal=True), rtol=1e-12, atol=1e-12)


def _write_in_place(layer):
    with torch.no_grad():
        layer.k_proj.weight.mul_(2)


def _write_through_data(layer):
    layer.v_proj.weight.data.add_(0.5)  # the version counter does not see this write
    layer.q_proj.bias.data.fill_(0.25)


def _write_through_numpy(layer):
    layer.k_proj.weight.detach().numpy()[:] *= -1.5  # nor this one


def _load_state_dict(layer):
    state = {name: torch.randn_like(t) for name, t in layer.state_dict().items()}
    layer.load_state_dict(state)


def _load_state_dict_assign(layer):
    state = {name: torch.randn_like(t) for name, t in layer.state_dict().items()}
    layer.load_state_dict(state, assign=True)


def _assign_a_parameter(layer):
    layer.v_proj.weight = nn.Parameter(torch.randn_like(layer.v_proj.weight))


def _set_data(layer):
    layer.q_proj.weight.data = torch.randn_like(layer.q_proj.weight)


def _transpose_in_place_of_itself(layer):
    layer.q_proj.weight.data = layer.q_proj.weight.data.t()  # the same memory, another layout


def _replace_a_module(layer):
    layer.k_proj = nn.Linear(32, 16)


def _delete_a_bias(layer):
    del layer.q_proj.bias
    layer.q_proj.bias = torch.randn(32)  # now a plain attribute, not a parameter


def _hook(layer):
    layer.v_proj.register_forward_hook(lambda module, args, out: out * 3)


@pytest.mark.parametrize("write", [_write_in_place, _write_through_data, _write_through_numpy, _load_state_dict,
                                   _load_state_dict_assign, _assign_a_parameter, _set_data,
                                   _transpose_in_place_of_itself, _replace_a_module, _delete_a_bias, _hook],
                         ids=lambda f: f.__name__.strip("_"))
def test_every_way_of_changing_a_projection_is_seen(write, rng):
    """After each change the layer computes with the weights it now has (checked against the projections called
    one by one), packed where they still are its parts and projected one by one where they are not."""
    torch.manual_seed(1)
    layer = MultiHeadAttention(32, 4, 2).eval()
    x = randn(2, 7, 32, generator=rng)
    with torch.no_grad():
        before = layer(x).output
    write(layer)
    with torch.no_grad():
        got = layer(x).output
    torch.testing.assert_close(got, separately(layer, x), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, before)


def test_a_layer_whose_projection_was_reseated_drops_the_packing():
    layer = MultiHeadAttention(32, 4)
    layer.q_proj.weight = nn.Parameter(torch.randn(32, 32))
    with torch.no_grad():
        layer(torch.randn(1, 3, 32))
    assert layer._packed_qkv is None  # the old memory is not kept for nothing
    with torch.no_grad():
        assert matmuls(lambda: layer(torch.randn(1, 3, 32))) == 4


def test_training_takes_the_projections_one_by_one_and_their_gradients(rng):
    layer = MultiHeadAttention(32, 4, 2).double()
    twin = copy.deepcopy(layer)
    x = randn(2, 5, 32, dtype=torch.float64, generator=rng)
    assert matmuls(lambda: layer(x)) == 4
    layer(x).output.square().sum().backward()
    # the twin's projections, never packed: the same gradients, parameter by parameter
    twin._packed_qkv = None
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(twin, name, copy.deepcopy(getattr(twin, name)))
    twin(x).output.square().sum().backward()
    for (name, p), q in zip(layer.named_parameters(), twin.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("convert", [lambda m: m.double(), lambda m: m.to(torch.bfloat16), lambda m: m.float(),
                                     lambda m: copy.deepcopy(m)], ids=["double", "bfloat16", "float (kept)", "deepcopy"])
def test_conversions_and_copies_stay_packed(convert, rng):
    layer = MultiHeadAttention(32, 4, 2)
    before = layer._packed_qkv
    converted = convert(layer)
    packed = converted._packed_qkv
    assert packed is not None and packed.holds((converted.q_proj, converted.k_proj, converted.v_proj))
    assert packed.weight.dtype == converted.q_proj.weight.dtype
    if converted.q_proj.weight.dtype == torch.float32 and converted is layer:
        assert packed is before  # nothing converted: nothing re-seated
    x = randn(1, 6, 32, dtype=converted.q_proj.weight.dtype, generator=rng)
    with torch.no_grad():
        assert matmuls(lambda: converted(x)) == 2
        torch.testing.assert_close(converted(x).output, separately(converted, x))


@pytest.mark.parametrize("how", ["built there", "moved there"])
def test_a_layer_on_the_meta_device_runs_there_and_packs_when_materialised(how, rng):
    """A layer built on the meta device, or a packed one moved there (torch.func's ensembling recipe moves a copy
    there for functional_call), keeps no packing (none pointing at old memory: is_set_to has no meta kernel, and
    the move raised), runs a meta forward for its shapes, and packs when materialised (to_empty)."""
    if how == "built there":
        with torch.device("meta"):
            layer = MultiHeadAttention(32, 4)
    else:
        layer = MultiHeadAttention(32, 4)
        assert layer._packed_qkv is not None
        layer.to("meta")
    assert layer._packed_qkv is None
    assert layer(torch.empty(2, 5, 32, device="meta")).output.shape == (2, 5, 32)
    layer.to_empty(device="cpu")
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
        x = randn(1, 4, 32, generator=rng)
        assert matmuls(lambda: layer(x)) == 2
        torch.testing.assert_close(layer(x).output, separately(layer, x))


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's own vmap fallback
def test_an_ensemble_of_layers_through_functional_call_and_vmap_gives_each_layers_numbers(rng):
    """torch.func's model ensembling: the stacked parameters of three layers, vmapped through functional_call
    on a meta copy, give what each layer gives."""
    from torch.func import functional_call, stack_module_state, vmap

    layers = [MultiHeadAttention(32, 4, 2).eval() for _ in range(3)]
    params, buffers = stack_module_state(layers)
    base = copy.deepcopy(layers[0]).to("meta")
    x = randn(2, 6, 32, generator=rng)
    got = vmap(lambda p, b: functional_call(base, (p, b), (x,)).output)(params, buffers)
    with torch.no_grad():
        torch.testing.assert_close(got, torch.stack([layer(x).output for layer in layers]))


def test_a_state_dict_round_trip_through_safetensors(tmp_path, rng):
    from safetensors.torch import load_file, save_file

    layer = MultiHeadAttention(32, 4, 2)
    save_file(layer.state_dict(), str(tmp_path / "mha.safetensors"))
    fresh = MultiHeadAttention(32, 4, 2)
    fresh.load_state_dict(load_file(str(tmp_path / "mha.safetensors")))
    x = randn(1, 5, 32, generator=rng)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).output, layer(x).output, rtol=0, atol=0)
        assert matmuls(lambda: fresh(x)) == 2


def test_only_self_attention_of_the_plain_layer_packs(rng):
    assert MultiHeadAttention(32, 4, kdim=16)._packed_qkv is None  # keys of another width
    assert GatedAttention(32, 4)._packed_qkv is None  # its own queries()
    assert DifferentialAttention(32, 4)._packed_qkv is None  # its own project_kv()
    layer = MultiHeadAttention(32, 4).eval()
    x, memory = randn(1, 3, 32, generator=rng), randn(1, 5, 32, generator=rng)
    with torch.no_grad():
        assert matmuls(lambda: layer(x, memory)) == 4  # cross attention: the keys read another input
        torch.testing.assert_close(layer(x, memory).output, separately(layer, x, key=memory))


def test_pack_refuses_what_it_cannot_pack_and_changes_nothing():
    mixed = [nn.Linear(8, 8), nn.Linear(8, 8, bias=False)]
    widths = [nn.Linear(8, 8), nn.Linear(4, 8)]
    dtypes = [nn.Linear(8, 8), nn.Linear(8, 8).double()]
    for layers in (mixed, widths, dtypes, []):
        storages = [layer.weight.untyped_storage().data_ptr() for layer in layers]
        assert pack(layers) is None
        assert [layer.weight.untyped_storage().data_ptr() for layer in layers] == storages
    assert packed_projection(None, [], torch.randn(2, 8)) is None


def rotations(layer: MultiHeadAttention, fn) -> list[tuple[int, ...]]:
    """The shapes the layer's rotary embedding rotated during one call of ``fn``."""
    shapes = []
    rotate = RotaryEmbedding._rotated

    def counted(self, x, offset, positions):
        shapes.append(tuple(x.shape))
        return rotate(self, x, offset, positions)

    RotaryEmbedding._rotated = counted
    try:
        fn()
    finally:
        RotaryEmbedding._rotated = rotate
    return shapes


@pytest.mark.parametrize("make_cache", [lambda: None, KVCache, lambda: FixedKVCache(16)],
                         ids=["no cache", "KVCache", "FixedKVCache"])
def test_packed_queries_and_keys_are_rotated_in_one_call_with_the_same_numbers(make_cache, rng):
    """q and k of a packed projection sit side by side (AttentionCall.qk): one rotation of (B, H + Hkv, L, E) at
    the positions both take, bit for bit the two rotations of the projections called one by one where PyTorch's CPU
    kernels run AVX-512, within float64's rounding elsewhere (helpers.assert_same_numbers)."""
    layer = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8)).double().eval()
    x = randn(2, 5, 32, dtype=torch.float64, generator=rng)
    positions = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 3, 4]])
    for kwargs in ({}, {"positions": positions}):
        with torch.no_grad():
            shapes = rotations(layer, lambda: layer(x, is_causal=True, cache=make_cache(), **kwargs))
            got = layer(x, is_causal=True, cache=make_cache(), **kwargs).output
        assert shapes == [(2, 6, 5, 8)]  # 4 query heads and 2 key heads, once
        with torch.enable_grad():  # the projections one by one: q and k rotated one by one
            assert len(rotations(layer, lambda: layer(x, is_causal=True, cache=make_cache(), **kwargs))) == 2
            want = layer(x, is_causal=True, cache=make_cache(), **kwargs).output.detach()
        assert_same_numbers(got, want)


def test_a_hook_on_the_rotary_embedding_still_runs_on_the_joint_rotation(rng):
    layer = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8)).eval()
    x = randn(1, 4, 32, generator=rng)
    with torch.no_grad():
        before = layer(x, is_causal=True).output
        seen = []
        layer.rotary.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)) or out * 2)
        got = layer(x, is_causal=True).output
    assert seen == [(1, 6, 4, 8)]
    assert not torch.allclose(got, before)
    torch.testing.assert_close(got, separately(layer, x, is_causal=True))  # one by one, each doubled by the hook


def test_empty_inputs_and_autocast_through_the_packed_call_and_the_joint_rotation(rng):
    layer = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8)).eval()
    with torch.no_grad():
        assert matmuls(lambda: layer(torch.randn(0, 5, 32), is_causal=True)) == 2
        assert layer(torch.randn(0, 5, 32), is_causal=True).output.shape == (0, 5, 32)
        assert layer(torch.randn(2, 0, 32), is_causal=True).output.shape == (2, 0, 32)
    x = randn(2, 5, 32, generator=rng)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert matmuls(lambda: layer(x, is_causal=True)) == 2
        got = layer(x, is_causal=True).output
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = separately(layer, x, is_causal=True)  # projected one by one, rotated one by one
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)
