"""GGUF files (llama.cpp) -> attnkit: a Llama-architecture file's tensors dequantised with the
``gguf`` package (llama.cpp's q/k row permutation undone) into a :class:`DecoderLM`, and its
byte-level BPE tokenizer rebuilt from the GGUF vocabulary. Reading never executes code."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from .._progress import progress_bar
from ..errors import InputError
from .config import DecoderConfig
from .decoder import DecoderLM
from .hf_names import load_hf_state_dict

__all__ = ["load_gguf", "gguf_tokenizer"]


def _unpermute(weight: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's row permutation of q/k weights (interleaved -> half-split RoPE pairs)."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


_GGUF_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def read_gguf(path: str | os.PathLike):
    """The ``gguf`` package's reader of the GGUF file at ``path``: FileNotFoundError where there is no such file,
    InputError naming the file where the package cannot read it."""
    try:
        import gguf
    except ImportError as error:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'attnkit[models]'") from error
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as error:  # the gguf package raises ValueError, struct.error, IndexError... on a bad file
        raise InputError(f"{path}: not a readable GGUF file ({type(error).__name__}: {error})") from error


def load_gguf(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, progress: bool = False):
    """(DecoderLM, tokenizers.Tokenizer, Hugging Face-named state dict) from a Llama-architecture
    GGUF file; quantised tensors are dequantised with the ``gguf`` package."""
    reader = read_gguf(path)
    import gguf
    import numpy as np

    def field(name: str, default=None):
        value = reader.fields.get(name)
        return default if value is None else value.contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise InputError(f"{path}: only the llama architecture is supported, got {arch!r}")
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    state: dict[str, Tensor] = {}
    for tensor in progress_bar(reader.tensors, progress=progress, desc="dequantising", unit="tensor"):
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
    return model.eval(), gguf_tokenizer(field), state


def gguf_tokenizer(field):
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
