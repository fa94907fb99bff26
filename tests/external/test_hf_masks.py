"""The bridge against eager where users' masks and training set-ups differ from transformers' defaults: a
mask of -1e9 (the masked_fill convention), masks mixing -inf and finfo.min, a float32 mask in a
bfloat16 model, a loss on the returned attention weights of rows with no key, attnkit.hf.record beside
output_attentions, and mixed precision (torch.autocast)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.hf  # noqa: E402
from attnkit.hf import VERIFIED_FAMILIES  # noqa: E402

from float64_checks import float64_inside  # noqa: E402
from hf_families import model_class, tiny_config  # noqa: E402

DECODERS = ["llama", "mistral", "gemma2", "qwen3", "gpt2", "phi3", "olmo2", "cohere2"]


@pytest.fixture(scope="module", autouse=True)
def registered():
    attnkit.hf.register()


def _pair(family: str, dtype=torch.float32, implementations=("eager", "attnkit")):
    """Models of ``family``'s tiny config with equal random weights, one per implementation."""
    config = tiny_config(family)
    cls, kind = model_class(family)
    models = []
    for implementation in implementations:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            models.append(cls._from_config(copy.deepcopy(config), attn_implementation=implementation).eval())
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in models[0].parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    return [m.to(dtype) for m in models], kind


def _left_padded(rng, L=11, pads=4):
    ids = torch.randint(3, 99, (2, L), generator=rng)
    padding = torch.ones(2, L, dtype=torch.bool)
    padding[1, :pads] = False
    labels = ids.masked_fill(~padding, -100)  # the last pad predicts the first real token
    return ids, padding, labels


def _loss_and_grads(model, **inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _assert_same_training(eager, ours, tolerance=1e-4, **inputs):
    (theirs, their_grads), (mine, my_grads) = _loss_and_grads(eager, **inputs), _loss_and_grads(ours, **inputs)
    assert abs(float(theirs.loss - mine.loss)) <= tolerance, (theirs.loss.item(), mine.loss.item())
    assert torch.isfinite(mine.logits).all()
    worst = max(_relative(my_grads[n], g) for n, g in their_grads.items())
    assert worst <= tolerance * 10, f"gradients differ by {worst:.3g} relative"


@pytest.mark.parametrize("family", DECODERS)
def test_a_minus_1e9_mask_trains_as_eager(family, rng):
    """masked_fill(~allowed, -1e9): the pad rows' scores round to one value (uniform), and their
    gradients were S times too large in attnkit's fused backends (5.35 relative on Llama's loss)."""
    (eager, ours), _ = _pair(family)
    ids, padding, labels = _left_padded(rng)
    L = ids.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    allowed = causal[None, None] & padding[:, None, None, :]
    mask = torch.zeros(2, 1, L, L).masked_fill(~allowed, -1e9)
    _assert_same_training(eager, ours, input_ids=ids, attention_mask=mask, labels=labels)


@pytest.mark.parametrize("order", ["causal -inf, padding finfo.min", "causal finfo.min, padding -inf"])
@pytest.mark.parametrize("family", DECODERS)
def test_a_mask_mixing_minus_inf_and_finfo_min_follows_eager(family, order, rng):
    """Eager averages a row's finfo.min keys where the rest are -inf (a pad row under causality); attnkit
    gave zeros (loss 4.785 against eager's 4.852 on Llama). Rows eager makes NaN (every key -inf) are the
    one place attnkit keeps its zeros: with the padding -inf a pad query has none here (its key 0 is
    causal-masked with finfo.min... only when the padding is finfo.min)."""
    (eager, ours), _ = _pair(family)
    ids, padding, labels = _left_padded(rng)
    L = ids.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None, None]
    lowest = torch.finfo(torch.float32).min
    causal_value, padding_value = (float("-inf"), lowest) if order.startswith("causal -inf") else (lowest, float("-inf"))
    mask = torch.zeros(2, 1, L, L).masked_fill(~causal, causal_value)
    mask = mask.masked_fill(~padding[:, None, None, :] & causal, padding_value)
    if padding_value == float("-inf"):  # a pad query whose keys are -inf (pads) and finfo.min (future)
        with torch.no_grad():
            theirs = eager(input_ids=ids, attention_mask=mask).logits
        if torch.isnan(theirs).any():
            pytest.skip("eager gives NaN here (rows all -inf): attnkit's zeros are its documented difference")
    _assert_same_training(eager, ours, input_ids=ids, attention_mask=mask, labels=labels)


def test_a_float32_mask_in_a_bfloat16_model_keeps_eagers_uniform_pad_rows(rng):
    """finfo(float32).min is -inf in bfloat16; eager adds the float32 mask to its scores in float32 (type
    promotion), so a pad row is uniform there. attnkit decides the rows before casting the mask."""
    (eager, ours), _ = _pair("llama", torch.bfloat16)
    ids, padding, labels = _left_padded(rng)
    L = ids.shape[1]
    allowed = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & padding[:, None, None, :]
    mask = torch.zeros(2, 1, L, L).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        theirs = eager(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
        mine = ours(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
    for a, b in zip(theirs.attentions, mine.attentions):
        torch.testing.assert_close(b[1, :, 0].float(), a[1, :, 0].float(), rtol=0, atol=1e-3)  # 1/11 on a pad row
        assert float(b[1, :, 0].float().mean()) == pytest.approx(1 / L, abs=1e-3)
    assert abs(float(theirs.loss - mine.loss)) <= 2e-2


# --------------------------------------------------------------- a loss on the returned weights
WEIGHT_CASES = [("llama", "left"), ("llama", "right"), ("llama", "hole"), ("mistral", "left"), ("gemma2", "left"),
                ("bert", "right"), ("bart", "right")]


@pytest.mark.parametrize(("family", "padding"), WEIGHT_CASES, ids=[f"{f}-{p}" for f, p in WEIGHT_CASES])
def test_a_loss_on_the_weights_of_rows_with_no_key_trains_as_eager(family, padding, rng):
    """Rows with no allowed key get eager's weights (uniform) and now eager's gradient too (softmax's
    Jacobian there): a loss on the returned attentions (attention supervision, distillation) trained
    differently (0.007-0.107 relative on the embeddings in 13 of 16 families). float64, eager's softmax
    kept in float64 (its float32 softmax turns finfo(float64).min into -inf): both run inside
    float64_checks.float64_inside."""
    (eager, ours), kind = _pair(family, torch.float64)
    L = 11
    ids = torch.randint(3, 99, (2, L), generator=rng)
    mask = torch.ones(2, L, dtype=torch.long)
    if padding == "left":
        mask[1, :4] = 0
    elif padding == "right":
        mask[1, 7:] = 0
    else:
        mask[1, 3:6] = 0  # a hole
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "encoder":  # an encoder's rows always see a real key: a user's 4D mask gives one row none
        lowest = torch.finfo(torch.float64).min
        full = torch.zeros(2, 1, L, L, dtype=torch.float64).masked_fill(~mask.bool()[:, None, None, :], lowest)
        full[1, :, 6] = lowest
        inputs["attention_mask"] = full
    if kind == "seq2seq":  # the decoder left-padded: its pad rows have no key
        decoder_mask = torch.ones(2, 5, dtype=torch.long)
        decoder_mask[1, :2] = 0
        inputs.update(decoder_input_ids=torch.randint(3, 99, (2, 5), generator=rng), decoder_attention_mask=decoder_mask)
    targets = None
    grads = []
    for model in (eager, ours):
        model.zero_grad()
        with float64_inside():
            out = model(**inputs, output_attentions=True)
            attentions = out.attentions if kind != "seq2seq" else out.decoder_attentions
            if targets is None:
                targets = [torch.rand(a.shape, generator=rng, dtype=a.dtype) for a in attentions]
            loss = sum((a * t).sum() for a, t in zip(attentions, targets))
            loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    theirs, mine = grads
    assert set(theirs) == set(mine)
    scale = max(float(g.abs().max()) for g in theirs.values())  # (a key bias's gradient is 0 up to rounding)
    for name, g in theirs.items():
        assert float((mine[name] - g).abs().max()) <= 1e-9 * scale, name


# ----------------------------------------------------------------------------------- record()
@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "qwen3", "gemma2", "mistral", "phi3"])
def test_recording_heads_leaves_what_the_model_returns_alone(family, rng):
    """record(heads=[1]) replaced the model's returned attentions by the recorded head (2, 1, 9, 9); index
    0 was really head 1. The model returns every head as without recording; the recording holds head 1."""
    (ours,), _ = _pair(family, implementations=("attnkit",))
    ids = torch.randint(3, 99, (2, 9), generator=rng)
    with torch.no_grad():
        plain = ours(input_ids=ids, output_attentions=True).attentions
        with attnkit.hf.record(ours, heads=[1]) as recording:
            recorded = ours(input_ids=ids, output_attentions=True).attentions
    assert len(plain) == len(recorded)
    for a, b in zip(plain, recorded):
        assert b.shape == a.shape and torch.equal(a, b)
    stored = list(recording.weights.values())
    assert len(stored) == len(plain)
    for (weights,), full in zip(stored, plain):
        assert weights.shape[1] == 1 and torch.equal(weights[:, 0], full[:, 1])


# ----------------------------------------------------------------------------------- autocast
CAPACITY_ROUTED = {"switch_transformers", "nllb-moe"}
"""Top-1 / top-2 expert routing with a capacity: a bfloat16 rounding of a router logit can send a token to
another expert (an 11-26% gradient difference in switch_transformers with the logits 0.8% apart), so
their gradients are not compared, their logits are."""

def _autocast_families() -> list[str]:
    return sorted(f for f, kind in VERIFIED_FAMILIES.items() if kind in ("decoder", "encoder", "seq2seq"))


@pytest.mark.slow
@pytest.mark.parametrize("family", _autocast_families())
def test_every_verified_family_trains_under_autocast_as_sdpa_does(family, rng):
    """Under torch.autocast(bfloat16) over a float32 model, 17 of 27 RoPE families raised in attnkit (q in
    float32 after RoPE, v in bfloat16). Now attnkit casts as SDPA does there: the loss and every gradient
    equal sdpa's under autocast (or eager's, for a family without sdpa) within bfloat16's tolerance."""
    cls, kind = model_class(family)
    reference = "sdpa" if cls._supports_sdpa else "eager"
    (theirs, ours), kind = _pair(family, implementations=(reference, "attnkit"))
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 99, (2, 13), generator=generator)
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, 9:] = 0  # right padding: every row has a key under every implementation
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "seq2seq":
        inputs["decoder_input_ids"] = torch.randint(3, 99, (2, 7), generator=generator)
    results = []
    for model in (theirs, ours):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(**inputs)
            logits = out.logits.float()
            loss = (logits * torch.randn(logits.shape, generator=torch.Generator().manual_seed(4))).mean()
        loss.backward()
        results.append((logits, {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = results
    assert _relative(b, a) <= 5e-2, f"logits differ by {_relative(b, a):.3g} relative"
    assert set(ga) == set(gb)
    if family in CAPACITY_ROUTED:
        return
    overall = max(float(g.abs().max()) for g in ga.values())  # a key bias's gradient is 0 up to rounding
    for name, g in ga.items():
        error = float((gb[name] - g).abs().max())
        assert error <= 0.15 * float(g.abs().max()) + 1e-3 * overall, f"{name}: gradients differ by {error:.3g}"


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3", "gemma2", "phi3"])
def test_rope_families_train_under_autocast(family):
    test_every_verified_family_trains_under_autocast_as_sdpa_does(family, None)


def test_seamless_m4t_v2s_speech_encoder_meets_the_boolean_mask_difference():
    """docs/hf.md's deliberate differences name the families that meet one on their own: seamless_m4t_v2's
    speech encoder builds a boolean 4D chunk mask, which eager adds to its scores as 0 / 1. With padded
    audio attnkit equals sdpa (True = attend) exactly, and eager differs."""
    config = transformers.SeamlessM4Tv2Config(
        vocab_size=99, t2u_vocab_size=99, hidden_size=32, encoder_layers=1, decoder_layers=1, speech_encoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, speech_encoder_attention_heads=4, encoder_ffn_dim=37,
        decoder_ffn_dim=37, speech_encoder_intermediate_size=37, feature_projection_input_dim=16,
        speech_encoder_chunk_size=4, speech_encoder_left_chunk_num=1, t2u_encoder_layers=1, t2u_decoder_layers=1,
        max_position_embeddings=64, num_adapter_layers=1, adapter_kernel_size=2, adapter_stride=2)
    features = torch.randn(2, 20, 16, generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 20, dtype=torch.long)
    padding[1, 14:] = 0
    outputs, state = {}, None
    for implementation in ("eager", "sdpa", "attnkit"):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.SeamlessM4Tv2ForSpeechToText._from_config(copy.deepcopy(config),
                                                                           attn_implementation=implementation).eval()
        state = model.state_dict() if state is None else state
        model.load_state_dict(state)
        with torch.no_grad():
            outputs[implementation] = model.speech_encoder(input_features=features, attention_mask=padding).last_hidden_state
    torch.testing.assert_close(outputs["attnkit"], outputs["sdpa"], rtol=1e-5, atol=1e-5)
    assert (outputs["attnkit"] - outputs["eager"]).abs().max() > 1e-2
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "hf.md").read_text(encoding="utf-8")
    row = next(line for line in page.splitlines() if line.startswith("| a boolean 4D `attention_mask`"))
    assert "`seamless_m4t_v2`" in row.split("|")[4]
