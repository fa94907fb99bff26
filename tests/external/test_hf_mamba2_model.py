"""attnkit's native Mamba-2 (``attnkit.models.mamba2``) loaded from a transformers checkpoint by the one loader: the
same logits as transformers' Mamba2ForCausalLM (float32, a batch as it is and left-padded; float64 to 1e-10 with
transformers' float32 steps kept in float64), the same greedy tokens, cached decoding equal to one pass, every
layer's implicit attention, and config keys it does not implement refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.mamba2 import Mamba2LM  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_same_greedy_tokens,
    assert_same_logits,
    cached_decoding_equals_one_pass,
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module")
def checkpoint():
    config = tiny_config("mamba2")
    theirs, folder = saved_checkpoint(lambda: transformers.Mamba2ForCausalLM(config))
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_one_loader_gives_transformers_logits_padded_or_not(checkpoint):
    theirs, folder = checkpoint
    ours = load_hf_folder(folder)
    assert isinstance(ours, Mamba2LM)
    assert_same_logits(ours, theirs, tol=2e-4)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64(checkpoint):
    theirs, folder = checkpoint
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_greedy_generation_gives_transformers_tokens(checkpoint):
    theirs, folder = checkpoint
    assert_same_greedy_tokens(load_hf_folder(folder), theirs, new=10)


def test_cached_decoding_equals_one_pass_and_every_layer_has_its_implicit_attention(checkpoint):
    _, folder = checkpoint
    ours = load_hf_folder(folder, dtype=torch.float64)
    cached_decoding_equals_one_pass(ours)
    attentions = ours(torch.randint(3, 60, (1, 9)), need_weights=True).attentions
    assert len(attentions) == 3 and all(a.shape == (1, 4, 9, 9) and (a.triu(1) == 0).all() for a in attentions)


def test_a_key_attnkit_does_not_implement_is_refused(checkpoint, tmp_path):
    _, folder = checkpoint
    config = json.loads(open(f"{folder}/config.json").read())
    config["hidden_act"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="hidden_act"):
        load_hf_folder(tmp_path)
    config["hidden_act"], config["num_heads"] = "silu", 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="num_heads x head_dim"):
        load_hf_folder(tmp_path)


def test_a_left_padded_batch_generates_as_each_prompt_alone_and_as_transformers(checkpoint):
    from hybrid_checks import assert_same_padded_greedy_tokens

    theirs, folder = checkpoint
    assert_same_padded_greedy_tokens(load_hf_folder(folder), theirs)
