"""Every key of every config class the loader accepts, walked: set to a plausible non-default value,
then either attnkit's logits equal transformers' (fp32, 1e-4) or loading raises
UnsupportedConfigError naming the key, its value and what is supported. Never a third outcome."""

from __future__ import annotations

import pytest
import torch

from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderModel
from attnkit.models.pretrained import UnsupportedConfigError, config_from_hf, load_hf_state_dict

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
TINY = {
    "bert": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=64),
    "gpt2": dict(vocab_size=101, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "llama": dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                  intermediate_size=64, max_position_embeddings=128),
}
TINY["mistral"] = TINY["llama"] | {"sliding_window": 5}
TINY["qwen2"] = TINY["llama"] | {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}
CLASSES = {"bert": ("BertConfig", "BertModel"), "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
           "llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
ROPE = [{"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8, "rope_theta": 500.0},
        {"rope_type": "default", "rope_theta": 123.0},
        {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 8},
        {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}]
ACTS = ["relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "quick_gelu", "gelu_fast"]
# Plausible non-default values for keys the generic rule (flip a bool, nudge a number) cannot make.
VALUES = {
    "any": {"transformers_version": ["4.0.0"], "architectures": [["SomethingForX"]], "dtype": ["bfloat16"],
            "id2label": [{0: "a", 1: "b", 2: "c"}], "label2id": [{"a": 0, "b": 1, "c": 2}],
            "problem_type": ["regression"], "_name_or_path": ["somewhere"], "pad_token_id": [3], "bos_token_id": [3],
            "eos_token_id": [4], "classifier_dropout": [0.3]},
    "bert": {"hidden_size": [48], "num_attention_heads": [8], "hidden_act": ACTS, "layer_norm_eps": [1e-3]},
    "gpt2": {"n_embd": [64], "n_head": [8], "n_inner": [50], "activation_function": ACTS,
             "layer_norm_epsilon": [1e-3], "summary_type": ["last"], "summary_activation": ["tanh"]},
    "llama": {"hidden_size": [60], "num_attention_heads": [4], "num_key_value_heads": [1, 6], "hidden_act": ACTS,
              "rms_norm_eps": [1e-3], "rope_parameters": ROPE, "head_dim": [16], "pretraining_tp": [2]},
}
VALUES["mistral"] = VALUES["llama"] | {"sliding_window": [3, None]}
VALUES["qwen2"] = VALUES["llama"] | {"sliding_window": [3], "max_window_layers": [0, 2],
                                     "layer_types": [["sliding_attention"] * 2, ["sliding_attention", "full_attention"]]}
# Values real checkpoints use: these must load (and equal transformers), not be refused.
MUST_LOAD = {
    ("bert", "hidden_act", v) for v in ("relu", "gelu_new", "silu", "gelu_pytorch_tanh")} | {
    ("gpt2", "activation_function", v) for v in ("relu", "gelu", "silu")} | {
    ("gpt2", "scale_attn_by_inverse_layer_idx", True), ("gpt2", "scale_attn_weights", False),
    ("gpt2", "tie_word_embeddings", False)} | {
    (f, k, v) for f in ("llama", "mistral", "qwen2") for k, v in (
        ("hidden_act", "gelu"), ("hidden_act", "relu"), ("tie_word_embeddings", True),
        ("rope_parameters", "linear"), ("rope_parameters", "llama3"), ("num_key_value_heads", 1))} | {
    ("llama", "head_dim", 16), ("mistral", "head_dim", 16)} | {
    ("llama", "attention_bias", True), ("llama", "mlp_bias", True), ("mistral", "sliding_window", 3),
    ("qwen2", "layer_types", "sliding"), ("qwen2", "sliding_window", 3), ("qwen2", "max_window_layers", 0)}


def _values(family: str, key: str, default) -> list:
    for table in (VALUES[family], VALUES["any"]):
        if key in table:
            return table[key]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default + 1]
    if isinstance(default, float):
        return [default + 0.1 if default < 0.5 else default / 2]
    raise AssertionError(f"{family}: no plausible value for config key {key!r} (default {default!r}): add one to VALUES")


def _cases():
    for family, (config_name, _) in CLASSES.items():
        defaults = getattr(transformers, config_name)(**TINY[family]).to_dict()
        for key, default in defaults.items():
            if key == "model_type":
                continue
            for value in _values(family, key, default):
                yield pytest.param(family, key, value, id=f"{family}-{key}-{value!r}"[:90])


def _randomise(model, generator):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))


def _label(key, value):
    if key == "rope_parameters":
        return value["rope_type"]
    if key == "layer_types":
        return "sliding"
    return repr(value) if isinstance(value, (list, dict)) else value


@pytest.mark.parametrize("family, key, value", list(_cases()))
def test_config_key_is_implemented_or_refused_by_name(family, key, value):
    config_name, model_name = CLASSES[family]
    hf_config = getattr(transformers, config_name)(**(TINY[family] | {key: value}))
    generator = torch.Generator().manual_seed(7)
    try:
        hf = getattr(transformers, model_name)(hf_config).float().eval()
    except ValueError:  # transformers cannot build it either: attnkit must not load it
        with pytest.raises(UnsupportedConfigError, match=key):
            config_from_hf(hf_config.to_dict())
        return
    _randomise(hf, generator)
    if getattr(hf.config, "tie_word_embeddings", False) and hasattr(hf, "lm_head"):
        hf.lm_head.weight = hf.get_input_embeddings().weight
    try:
        config = config_from_hf(hf.config.to_dict())
    except UnsupportedConfigError as error:
        text = str(error)
        assert (family, key, _label(key, value)) not in MUST_LOAD, f"refused a value real checkpoints use: {text}"
        assert key in text and "supported" in text, text
        if not isinstance(value, (dict, list)):
            assert repr(value) in text, text
        return
    model = (EncoderModel if family == "bert" else DecoderLM)(config).eval()
    load_hf_state_dict(model, hf.state_dict(), {"bert": "bert", "gpt2": "gpt2"}.get(family, "llama"))
    ids = torch.randint(0, hf.config.vocab_size, (2, 17), generator=generator)
    mask = torch.ones(2, 17, dtype=torch.long)
    mask[1, 12:] = 0
    with torch.no_grad():
        hf.config.return_dict = True  # return_dict=False breaks transformers' own GPT-2 and Llama forward
        expected = hf(input_ids=ids, attention_mask=mask, use_cache=False)[0]  # last_hidden_state or logits (return_dict or not)
        got = model(ids, mask)
    keep = mask.bool()
    error = ((got.hidden_states if family == "bert" else got.logits) - expected)[keep].abs().max().item()
    assert error <= ATOL, f"{family} {key}={value!r}: loaded without an error but logits differ by {error:.3g}"


def test_every_implemented_value_was_walked():
    walked = {(p.values[0], p.values[1], _label(p.values[1], p.values[2])) for p in _cases()}
    assert MUST_LOAD <= walked, sorted(MUST_LOAD - walked)


def test_unknown_keys_are_refused_unless_vouched_for():
    hf = transformers.LlamaConfig(**TINY["llama"]).to_dict() | {"fancy_new_norm": True}
    with pytest.raises(UnsupportedConfigError, match="unknown keys \\['fancy_new_norm'\\]"):
        config_from_hf(hf)
    assert config_from_hf(hf, ignore=["fancy_new_norm"]).d_model == 48
