"""RNN encoder-decoder, with and without attention.

- ``attention="none"``: Sutskever, Vinyals and Le (2014). The whole source reaches the decoder
  through one fixed-length vector, the encoder's final state (the bottleneck).
- ``"bahdanau"``: Bahdanau, Cho and Bengio (2014). At step i the previous state s_{i-1} scores
  every annotation h_j (additive score); the context c_i enters the recurrence:
  s_i = RNN(s_{i-1}, [y_{i-1}; c_i]).
- ``"luong-*"``: Luong, Pham and Manning (2015). The new state h_t scores the annotations (dot,
  general, concat; global or local-p); the attentional vector h~_t = tanh(W_c [c_t; h_t]) predicts
  the word and, with input feeding, enters the next step.

Shapes: B batch, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..functional.checks import check_rank
from ..layers import BahdanauAttention, LuongAttention
from .config import PAD_ID, Seq2SeqConfig
from .outputs import StepOutput, TranslationOutput, check_source
from .recurrence import AdditiveRecurrence

__all__ = ["Seq2Seq"]


def _rnn_kernels(model: nn.Module, like: Tensor):
    """The context the model's RNN calls run in. cuDNN's RNN has no backward outside training mode
    ("cudnn RNN backward can only be called in training mode"), so an evaluated model asked for
    gradients on CUDA (attribution, gradient checks) runs PyTorch's own RNN kernels: the same
    arithmetic. Training and gradient-free inference keep cuDNN."""
    if like.is_cuda and not model.training and torch.is_grad_enabled():
        return torch.backends.cudnn.flags(enabled=False)
    return contextlib.nullcontext()


def _layer_weights(rnn: nn.RNNBase, layer: int = 0, suffix: str = "") -> list[Tensor]:
    """weight_ih, weight_hh, bias_ih, bias_hh of one layer (and direction: "" or "_reverse") of an RNN."""
    return [getattr(rnn, f"{name}_l{layer}{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]


def _weights_of(weights: Tensor | None) -> Tensor:
    assert weights is not None, "a model with attention gives weights at every step"
    return weights


def _weights(step) -> Tensor:
    return _weights_of(step.weights)


@dataclass
class Seq2SeqState:
    """What the decoder carries between steps; :meth:`reorder` follows beams."""

    memory: Tensor  # (B, S, A_enc) encoder annotations (attention values)
    keys: Tensor | None  # (B, S, .) precomputed attention keys: U_a h_j (Bahdanau), projected h_j (Luong)
    mask: Tensor  # (B, S) True at real source tokens
    hidden: Tensor | tuple[Tensor, Tensor]  # (layers, B, hidden) (and the LSTM cell)
    feed: Tensor | None  # (B, hidden) Luong input feeding: previous attentional vector

    def reorder(self, index: Tensor, *, within_source: bool = False) -> None:
        """Rows ``index`` of the state. ``within_source``: every row moves among the copies of one
        source (beam search after the first step), so the source's memory, mask and keys, the same
        in all its copies, stay where they are; only the per-hypothesis state moves."""
        if not within_source:
            self.memory, self.mask = self.memory.index_select(0, index), self.mask.index_select(0, index)
            self.keys = None if self.keys is None else self.keys.index_select(0, index)
        self.feed = None if self.feed is None else self.feed.index_select(0, index)
        if isinstance(self.hidden, tuple):
            self.hidden = (self.hidden[0].index_select(1, index), self.hidden[1].index_select(1, index))
        else:
            self.hidden = self.hidden.index_select(1, index)


class Seq2Seq(nn.Module):
    """RNN encoder-decoder; see the module docstring for the attention variants.

    Parameters: ``source_embedding``, ``target_embedding``, ``encoder`` (GRU/LSTM), ``bridge``
    (encoder final state -> decoder initial state), ``decoder``, ``attention`` (absent for "none"),
    ``key_proj`` (Luong with a bidirectional encoder: annotations -> decoder width for scoring),
    ``combine`` (attentional / output vector), ``generator`` (-> V logits).
    """

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = c = config
        rnn = nn.GRU if c.cell == "gru" else nn.LSTM
        between = c.dropout if c.num_layers > 1 else 0.0
        memory_dim = c.hidden_size * (2 if c.bidirectional else 1)
        self.source_embedding = nn.Embedding(c.source_vocab, c.embedding_dim, padding_idx=PAD_ID)
        self.target_embedding = nn.Embedding(c.target_vocab, c.embedding_dim, padding_idx=PAD_ID)
        self.encoder = rnn(c.embedding_dim, c.hidden_size, c.num_layers, batch_first=True,
                           bidirectional=c.bidirectional, dropout=between)
        self.bridge = nn.Linear(memory_dim, c.hidden_size)
        if c.cell == "lstm":
            self.bridge_cell = nn.Linear(memory_dim, c.hidden_size)
        self.style = c.attention.split("-")[0]  # "none" | "bahdanau" | "luong"
        self.attention: BahdanauAttention | LuongAttention
        decoder_input = c.embedding_dim
        if self.style == "bahdanau":
            self.attention = BahdanauAttention(c.hidden_size, memory_dim, c.attention_dim)
            decoder_input += memory_dim
        elif self.style == "luong":
            score = "general" if c.attention == "luong-local-p" else c.attention.split("-")[1]
            mode = "local-p" if c.attention == "luong-local-p" else "global"
            self.attention = LuongAttention(c.hidden_size, score=score, mode=mode, half_width=c.local_window)
            if memory_dim != c.hidden_size:
                self.key_proj = nn.Linear(memory_dim, c.hidden_size, bias=False)
            if c.input_feeding:
                decoder_input += c.hidden_size
        self.decoder = rnn(decoder_input, c.hidden_size, c.num_layers, batch_first=True, dropout=between)
        self.combine = nn.Linear(c.hidden_size + (0 if self.style == "none" else memory_dim), c.hidden_size)
        self.generator = nn.Linear(c.hidden_size, c.target_vocab)
        self.dropout = nn.Dropout(c.dropout)

    @property
    def parallel_decoding(self) -> bool:
        """Whether teacher forcing can run the decoder RNN over all steps at once."""
        return self.style == "none" or (self.style == "luong" and not self.config.input_feeding)

    # -- encoder --------------------------------------------------------------------------------

    def _initial_state(self, final: Tensor, bridge: nn.Linear) -> Tensor:
        """Encoder final states (layers * dirs, B, hidden) -> decoder initial state (layers, B, hidden)."""
        c = self.config
        if c.bidirectional:
            final = final.view(c.num_layers, 2, *final.shape[1:])  # (layers, dirs, B, hidden)
            final = torch.cat([final[:, 0], final[:, 1]], dim=-1)  # (layers, B, 2 hidden)
        return torch.tanh(bridge(final))

    def _read_unpacked(self, embedded: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The GRU encoder over right-padded (B, S, emb) without packing: the same numbers as
        packing, faster forward and backward on a CPU (a packed sequence projects its inputs one
        step at a time, a padded one in one product: 62 -> 49 ms per demo batch, docs/demo.md). Each direction of each layer is one
        unidirectional pass; the backward direction reads every sentence reversed within its length
        (pads stay at the end), so no pad enters a real state; the outputs at pads are zeroed as
        ``pad_packed_sequence`` does. Final states (layers * dirs, B, H), as ``nn.GRU`` gives them:
        each pass's state at the sentence's last real token.
        """
        rnn = self.encoder
        assert isinstance(rnn, nn.GRU), "an LSTM encoder reads a packed sequence"
        B, S, _ = embedded.shape
        position = torch.arange(S, device=embedded.device)
        real = position < lengths[:, None]  # (B, S)
        reverse = torch.where(real, lengths[:, None] - 1 - position, position)  # its own inverse
        last = (lengths - 1)[:, None, None].expand(B, 1, rnn.hidden_size)
        start = embedded.new_zeros(1, B, rnn.hidden_size)
        inputs, finals = embedded, []
        for layer in range(rnn.num_layers):
            outputs = []
            for suffix in ("", "_reverse")[: 1 + rnn.bidirectional]:
                weights = _layer_weights(rnn, layer, suffix)
                flip = (lambda x: x.gather(1, reverse[..., None].expand_as(x))) if suffix else (lambda x: x)
                out = flip(torch.gru(flip(inputs), start, weights, True, 1, 0.0, self.training, False, True)[0])
                finals.append(out[:, 0] if suffix else out.gather(1, last)[:, 0])
                outputs.append(out)
            inputs = torch.cat(outputs, -1) * real[..., None]
            if layer + 1 < rnn.num_layers:
                inputs = F.dropout(inputs, rnn.dropout, self.training)
        return inputs, torch.stack(finals)

    def encode(self, source: Tensor, source_lengths: Tensor) -> Seq2SeqState:
        """Read source (B, S) with lengths (B,); return the decoder's initial state."""
        with _rnn_kernels(self, source):
            return self._encode(source, source_lengths)

    def _encode(self, source: Tensor, source_lengths: Tensor) -> Seq2SeqState:
        check_source(source, source_lengths)
        S = source.shape[1]
        embedded = self.dropout(self.source_embedding(source))  # (B, S, emb)
        if isinstance(self.encoder, nn.GRU):
            memory, final = self._read_unpacked(embedded, source_lengths.to(source.device))
        else:  # an LSTM's final cell at each sentence's last token is only reachable by packing
            packed = pack_padded_sequence(embedded, source_lengths.cpu(), batch_first=True, enforce_sorted=False)
            packed_out, final = self.encoder(packed)
            memory, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=S)  # (B, S, memory_dim)
        hidden: Tensor | tuple[Tensor, Tensor]
        if isinstance(final, tuple):  # LSTM: (h_n, c_n)
            hidden = (self._initial_state(final[0], self.bridge), self._initial_state(final[1], self.bridge_cell))
        else:
            hidden = self._initial_state(final, self.bridge)
        mask = torch.arange(S, device=source.device) < source_lengths.to(source.device)[:, None]  # (B, S)
        keys = feed = None
        if self.style == "bahdanau":
            assert isinstance(self.attention, BahdanauAttention)
            keys = self.attention.project_keys(memory)  # U_a h_j once per sentence
        elif self.style == "luong":
            keys = self.key_proj(memory) if hasattr(self, "key_proj") else memory
            if self.config.input_feeding:
                feed = memory.new_zeros(source.shape[0], self.config.hidden_size)
        return Seq2SeqState(memory, keys, mask, hidden, feed)

    # -- decoder --------------------------------------------------------------------------------

    def _top(self, hidden) -> Tensor:
        return (hidden[0] if isinstance(hidden, tuple) else hidden)[-1]  # (B, hidden)

    def step(self, state: Seq2SeqState, tokens: Tensor) -> StepOutput:
        """One decoder step from the previous tokens (B,); updates ``state`` in place."""
        with _rnn_kernels(self, tokens):
            features, weights = self._recur(state, tokens)
        attentional = torch.tanh(self.combine(features))  # (B, hidden)
        if state.feed is not None:
            state.feed = attentional
        return StepOutput(self.generator(self.dropout(attentional)), weights)

    def _recur(self, state: Seq2SeqState, tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        """The recurrent part of a step: the features (B, hidden [+ memory]) that the output layers
        read, and the attention weights (B, S) or None; updates ``state.hidden``."""
        embedded = self.dropout(self.target_embedding(tokens))  # (B, emb)
        weights = None
        if self.style == "bahdanau":
            context, weights, _ = self.attention(
                self._top(state.hidden), state.memory, key_mask=state.mask, projected_keys=state.keys
            )
            output, state.hidden = self.decoder(torch.cat([embedded, context], -1)[:, None], state.hidden)
            features = torch.cat([output[:, 0], context], -1)
        elif self.style == "luong":
            inputs = embedded if state.feed is None else torch.cat([embedded, state.feed], -1)
            output, state.hidden = self.decoder(inputs[:, None], state.hidden)
            context, weights, _ = self.attention(output[:, 0], state.keys, state.memory, key_mask=state.mask)
            features = torch.cat([output[:, 0], context], -1)
        else:
            output, state.hidden = self.decoder(embedded[:, None], state.hidden)
            features = output[:, 0]
        return features, weights

    def _outputs(self, features: Tensor, weights: Tensor | None) -> TranslationOutput:
        """The output layers over all (B, T) steps at once: attentional vector, then logits."""
        attentional = torch.tanh(self.combine(features))  # (B, T, hidden)
        return TranslationOutput(self.generator(self.dropout(attentional)), weights)

    def _decode_all(self, state: Seq2SeqState, target_in: Tensor) -> TranslationOutput:
        """Teacher forcing in one RNN call (no attention, or Luong without input feeding)."""
        output, state.hidden = self.decoder(self.dropout(self.target_embedding(target_in)), state.hidden)
        weights = None
        if self.style == "luong":
            context, weights, _ = self.attention(output, state.keys, state.memory, key_mask=state.mask)  # (B, T, .)
            output = torch.cat([output, context], -1)
        return self._outputs(output, weights)

    @property
    def folded_teacher_forcing(self) -> bool:
        """Whether teacher forcing can take :meth:`_decode_folded` (Bahdanau, one RNN layer)."""
        return self.style == "bahdanau" and self.config.num_layers == 1

    def _decode_folded(self, state: Seq2SeqState, target_in: Tensor) -> TranslationOutput:
        """Bahdanau teacher forcing with only the recurrence left per step, run by
        :class:`~attnkit.models.recurrence.AdditiveRecurrence` (the same numbers as the step loop;
        its docstring says how the products are regrouped). Around it, large products only: the
        RNN's input projection of all target words, W_c h_j once per sentence, and the contexts
        (B, T, S) @ (B, S, 2H) once at the end.
        """
        E, attention = self.config.embedding_dim, self.attention
        assert isinstance(attention, BahdanauAttention) and state.keys is not None
        w_ih, w_hh, b_ih, b_hh = _layer_weights(self.decoder)
        from_words = F.linear(self.dropout(self.target_embedding(target_in)), w_ih[:, :E], b_ih)  # (B, T, G)
        from_memory = state.memory @ w_ih[:, E:].transpose(0, 1)  # (B, S, G)
        query_bias = attention.query_proj.bias
        weight = torch.cat([w_hh, attention.query_proj.weight])  # (G + A, H)
        bias = torch.cat([b_hh, b_hh.new_zeros(attention.attn_dim) if query_bias is None else query_bias])
        hidden, cell = (state.hidden[0][0], state.hidden[1][0]) if isinstance(state.hidden, tuple) else (state.hidden[0], None)
        tops, alignment = AdditiveRecurrence.apply(from_words, from_memory, state.keys, state.mask, hidden, cell,
                                                   weight, bias, attention.score_proj.weight[0])
        features = torch.cat([tops, alignment @ state.memory], -1)  # (B, T, H + 2H)
        return self._outputs(features, alignment)

    def forward(self, source: Tensor, source_lengths: Tensor, target_in: Tensor, *, stepwise: bool = False) -> TranslationOutput:
        """Teacher-forced logits (B, T, V) and alignment (B, T, S) for target_in (B, T) = <bos> y_1 ...

        ``stepwise=True`` runs the step-by-step decoder even where one RNN call would do (the two
        give the same numbers; the tests check it).
        """
        check_rank("target_in", target_in, 2, "(B, T)")
        with _rnn_kernels(self, source):
            return self._teacher_forced(source, source_lengths, target_in, stepwise)

    def _teacher_forced(self, source: Tensor, source_lengths: Tensor, target_in: Tensor, stepwise: bool) -> TranslationOutput:
        state = self.encode(source, source_lengths)
        if self.parallel_decoding and not stepwise:
            return self._decode_all(state, target_in)
        if self.folded_teacher_forcing and not stepwise:
            return self._decode_folded(state, target_in)
        if state.feed is not None:  # input feeding: each step needs the previous attentional vector
            steps = [self.step(state, target_in[:, t]) for t in range(target_in.shape[1])]
            logits = torch.stack([s.logits for s in steps], 1)
            weights = None if self.style == "none" else torch.stack([_weights(s) for s in steps], 1)
            return TranslationOutput(logits, weights)
        # Only the recurrence is sequential: the output layers run once over all (B, T) steps,
        # one large matrix product instead of T small ones (the generator is most of the FLOPs).
        recurred = [self._recur(state, target_in[:, t]) for t in range(target_in.shape[1])]
        features = torch.stack([f for f, _ in recurred], 1)  # (B, T, F)
        weights = None if self.style == "none" else torch.stack([_weights_of(w) for _, w in recurred], 1)
        return self._outputs(features, weights)
