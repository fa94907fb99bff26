"""attnkit's native Qwen3-Next (``attnkit.models.qwen3_next``) loaded from a transformers checkpoint folder by the
one loader: the same logits as transformers' Qwen3NextForCausalLM (a left-padded batch too), the same greedy
tokens through its mixed cache (KV caches for the softmax layers, constant-size states for the Gated DeltaNet
layers), and a config key it does not implement refused by name. transformers computes the delta rule, its norms and
softmaxes in float32 whatever the model's dtype: with those steps kept in float64 (``hybrid_checks.float64_inside``)
the two agree in float64 to 1e-10."""

from __future__ import annotations

import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from attnkit.layers import KVCache, LinearStateCache  # noqa: E402
from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402
from attnkit.models.qwen3_next import Qwen3NextLM  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_a_call_of_no_token_is_empty,
    assert_same_greedy_tokens,
    assert_same_logits,
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module")
def checkpoint():
    config = tiny_config("qwen3_next")
    theirs, folder = saved_checkpoint(
        lambda: transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"), keep=())
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


def test_greedy_generation_through_the_mixed_cache_gives_transformers_tokens(checkpoint):
    theirs, folder = checkpoint
    ours = load_hf_folder(folder)
    assert_same_greedy_tokens(ours, theirs)
    kinds = [type(c) for c in ours.new_cache()]
    assert kinds == [LinearStateCache, LinearStateCache, LinearStateCache, KVCache]


def test_a_config_key_attnkit_does_not_implement_is_refused_by_name(checkpoint, tmp_path):
    _, folder = checkpoint
    config = json.loads(open(f"{folder}/config.json").read())
    config["sliding_window_everywhere"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(f"{folder}/model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedConfigError, match="sliding_window_everywhere"):
        load_hf_folder(tmp_path)


def test_a_config_without_the_sizes_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "vocab_size": 10}))
    with pytest.raises(UnsupportedConfigError, match="missing keys .*num_hidden_layers"):
        load_hf_folder(tmp_path)


def test_a_call_of_no_token_gives_empty_logits_and_leaves_the_caches_as_they_were(checkpoint):
    assert_a_call_of_no_token_is_empty(load_hf_folder(checkpoint[1]))
