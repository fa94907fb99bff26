"""attnkit as transformers' attention implementation: every family in attnkit.hf.FAMILIES, a tiny
random model of it run with attn_implementation="attnkit" against the same weights with "eager":
logits (or hidden states) with padding in the batch, the attention weights of every kind, and
greedy generation with the KV cache. The test list is the FAMILIES table itself."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.hf  # noqa: E402
from attnkit.hf import FAMILIES, UnsupportedFeature  # noqa: E402

ATOL = 1e-4
_DEC = dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=128)
_S2S = dict(vocab_size=101, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64)
# family: (config class, model class, tiny config, input kind)
TINY = {
    "bert": ("BertConfig", "BertModel", dict(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=37,
                                             max_position_embeddings=64), "encoder"),
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(vocab_size=99, hidden_size=32, num_hidden_layers=3,
                                                              num_attention_heads=4, intermediate_size=37,
                                                              max_position_embeddings=64, local_attention=8,
                                                              global_attn_every_n_layers=2, pad_token_id=0,
                                                              bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                                              sep_token_id=2), "encoder"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=101, n_embd=48, n_layer=2, n_head=6, n_positions=128,
                                                   bos_token_id=1, eos_token_id=2), "decoder"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _DEC, "decoder"),
    "mistral": ("MistralConfig", "MistralForCausalLM", _DEC | dict(sliding_window=5), "decoder"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DEC, "decoder"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _DEC | dict(head_dim=8), "decoder"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _DEC | dict(head_dim=8, sliding_window=5, attn_logit_softcapping=None,
                                                                final_logit_softcapping=None), "decoder"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", _DEC | dict(head_dim=8, sliding_window=5), "decoder"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _DEC | dict(pad_token_id=0, eos_token_id=2, bos_token_id=1), "decoder"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", _DEC | dict(pad_token_id=0, eos_token_id=2, bos_token_id=1),
                "decoder"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _DEC | dict(pad_token_id=0, eos_token_id=2), "decoder"),
    "bart": ("BartConfig", "BartForConditionalGeneration", _S2S, "seq2seq"),
    "marian": ("MarianConfig", "MarianMTModel", _S2S | dict(pad_token_id=0, decoder_start_token_id=0), "seq2seq"),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=101, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                                          num_heads=4, decoder_start_token_id=0), "seq2seq"),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", _S2S | dict(
        num_mel_bins=8, max_source_positions=16, max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=2, bos_token_id=1, begin_suppress_tokens=None, suppress_tokens=None), "speech"),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()
    attnkit.hf.register()  # idempotent


def _pair(family: str):
    """(eager model, attnkit model) with equal random weights (large enough to matter)."""
    config_name, model_name, tiny, _ = TINY[family]
    config = getattr(transformers, config_name)(**tiny)
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        models.append(getattr(transformers, model_name)._from_config(copy.deepcopy(config),
                                                                     attn_implementation=implementation).eval())
    eager, ours = models
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in eager.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    ours.load_state_dict(eager.state_dict())
    return eager, ours


def _inputs(kind: str, generator, *, left: bool = False):
    if kind in ("encoder", "decoder"):
        ids = torch.randint(3, 99, (2, 17), generator=generator)
        mask = torch.ones(2, 17, dtype=torch.long)
        if left:
            mask[1, :5] = 0
        else:
            mask[1, 12:] = 0
        return {"input_ids": ids, "attention_mask": mask}
    decoder = {"decoder_input_ids": torch.randint(3, 99, (2, 7), generator=generator)}
    if kind == "speech":
        return {"input_features": torch.randn(2, 8, 32, generator=generator)} | decoder
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0
    return {"input_ids": torch.randint(3, 99, (2, 11), generator=generator), "attention_mask": mask} | decoder


def test_the_tested_families_are_the_claimed_ones():
    assert sorted(TINY) == sorted(FAMILIES)


def test_readme_lists_every_claimed_family():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    for family in FAMILIES:
        assert f"| `{family}` |" in readme, family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_outputs_and_weights_equal_eager(family, rng):
    eager, ours = _pair(family)
    kind = TINY[family][3]
    inputs = _inputs(kind, rng)
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True)
        got = ours(**inputs, output_attentions=True)
    name = "last_hidden_state" if kind == "encoder" else "logits"
    difference = getattr(got, name) - getattr(expected, name)
    if kind in ("encoder", "decoder"):
        difference = difference[inputs["attention_mask"].bool()]  # padded positions are nobody's output
    assert difference.abs().max() <= ATOL
    kinds = ["attentions"] if kind in ("encoder", "decoder") else ["encoder_attentions", "decoder_attentions",
                                                                    "cross_attentions"]
    for what in kinds:
        theirs, mine = getattr(expected, what), getattr(got, what)
        assert len(mine) == len(theirs) > 0, what
        for a, b in zip(theirs, mine):
            assert b is not None and b.shape == a.shape
            # The unpadded example whole; of the padded one its real queries (a padded query with no
            # key left is a fully masked row: attnkit gives it zeros, eager a uniform row).
            assert (a[0] - b[0]).abs().max() <= ATOL, what
            real = 12 if kind in ("encoder", "decoder") else a.shape[2]
            assert (a[1, :, :real] - b[1, :, :real]).abs().max() <= ATOL, what


@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if TINY[f][3] in ("decoder", "seq2seq")))
def test_greedy_generation_equals_eager(family, rng):
    eager, ours = _pair(family)
    kind = TINY[family][3]
    inputs = _inputs(kind, rng, left=True)  # decoder-only generation pads on the left
    inputs.pop("decoder_input_ids", None)
    with torch.no_grad():
        expected = eager.generate(**inputs, max_new_tokens=20, do_sample=False, min_new_tokens=20)
        got = ours.generate(**inputs, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    assert torch.equal(got, expected)


def test_gemma2_softcapping_is_refused_by_name():
    config = transformers.Gemma2Config(**(_DEC | dict(head_dim=8, attn_logit_softcapping=50.0)))
    model = transformers.Gemma2ForCausalLM._from_config(config, attn_implementation=attnkit.hf.IMPLEMENTATION).eval()
    with pytest.raises(UnsupportedFeature, match="Gemma2Attention asks for attention logit softcapping"):
        model(input_ids=torch.tensor([[3, 4, 5]]))


def test_record_captures_only_the_chosen_heads_of_the_chosen_layers(rng):
    eager, ours = _pair("llama")
    inputs = _inputs("decoder", rng)
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True).attentions
        with attnkit.hf.record(ours, layers=[1], heads=[4, 0]) as recording:
            ours(**inputs)
    assert list(recording.weights) == ["model.layers.1.self_attn"]
    (weights,) = recording.weights["model.layers.1.self_attn"]
    assert weights.shape == (2, 2, 17, 17)
    keep = inputs["attention_mask"].bool()[:, None, :, None]
    assert ((weights - expected[1][:, [4, 0]]).abs() * keep).max() <= ATOL
    with pytest.raises(ValueError, match="attn_implementation='attnkit'"):
        with attnkit.hf.record(eager):
            pass


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_an_unpadded_sliding_window_runs_as_a_window_without_a_mask(family, rng, monkeypatch):
    eager, ours = _pair(family)
    seen = []
    real = attnkit.hf.attention

    def spy(q, k, v, **kwargs):
        seen.append((kwargs["mask"], kwargs["window"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attnkit.hf, "attention", spy)
    ids = torch.randint(3, 99, (2, 40), generator=rng)  # 40 tokens, window 5: no (L, S) mask is built
    with torch.no_grad():
        expected, got = eager(input_ids=ids).logits, ours(input_ids=ids).logits
    assert (got - expected).abs().max() <= ATOL
    assert all(mask is None for mask, _ in seen) and any(window == 5 for _, window in seen)


@pytest.mark.parametrize("family", ["llama", "mistral", "bert"])
def test_padding_travels_as_padding_not_as_an_l_by_s_mask(family, rng, monkeypatch):
    eager, ours = _pair(family)
    seen = []
    real = attnkit.hf.attention

    def spy(q, k, v, **kwargs):
        seen.append((None if kwargs["mask"] is None else tuple(kwargs["mask"].shape), kwargs["is_causal"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attnkit.hf, "attention", spy)
    ids = torch.randint(3, 99, (2, 24), generator=rng)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :7] = 0  # left padding
    with torch.no_grad():
        expected = (eager(input_ids=ids, attention_mask=mask)[0])
        got = ours(input_ids=ids, attention_mask=mask)[0]
    assert (got - expected)[mask.bool()].abs().max() <= ATOL
    assert seen and all(shape == (2, 1, 1, 24) for shape, _ in seen)
    assert all(causal == (family != "bert") for _, causal in seen)
