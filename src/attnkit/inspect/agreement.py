"""Does attention rank input tokens the way gradient attribution does? Per example, the rank
correlations between attention-based token scores and attribution scores, for two kinds of model:

- a sentence encoder (all-MiniLM-L6-v2): the output is the cosine similarity of the sentence's
  mean-pooled embedding to a partner sentence's; attention scores per token are the mass it
  receives in the last layer (mean over heads and queries) and its attention-rollout mass;
- an attention seq2seq model: for each target step t the output is log p(y_t | y_<t, x) with the
  reference target forced; the attention score of a source piece is its weight at step t.

Attributions (Captum): integrated gradients, gradient x input and sampled Shapley values.
Special tokens ([CLS], [SEP], <eos>) are left out of the rankings: they are not words of the input.
Attribution scores are ranked by magnitude (an attribution of -2 matters more than +0.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data.batching import collate
from ..models.encoder import mean_pool
from .attribution import gradient_x_input, integrated_gradients, kendall, shapley_values, spearman
from .roles import encoder_attentions
from .rollout import attention_rollout

__all__ = ["Agreement", "encoder_agreement", "seq2seq_agreement", "summarise"]


@dataclass
class Agreement:
    """One example: its scored tokens, each score vector, and the correlations
    ``correlations[(attention, attribution)] = (spearman, kendall)``."""

    name: str
    tokens: list[str]
    attention: dict[str, np.ndarray]
    attribution: dict[str, np.ndarray]
    correlations: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def correlate(self) -> Agreement:
        """Every attention score against every attribution's magnitude, then the attributions
        against each other (do integrated gradients and Shapley values agree?). An example of fewer than two
        scored tokens ranks nothing: its correlations are NaN (left out of :func:`summarise`, which counts
        them)."""
        if len(self.tokens) < 2:
            names = list(self.attribution)
            pairs = [(a, b) for a in self.attention for b in names]
            pairs += [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
            self.correlations = {pair: (math.nan, math.nan) for pair in pairs}
            return self
        for a, att in self.attention.items():
            for b, attr in self.attribution.items():
                self.correlations[(a, b)] = (spearman(att, np.abs(attr)), kendall(att, np.abs(attr)))
        names = list(self.attribution)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                x, y = np.abs(self.attribution[a]), np.abs(self.attribution[b])
                self.correlations[(a, b)] = (spearman(x, y), kendall(x, y))
        return self


def summarise(examples: Sequence[Agreement]) -> list[dict]:
    """Per (attention, attribution) pair: count, mean, median and quartiles of Spearman and Kendall."""
    if not examples:
        raise ValueError("no examples to summarise")
    rows: list[dict[str, Any]] = []
    for key in examples[0].correlations:
        row: dict[str, Any] = {"attention": key[0], "attribution": key[1]}
        for k, name in enumerate(("spearman", "kendall")):
            values = np.array([e.correlations[key][k] for e in examples], dtype=np.float64)
            values = values[np.isfinite(values)]
            if not len(values):  # no example ranked two tokens
                row[name] = {"n": 0, "mean": None, "median": None, "q25": None, "q75": None, "values": []}
                continue
            row[name] = {"n": int(len(values)), "mean": float(values.mean()), "median": float(np.median(values)),
                         "q25": float(np.quantile(values, 0.25)), "q75": float(np.quantile(values, 0.75)),
                         "values": values.tolist()}
        rows.append(row)
    return rows


def _similarity(model, ids, types, target):
    """forward(m): cosine similarity of m copies of the sentence's mean-pooled embedding to ``target``."""

    def forward(m: int) -> torch.Tensor:
        batch, mask = ids.expand(m, -1), torch.ones(m, ids.shape[1], dtype=torch.long, device=ids.device)
        pooled = mean_pool(model(batch, mask, types.expand(m, -1)).hidden_states, mask)
        return F.cosine_similarity(pooled, target[None], dim=-1)

    return forward


def _log_probability(model, batch, t: int, token: int):
    """forward(m): log p(token at step t | the forced prefix, source) for m copies of the pair."""

    def forward(m: int) -> torch.Tensor:
        logits = model(batch.source.expand(m, -1), batch.source_lengths.expand(m),
                       batch.target_in[:, : t + 1].expand(m, -1)).logits  # (m, t + 1, V)
        return logits[:, t].log_softmax(-1)[:, token]

    return forward


def encoder_agreement(model, tokenizer, sentences: Sequence[str], partners: Sequence[str], *,
                      steps: int = 32, shapley_samples: int = 25) -> list[Agreement]:
    """Agreement on a BERT-style sentence encoder (``tokenizers`` tokenizer): output =
    cos(mean-pooled embedding of the sentence, that of its partner). Attributions: integrated
    gradients, gradient x input and (``shapley_samples`` > 0) sampled Shapley values."""
    if len(sentences) != len(partners):
        raise ValueError(f"sentences and partners differ in number: {len(sentences)} and {len(partners)}")
    same = [s for s, p in zip(sentences, partners) if s.strip() == p.strip()]
    if same:
        raise ValueError(f"a sentence is its own partner ({same[0][:60]!r}): its cosine is 1 whatever the input, a "
                         "degenerate objective whose attributions are noise; give a different partner")
    model.eval()
    device = next(model.parameters()).device
    specials = {"[CLS]", "[SEP]", "[PAD]"}
    out = []
    for sentence, partner in zip(sentences, partners):
        e = tokenizer.encode(sentence)
        p = tokenizer.encode(partner)
        ids, types = torch.tensor([e.ids], device=device), torch.tensor([e.type_ids], device=device)
        with torch.no_grad():
            pids = torch.tensor([p.ids], device=device)
            target = mean_pool(model(pids, torch.ones_like(pids)).hidden_states, torch.ones_like(pids))[0]
        (attentions,), _ = encoder_attentions(model, tokenizer, [sentence])

        forward = _similarity(model, ids, types, target)
        embedding = model.embeddings.tokens
        keep = np.array([t not in specials for t in e.tokens])
        last = attentions[-1].double().mean(0).mean(0).numpy()  # mass each token receives, last layer
        rollout = attention_rollout(attentions).mean(0).numpy()
        attributions = {"integrated-gradients": integrated_gradients(forward, embedding, steps=steps).numpy(),
                        "gradient-x-input": gradient_x_input(forward, embedding).numpy()}
        if shapley_samples:
            attributions["shapley"] = shapley_values(forward, embedding, samples=shapley_samples).numpy()
        out.append(Agreement(
            sentence, [t for t, k in zip(e.tokens, keep) if k],
            {"last-layer": last[keep], "rollout": rollout[keep]},
            {name: values[keep] for name, values in attributions.items()},
        ).correlate())
    return out


def seq2seq_agreement(model, source_tokenizer, target_tokenizer, pairs, *, steps: int = 32,
                      max_steps_per_pair: int | None = None, shapley_samples: int = 0) -> list[Agreement]:
    """Agreement on an attention seq2seq model, one :class:`Agreement` per (pair, target step);
    sampled Shapley values too when ``shapley_samples`` > 0 (samples x S forward passes per step)."""
    if getattr(model, "style", None) == "none":
        raise ValueError("this model has no attention (attention='none')")
    model.eval()
    out = []
    for pair in pairs:
        source = source_tokenizer.encode(pair.source)
        target = target_tokenizer.encode(pair.target)
        batch = collate([source], [target]).to(next(model.parameters()).device)
        with torch.no_grad():
            weights = model(batch.source, batch.source_lengths, batch.target_in).weights[0].cpu()  # (T, S)
        tokens = source_tokenizer.tokens(pair.source)
        for t in range(min(len(target), max_steps_per_pair or len(target))):
            forward = _log_probability(model, batch, t, target[t])
            embedding = model.source_embedding
            attributions = {"integrated-gradients": integrated_gradients(forward, embedding, steps=steps).numpy(),
                            "gradient-x-input": gradient_x_input(forward, embedding).numpy()}
            if shapley_samples:
                attributions["shapley"] = shapley_values(forward, embedding, samples=shapley_samples).numpy()
            out.append(Agreement(
                f"{pair.reference or pair.source[:40]} @ {target_tokenizer.id_to_token(target[t])}", tokens,
                {"attention": weights[t].double().numpy()}, attributions,
            ).correlate())
    return out
