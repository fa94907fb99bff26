"""What attnkit keeps beside a tensor (the key mask's (B, 1, 1, S) form, whether a mask has an empty row,
the rotary tables of explicit positions) lives for one model call (``attnkit.functional.kept``): inference
tensors (no version counter) work, a tensor rewritten between calls by a write no version counter sees is
read afresh, and within one call the layers share one build."""

from __future__ import annotations

import numpy as np
import torch

import attnkit
from attnkit.functional import kept
from attnkit.models import DecoderLM
from attnkit.models.config import DecoderConfig

CONFIG = DecoderConfig(vocab_size=50, d_model=32, num_heads=4, num_kv_heads=2, num_layers=3, d_ff=64, max_len=64,
                       positional="rope", norm="rmsnorm", mlp="swiglu", bias="none")


def _model():
    torch.manual_seed(0)
    return DecoderLM(CONFIG).eval()


def test_multihead_attention_and_a_model_run_under_inference_mode():
    torch.manual_seed(0)
    mha = attnkit.MultiHeadAttention(32, 4, num_kv_heads=2).eval()
    model = _model()
    x = torch.randn(2, 5, 32)
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        padding = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]).bool()
        want = mha(x, key_mask=padding).output
        want_logits = model(ids, attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])).logits
    with torch.inference_mode():  # the masks made inside: inference tensors, no version counter
        padding = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]).bool()
        got = mha(x, key_mask=padding).output
        got_logits = model(ids, attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])).logits
        positions = torch.arange(5)
        rotated = attnkit.MultiHeadAttention(32, 4, rotary=attnkit.layers.RotaryEmbedding(8))(x, positions=positions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    assert rotated.output.shape == (2, 5, 32)


def test_training_after_an_evaluation_under_inference_mode():
    """What a model keeps across calls (the rotary table and its last slice) is made as ordinary tensors even under
    inference_mode: a loop that validates under inference_mode then trains the same model keeps training (an
    inference tensor cannot be saved for a backward)."""
    model = _model()
    ids = torch.randint(0, 50, (2, 6))
    with torch.inference_mode():
        model(ids)  # the rotary table and the slice of this call's positions are built here
        cache = model.new_cache()
        model(ids[:, :4], cache=cache)
        model(ids[:, 4:5], cache=cache)
    model.train()
    loss = model(ids).logits.square().mean()  # the same positions: the slice kept above
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_an_integer_key_mask_rewritten_behind_the_version_counter_is_read_afresh():
    model = _model()
    ids = torch.randint(0, 50, (2, 6))
    buffer = np.ones((2, 6), dtype=np.int64)
    mask = torch.from_numpy(buffer)  # a reused buffer, as a data loader hands it over
    with torch.no_grad():
        model(ids, attention_mask=mask)
        buffer[1, :3] = 0  # NumPy writes: torch's version counter sees nothing
        got = model(ids, attention_mask=mask).logits
        want = model(ids, attention_mask=torch.tensor(buffer)).logits
        mask.data[0, :2] = 0  # the same through .data
        got_data = model(ids, attention_mask=mask).logits
        want_data = model(ids, attention_mask=mask.clone()).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_data, want_data, rtol=0, atol=0)


def test_rotary_positions_rewritten_behind_the_version_counter_are_read_afresh():
    torch.manual_seed(0)
    mha = attnkit.MultiHeadAttention(32, 4, rotary=attnkit.layers.RotaryEmbedding(8)).eval()
    x = torch.randn(1, 5, 32)
    buffer = np.arange(5)
    positions = torch.from_numpy(buffer)
    with torch.no_grad():
        mha(x, positions=positions)
        buffer += 7
        got = mha(x, positions=positions).output
        want = mha(x, positions=torch.tensor(buffer)).output
        positions.data.mul_(3)
        got_data = mha(x, positions=positions).output
        want_data = mha(x, positions=positions.clone()).output
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_data, want_data, rtol=0, atol=0)


def test_the_layers_of_one_model_call_share_one_build_and_nothing_outlives_the_call(monkeypatch):
    model = _model()
    builds = []
    real = kept.get

    def counting(tensor, key, build):
        return real(tensor, key, lambda: builds.append(key if isinstance(key, str) else key[0]) or build())

    monkeypatch.setattr(kept, "get", counting)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 6)), attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    assert builds.count("keys") == 1 and builds.count("rotary") == 1, builds  # 3 layers, one build of each
    assert kept._ATTRIBUTE not in mask.__dict__ and not kept.active()
    builds.clear()
    layer = model.layers[0].self_attn
    with torch.no_grad():
        for _ in range(2):
            layer(torch.randn(2, 6, 32), key_mask=mask)
    assert builds.count("keys") == 2  # outside a model call nothing is kept


def test_a_call_that_raises_leaves_nothing_kept():
    model = _model()
    mask = torch.ones(2, 6, dtype=torch.long)
    try:
        with torch.no_grad():
            model(torch.randint(0, 50, (2, 6)), attention_mask=mask, position_ids=torch.zeros(3, 3, dtype=torch.long))
    except ValueError:
        pass
    assert not kept.active() and kept._ATTRIBUTE not in mask.__dict__
