"""What attnkit's native Falcon-H1 (``attnkit.models.falcon_h1``) adds to the checks every Mamba-2 model passes
(test_hf_mamba2_hybrids.py, its three norms among them): each layer's attention and Mamba-2 heads side by side,
cached columns NaN for the Mamba-2 heads, every muP multiplier read, and config keys refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.falcon_h1 import FalconH1LM, falcon_h1_config_from_hf  # noqa: E402
from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from hybrid_checks import (  # noqa: E402
    cached_decoding_equals_one_pass,
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module")
def checkpoint():
    theirs, folder = saved_checkpoint(lambda: transformers.FalconH1ForCausalLM(tiny_config("falcon_h1")))
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_cached_decoding_equals_one_pass_and_each_layer_has_both_kinds_of_heads(checkpoint):
    _, folder = checkpoint
    ours = load_hf_folder(folder, dtype=torch.float64)
    cached_decoding_equals_one_pass(ours)
    attentions = ours(torch.randint(3, 60, (1, 9)), need_weights=True).attentions
    assert len(attentions) == 3
    for a in attentions:  # 4 attention heads, then 4 Mamba-2 heads: each row of each a distribution or less
        assert a.shape == (1, 8, 9, 9) and (a.triu(1) == 0).all()
        torch.testing.assert_close(a[:, :4].sum(-1), torch.ones(1, 4, 9, dtype=a.dtype))
    cache = ours.new_cache()
    ours(torch.randint(3, 60, (1, 5)), cache=cache)
    step = ours(torch.randint(3, 60, (1, 2)), cache=cache, need_weights=True).attentions[0]
    assert step.shape == (1, 8, 2, 7) and step[:, 4:, :, :5].isnan().all() and not step[:, :4].isnan().any()


def test_every_multiplier_is_read(checkpoint):
    _, folder = checkpoint
    hf = json.loads(open(f"{folder}/config.json").read())
    loaded = load_hf_folder(folder)
    tokens = torch.randint(3, 60, (1, 7))
    base = loaded(tokens).logits
    for key, neutral in [("embedding_multiplier", 1.0), ("lm_head_multiplier", 1.0), ("key_multiplier", 1.0),
                         ("attention_in_multiplier", 1.0), ("attention_out_multiplier", 1.0),
                         ("ssm_in_multiplier", 1.0), ("ssm_out_multiplier", 1.0), ("mlp_multipliers", [1.0, 1.0]),
                         ("ssm_multipliers", [1.0] * 5)]:
        assert hf[key] != neutral, key
        model = FalconH1LM(falcon_h1_config_from_hf(hf | {key: neutral}))
        model.load_state_dict(loaded.state_dict())
        assert not torch.allclose(model.eval()(tokens).logits, base, atol=1e-4), key


@pytest.mark.parametrize("change, match", [
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(mamba_n_heads=5), "mamba_n_heads x mamba_d_head"),
    (dict(ssm_multipliers=[1.0, 1.0]), "ssm_multipliers"),
    (dict(some_new_key=1), "some_new_key"),
])
def test_what_attnkit_does_not_implement_is_refused_by_name(change, match):
    hf = tiny_config("falcon_h1").to_dict() | change
    with pytest.raises(UnsupportedConfigError, match=match):
        falcon_h1_config_from_hf(hf)
