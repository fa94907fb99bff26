"""Position tables stay float32 whatever the model's dtype: a bf16 Llama at 600 tokens is no further
from its float32 self than transformers' bf16 model is from its float32 one, on the same weights,
and the result does not depend on what ran before the cast."""

from __future__ import annotations

import copy

import pytest
import torch

from attnkit.layers import RotaryEmbedding, SinusoidalPositionalEncoding
from attnkit.models.decoder import DecoderLM
from attnkit.models.pretrained import config_from_hf, load_hf_state_dict

transformers = pytest.importorskip("transformers")

LENGTH = 600


def _hf_llama(tmp_path):
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=1024,
                                      rope_theta=10000.0)
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # weights large enough that positions move the logits (the default init is tiny)
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator) if "norm" in name
                    else torch.randn(p.shape, generator=generator) * p.shape[-1] ** -0.5)
    model.save_pretrained(tmp_path)
    return model


def test_bf16_logits_at_600_tokens_no_further_from_fp32_than_transformers(tmp_path, rng):
    hf32 = _hf_llama(tmp_path)
    hf16 = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    ours32 = DecoderLM(config_from_hf(hf32.config.to_dict())).eval()
    load_hf_state_dict(ours32, hf32.state_dict(), "llama")
    ours16 = copy.deepcopy(ours32).to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, LENGTH), generator=rng)
    with torch.no_grad():
        reference = hf32(input_ids=ids).logits
        assert (ours32(ids).logits - reference).abs().max() <= 1e-4
        theirs = (hf16(input_ids=ids).logits.float() - reference).abs().max().item()
        ours = (ours16(ids).logits.float() - reference).abs().max().item()
    assert ours <= 1.1 * theirs, f"attnkit bf16 error {ours:.3f} vs transformers bf16 {theirs:.3f}"


def test_bf16_result_does_not_depend_on_call_history(rng):
    config = config_from_hf(dict(model_type="llama", vocab_size=97, hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                 rms_norm_eps=1e-6, max_position_embeddings=1024))
    torch.manual_seed(4)
    ran_first, cast_first = DecoderLM(config).eval(), None
    cast_first = copy.deepcopy(ran_first).to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, LENGTH), generator=rng)
    with torch.no_grad():
        ran_first(ids)  # builds float32 cos/sin tables before the cast
        ran_first.to(torch.bfloat16)
        assert torch.equal(ran_first(ids).logits, cast_first(ids).logits)


def test_position_tables_stay_float32_after_a_cast():
    rotary = RotaryEmbedding(16, 10000.0).to(torch.bfloat16)
    assert rotary.inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, RotaryEmbedding(16, 10000.0).inv_freq)
    sinusoids = SinusoidalPositionalEncoding(32, max_len=64).to(torch.float16)
    assert sinusoids.table.dtype == torch.float32
    assert torch.equal(sinusoids.table, SinusoidalPositionalEncoding(32, max_len=64).table)
