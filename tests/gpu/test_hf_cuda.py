"""The Hugging Face bridge on CUDA (marker ``gpu``): windowed families and Gemma 2's softcapping
reach FlexAttention, dense ones SDPA, and the logits equal transformers' eager attention on the
same GPU (float32)."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

import attnkit
import attnkit.hf

attention_module = importlib.import_module("attnkit.functional.attention")  # the module, not the function

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, head_dim=64)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "sdpa"),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=128), "flex"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=128, attn_logit_softcapping=5.0), "flex"),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bridge_on_cuda_equals_eager_on_fused_kernels(family, monkeypatch):
    config_name, model_name, extra, backend = FAMILIES[family]
    config = getattr(transformers, config_name)(**BASE, **extra)
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        models.append(getattr(transformers, model_name)._from_config(copy.deepcopy(config),
                                                                     attn_implementation=implementation).eval())
    eager, ours = models
    ours.load_state_dict(eager.state_dict())
    eager, ours = eager.cuda(), ours.cuda()
    ids = torch.randint(3, 101, (2, 2100), device="cuda")  # windows reach flex from 2K x 2K scores
    mask = torch.ones(2, 2100, dtype=torch.long, device="cuda")
    mask[1, 1800:] = 0
    chosen = []
    real = attention_module.choose_backend
    monkeypatch.setattr(attention_module, "choose_backend", lambda p: chosen.append(real(p)) or chosen[-1])
    plain = attention_module.plain  # a plain call (no mask, window or score_mod) goes straight to SDPA
    monkeypatch.setattr(attention_module, "plain", lambda *a: chosen.append("sdpa") or plain(*a))
    with torch.no_grad():
        want = eager(input_ids=ids[:1], attention_mask=mask[:1]).logits
        got = ours(input_ids=ids[:1], attention_mask=mask[:1]).logits
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    assert chosen and set(chosen) == {backend}, chosen
    with torch.no_grad():  # with padding too
        want = eager(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    real_rows = mask.bool()
    torch.testing.assert_close(got[real_rows], want[real_rows], rtol=2e-4, atol=2e-4)
