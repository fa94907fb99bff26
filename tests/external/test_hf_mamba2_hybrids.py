"""What attnkit's native Mamba-2 models each give against transformers (Mamba-2, Bamba, Granite 4.0-H, Nemotron-H,
Falcon-H1), loaded from a tiny checkpoint saved by transformers through the one loader: the same logits as its
``*ForCausalLM`` (float32, a batch as it is and left-padded; float64 to 1e-10 with transformers' float32 steps kept in
float64), the same greedy tokens (a left-padded batch as each prompt alone), decoding through the caches equal to
one pass, and every layer that mixes tokens with its causal attention. What each family adds (multipliers, tensor
names, refusals) is tested in its own file."""

from __future__ import annotations

import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.falcon_h1 import FalconH1LM  # noqa: E402
from attnkit.models.granite import GraniteHybridLM  # noqa: E402
from attnkit.models.hybrid import FEED_FORWARD_ONLY  # noqa: E402
from attnkit.models.mamba2 import Mamba2LM  # noqa: E402
from attnkit.models.nemotron_h import NemotronHLM  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_same_greedy_tokens,
    assert_same_logits,
    assert_same_padded_greedy_tokens,
    cached_decoding_equals_one_pass,
    saved_checkpoint,
    tiny_config,
)

CHECKPOINTS = {  # name: (transformers' model, the tiny config's family and overrides, attnkit's model)
    "mamba2": ("Mamba2ForCausalLM", "mamba2", {}, Mamba2LM),
    "bamba": ("BambaForCausalLM", "bamba", {}, GraniteHybridLM),
    "granite-4.0-h": ("GraniteMoeHybridForCausalLM", "granitemoehybrid", {}, GraniteHybridLM),
    "granite-rope-dense": ("GraniteMoeHybridForCausalLM", "granitemoehybrid", dict(
        num_local_experts=0, position_embedding_type="rope", embedding_multiplier=1.0, residual_multiplier=1.0,
        attention_multiplier=1.0, logits_scaling=1.0,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"]), GraniteHybridLM),
    "nemotron-h-latent": ("NemotronHForCausalLM", "nemotron_h", {}, NemotronHLM),
    "nemotron-h-plain": ("NemotronHForCausalLM", "nemotron_h", dict(moe_latent_size=None), NemotronHLM),
    "falcon-h1-norm-then-gate": ("FalconH1ForCausalLM", "falcon_h1", dict(mamba_norm_before_gate=True), FalconH1LM),
    "falcon-h1-gate-then-norm": ("FalconH1ForCausalLM", "falcon_h1", dict(mamba_norm_before_gate=False), FalconH1LM),
    "falcon-h1-no-norm": ("FalconH1ForCausalLM", "falcon_h1", dict(mamba_rms_norm=False), FalconH1LM),
}


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request):
    model, family, overrides, ours = CHECKPOINTS[request.param]
    config = tiny_config(family, **overrides)
    theirs, folder = saved_checkpoint(lambda: getattr(transformers, model)(config))
    yield theirs, folder, ours
    shutil.rmtree(folder, ignore_errors=True)


def test_the_one_loader_gives_transformers_logits_padded_or_not(checkpoint):
    theirs, folder, kind = checkpoint
    ours = load_hf_folder(folder)
    assert type(ours) is kind
    assert_same_logits(ours, theirs, tol=2e-4)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64(checkpoint):
    theirs, folder, _ = checkpoint
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_greedy_generation_gives_transformers_tokens(checkpoint):
    theirs, folder, _ = checkpoint
    assert_same_greedy_tokens(load_hf_folder(folder), theirs, new=10)


def test_a_left_padded_batch_generates_as_each_prompt_alone_and_as_transformers(checkpoint):
    theirs, folder, _ = checkpoint
    assert_same_padded_greedy_tokens(load_hf_folder(folder), theirs)


def test_cached_decoding_equals_one_pass_and_every_mixing_layer_has_causal_attention(checkpoint):
    _, folder, _ = checkpoint
    ours = load_hf_folder(folder, dtype=torch.float64)
    cached_decoding_equals_one_pass(ours)
    attentions = ours(torch.randint(3, 60, (1, 9)), need_weights=True).attentions
    assert len(attentions) == len(ours.layers)
    for block, a in zip(ours.layers, attentions):
        if block.kind in FEED_FORWARD_ONLY:
            assert a is None
        else:  # (B, heads, L, L): a Mamba-2 layer's implicit attention or a softmax layer's weights, causal
            assert a.shape[0] == 1 and a.shape[2:] == (9, 9) and (a.triu(1) == 0).all(), block.kind


CONFIG_READERS = {  # the families whose configs keep time_step_limit: config reader, tiny config family
    "mamba2": ("attnkit.models.mamba2", "mamba2_config_from_hf", "mamba2"),
    "bamba": ("attnkit.models.granite", "granite_hybrid_config_from_hf", "bamba"),
    "granitemoehybrid": ("attnkit.models.granite", "granite_hybrid_config_from_hf", "granitemoehybrid"),
    "falcon_h1": ("attnkit.models.falcon_h1", "falcon_h1_config_from_hf", "falcon_h1"),
}


@pytest.mark.parametrize("family", CONFIG_READERS)
def test_each_family_reads_time_step_limit_and_refuses_a_malformed_one(family):
    """models.mamba2.dt_limit_from_hf, shared: [low, high] read as floats, null as no limit, anything else refused
    by name in the family's own words."""
    import importlib

    from attnkit.models.hf_config import UnsupportedConfigError

    module, reader, tiny = CONFIG_READERS[family]
    read = getattr(importlib.import_module(module), reader)
    hf = tiny_config(tiny).to_dict()
    assert read(hf | {"time_step_limit": [0.01, 5]}).dt_limit == (0.01, 5.0)
    assert read(hf | {"time_step_limit": None}).dt_limit == (0.0, float("inf"))
    for bad in ([0.1], "0.1, 2", [0.1, "two"]):
        with pytest.raises(UnsupportedConfigError, match=f"{family} config: time_step_limit"):
            read(hf | {"time_step_limit": bad})
