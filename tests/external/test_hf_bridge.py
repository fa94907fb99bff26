"""attnkit as transformers' attention implementation, in detail for 16 hand-configured families (the
registry-wide walk is tests/external/test_hf_families.py): a tiny random model run with
attn_implementation="attnkit" against the same weights with "eager": logits (or hidden states)
with padding in the batch, the attention weights of every kind, greedy generation with the
dynamic and the static cache, a user's own 4D masks of both shapes (boolean and additive), packed
position_ids, Gemma 2's softcapping (its default config), gpt-oss's sinks, and the refusals. The outputs and
weights, the 4D masks, the softcapping and the sinks in float64 too, to 1e-12, with the steps transformers rounds to
float32 whatever the model's dtype kept in float64 (float64_checks)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.hf  # noqa: E402
from attnkit.hf import VERIFIED_FAMILIES, UnsupportedFeature, UnverifiedFamily  # noqa: E402

from float64_checks import float64_inside, in_dtype  # noqa: E402
from helpers import slow  # noqa: E402
from hf_families import counting_calls  # noqa: E402

ATOL = 1e-4
TOLERANCE = {torch.float32: ATOL, torch.float64: 1e-12}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
_DEC = dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=128)
_S2S = dict(vocab_size=101, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64)
# family: (config class, model class, tiny config, input kind)
TINY = {
    "bert": ("BertConfig", "BertModel", dict(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=37,
                                             max_position_embeddings=64), "encoder"),
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(vocab_size=99, hidden_size=32, num_hidden_layers=3,
                                                              num_attention_heads=4, intermediate_size=37,
                                                              max_position_embeddings=64, local_attention=8,
                                                              global_attn_every_n_layers=2, pad_token_id=0,
                                                              bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                                              sep_token_id=2), "encoder"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=101, n_embd=48, n_layer=2, n_head=6, n_positions=128,
                                                   bos_token_id=1, eos_token_id=2), "decoder"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _DEC, "decoder"),
    "mistral": ("MistralConfig", "MistralForCausalLM", _DEC | dict(sliding_window=5), "decoder"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DEC, "decoder"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _DEC | dict(head_dim=8), "decoder"),
    # Gemma 2 with its default softcapping (attention 50, final 30), made to matter by a small cap.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _DEC | dict(head_dim=8, sliding_window=5, attn_logit_softcapping=2.0),
               "decoder"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", _DEC | dict(head_dim=8, sliding_window=5), "decoder"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _DEC | dict(pad_token_id=0, eos_token_id=2, bos_token_id=1), "decoder"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", _DEC | dict(pad_token_id=0, eos_token_id=2, bos_token_id=1),
                "decoder"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _DEC | dict(pad_token_id=0, eos_token_id=2), "decoder"),
    "bart": ("BartConfig", "BartForConditionalGeneration", _S2S, "seq2seq"),
    "marian": ("MarianConfig", "MarianMTModel", _S2S | dict(pad_token_id=0, decoder_start_token_id=0), "seq2seq"),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(vocab_size=101, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                                          num_heads=4, decoder_start_token_id=0), "seq2seq"),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", _S2S | dict(
        num_mel_bins=8, max_source_positions=16, max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=2, bos_token_id=1, begin_suppress_tokens=None, suppress_tokens=None), "speech"),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()
    attnkit.hf.register()  # idempotent


def _pair(family: str):
    """(eager model, attnkit model) with equal random weights (large enough to matter)."""
    config_name, model_name, tiny, _ = TINY[family]
    config = getattr(transformers, config_name)(**tiny)
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        models.append(getattr(transformers, model_name)._from_config(copy.deepcopy(config),
                                                                     attn_implementation=implementation).eval())
    eager, ours = models
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in eager.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    ours.load_state_dict(eager.state_dict())
    return eager, ours


def _inputs(kind: str, generator, *, left: bool = False):
    if kind in ("encoder", "decoder"):
        ids = torch.randint(3, 99, (2, 17), generator=generator)
        mask = torch.ones(2, 17, dtype=torch.long)
        if left:
            mask[1, :5] = 0
        else:
            mask[1, 12:] = 0
        return {"input_ids": ids, "attention_mask": mask}
    decoder = {"decoder_input_ids": torch.randint(3, 99, (2, 7), generator=generator)}
    if kind == "speech":
        return {"input_features": torch.randn(2, 8, 32, generator=generator)} | decoder
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0
    return {"input_ids": torch.randint(3, 99, (2, 11), generator=generator), "attention_mask": mask} | decoder


FAMILIES = sorted(TINY)


def test_the_families_tested_here_are_verified_ones():
    assert set(TINY) <= set(VERIFIED_FAMILIES)


def test_docs_table_lists_exactly_the_verified_families_by_kind():
    page = (Path(__file__).resolve().parents[2] / "docs" / "hf.md").read_text(encoding="utf-8")
    table = page.split("## Verified families", 1)[1]
    listed = {}
    for row in [line for line in table.splitlines() if line.startswith("|")][2:]:  # past the head and the rule
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[2])
        assert int(cells[1]) == len(names), row[:60]
        listed.update(dict.fromkeys(names, cells[0]))
    assert set(listed) == set(VERIFIED_FAMILIES)
    assert f"**{len(VERIFIED_FAMILIES)} families**" in page


@DTYPES
@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_and_weights_equal_eager(family, dtype, rng):
    kind = TINY[family][3]
    tolerance = TOLERANCE[dtype]
    with torch.no_grad(), in_dtype(dtype, _pair(family), _inputs(kind, rng, left=kind == "decoder")) as ((eager, ours),
                                                                                                     inputs):
        expected = eager(**inputs, output_attentions=True)
        with counting_calls() as calls:
            got = ours(**inputs, output_attentions=True)
    assert calls[0] > 0  # attnkit ran: a family that never reaches it verifies nothing
    name = "last_hidden_state" if kind == "encoder" else "logits"
    assert getattr(got, name).dtype == dtype
    assert (getattr(got, name) - getattr(expected, name)).abs().max() <= tolerance  # every position, padded ones too
    kinds = ["attentions"] if kind in ("encoder", "decoder") else ["encoder_attentions", "decoder_attentions",
                                                                    "cross_attentions"]
    for what in kinds:
        theirs, mine = getattr(expected, what), getattr(got, what)
        assert len(mine) == len(theirs) > 0, what
        for a, b in zip(theirs, mine):
            assert b is not None and b.shape == a.shape
            assert (a - b).abs().max() <= tolerance, what  # every row, the left-padded ones with no key included


@pytest.mark.parametrize("cache", ["dynamic", slow("static")])
@pytest.mark.parametrize("family", [f for f in FAMILIES if TINY[f][3] in ("decoder", "seq2seq")])
def test_greedy_generation_equals_eager(family, cache, rng):
    eager, ours = _pair(family)
    kind = TINY[family][3]
    inputs = _inputs(kind, rng, left=True)  # decoder-only generation pads on the left
    inputs.pop("decoder_input_ids", None)
    options = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        expected = eager.generate(**inputs, **options)
        got = ours.generate(**inputs, **options)
    assert torch.equal(got, expected)


DECODERS = [f for f in FAMILIES if TINY[f][3] == "decoder"]


@pytest.mark.parametrize("family", DECODERS)
def test_static_cache_prefill_without_padding_equals_eager(family, rng):
    """The empty slots of a static cache get no weight (they got 0.78 of it before)."""
    eager, ours = _pair(family)
    ids = torch.randint(3, 99, (1, 9), generator=rng)
    logits = []
    for model in (eager, ours):
        cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad():
            logits.append(model(input_ids=ids, past_key_values=cache, use_cache=True).logits)
    assert (logits[0] - logits[1]).abs().max() <= ATOL


@pytest.mark.parametrize("shape", ["B11S", "B1LS"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@DTYPES
@pytest.mark.parametrize("family", DECODERS)
def test_a_users_own_4d_mask_is_applied_as_given(family, shape, kind, dtype, rng):
    """A 4D mask is the user's word: no causality or window is added to a (B, 1, 1, S) one.
    A boolean mask means True = attend (transformers' sdpa, and attnkit); eager would add it to the
    scores as 0 / 1, so eager gets the same mask in its additive form."""
    ids = torch.randint(3, 99, (2, 11), generator=rng)
    allowed = torch.rand(2, 1, 11 if shape == "B1LS" else 1, 11, generator=rng) < 0.7
    allowed[..., 0] = True  # every query keeps a key
    additive = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    mask = allowed if kind == "bool" else additive
    with torch.no_grad(), in_dtype(dtype, _pair(family), {}) as ((eager, ours), _):
        expected = eager(input_ids=ids, attention_mask=additive).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    assert (got - expected).abs().max() <= TOLERANCE[dtype]


@pytest.mark.parametrize("family", DECODERS)
def test_packed_position_ids_equal_eager(family, rng):
    """Two documents packed in one row, told apart by position_ids restarting at 0."""
    eager, ours = _pair(family)
    ids = torch.randint(3, 99, (1, 14), generator=rng)
    positions = torch.cat([torch.arange(6), torch.arange(8)])[None]
    with torch.no_grad():
        expected = eager(input_ids=ids, position_ids=positions).logits
        got = ours(input_ids=ids, position_ids=positions).logits
    assert (got - expected).abs().max() <= ATOL


@DTYPES
def test_gemma2_default_config_softcapping_equals_eager(dtype, rng):
    """Gemma 2's own defaults (attention softcap 50, final 30, query_pre_attn_scalar 256), shrunk."""
    default = transformers.Gemma2Config()
    assert default.attn_logit_softcapping == 50.0
    config = transformers.Gemma2Config(**(_DEC | dict(head_dim=8, sliding_window=5)))
    assert config.attn_logit_softcapping == 50.0 and config.final_logit_softcapping == 30.0
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        models.append(transformers.Gemma2ForCausalLM._from_config(copy.deepcopy(config),
                                                                  attn_implementation=implementation).eval())
    with torch.no_grad():
        for p in models[0].parameters():
            p.mul_(8.0)  # scores in the tens, where a cap of 50 bends them
    models[1].load_state_dict(models[0].state_dict())
    with torch.no_grad(), in_dtype(dtype, models, _inputs("decoder", rng)) as (models, inputs):
        expected, got = (m(**inputs, output_attentions=True) for m in models)
    real = inputs["attention_mask"].bool()
    assert (got.logits - expected.logits)[real].abs().max() <= TOLERANCE[dtype]
    assert max((a[0] - b[0]).abs().max() for a, b in zip(expected.attentions, got.attentions)) <= TOLERANCE[dtype]


@DTYPES
def test_gpt_oss_sinks_on_sliding_and_full_layers_equal_eager(dtype, rng):
    config = transformers.GptOssConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=8, intermediate_size=32, num_local_experts=4,
                                       num_experts_per_tok=2, sliding_window=5, max_position_embeddings=64,
                                       layer_types=["sliding_attention", "full_attention"], pad_token_id=0)
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        models.append(transformers.GptOssForCausalLM._from_config(
            copy.deepcopy(config), attn_implementation=implementation, experts_implementation="eager").eval())
    with torch.no_grad():
        for layer in models[0].model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0, generator=rng)  # sinks that matter
    models[1].load_state_dict(models[0].state_dict())
    with torch.no_grad(), in_dtype(dtype, models, _inputs("decoder", rng)) as (copies, inputs):
        expected, got = (m(**inputs, output_attentions=True) for m in copies)
    real = inputs["attention_mask"].bool()
    assert (got.logits - expected.logits)[real].abs().max() <= TOLERANCE[dtype]
    for a, b in zip(expected.attentions, got.attentions):
        assert (a[0] - b[0]).abs().max() <= TOLERANCE[dtype]
    if dtype == torch.float32:
        with torch.no_grad():
            ids = [m.generate(**_inputs("decoder", torch.Generator().manual_seed(1), left=True), max_new_tokens=12,
                              min_new_tokens=12, do_sample=False) for m in models]
        assert torch.equal(*ids)


def test_a_window_the_family_does_not_have_is_not_applied(rng):
    """olmoe's config accepts sliding_window, its eager attention ignores it: so does attnkit."""
    config = transformers.OlmoeConfig(**(_DEC | dict(num_experts=4, num_experts_per_tok=2, sliding_window=3)))
    models = []
    for implementation in ("eager", attnkit.hf.IMPLEMENTATION):
        torch.manual_seed(0)
        models.append(transformers.OlmoeForCausalLM._from_config(
            copy.deepcopy(config), attn_implementation=implementation, experts_implementation="eager").eval())
    ids = torch.randint(3, 99, (2, 12), generator=rng)
    with torch.no_grad():
        expected, got = (m(input_ids=ids).logits for m in models)
    assert (got - expected).abs().max() <= ATOL


# Families that do not go through the attention interface, or not all the way (their own attention
# code, a mask read with the other polarity, masks dropped in decoder modules): refused at load.
REFUSED = {
    "bloom": ("BloomConfig", "BloomForCausalLM"),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM"),
    "led": ("LEDConfig", "LEDForConditionalGeneration"),
    "mpt": ("MptConfig", "MptForCausalLM"),
    "falcon": ("FalconConfig", "FalconForCausalLM"),
    "gptj": ("GPTJConfig", "GPTJForCausalLM"),
    "xglm": ("XGLMConfig", "XGLMForCausalLM"),
}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_unverified_families_are_refused_by_name_at_load(family):
    config_name, model_name = REFUSED[family]
    assert family not in VERIFIED_FAMILIES
    config = getattr(transformers, config_name)()
    with torch.device("meta"), pytest.raises(UnverifiedFamily, match=f"model_type '{family}' is not a family"):
        getattr(transformers, model_name)._from_config(config, attn_implementation=attnkit.hf.IMPLEMENTATION)


def test_an_unverified_family_loads_with_a_loud_warning_when_allowed(monkeypatch):
    monkeypatch.setattr(attnkit.hf.families, "_ALLOWED_UNVERIFIED", {"granite_swa"})
    config = transformers.GraniteSWAConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                           intermediate_size=37)
    with pytest.warns(attnkit.hf.UnverifiedFamilyWarning, match="numbers unverified"):
        transformers.GraniteSWAForCausalLM._from_config(config, attn_implementation=attnkit.hf.IMPLEMENTATION)


def test_an_allowed_family_whose_attention_never_reaches_the_interface_is_refused(monkeypatch):
    """bloom's attention is its own code: allowed or not, attnkit would never run in it."""
    monkeypatch.setattr(attnkit.hf.families, "_ALLOWED_UNVERIFIED", {"bloom"})
    config = transformers.BloomConfig(vocab_size=99, hidden_size=32, n_layer=1, n_head=4)
    with pytest.warns(attnkit.hf.UnverifiedFamilyWarning), pytest.raises(
            UnsupportedFeature, match="BloomForCausalLM does not route its attention through transformers' AttentionInterface"):
        transformers.BloomForCausalLM._from_config(config, attn_implementation=attnkit.hf.IMPLEMENTATION)


@pytest.mark.parametrize("names", ["bloom", [3]])
def test_allow_unverified_takes_a_list_of_names(names):
    with pytest.raises(TypeError, match="allow_unverified must be a list of model_type names"):
        attnkit.hf.register(allow_unverified=names)
    assert "b" not in attnkit.hf.families._ALLOWED_UNVERIFIED


def test_a_mask_changed_on_its_way_is_refused_not_guessed():
    from attnkit.hf import StructuredMask, attnkit_attention_forward, attnkit_mask

    mask = attnkit_mask(2, 5, 5, attention_mask=torch.tensor([[1] * 5, [0, 1, 1, 1, 1]]))
    assert isinstance(mask, StructuredMask) and mask.structure.is_causal and mask.structure.padded
    # what every layer reads is kept beside it: the padding as a plain tensor of the same memory, and S
    assert type(mask.padding) is torch.Tensor and mask.padding.data_ptr() == mask.data_ptr() and mask.keys == 5
    derived = mask[..., :5] & True
    assert derived.structure is None and derived.padding is None and derived.keys is None
    q = torch.randn(2, 4, 5, 8)
    module = torch.nn.Module()
    out, _ = attnkit_attention_forward(module, q, q, q, mask)
    expected = attnkit.attention(q, q, q, mask=mask.as_subclass(torch.Tensor), is_causal=True).output
    expected[1, :, 0] = q[1].mean(dim=-2)  # the pad row has no key: eager averages every value
    torch.testing.assert_close(out, expected.transpose(1, 2))
    with pytest.raises(UnsupportedFeature, match="changed the mask attnkit built"):
        attnkit_attention_forward(module, q, q, q, mask[..., :5] & True)


def test_record_captures_only_the_chosen_heads_of_the_chosen_layers(rng):
    eager, ours = _pair("llama")
    inputs = _inputs("decoder", rng)
    with torch.no_grad():
        expected = eager(**inputs, output_attentions=True).attentions
        with attnkit.hf.record(ours, layers=[1], heads=[4, 0]) as recording:
            ours(**inputs)
    assert list(recording.weights) == ["model.layers.1.self_attn"]
    (weights,) = recording.weights["model.layers.1.self_attn"]
    assert weights.shape == (2, 2, 17, 17)
    keep = inputs["attention_mask"].bool()[:, None, :, None]
    assert ((weights - expected[1][:, [4, 0]]).abs() * keep).max() <= ATOL
    with pytest.raises(ValueError, match="attn_implementation='attnkit'"):
        with attnkit.hf.record(eager):
            pass


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_a_model_compiles_into_one_graph_and_exports(family, rng):
    """Compiled with fullgraph=True (TorchDynamo's capture, run as captured) and exported with a dynamic length, an
    attnkit model gives eager's logits at the real tokens: traced, the bridge hands attnkit transformers' own mask
    (a StructuredMask is a tensor subclass, which dynamo breaks on and a fake tensor cannot become) and reads no
    ContextVar while no recording is open. A recording still records under plain torch.compile."""
    eager, ours = _pair(family)
    inputs = _inputs("decoder", rng, left=True)
    real = inputs["attention_mask"].bool()

    def logits(model, **kwargs):
        return model(**kwargs, use_cache=False).logits

    with torch.no_grad():
        expected = logits(eager, **inputs)
        torch._dynamo.reset()
        compiled = torch.compile(lambda **kw: logits(ours, **kw), fullgraph=True, backend="eager")
        assert (compiled(**inputs) - expected)[real].abs().max() <= ATOL
        n = torch.export.Dim("n", min=2, max=64)
        program = torch.export.export(ours, (), kwargs={**inputs, "use_cache": False}, strict=False,
                                      dynamic_shapes={"input_ids": {1: n}, "attention_mask": {1: n}, "use_cache": None})
        longer = _inputs("decoder", rng, left=True)
        longer = {key: torch.cat([value, value[:, :9]], dim=1) for key, value in longer.items()}
        got = program.module()(**longer, use_cache=False).logits
        assert (got - logits(eager, **longer))[longer["attention_mask"].bool()].abs().max() <= ATOL
        torch._dynamo.reset()
        graphs = torch.compile(lambda **kw: logits(ours, **kw), backend="eager")  # breaks where it reads the recording
        with attnkit.hf.record(ours, layers=[1], heads=[0]) as recording:
            graphs(**inputs)
    assert recording.weights["model.layers.1.self_attn"][0].shape == (2, 1, 17, 17)


@pytest.mark.slow
def test_vmap_over_padded_batches_gives_the_loops_logits(rng):
    """Under torch.func's vmap the bridge reads nothing on the host (transformers' own mask, as while compiling):
    padded batches mapped over a leading dim give a loop's logits at the real tokens (transformers' sdpa raises
    there on a data-dependent read; eager runs)."""
    from torch.func import vmap

    _, ours = _pair("llama")
    batches = [_inputs("decoder", rng, left=True) for _ in range(3)]
    ids = torch.stack([b["input_ids"] for b in batches])
    mask = torch.stack([b["attention_mask"] for b in batches])
    with torch.no_grad():
        mapped = vmap(lambda i, m: ours(input_ids=i, attention_mask=m, use_cache=False).logits)(ids, mask)
        looped = torch.stack([ours(**b, use_cache=False).logits for b in batches])
    assert (mapped - looped)[mask.bool()].abs().max() <= ATOL


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_an_unpadded_sliding_window_runs_as_a_window_without_a_mask(family, rng, monkeypatch):
    eager, ours = _pair(family)
    seen = []
    real = attnkit.hf.interface.attention

    def spy(q, k, v, **kwargs):
        seen.append((kwargs["mask"], kwargs["window"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attnkit.hf.interface, "attention", spy)
    ids = torch.randint(3, 99, (2, 40), generator=rng)  # 40 tokens, window 5: no (L, S) mask is built
    with torch.no_grad():
        expected, got = eager(input_ids=ids).logits, ours(input_ids=ids).logits
    assert (got - expected).abs().max() <= ATOL
    assert all(mask is None for mask, _ in seen) and any(window == 5 for _, window in seen)


@pytest.mark.parametrize("family", ["llama", "mistral", "bert"])
def test_padding_travels_as_padding_not_as_an_l_by_s_mask(family, rng, monkeypatch):
    eager, ours = _pair(family)
    seen = []
    real = attnkit.hf.interface.attention

    def spy(q, k, v, **kwargs):
        seen.append((None if kwargs["mask"] is None else tuple(kwargs["mask"].shape), kwargs["is_causal"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attnkit.hf.interface, "attention", spy)
    ids = torch.randint(3, 99, (2, 24), generator=rng)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :7] = 0  # left padding
    with torch.no_grad():
        expected = (eager(input_ids=ids, attention_mask=mask)[0])
        got = ours(input_ids=ids, attention_mask=mask)[0]
    assert (got - expected)[mask.bool()].abs().max() <= ATOL
    assert seen and all(shape == (2, 1, 1, 24) for shape, _ in seen)
    assert all(causal == (family != "bert") for _, causal in seen)


def test_the_deliberate_differences_from_eager_are_what_docs_hf_md_says(rng):
    """docs/hf.md, "Where attnkit differs from eager on purpose", each pinned:
    1. a boolean 4D mask means True = attend, as in transformers' sdpa (eager adds it to the scores as
       0 / 1, which is no mask);
    2. an additive mask with a real query row all -inf: eager's row is NaN and spreads; attnkit's row
       has no allowed key, so zeros, and everything stays finite;
    3. float64 with left padding: eager's float32 softmax turns finfo(float64).min into -inf and the
       pad rows into NaN; attnkit stays finite and equals eager with its softmax kept in float64."""
    eager, ours = _pair("llama")
    config = copy.deepcopy(ours.config)
    sdpa = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    sdpa.load_state_dict(ours.state_dict())
    ids = torch.randint(3, 99, (2, 11), generator=rng)
    allowed = torch.rand(2, 1, 11, 11, generator=rng) < 0.7
    allowed[..., 0] = True
    with torch.no_grad():
        ours_bool, eager_bool, sdpa_bool = (m(input_ids=ids, attention_mask=allowed).logits for m in (ours, eager, sdpa))
    assert (ours_bool - sdpa_bool).abs().max() <= ATOL
    assert (ours_bool - eager_bool).abs().max() > 0.1  # eager reads the booleans as 0 / 1 added

    additive = torch.zeros(2, 1, 11, 11).masked_fill(~allowed, float("-inf"))
    additive[1, :, 5] = float("-inf")  # a real row with no key
    with torch.no_grad():
        assert torch.isnan(eager(input_ids=ids, attention_mask=additive).logits).any()
        mine = ours(input_ids=ids, attention_mask=additive, output_attentions=True)
    assert torch.isfinite(mine.logits).all()
    assert all((weights[1, :, 5] == 0).all() for weights in mine.attentions)

    eager64, ours64 = eager.double(), ours.double()
    padding = torch.ones(2, 11, dtype=torch.long)
    padding[1, :4] = 0
    with torch.no_grad():
        assert torch.isnan(eager64(input_ids=ids, attention_mask=padding).logits).any()
        with float64_inside():  # eager's softmax in float64 (in float32 finfo(float64).min is -inf), and both alike
            got = ours64(input_ids=ids, attention_mask=padding).logits
            want = eager64(input_ids=ids, attention_mask=padding).logits
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_window_of_one_is_refused_with_its_cause(rng):
    """transformers' sliding-window cache cannot keep window - 1 = 0 keys (it keeps them all), and
    its 1-key mask then no longer describes the keys: refused, naming the window."""
    config = transformers.MistralConfig(**_DEC, sliding_window=1)
    model = transformers.MistralForCausalLM._from_config(config, attn_implementation="attnkit").eval()
    ids = torch.randint(3, 99, (1, 12), generator=rng)
    with torch.no_grad(), pytest.raises(UnsupportedFeature, match="a sliding window of 1 key: .*Use a window of at least 2"):
        model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)


@pytest.mark.parametrize("how", ["a transformers config", "an attribute answered by __getattr__"])
def test_the_call_refuses_a_module_of_an_unverified_family_however_its_config_answers(how):
    """The guard at the call reads model_type past transformers' config __getattribute__, and falls back to the
    ordinary lookup for a config that answers through __getattr__: both are refused by name."""
    import transformers

    from attnkit.hf import attnkit_attention_forward

    class Answering:
        def __getattr__(self, name):
            if name == "model_type":
                return "bloom"
            raise AttributeError(name)

    module = torch.nn.Module()
    module.config = transformers.BloomConfig() if how == "a transformers config" else Answering()
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(UnverifiedFamily, match="bloom"):
        attnkit_attention_forward(module, q, q, q, None)
    module.config = transformers.LlamaConfig()  # a verified family runs
    out, _ = attnkit_attention_forward(module, q, q, q, None)
    assert out.shape == (1, 3, 2, 4)


def test_the_family_guard_traces_without_a_graph_break():
    """Under torch.compile the guard reads model_type the ordinary way (dynamo breaks its graph on
    object.__getattribute__, which the eager path uses to step past transformers' config __getattribute__)."""
    import transformers

    from attnkit.hf.interface import _check_module

    module = torch.nn.Module()
    module.config = transformers.LlamaConfig()
    torch._dynamo.reset()
    # (ops before and after it: a break before the first op would not count as one)
    explained = torch._dynamo.explain(lambda x: (x * 2, _check_module(module), x + 1)[2])(torch.ones(3))
    assert explained.graph_break_count == 0, [str(reason.reason)[:200] for reason in explained.break_reasons]
