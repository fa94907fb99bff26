"""attnkit's native MiniMax-01 (``attnkit.models.minimax``) loaded from a transformers checkpoint folder by the one
loader: the same logits as transformers' MiniMaxForCausalLM (residual scales other than 1, a left-padded batch, a
sliding window), the same greedy tokens through its mixed cache (KV caches for the softmax layers, constant-size
states for the lightning layers), float64 decoding equal to one whole pass, and config keys it does not implement
refused by name. With transformers' float32 steps kept in float64 (its RMSNorm, eager softmax, router softmax,
rotary frequencies and lightning decay tables: ``hybrid_checks.float64_inside``), the two agree in float64 to
1e-10."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.layers import KVCache, LinearStateCache  # noqa: E402
from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.minimax import MiniMaxLM  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_a_call_of_no_token_is_empty,
    assert_same_greedy_tokens,
    assert_same_logits,
    cached_decoding_equals_one_pass,
    ids,
    saved_checkpoint,
    tiny_config,
)


def _checkpoint(**extra):
    config = tiny_config("minimax", **extra)
    return saved_checkpoint(lambda: transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"),
                            keep=())


@pytest.fixture(scope="module")
def checkpoint():
    theirs, folder = _checkpoint()
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_one_loader_gives_transformers_logits_padded_or_not(checkpoint):
    theirs, folder = checkpoint
    ours = load_hf_folder(folder)
    assert isinstance(ours, MiniMaxLM)
    assert_same_logits(ours, theirs, tol=5e-5)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64(checkpoint):
    theirs, folder = checkpoint
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_float64_decoding_through_the_mixed_cache_equals_one_whole_pass(checkpoint):
    _, folder = checkpoint
    cache = cached_decoding_equals_one_pass(load_hf_folder(folder, dtype=torch.float64))
    assert [type(c) for c in cache] == [KVCache, LinearStateCache, LinearStateCache, KVCache]


def test_greedy_generation_gives_transformers_tokens(checkpoint):
    theirs, folder = checkpoint
    assert_same_greedy_tokens(load_hf_folder(folder), theirs)


def test_a_sliding_window_equals_transformers():
    theirs, folder = _checkpoint(sliding_window=5)
    try:
        ours = load_hf_folder(folder)
        assert ours.config.window == 5
        tokens = ids(4, length=13)
        with torch.no_grad():
            torch.testing.assert_close(ours(tokens).logits, theirs(tokens).logits, rtol=5e-5, atol=5e-5)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("key, value", [("sliding_window_everywhere", 8), ("hidden_act", "gelu"),
                                        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0})])
def test_what_attnkit_does_not_implement_is_refused_by_name(checkpoint, tmp_path, key, value):
    _, folder = checkpoint
    config = json.loads(open(f"{folder}/config.json").read())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(f"{folder}/model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedConfigError, match=key if key != "rope_parameters" else "rope_type"):
        load_hf_folder(tmp_path)


def test_a_rolling_cache_with_a_padded_batch_decodes_as_one_whole_pass():
    """A sliding window: the softmax layers' caches keep the last `window` tokens; the mask of a step covers what
    they hold and the new token (attnkit's convention: S = held + new). float64, attnkit against itself."""
    _, folder = _checkpoint(sliding_window=5)
    try:
        ours = load_hf_folder(folder, dtype=torch.float64)
        tokens = ids(6)
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, :3] = 0
        with torch.no_grad():
            whole = ours(tokens, mask).logits
            cache = ours.new_cache()
            pieces = [ours(tokens[:, :6], mask[:, :6], cache=cache).logits]
            for t in range(6, 12):
                held = cache[0].length
                assert held == 5  # the window, whatever the position
                pieces.append(ours(tokens[:, t:t + 1], mask[:, t - held:t + 1], cache=cache).logits)
        real = mask.bool()
        torch.testing.assert_close(torch.cat(pieces, dim=1)[real], whole[real], rtol=1e-10, atol=1e-10)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_call_of_no_token_gives_empty_logits_and_leaves_the_caches_as_they_were(checkpoint):
    assert_a_call_of_no_token_is_empty(load_hf_folder(checkpoint[1]))


def test_through_the_bridge_a_linear_layer_0_generates_as_eager_and_a_padded_batch_is_refused_by_name():
    """MiniMax-Text-01's real layout (layer 0 linear) with attn_implementation="attnkit": transformers sizes the
    softmax layers' decoding masks from layer 0's cache, which counts no keys (one column). Unpadded, attnkit
    attends every key as eager's broadcast of that column does: the same greedy tokens as eager. A padded batch,
    where eager would attend the padded keys too, is refused by name."""
    import attnkit.hf

    attnkit.hf.register()
    config = tiny_config("minimax", layer_types=["linear_attention", "full_attention", "linear_attention",
                                                 "full_attention"])
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    bridged = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="attnkit").eval()
    bridged.load_state_dict(eager.state_dict())
    prompt = ids(5, batch=1, length=6)
    settings = dict(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        want = eager.generate(prompt, **settings)
        assert torch.equal(bridged.generate(prompt, **settings), want)
        padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), prompt], 1).expand(2, -1).clone()
        mask = torch.ones_like(padded)
        mask[0, :2] = 0
        with pytest.raises(attnkit.hf.UnsupportedFeature, match="MiniMax with a linear layer 0"):
            bridged.generate(padded, attention_mask=mask, **settings)
