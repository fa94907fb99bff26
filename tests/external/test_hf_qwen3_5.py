"""Qwen3.5's text models (``qwen3_5_text``, dense, and ``qwen3_5_moe_text``) loaded by the one loader into attnkit's
Qwen3-Next decoder: their four Gated DeltaNet projections regrouped into Qwen3-Next's two, the same logits as
transformers' Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (a left-padded batch too; float32, as transformers computes
the rule, and float64 to 1e-10 with transformers' float32 steps kept in float64) and the same greedy tokens through
the mixed cache."""

from __future__ import annotations

import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.pretrained import load_hf_folder  # noqa: E402
from attnkit.models.qwen3_next import Qwen3NextLM  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_same_greedy_tokens,
    assert_same_logits,
    saved_checkpoint,
)

SIZES = dict(vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
             linear_value_head_dim=6, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])


@pytest.fixture(scope="module", params=["dense", "moe"])
def checkpoint(request):
    if request.param == "dense":
        config = transformers.Qwen3_5TextConfig(intermediate_size=48, **SIZES)
        cls = transformers.Qwen3_5ForCausalLM
    else:
        config = transformers.Qwen3_5MoeTextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                   shared_expert_intermediate_size=16, **SIZES)
        cls = transformers.Qwen3_5MoeForCausalLM
    theirs, folder = saved_checkpoint(lambda: cls(config), keep=())
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_one_loader_gives_transformers_logits_padded_or_not(checkpoint):
    theirs, folder = checkpoint
    ours = load_hf_folder(folder)
    assert isinstance(ours, Qwen3NextLM)
    assert_same_logits(ours, theirs, tol=2e-4)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64(checkpoint):
    theirs, folder = checkpoint
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_greedy_generation_gives_transformers_tokens(checkpoint):
    theirs, folder = checkpoint
    assert_same_greedy_tokens(load_hf_folder(folder), theirs, new=10)
