"""Word alignments: from a seq2seq model's attention, from IBM Model 1, from the diagonal, and
their quality against gold links (alignment error rate).

A link ``(i, j)`` joins source word i and target word j (0-based, words separated by spaces).
With sure links S, possible links P (S is a subset of P) and predicted links A
(Och & Ney 2003):

    precision = |A & P| / |A|,  recall = |A & S| / |S|,  AER = 1 - (|A & S| + |A & P|) / (|A| + |S|)

Counts are summed over the corpus before dividing. When only one kind of gold link exists
(P = S), AER = 1 - F1.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..data.batching import collate
from ..data.corpus import Pair
from ..data.tokenizer import Tokenizer

__all__ = [
    "Links",
    "AlignmentScores",
    "alignment_error_rate",
    "diagonal_alignment",
    "IBMModel1",
    "links_from_weights",
    "word_weights",
    "attention_word_weights",
]

Links = frozenset  # of (source index, target index)


class AlignmentScores(NamedTuple):
    precision: float
    recall: float
    aer: float
    predicted: int  # |A|
    sure: int  # |S|


def alignment_error_rate(
    predicted: Sequence[Iterable[tuple[int, int]]],
    sure: Sequence[Iterable[tuple[int, int]]],
    possible: Sequence[Iterable[tuple[int, int]]] | None = None,
) -> AlignmentScores:
    """Corpus-level precision, recall and AER of predicted links against gold sure (and possible) links."""
    if len(predicted) != len(sure):
        raise ValueError(f"predicted and sure differ in number of sentences: {len(predicted)} and {len(sure)}")
    if possible is not None and len(possible) != len(sure):
        raise ValueError(f"possible and sure differ in number of sentences: {len(possible)} and {len(sure)}")
    a_total = s_total = a_and_s = a_and_p = 0
    for k, (a, s) in enumerate(zip(predicted, sure)):
        a, s = set(a), set(s)
        p = s | set(possible[k]) if possible is not None else s
        a_total += len(a)
        s_total += len(s)
        a_and_s += len(a & s)
        a_and_p += len(a & p)
    if s_total == 0:
        raise ValueError("the gold alignment has no sure links")
    precision = a_and_p / a_total if a_total else 0.0
    recall = a_and_s / s_total
    aer = 1.0 - (a_and_s + a_and_p) / (a_total + s_total)
    return AlignmentScores(precision, recall, aer, a_total, s_total)


def diagonal_alignment(source_length: int, target_length: int) -> Links:
    """The baseline that links each target word j to the source word at the same relative position."""
    if source_length < 1 or target_length < 1:
        raise ValueError(f"lengths must be >= 1, got source {source_length} and target {target_length}")
    return Links((min(source_length - 1, int((j + 0.5) * source_length / target_length)), j) for j in range(target_length))


def links_from_weights(weights, *, method: str = "argmax", threshold: float = 0.3) -> Links:
    """Links from a (target words, source words) weight matrix.

    "argmax": each target word to its highest-weight source word. "threshold": every pair whose
    weight is at least ``threshold``, plus the argmax when no weight of a row reaches it.
    """
    w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64)
    if w.ndim != 2 or 0 in w.shape:
        raise ValueError(f"weights must be a non-empty 2-D (target, source) matrix, got shape {w.shape}")
    best = w.argmax(1)
    if method == "argmax":
        return Links((int(best[j]), j) for j in range(w.shape[0]))
    if method == "threshold":
        links = {(int(i), int(j)) for j, i in zip(*np.nonzero(w >= threshold))}
        links |= {(int(best[j]), j) for j in range(w.shape[0]) if w[j].max() < threshold}
        return Links(links)
    raise ValueError(f"method must be 'argmax' or 'threshold', got {method!r}")


def word_weights(weights, source_words: Sequence[int], target_words: Sequence[int]) -> np.ndarray:
    """Piece-level (T pieces, S pieces) weights to word level (T words, S words).

    A source word receives the sum of its pieces' weights (the mass put on it); a target word's
    row is the mean of its pieces' rows, so every row still sums to the mass on the source words.
    ``source_words[s]`` / ``target_words[t]`` give each piece's word index.
    """
    w = np.asarray(weights, dtype=np.float64)
    T, S = w.shape
    if len(source_words) != S or len(target_words) != T:
        raise ValueError(f"weights of shape {w.shape} need {S} source and {T} target word ids, "
                         f"got {len(source_words)} and {len(target_words)}")
    columns = np.zeros((S, max(source_words) + 1))
    columns[np.arange(S), source_words] = 1.0
    rows = np.zeros((max(target_words) + 1, T))
    rows[target_words, np.arange(T)] = 1.0
    rows /= rows.sum(1, keepdims=True)
    return rows @ w @ columns


@torch.no_grad()
def attention_word_weights(model, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, pairs: Sequence[Pair],
                           *, batch_size: int = 64) -> list[np.ndarray]:
    """Word-level attention of a seq2seq model forced to produce each pair's reference target.

    The row of target piece t is the attention used to predict it; the <eos> row and nothing else
    is dropped. Returns one (target words, source words) matrix per pair.
    """
    if getattr(model, "style", None) == "none":
        raise ValueError("this model has no attention (attention='none'); alignments need one")
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            sources = [source_tokenizer.encode(p.source) for p in chunk]
            targets = [target_tokenizer.encode(p.target) for p in chunk]
            batch = collate(sources, targets)
            result = model(batch.source, batch.source_lengths, batch.target_in)
            if result.weights is None:
                raise ValueError(f"{type(model).__name__} returned no attention weights")
            for k, pair in enumerate(chunk):
                w = result.weights[k, : len(targets[k]), : len(sources[k])].double().numpy()
                out.append(word_weights(w, source_tokenizer.word_ids(pair.source), target_tokenizer.word_ids(pair.target)))
    finally:
        model.train(was_training)
    return out


class IBMModel1:
    """IBM Model 1 (Brown et al. 1993): lexical translation probabilities t(target | source)
    learnt by EM from sentence pairs alone, with a NULL source word.

        p(t_j aligned to s_i) = t(t_j | s_i) / sum_i' t(t_j | s_i'),  i over NULL and the source words

    Train with :meth:`fit`; :meth:`align` links each target word to its most probable source word
    (no link when NULL wins).
    """

    NULL = "<null>"

    def __init__(self) -> None:
        self.table: dict[str, dict[str, float]] = {}
        self.log_likelihoods: list[float] = []

    def fit(self, pairs: Sequence[tuple[Sequence[str], Sequence[str]]], *, iterations: int = 5,
            progress: bool = False) -> IBMModel1:
        """EM on (source words, target words) pairs; t starts uniform. ``progress`` shows a tqdm bar
        of the iterations."""
        from tqdm.auto import tqdm

        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        vocabulary = {w for _, target in pairs for w in target}
        if not vocabulary:
            raise ValueError("no target words to learn from")
        uniform = 1.0 / len(vocabulary)
        table: dict[str, dict[str, float]] = defaultdict(dict)
        for source, target in pairs:
            for s in (self.NULL, *source):
                row = table[s]
                for t in target:
                    row[t] = uniform
        self.log_likelihoods = []
        for _ in tqdm(range(iterations), desc="IBM Model 1 EM", unit="iteration", leave=False, disable=not progress):
            counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            log_likelihood = 0.0
            for source, target in pairs:
                words = (self.NULL, *source)
                for t in target:
                    probs = [table[s][t] for s in words]
                    total = sum(probs)
                    log_likelihood += math.log(total / len(words))
                    for s, p in zip(words, probs):
                        counts[s][t] += p / total
            for s, row in counts.items():
                norm = sum(row.values())
                table[s] = {t: c / norm for t, c in row.items()}
            self.log_likelihoods.append(log_likelihood)
        self.table = dict(table)
        return self

    def probability(self, target: str, source: str) -> float:
        return self.table.get(source, {}).get(target, 0.0)

    def align(self, source: Sequence[str], target: Sequence[str]) -> Links:
        """The Viterbi alignment: each target word to its most probable source word, or none (NULL)."""
        links = set()
        for j, t in enumerate(target):
            best, best_p = None, self.probability(t, self.NULL)
            for i, s in enumerate(source):
                p = self.probability(t, s)
                if p > best_p:
                    best, best_p = i, p
            if best is not None:
                links.add((best, j))
        return Links(links)
