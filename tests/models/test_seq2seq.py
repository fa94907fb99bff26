"""RNN encoder-decoder: all attention variants, stepwise == one-call decoding, padding invariance."""

from __future__ import annotations

import pytest
import torch

from attnkit.models import Seq2Seq, Seq2SeqConfig
from attnkit.models.config import SEQ2SEQ_ATTENTIONS

ATTENTIONS = list(SEQ2SEQ_ATTENTIONS)


def _model(attention, cell="gru", **changes) -> Seq2Seq:
    torch.manual_seed(0)
    config = Seq2SeqConfig(40, 50, embedding_dim=12, hidden_size=16, attention=attention, cell=cell,
                           attention_dim=10, local_window=2, **({"dropout": 0.0} | changes))
    return Seq2Seq(config).double().eval()


def _inputs(generator):
    source = torch.randint(4, 40, (3, 9), generator=generator)
    lengths = torch.tensor([9, 4, 6])
    source[1, 4:] = 0
    source[2, 6:] = 0
    target_in = torch.randint(4, 50, (3, 7), generator=generator)
    return source, lengths, target_in


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_shapes_and_alignment_rows(rng, attention, cell, layers):
    model = _model(attention, cell, num_layers=layers)
    source, lengths, target_in = _inputs(rng)
    out = model(source, lengths, target_in)
    assert out.logits.shape == (3, 7, 50)
    if attention == "none":
        assert out.weights is None
        return
    assert out.weights.shape == (3, 7, 9)
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(out.weights[b, :, n:] == 0), "padding got attention"
    if attention != "luong-local-p":  # local-p multiplies by a Gaussian after normalising (as the paper)
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 7, dtype=torch.float64))


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("input_feeding", [True, False])
def test_step_by_step_decoding_equals_teacher_forced_forward(rng, attention, input_feeding):
    model = _model(attention, input_feeding=input_feeding, bidirectional=attention != "luong-dot")
    source, lengths, target_in = _inputs(rng)
    full = model(source, lengths, target_in)
    stepped = model(source, lengths, target_in, stepwise=True)
    torch.testing.assert_close(stepped.logits, full.logits, rtol=1e-12, atol=1e-12)
    state = model.encode(source, lengths)
    for t in range(target_in.shape[1]):
        step = model.step(state, target_in[:, t])
        torch.testing.assert_close(step.logits, full.logits[:, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_padding_and_batch_neighbours_do_not_change_a_sentence(rng, attention):
    model = _model(attention)
    source, lengths, target_in = _inputs(rng)
    batched = model(source, lengths, target_in)
    alone = model(source[1:2, :4], lengths[1:2], target_in[1:2])
    torch.testing.assert_close(alone.logits, batched.logits[1:2], rtol=1e-10, atol=1e-10)


def test_bottleneck_sees_the_source_only_through_the_final_state(rng):
    """Without attention, two sources with the same encoder final state give the same output."""
    model = _model("none")
    source, lengths, target_in = _inputs(rng)
    state = model.encode(source, lengths)
    assert state.keys is None and not hasattr(model, "attention")
    other = model.encode(source.flip(0), lengths.flip(0))
    other.hidden = state.hidden
    torch.testing.assert_close(model.step(other, target_in[:, 0]).logits, model.step(state, target_in[:, 0]).logits)


def test_bahdanau_keys_are_projected_once_per_sentence(rng, monkeypatch):
    model = _model("bahdanau")
    source, lengths, target_in = _inputs(rng)
    calls = []
    original = model.attention.key_proj.forward
    monkeypatch.setattr(model.attention.key_proj, "forward", lambda x: calls.append(x.shape) or original(x))
    model(source, lengths, target_in)
    assert calls == [torch.Size([3, 9, 32])]


def test_input_errors_name_the_argument():
    model = _model("bahdanau")
    with pytest.raises(ValueError, match=r"source_lengths must lie in \[1, S=3\]"):
        model(torch.ones(2, 3, dtype=torch.long), torch.tensor([3, 0]), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="source must hold int64"):
        model(torch.ones(2, 3), torch.tensor([3, 1]), torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="attention must be one of"):
        Seq2SeqConfig(10, 10, attention="luong")
