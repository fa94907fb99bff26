"""Tiny random checkpoints of every decoder family attnkit serves, saved by transformers and loaded natively: what
the serving tests (tests/external/test_serving_families.py) and the serving benchmark share."""

from __future__ import annotations

import copy
import warnings

import torch

from attnkit.models.pretrained import load_hf_folder

from hybrid_checks import tiny_config

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "deepseek_v3", "deepseek_v32", "qwen3_next", "qwen3_5_text",
            "kimi_linear", "minimax", "mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1")
"""Every native decoder family: the dense ones (Mistral with a sliding window on every layer, Qwen2 on some), the
latent ones (DeepSeek-V3 and V3.2 with its indexer), the hybrids of linear and softmax attention, the Mamba-2 ones."""

VOCAB = 60


def family_config(family: str):
    """transformers' config of ``family``'s tiny model: width 32, a vocabulary of 60, room for 512 positions."""
    import transformers

    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    dense = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=48, max_position_embeddings=512, **ids)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=512, **ids)
    if family == "llama":
        return transformers.LlamaConfig(**dense)
    if family == "mistral":
        return transformers.MistralConfig(**dense, sliding_window=7)
    if family == "qwen2":  # the first layer full attention, the others a window of 7
        return transformers.Qwen2Config(**(dense | dict(num_hidden_layers=3)), use_sliding_window=True, sliding_window=7,
                                        max_window_layers=1)
    if family in ("deepseek_v3", "deepseek_v32"):
        sparse = dict(index_n_heads=4, index_head_dim=8, index_topk=6) if family == "deepseek_v32" else {}
        Config = transformers.DeepseekV32Config if family == "deepseek_v32" else transformers.DeepseekV3Config
        return Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                      intermediate_size=40, moe_intermediate_size=12, first_k_dense_replace=1, n_routed_experts=8,
                      n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                      max_position_embeddings=512, **ids, **sparse)
    if family == "qwen3_next":
        return tiny_config(family, max_position_embeddings=512)
    return tiny_config(family)


def family_checkpoint(family: str, folder):
    """(transformers' model, attnkit's model loaded from the folder transformers saved it to), eval mode, float32;
    the weights moved from their initialisation (the decay rates, ``A_log``, left), so that the tokens differ."""
    import transformers

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_config(family_config(family), attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "A_log" not in name:
                p.add_(0.2 * torch.randn_like(p))
    theirs.save_pretrained(folder)
    return theirs, load_hf_folder(folder)


def transformers_greedy(theirs, prompt: list[int], new: int) -> list[int]:
    """transformers' ``new`` greedy tokens after ``prompt``, its end token a token like any other."""
    config = copy.deepcopy(theirs.generation_config)
    config.eos_token_id, config.pad_token_id = theirs.config.vocab_size, 0  # (never generated)
    with torch.no_grad():
        out = theirs.generate(torch.tensor([prompt]), generation_config=config, max_new_tokens=new, do_sample=False)
    return out[0, len(prompt):].tolist()
