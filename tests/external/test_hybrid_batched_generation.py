"""Batched, left-padded generation on models whose layers hold different lengths: hybrids whose layer 0 is a
linear layer (Qwen3-Next's and Kimi Linear's default layouts, MiniMax-01's real one) and Qwen2 with a sliding window
on some layers only. Each layer reads the attention mask's columns its cache attends; the batch gives transformers'
greedy tokens and each row its prompt's alone."""

from __future__ import annotations

import shutil

import pytest

transformers = pytest.importorskip("transformers")

from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from hybrid_checks import assert_same_padded_greedy_tokens, saved_checkpoint, tiny_config  # noqa: E402

LINEAR_FIRST = ["linear_attention", "full_attention", "linear_attention", "full_attention"]


@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear", "minimax"])
def test_a_linear_first_hybrid_generates_a_left_padded_batch_as_transformers_does(family):
    config = tiny_config(family, layer_types=LINEAR_FIRST, **({"mlp_layer_types": ["dense"] + ["sparse"] * 3}
                                                               if family == "kimi_linear" else {}))
    theirs, folder = saved_checkpoint(lambda: transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager"))
    try:
        ours = load_hf_folder(folder)
        # transformers' MiniMax decodes a padded batch's lightning layers without the mask (its rows then differ from
        # the same prompts alone, while its padded prompt's logits equal attnkit's): compared with its rows alone
        assert_same_padded_greedy_tokens(ours, theirs, theirs_padded=family != "minimax")
    finally:
        shutil.rmtree(folder)


def test_qwen2_with_a_window_on_some_layers_generates_a_left_padded_batch_as_transformers_does():
    """Layers 0 and 1 full, 2 and 3 windowed (max_window_layers=2, window 4): the windowed layers' rolling caches
    hold fewer keys than the full ones' after a few steps."""
    config = transformers.Qwen2Config(vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=128,
                                      use_sliding_window=True, sliding_window=4, max_window_layers=2, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2)
    theirs, folder = saved_checkpoint(lambda: transformers.Qwen2ForCausalLM._from_config(
        config, attn_implementation="eager"))
    try:
        ours = load_hf_folder(folder)
        assert_same_padded_greedy_tokens(ours, theirs, new=10)
    finally:
        shutil.rmtree(folder)
