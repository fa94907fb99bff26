"""A model's submodules are called without ``nn.Module.__call__`` where that call would add nothing
(``attnkit.layers.calls.called``, ``attnkit.models.blocks.normalised``, ``project_by_name``): the same
numbers, and every hook, replacement or compiled call still runs where one is set."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.layers.calls import called, hookless
from attnkit.models.blocks import FeedForward, GatedFeedForward, normalised
from attnkit.models.config import DecoderConfig
from attnkit.models.decoder import DecoderLM

CONFIG = DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=40,
                       positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)


def _model_and_ids(rng, config=CONFIG):
    torch.manual_seed(0)
    model = DecoderLM(config).double().eval()
    return model, torch.randint(0, 61, (2, 7), generator=rng)


def _as_modules(model: DecoderLM, ids) -> torch.Tensor:
    """The logits with every submodule called as a module (a global hook that does nothing forces it)."""
    handle = nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        return model(ids).logits
    finally:
        handle.remove()


@pytest.mark.parametrize("config", [CONFIG, DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=4,
                                                          d_ff=40, max_len=64, bias=True)], ids=["llama", "gpt2"])
def test_a_model_gives_the_same_numbers_without_the_module_calls(rng, config):
    model, ids = _model_and_ids(rng, config)
    torch.testing.assert_close(model(ids).logits, _as_modules(model, ids), rtol=0, atol=0)
    cache = model.new_cache()
    steps = [model(ids[:, :4], cache=cache).logits] + [model(ids[:, i:i + 1], cache=cache).logits for i in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), model(ids).logits, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", ["layer", "self_attn", "mlp", "attn_norm", "mlp_norm", "gate_proj", "norm", "lm_head"])
def test_a_hook_on_any_submodule_still_runs_and_its_result_is_used(rng, where):
    model, ids = _model_and_ids(rng)
    want = model(ids).logits
    block = model.layers[1]
    module = {"layer": block, "self_attn": block.self_attn, "mlp": block.mlp, "attn_norm": block.attn_norm,
              "mlp_norm": block.mlp_norm, "gate_proj": block.mlp.gate_proj, "norm": model.norm,
              "lm_head": model.lm_head}[where]
    seen = []

    def shifted(module, args, out):  # (a shift, not a scale: a norm after it would undo a scale)
        seen.append(where)
        if hasattr(out, "_fields"):  # the attention's AttentionOutput
            return out._replace(output=out.output + 1)
        if isinstance(out, tuple):  # a block's (x, weights)
            return (out[0] + 1, *out[1:])
        return out + 1

    handle = module.register_forward_hook(shifted)
    try:
        got = model(ids).logits
    finally:
        handle.remove()
    assert seen == [where]
    assert not torch.allclose(got, want)
    torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)  # removed: as before


def test_a_replaced_norm_or_mlp_is_called_as_a_module(rng):
    model, ids = _model_and_ids(rng)
    want = model(ids).logits
    seen = []

    class Logged(nn.RMSNorm):  # a subclass: never taken for the plain norm
        def forward(self, x):
            seen.append("norm")
            return super().forward(x)

    replacement = Logged(24, eps=model.layers[0].attn_norm.eps).double()
    replacement.load_state_dict(model.layers[0].attn_norm.state_dict())
    model.layers[0].attn_norm = replacement
    torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)
    assert seen == ["norm"]


def test_a_compiled_submodule_runs_its_compiled_call(rng):
    model, ids = _model_and_ids(rng)
    want = model(ids).logits
    mlp = model.layers[0].mlp
    assert hookless(mlp) and called(mlp) == mlp.forward
    calls = []
    mlp.compile(backend=lambda graph, inputs: calls.append(1) or graph.forward)  # dynamo with a recording backend
    assert not hookless(mlp) and called(mlp) is mlp
    torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)
    assert calls, "the compiled call was bypassed"
    torch._dynamo.reset()


@pytest.mark.parametrize("norm", [nn.RMSNorm(8, eps=1e-6), nn.RMSNorm(8, elementwise_affine=False),
                                  nn.LayerNorm(8), nn.LayerNorm(8, bias=False), nn.LayerNorm(8, elementwise_affine=False)],
                         ids=["rms", "rms-plain", "layer", "layer-no-bias", "layer-plain"])
def test_normalised_is_the_norms_call_bit_for_bit(norm, rng):
    for parameter in norm.parameters():
        parameter.data.normal_(generator=rng)
    x = torch.randn(3, 5, 8, generator=rng)
    torch.testing.assert_close(normalised(norm, x), norm(x), rtol=0, atol=0)
    x.requires_grad_()
    normalised(norm, x).sum().backward()
    grads = [x.grad] + [p.grad for p in norm.parameters()]
    x.grad = None
    norm.zero_grad(set_to_none=True)
    norm(x).sum().backward()
    for got, want in zip(grads, [x.grad] + [p.grad for p in norm.parameters()]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_normalised_calls_a_norm_without_its_weight_in_the_registry_as_a_module(rng):
    norm = nn.RMSNorm(8)
    del norm._parameters["weight"]
    norm.weight = torch.full((8,), 3.0)  # a plain attribute now, which the module's own forward reads
    x = torch.randn(2, 8, generator=rng)
    torch.testing.assert_close(normalised(norm, x), torch.nn.functional.rms_norm(x, (8,), torch.full((8,), 3.0)))


@pytest.mark.parametrize("kind", ["gated", "plain"])
def test_feed_forwards_give_their_module_calls_numbers(kind, rng):
    torch.manual_seed(0)
    ffn = GatedFeedForward(8, 16) if kind == "gated" else FeedForward(8, 16, dropout=0.5, activation="gelu")
    ffn.eval()
    x = torch.randn(2, 3, 8, generator=rng)
    projections = [m for m in ffn.modules() if isinstance(m, nn.Linear)]
    want = ffn(x)
    seen = []
    handles = [m.register_forward_hook(lambda module, args, out: seen.append(1)) for m in projections]
    torch.testing.assert_close(ffn(x), want, rtol=0, atol=0)
    assert len(seen) == len(projections)
    for handle in handles:
        handle.remove()
    ffn.train()  # the plain FFN's dropout drops in training
    if kind == "plain":
        assert not torch.equal(ffn(x), want)
