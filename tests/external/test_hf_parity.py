"""attnkit models against Hugging Face transformers' (code nobody here wrote): tiny randomly
initialised BERT, GPT-2, Llama with grouped-query attention and Mistral with a sliding window
shorter than the sequence; state dicts copied across; fp32 max abs error <= 1e-4, and float64 to 1e-10 with the
steps transformers rounds to float32 kept in float64 (float64_checks)."""

from __future__ import annotations

import pytest
import torch

from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderModel
from attnkit.models.pretrained import config_from_hf, load_hf_safetensors, load_hf_state_dict, save_hf_safetensors

transformers = pytest.importorskip("transformers")

from float64_checks import in_dtype  # noqa: E402

ATOL = 1e-4
TOLERANCE = {torch.float32: ATOL, torch.float64: 1e-10}  # float64: transformers' float32 steps kept in float64
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])


def _hf_bert():
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64, attn_implementation="eager")
    return transformers.BertModel(config).eval()


def _hf_decoder(kind: str):
    common = dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, intermediate_size=64,
                  max_position_embeddings=128, attn_implementation="eager")
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=101, n_embd=48, n_layer=2, n_head=6, n_positions=64,
                                         attn_implementation="eager")
        return transformers.GPT2LMHeadModel(config).eval()
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, rope_theta=5000.0,
                                                                      **common)).eval()
    return transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=3, sliding_window=5,
                                                                      **common)).eval()


def _randomise(model, seed: int = 0) -> None:
    """Random weights everywhere (norm weights and biases included), so nothing matches by default."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2 + (1.0 if p.dim() == 1 and "norm" in str(p) else 0.0))


@DTYPES
def test_bert_hidden_states_and_pooler_equal_transformers_with_padding(dtype, rng):
    hf = _hf_bert()
    _randomise(hf)
    ours = EncoderModel(config_from_hf(hf.config.to_dict())).eval()
    load_hf_state_dict(ours, hf.state_dict(), "bert")
    ours = ours.to(dtype)
    ids = torch.randint(0, 99, (3, 13), generator=rng)
    mask = torch.ones(3, 13, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    types = (torch.arange(13) >= 6).long().expand(3, 13)
    with torch.no_grad():
        got = ours(ids, mask, types)
        with in_dtype(dtype, [hf], {}) as ([theirs], _):
            expected = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
    keep = mask.bool()
    assert got.hidden_states.dtype == dtype
    assert (got.hidden_states - expected.last_hidden_state)[keep].abs().max() <= TOLERANCE[dtype]
    assert (got.pooled - expected.pooler_output).abs().max() <= TOLERANCE[dtype]


def _decoder_pair(kind: str):
    """(transformers' decoder with random weights, attnkit's DecoderLM loaded from its state dict)."""
    hf = _hf_decoder(kind)
    _randomise(hf, seed=1)
    if kind == "gpt2":
        hf.lm_head.weight = hf.transformer.wte.weight
    ours = DecoderLM(config_from_hf(hf.config.to_dict())).eval()
    if kind == "mistral":
        assert ours.config.window == 5  # shorter than the 17-token sequence below
    load_hf_state_dict(ours, hf.state_dict(), "gpt2" if kind == "gpt2" else "llama")
    return hf, ours


@DTYPES
@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral"])
def test_decoder_logits_equal_transformers(rng, kind, dtype):
    hf, ours = _decoder_pair(kind)
    ours = ours.to(dtype)
    ids = torch.randint(0, 101, (2, 17), generator=rng)
    mask = torch.ones(2, 17, dtype=torch.long)
    mask[1, 11:] = 0  # right padding
    with torch.no_grad():
        got = ours(ids, mask)
        with in_dtype(dtype, [hf], {}) as ([theirs], _):
            expected = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    keep = mask.bool()
    assert got.logits.dtype == dtype
    assert (got.logits - expected.logits)[keep].abs().max() <= TOLERANCE[dtype]
    assert (got.hidden_states - expected.hidden_states[-1])[keep].abs().max() <= TOLERANCE[dtype]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_saving_back_under_hf_names_loads_into_transformers(tmp_path, rng, kind):
    hf = _hf_decoder(kind)
    ours = DecoderLM(config_from_hf(hf.config.to_dict())).eval()
    _randomise(ours, seed=2)
    save_hf_safetensors(ours, tmp_path / "model.safetensors", "gpt2" if kind == "gpt2" else "llama")
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "model.safetensors")
    if kind == "gpt2":
        result = hf.transformer.load_state_dict(saved, strict=False)
    else:  # LlamaForCausalLM: the base model under "model.", the untied output layer beside it
        result = hf.load_state_dict({k if k == "lm_head.weight" else f"model.{k}": v for k, v in saved.items()},
                                    strict=False)
    assert not result.unexpected_keys and all(k.endswith(("attn.bias", "masked_bias")) for k in result.missing_keys)
    ids = torch.randint(0, 101, (1, 9), generator=rng)
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - ours(ids).logits).abs().max() <= ATOL
    again = DecoderLM(ours.config)
    load_hf_safetensors(again, tmp_path / "model.safetensors", "gpt2" if kind == "gpt2" else "llama")
    for a, b in zip(again.state_dict().values(), ours.state_dict().values()):
        assert torch.equal(a, b)


def test_mismatched_weights_name_the_tensor_and_both_shapes():
    hf = _hf_decoder("llama")
    ours = DecoderLM(config_from_hf(hf.config.to_dict()))
    state = dict(hf.state_dict())
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(60, 48)
    del state["model.norm.weight"]
    state["model.layers.0.extra.weight"] = torch.zeros(2)
    with pytest.raises(ValueError) as error:
        load_hf_state_dict(ours, state, "llama")
    text = str(error.value)
    assert "tensor 'layers.1.mlp.up_proj.weight': expected shape (64, 48), found (60, 48)" in text
    assert "missing tensor 'norm.weight' (expected shape (48,))" in text
    assert "unexpected tensor 'layers.0.extra.weight' (shape (2,))" in text


def test_llama_style_biases_survive_save_and_load_both_ways(tmp_path, rng):
    from attnkit.models.config import DecoderConfig

    config = DecoderConfig(vocab_size=101, d_model=48, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=64,
                           positional="rope", norm="rmsnorm", mlp="swiglu", bias=True, tie_embeddings=False)
    ours = DecoderLM(config).eval()
    _randomise(ours, seed=5)
    save_hf_safetensors(ours, tmp_path / "model.safetensors", "llama")
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "model.safetensors")
    assert sum(name.endswith(".bias") for name in saved) == 2 * 7  # q, k, v, o, gate, up, down per layer
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
        intermediate_size=64, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5)).eval()
    result = hf.load_state_dict({k if k == "lm_head.weight" else f"model.{k}": v for k, v in saved.items()}, strict=False)
    assert not result.unexpected_keys and not result.missing_keys
    ids = torch.randint(0, 101, (1, 9), generator=rng)
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - ours(ids).logits).abs().max() <= ATOL
    again = DecoderLM(config)
    load_hf_safetensors(again, tmp_path / "model.safetensors", "llama")
    for name, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_a_model_tensor_without_a_hf_name_is_refused_not_dropped(tmp_path):
    ours = DecoderLM(config_from_hf(_hf_decoder("llama").config.to_dict()))
    ours.layers[0].register_parameter("extra_scale", torch.nn.Parameter(torch.ones(3)))
    with pytest.raises(ValueError, match="no Hugging Face name for \\['layers.0.extra_scale'\\]"):
        save_hf_safetensors(ours, tmp_path / "model.safetensors", "llama")
    with pytest.raises(ValueError, match="layers.0.extra_scale"):
        load_hf_state_dict(ours, _hf_decoder("llama").state_dict(), "llama")


@pytest.mark.parametrize("kind", ["masked-lm", "no-pooler"])
def test_bert_checkpoints_of_task_models_and_without_pooler_load(tmp_path, rng, kind):
    from attnkit.models.pretrained import load_hf_folder

    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64)
    if kind == "masked-lm":
        hf = transformers.BertForMaskedLM(config).eval()
        base = hf.bert
    else:
        hf = base = transformers.BertModel(config, add_pooling_layer=False).eval()
    _randomise(hf, seed=6)
    hf.save_pretrained(tmp_path)
    ours = load_hf_folder(tmp_path)
    assert ours.pooler is None
    ids = torch.randint(0, 99, (2, 11), generator=rng)
    with torch.no_grad():
        assert (ours(ids).hidden_states - base(input_ids=ids).last_hidden_state).abs().max() <= ATOL
    if kind == "masked-lm":
        from safetensors.torch import load_file

        skipped = load_hf_state_dict(EncoderModel(ours.config), load_file(tmp_path / "model.safetensors"), "bert")
        assert skipped and all(name.startswith("cls.") for name in skipped)
    with pytest.raises(ValueError, match="missing tensor 'pooler.dense.weight'"):
        load_hf_state_dict(EncoderModel(config_from_hf(config.to_dict())), base.state_dict(), "bert")
