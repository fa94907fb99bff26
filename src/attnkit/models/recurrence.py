"""Bahdanau's decoder recurrence over a whole target sentence, forward and backward by hand.

Teacher forcing runs the recurrence of :meth:`Seq2Seq.step` T times. Under autograd each target word
costs ~150 small recorded operations, and on a CPU their bookkeeping, not their arithmetic, is most
of the decoder's time (profile in docs/demo.md). :class:`AdditiveRecurrence` runs the T steps and
their backward pass (backpropagation through time) itself: ~16 operations per step forward and ~25
back, with the weight gradients of the recurrent products formed once, as one product over all
(B, T) steps, as cuDNN's RNNs do. What does not depend on the recurrence is computed outside it by
the caller, in large products (:meth:`Seq2Seq._decode_folded`):

- ``from_words`` (B, T, G): W_y y_{i-1} + b_ih, the RNN input projection of the target words;
- ``from_memory`` (B, S, G): W_c h_j, so that the projection of the context c_i = sum_j a_ij h_j is
  sum_j a_ij (W_c h_j), one (1, S) x (S, G) product per step and no (2H -> G) product;
- ``keys`` (B, S, A): U_a h_j, the alignment model's projected annotations.

Per step i: s_{i-1} -> [W_hh s_{i-1} + b_hh; W_a s_{i-1} + b_a] in one product; e_ij = v^T tanh(
W_a s_{i-1} + U_a h_j) over the unmasked j; a_i = softmax(e_i); the cell's input gates from_words_i +
a_i from_memory; the GRU (PyTorch's r, z, n) or LSTM (i, f, g, o) update. Outputs: the states
s_1..s_T (B, T, H) and the weights (B, T, S).

Gradients are checked with finite differences and against autograd through the step loop in
float64 (tests/models/test_seq2seq.py). The same treatment of a plain GRU layer (the encoder, the
bottleneck's decoder) measured 1.03x autograd through ``torch.gru``, and was not kept.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["AdditiveRecurrence"]

# Fused gradient kernels: grad * (1 - y^2) and grad * y * (1 - y) from the activation's output y,
# one pass each instead of three or four.
tanh_backward = torch.ops.aten.tanh_backward
sigmoid_backward = torch.ops.aten.sigmoid_backward


def _gru_update(into: Tensor, recurrent: Tensor, hidden: Tensor, gates: Tensor, extra: Tensor) -> Tensor:
    """One GRU update (PyTorch's equations) from the input gates ``into`` = W_ih x + b_ih and the
    recurrent ones W_hh s + b_hh, (B, 3H) each; writes the activated gates r, z, n into ``gates``
    (B, 3H) and W_hn s + b_hn into ``extra`` (B, H) for the backward pass; returns s' (B, H)."""
    H = hidden.shape[-1]
    torch.sigmoid(into[:, : 2 * H] + recurrent[:, : 2 * H], out=gates[:, : 2 * H])
    extra.copy_(recurrent[:, 2 * H :])
    torch.tanh(into[:, 2 * H :] + gates[:, :H] * extra, out=gates[:, 2 * H :])
    n = gates[:, 2 * H :]
    return n + gates[:, H : 2 * H] * (hidden - n)


def _gru_update_backward(d_hidden: Tensor, gates: Tensor, extra: Tensor, previous: Tensor, d_into: Tensor,
                         d_recurrent: Tensor) -> Tensor:
    """The gradients of :func:`_gru_update` for d(s') ``d_hidden``: writes d(into) and d(recurrent)
    (B, 3H); returns the part of d(s) that does not pass through W_hh (z * d(s'))."""
    H = d_hidden.shape[-1]
    r, z, n = gates[:, :H], gates[:, H : 2 * H], gates[:, 2 * H :]
    d_n = tanh_backward(d_hidden * (1 - z), n)
    d_into[:, :H] = sigmoid_backward(d_n * extra, r)
    d_into[:, H : 2 * H] = sigmoid_backward(d_hidden * (previous - n), z)
    d_into[:, 2 * H :] = d_n
    d_recurrent[:, : 2 * H] = d_into[:, : 2 * H]
    torch.mul(d_n, r, out=d_recurrent[:, 2 * H :])
    return d_hidden * z


def _tanh(x: Tensor, *, out: Tensor) -> Tensor:
    """tanh(x) into ``out``, overwriting ``x``. On the CPU as 2 sigmoid(2x) - 1: on the 2-core machine
    of docs/demo.md ``torch.tanh`` of a (32, 31, 128) tensor took 290 us and this 163 us (the
    recurrence's forward 33.7 -> 28.3 ms per batch); absolute error at most 1.8e-7 in float32
    (``torch.tanh``: 3e-8), 4e-16 in float64. Elsewhere (one kernel against four) ``torch.tanh``."""
    if not x.is_cpu:
        return torch.tanh(x, out=out)
    return torch.sigmoid(x.mul_(2), out=out).mul_(2).sub_(1)


class AdditiveRecurrence(torch.autograd.Function):
    """``apply(from_words, from_memory, keys, mask, hidden, cell, weight, bias, v) -> (states, weights)``.

    ``weight`` (G + A, H) and ``bias`` (G + A,) stack the recurrent projection W_hh over the query
    projection W_a; ``cell`` is the LSTM's initial cell (B, H), None for a GRU (G = 3H; LSTM 4H).
    ``mask`` (B, S) is True at real source tokens; every row needs one.
    """

    @staticmethod
    def forward(ctx, from_words: Tensor, from_memory: Tensor, keys: Tensor, mask: Tensor, hidden: Tensor,
                cell: Tensor | None, weight: Tensor, bias: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        B, T, G = from_words.shape
        S, H = from_memory.shape[1], hidden.shape[-1]
        blocked, initial_cell = ~mask, cell
        new = from_words.new_empty
        states, weights = new(T, B, H), new(T, B, S)  # time-major: each step writes a contiguous slice
        # tanh(W_a s_{i-1} + U_a h_j) of every step (B, S, A) for the backward pass; without one (no
        # input needs a gradient: evaluation) one step's worth, reused.
        keep = any(ctx.needs_input_grad)
        inputs, tanhs = new(T, B, H), new(T if keep else 1, B, S, keys.shape[-1])
        gates = new(T, B, G)  # the activated gates (GRU: r, z, n; LSTM: i, f, g, o)
        extra = new(T, B, H)  # GRU: W_hn s_{i-1} + b_hn; LSTM: the cell c_i
        from_words_t = from_words.transpose(0, 1)
        for t in range(T):
            inputs[t] = hidden
            projected = torch.addmm(bias, hidden, weight.t())  # (B, G + A)
            hidden_layer = tanhs[t if keep else 0]
            _tanh(keys + projected[:, None, G:], out=hidden_layer)
            energy = (hidden_layer @ v).masked_fill_(blocked, float("-inf"))  # (B, S)
            torch.softmax(energy, -1, out=weights[t])
            into = torch.baddbmm(from_words_t[t][:, None], weights[t][:, None], from_memory)[:, 0]  # (B, G)
            if cell is not None:  # LSTM
                g = gates[t]
                torch.add(into, projected[:, :G], out=g)
                g[:, : 2 * H].sigmoid_()
                g[:, 2 * H : 3 * H].tanh_()
                g[:, 3 * H :].sigmoid_()
                cell = g[:, H : 2 * H] * cell + g[:, :H] * g[:, 2 * H : 3 * H]
                extra[t] = cell
                hidden = g[:, 3 * H :] * torch.tanh(cell)
            else:
                hidden = _gru_update(into, projected[:, :G], hidden, gates[t], extra[t])
            states[t] = hidden
        ctx.save_for_backward(from_memory, weight, v, inputs, states, weights, tanhs, gates, extra, initial_cell)
        ctx.lstm = initial_cell is not None
        return states.transpose(0, 1), weights.transpose(0, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_states: Tensor | None, d_weights: Tensor | None):
        from_memory, weight, v, inputs, states, weights, tanhs, gates, extra, initial_cell = ctx.saved_tensors
        T, B, H = states.shape
        G = gates.shape[-1]
        d_states = states.new_zeros(T, B, H) if d_states is None else d_states.transpose(0, 1)
        d_weights = weights.new_zeros(T, B, weights.shape[-1]) if d_weights is None else d_weights.transpose(0, 1)
        d_into, d_projected = states.new_empty(T, B, G), states.new_empty(T, B, weight.shape[0])
        d_keys = torch.zeros_like(tanhs[0])
        d_v = torch.zeros_like(v)
        d_hidden = torch.zeros_like(states[0])
        d_cell = torch.zeros_like(states[0]) if ctx.lstm else None
        # (B, G, S): each step's d(a) is then a (1, G) x (G, S) product; on (B, S, G) x (G, 1) the CPU's
        # batched matrix-vector kernel is 5x slower (629 against 117 us at B 32, S 31, G 768; the
        # recurrence's backward 46.7 -> 29.7 ms per batch).
        memory_t = from_memory.transpose(1, 2).contiguous()
        for t in reversed(range(T)):
            d_hidden = d_hidden + d_states[t]
            g, d_in, d_proj = gates[t], d_into[t], d_projected[t]
            if ctx.lstm:  # s_{i-1} reaches s_i only through the gates' product: d_hidden restarts there
                i, f, candidate, o = g[:, :H], g[:, H : 2 * H], g[:, 2 * H : 3 * H], g[:, 3 * H :]
                tanh_cell = torch.tanh(extra[t])
                d_cell = d_cell + tanh_backward(d_hidden * o, tanh_cell)
                previous_cell = initial_cell if t == 0 else extra[t - 1]
                d_in[:, :H] = sigmoid_backward(d_cell * candidate, i)
                d_in[:, H : 2 * H] = sigmoid_backward(d_cell * previous_cell, f)
                d_in[:, 2 * H : 3 * H] = tanh_backward(d_cell * i, candidate)
                d_in[:, 3 * H :] = sigmoid_backward(d_hidden * tanh_cell, o)
                d_cell = d_cell * f
                d_proj[:, :G] = d_in
                d_hidden = torch.zeros_like(d_hidden)
            else:
                d_hidden = _gru_update_backward(d_hidden, g, extra[t], inputs[t], d_in, d_proj[:, :G])
            a = weights[t]  # (B, S)
            d_a = torch.baddbmm(d_weights[t][:, None], d_in[:, None], memory_t)[:, 0]  # (B, S)
            d_energy = a * (d_a - (a * d_a).sum(-1, keepdim=True))  # softmax backward; 0 where masked
            d_v += tanhs[t].flatten(0, 1).t() @ d_energy.flatten()
            d_pre = tanh_backward(d_energy[:, :, None] * v, tanhs[t])  # (B, S, A)
            d_keys += d_pre
            torch.sum(d_pre, 1, out=d_proj[:, G:])
            d_hidden = torch.addmm(d_hidden, d_proj, weight)
        d_weight = d_projected.flatten(0, 1).t() @ inputs.flatten(0, 1)  # (G + A, H): all steps in one product
        d_bias = d_projected.sum((0, 1))
        d_from_memory = torch.bmm(weights.permute(1, 2, 0), d_into.transpose(0, 1))  # (B, S, G)
        return (d_into.transpose(0, 1), d_from_memory, d_keys, None, d_hidden, d_cell, d_weight, d_bias, d_v)
