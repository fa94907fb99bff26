"""Composite transformers models and the family guard on every route to attnkit.

A composite model (an image-text model: gemma3, llava, qwen2_vl) is one config with sub-configs, one
per tower. Asked through the dict form, ``{"text_config": "attnkit"}``, the text tower of a verified
family runs on attnkit and equals eager (logits, loss with left padding, every gradient, every
attention weight, greedy ids; and in float64 to 1e-12, float64_checks), attnkit's attention called; an unverified tower (siglip, clip, the
qwen2_vl vision tower) is refused by name whatever the route (construction, set_attn_implementation
with a string or a dict, a config set by hand and then called), and a refused
``set_attn_implementation`` leaves the model as it was. A family whose attention does not go through
transformers' interface (bloom) is refused rather than left on eager, and "attnkit" before
``register()`` says to call it.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.hf  # noqa: E402
from attnkit.hf import VERIFIED_FAMILIES, UnsupportedFeature, UnverifiedFamily  # noqa: E402

from float64_checks import in_dtype  # noqa: E402
from hf_families import counting_calls  # noqa: E402

ATOL = 1e-4
_TEXT = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64)
_VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=28,
               patch_size=14)


def _gemma3():
    return transformers.Gemma3Config(text_config=_TEXT | dict(head_dim=8, sliding_window=5), vision_config=_VISION,
                                     mm_tokens_per_image=4, image_token_index=299, boi_token_index=297,
                                     eoi_token_index=298)


def _llava():
    return transformers.LlavaConfig(text_config=_TEXT | dict(model_type="llama"),
                                    vision_config=_VISION | dict(model_type="clip_vision_model", projection_dim=32),
                                    image_token_index=299)


def _qwen2_vl():
    return transformers.Qwen2VLConfig(
        text_config=_TEXT | dict(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, in_channels=3, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2))


# composite: (config, model class, text tower's model_type, vision tower's model_type)
COMPOSITES = {
    "gemma3": (_gemma3, "Gemma3ForConditionalGeneration", "gemma3_text", "siglip_vision_model"),
    "llava": (_llava, "LlavaForConditionalGeneration", "llama", "clip_vision_model"),
    "qwen2_vl": (_qwen2_vl, "Qwen2VLForConditionalGeneration", "qwen2_vl_text", "qwen2_vl_vision"),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()


def _eager(name: str):
    make, model_name, _, _ = COMPOSITES[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, model_name)._from_config(make(), attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


def _implementations(model) -> dict[str, str]:
    return {key: getattr(model.config, key)._attn_implementation for key in model.config.sub_configs
            if getattr(model.config, key) is not None} | {"": model.config._attn_implementation}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_a_verified_text_tower_runs_on_attnkit_through_the_dict_form_and_equals_eager(name, dtype, rng):
    """Logits, loss, every attention weight and gradient of a left-padded batch (and, in float32, greedy ids); in
    float64 with transformers' float32 steps kept in float64 (float64_checks.in_dtype), to 1e-12."""
    _, _, text, _ = COMPOSITES[name]
    assert text in VERIFIED_FAMILIES
    eager = _eager(name)
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation({"text_config": attnkit.hf.IMPLEMENTATION})
    assert _implementations(ours)["text_config"] == attnkit.hf.IMPLEMENTATION
    ids = torch.randint(3, 290, (2, 13), generator=rng)
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :4] = 0  # left padding, the first real label kept: its row has no key
    labels = ids.masked_fill(mask == 0, -100)
    tolerance = {torch.float32: ATOL, torch.float64: 1e-12}[dtype]
    results = []
    with in_dtype(dtype, [eager, ours], {}) as (models, _):
        for model in models:
            model.zero_grad()
            with counting_calls() as calls:
                out = model(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
            (out.loss + 0.01 * out.logits.sum()).backward()
            results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, calls[0]))
    (theirs, their_grads, _), (mine, my_grads, calls) = results
    assert calls > 0 and mine.logits.dtype == dtype
    assert (theirs.logits - mine.logits).abs().max() <= tolerance
    assert abs(theirs.loss.item() - mine.loss.item()) <= tolerance
    for a, b in zip(theirs.attentions, mine.attentions):
        assert (a - b).abs().max() <= tolerance
    assert set(their_grads) == set(my_grads)
    for key, grad in their_grads.items():
        assert (grad - my_grads[key]).abs().max() <= tolerance * max(1.0, float(grad.abs().max())), key
    if dtype == torch.float64:
        return
    with torch.no_grad(), counting_calls() as calls:
        want = eager.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        got = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(want, got) and calls[0] > 0


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_unverified_towers_are_refused_by_name_on_every_route_and_nothing_changes(name):
    make, model_name, text, vision = COMPOSITES[name]
    model = _eager(name)
    before = _implementations(model)
    for request, family in (({"vision_config": "attnkit"}, vision), ("attnkit", name),
                            ({"text_config": "attnkit", "vision_config": "attnkit"}, vision)):
        if text not in VERIFIED_FAMILIES and request != "attnkit":
            family = text  # the unverified text tower is met first
        with pytest.raises(UnverifiedFamily, match=f"model_type '{family}' is not a family"):
            model.set_attn_implementation(request)
        assert _implementations(model) == before  # all or nothing
    cls = getattr(transformers, model_name)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UnverifiedFamily, match=f"model_type '{vision}'"):
            cls._from_config(make(), attn_implementation={"text_config": "eager", "vision_config": "attnkit", "": "eager"})
        with pytest.raises(UnverifiedFamily, match=f"model_type '{name}'"):
            cls._from_config(make(), attn_implementation="attnkit")
        built = cls._from_config(make(), attn_implementation={"text_config": "attnkit", "vision_config": "eager",
                                                              "": "eager"})
    assert _implementations(built)["text_config"] == "attnkit"


def test_a_tower_set_by_hand_is_refused_when_its_attention_is_called():
    """The route round every load-time check, a config set by hand, meets the guard at the call."""
    model = _eager("llava")
    model.config.vision_config._attn_implementation_internal = attnkit.hf.IMPLEMENTATION
    pixels = torch.randn(1, 3, 28, 28)
    with pytest.raises(UnverifiedFamily, match="CLIPAttention: model_type 'clip_vision_model' is not a family"):
        model.model.vision_tower(pixels)


def test_a_family_outside_the_interface_is_refused_not_left_on_eager():
    config = transformers.BloomConfig(vocab_size=99, hidden_size=32, n_layer=1, n_head=4)
    model = transformers.BloomForCausalLM._from_config(config, attn_implementation="eager")
    with pytest.raises(UnsupportedFeature, match="BloomForCausalLM .*does not route its attention"):
        model.set_attn_implementation("attnkit")
    assert model.config._attn_implementation == "eager"


def test_attnkit_before_register_says_to_call_it(monkeypatch):
    from transformers import AttentionInterface

    monkeypatch.delitem(AttentionInterface._global_mapping, attnkit.hf.IMPLEMENTATION)
    config = transformers.LlamaConfig(**_TEXT)
    with pytest.raises(UnsupportedFeature, match=r"call attnkit\.hf\.register\(\) first"):
        transformers.LlamaForCausalLM._from_config(config, attn_implementation="attnkit")
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    with pytest.raises(UnsupportedFeature, match=r"call attnkit\.hf\.register\(\) first"):
        model.set_attn_implementation({"": "attnkit"})
