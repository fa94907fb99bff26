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


@pytest.mark.parametrize("attention", ["bahdanau", "none", "luong-general"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_teacher_forcing_by_hand_equals_the_step_loop_with_gradients(rng, attention, cell, layers):
    """Teacher forcing in one pass (Bahdanau: AdditiveRecurrence and its hand-written backward; the
    unpacked GRU encoder for all) against autograd through Seq2Seq.step, float64."""
    model = _model(attention, cell, num_layers=layers, input_feeding=False)
    assert model.folded_teacher_forcing == (attention == "bahdanau" and layers == 1)
    source, lengths, target_in = _inputs(rng)
    probe = torch.randn(3, 7, 9, generator=rng, dtype=torch.float64)  # gives the weights a gradient of their own
    results = []
    for stepwise in (False, True):
        model.zero_grad()
        out = model(source, lengths, target_in, stepwise=stepwise)
        aligned = 0 if out.weights is None else (out.weights * probe).sum()
        (out.logits.logsumexp(-1).sum() + aligned).backward()
        results.append((out, {name: p.grad.clone() for name, p in model.named_parameters()}))
    (folded, grads), (stepped, reference) = results
    torch.testing.assert_close(folded.logits, stepped.logits, rtol=1e-12, atol=1e-12)
    if attention != "none":
        torch.testing.assert_close(folded.weights, stepped.weights, rtol=1e-12, atol=1e-12)
    for name, grad in reference.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_folded_teacher_forcing_without_gradients_gives_the_same_numbers(rng):
    """Evaluation (no_grad) keeps one step's alignment-MLP activations instead of all T."""
    model = _model("bahdanau")
    source, lengths, target_in = _inputs(rng)
    with torch.no_grad():
        evaluated = model(source, lengths, target_in)
    trained = model(source, lengths, target_in)
    torch.testing.assert_close(evaluated.logits, trained.logits, rtol=0, atol=0)
    torch.testing.assert_close(evaluated.weights, trained.weights, rtol=0, atol=0)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_additive_recurrence_gradcheck(rng, cell):
    """Every input's gradient by finite differences, a query bias and a padded row included."""
    from attnkit.models.recurrence import AdditiveRecurrence

    B, T, S, H, A = 2, 3, 4, 3, 2
    G = (4 if cell == "lstm" else 3) * H

    def leaf(*shape):
        return torch.randn(*shape, generator=rng, dtype=torch.float64).requires_grad_()

    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    cell0 = leaf(B, H) if cell == "lstm" else None
    inputs = (leaf(B, T, G), leaf(B, S, G), leaf(B, S, A), leaf(B, H), cell0, leaf(G + A, H), leaf(G + A), leaf(A))

    def run(from_words, from_memory, keys, hidden, cell, weight, bias, v):
        return AdditiveRecurrence.apply(from_words, from_memory, keys, mask, hidden, cell, weight, bias, v)

    assert torch.autograd.gradcheck(run, inputs)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-7), (torch.float64, 1e-15)])
def test_the_recurrences_cpu_tanh_is_tanh(dtype, tolerance):
    """2 sigmoid(2x) - 1, the recurrence's tanh on the CPU, against float64 tanh over its whole range."""
    from attnkit.models.recurrence import _tanh

    x = torch.linspace(-20, 20, 400_001, dtype=dtype)
    want = torch.tanh(x.double())
    out = torch.empty_like(x)
    assert _tanh(x.clone(), out=out) is out
    assert (out.double() - want).abs().max() <= tolerance


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_unpacked_gru_encoder_equals_packed(rng, layers, bidirectional):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    model = _model("bahdanau", num_layers=layers, bidirectional=bidirectional)
    source, lengths, _ = _inputs(rng)
    embedded = model.source_embedding(source)
    memory, final = model._read_unpacked(embedded, lengths)
    packed, packed_final = model.encoder(pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False))
    packed_memory, _ = pad_packed_sequence(packed, batch_first=True, total_length=source.shape[1])
    torch.testing.assert_close(memory, packed_memory, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, packed_final, rtol=1e-12, atol=1e-12)
    probe = torch.randn(memory.shape, generator=rng, dtype=torch.float64)
    weights = list(model.encoder.parameters())
    grads = torch.autograd.grad((memory * probe).sum() + final.sum(), weights)
    reference = torch.autograd.grad((packed_memory * probe).sum() + packed_final.sum(), weights)
    for grad, expected in zip(grads, reference):
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_weights_that_share_one_buffer_are_saved_each_under_its_name(tmp_path):
    """cuDNN flattens an RNN's weights into one buffer on CUDA: the biases (and the reverse
    direction's matrices) are then views of one storage with equal shapes. Each is a parameter of
    its own and must be saved (a checkpoint trained on a GPU once lost six of them)."""
    from attnkit.models.weights import load_weights, save_weights

    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(40, 50, embedding_dim=8, hidden_size=12, attention="bahdanau", dropout=0.0))
    for rnn in (model.encoder, model.decoder):  # what flatten_parameters() does on CUDA
        params = list(rnn._flat_weights)
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        offset = 0
        for p in params:
            p.data = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
    save_weights(model, tmp_path / "model.safetensors")
    fresh = Seq2Seq(model.config)
    load_weights(fresh, tmp_path / "model.safetensors")
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
