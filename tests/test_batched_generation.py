"""Batched generation from prompts of different lengths (left padding, a mask, positions per row,
the KV cache): each row equals generating it alone, and the batch equals transformers' generate on
the same padded batch."""

from __future__ import annotations

import pytest
import torch

from attnkit.decoding import generate, pad_prompts
from attnkit.models.decoder import DecoderLM
from attnkit.models.pretrained import config_from_hf, load_hf_state_dict

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 9, 13, 2, 7, 30, 31], [4, 8], [11, 12, 13, 14, 15]]


def _pair(kind: str):
    common = dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, intermediate_size=64,
                  max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=101, n_embd=48, n_layer=2, n_head=6, n_positions=128,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
        hf = transformers.GPT2LMHeadModel(config)
    elif kind == "mistral":
        hf = transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=3, sliding_window=4,
                                                                       **common))
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **common))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator))
    hf.eval()
    ours = DecoderLM(config_from_hf(hf.config.to_dict())).eval()
    load_hf_state_dict(ours, hf.state_dict(), "gpt2" if kind == "gpt2" else "llama")
    return hf, ours


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mistral"])
def test_a_padded_batch_equals_each_prompt_alone_and_transformers(kind, use_cache):
    hf, ours = _pair(kind)
    ids, mask = pad_prompts(PROMPTS)
    batched = generate(ours, ids, attention_mask=mask, max_new_tokens=12, use_cache=use_cache).tokens
    for row, prompt in enumerate(PROMPTS):
        alone = generate(ours, torch.tensor([prompt]), max_new_tokens=12, use_cache=use_cache).tokens
        assert torch.equal(batched[row], alone[0]), row
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[:, ids.shape[1]:]  # no stop token: 12 each
    assert torch.equal(batched, theirs)


def test_right_padding_is_refused():
    _, ours = _pair("llama")
    with pytest.raises(ValueError, match="pad prompts on the left"):
        generate(ours, torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]), max_new_tokens=2)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mistral"])
def test_the_compiled_fixed_cache_step_gives_transformers_tokens_and_compiles_once(kind):
    """compile_step: fixed-size caches, one captured graph (aot_eager: no C++ compiler needed)
    for every decode step of a padded batch and of later calls; transformers' greedy tokens."""
    from torch._dynamo.utils import counters

    hf, ours = _pair(kind)
    ids, mask = pad_prompts(PROMPTS)
    torch._dynamo.reset()
    counters.clear()
    first = generate(ours, ids, attention_mask=mask, max_new_tokens=12, compile_step="aot_eager").tokens
    again = generate(ours, ids, attention_mask=mask, max_new_tokens=12, compile_step="aot_eager").tokens
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[:, ids.shape[1]:]
    assert torch.equal(first, theirs) and torch.equal(again, theirs)


@pytest.mark.slow
def test_compiled_steps_keep_their_caches_with_the_model_and_let_it_go():
    """A later call of the same shape decodes into the same cache tensors (zeroed: a captured CUDA
    graph and Dynamo's static addresses need them), another batch size gets new ones, and the
    kept caches do not keep the model alive."""
    import gc
    import weakref

    from attnkit import decoding

    _, ours = _pair("llama")
    ids, mask = pad_prompts(PROMPTS)
    generate(ours, ids, attention_mask=mask, max_new_tokens=3, compile_step="eager")
    key, caches = decoding._FIXED_CACHES[ours]
    storage = [t.data_ptr() for layer in caches for t in layer.tensors()]
    generate(ours, ids, attention_mask=mask, max_new_tokens=3, compile_step="eager")
    assert decoding._FIXED_CACHES[ours][1] is caches
    assert [t.data_ptr() for layer in caches for t in layer.tensors()] == storage
    generate(ours, ids[:2], attention_mask=mask[:2], max_new_tokens=3, compile_step="eager")
    assert decoding._FIXED_CACHES[ours][1] is not caches
    alive = weakref.ref(ours)
    del ours
    gc.collect()
    assert alive() is None
