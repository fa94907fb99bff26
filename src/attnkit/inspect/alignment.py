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
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .._progress import progress_bar
from ..data.batching import collate
from ..data.corpus import Pair
from ..data.tokenizer import Tokenizer
from ..errors import InputError

__all__ = [
    "Links",
    "AlignmentScores",
    "alignment_error_rate",
    "diagonal_alignment",
    "IBMModel1",
    "links_from_weights",
    "word_weights",
    "attention_word_weights",
    "attribution_word_weights",
    "cross_attention_pieces",
    "select_weights",
    "symmetrize",
    "SYMMETRIZATIONS",
    "eflomal_align",
    "read_links",
    "write_links",
]

Links = frozenset  # of (source index, target index)


def write_links(path, alignments: Sequence[Iterable[tuple[int, int]]]) -> None:
    """One line per sentence pair of ``source-target`` word index pairs (the "Pharaoh" format of
    Moses, fast_align and eflomal), written atomically."""
    from .._files import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text("".join(" ".join(f"{i}-{j}" for i, j in sorted(links)) + "\n" for links in alignments),
                       encoding="utf-8")


def read_links(path) -> list[Links]:
    """The alignments of a Pharaoh-format file (:func:`write_links`); a malformed link is a
    ValueError naming its line."""
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        links = set()
        for item in line.split():
            parts = item.split("-")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise InputError(f"{path}, line {number}: expected links like 3-4 (source-target word indices), got {item!r}")
            links.add((int(parts[0]), int(parts[1])))
        out.append(Links(links))
    return out


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
def cross_attention_pieces(model, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, pairs: Sequence[Pair],
                           *, batch_size: int = 64) -> list[np.ndarray]:
    """Every cross-attention matrix of a seq2seq model forced to produce each pair's reference.

    Returns one (layers, heads, T + 1, S) array per pair over its T target and S source pieces:
    row t is the decoder step whose input is piece t - 1 (``<s>`` for t = 0) and whose output is
    piece t (``</s>`` for t = T). An RNN seq2seq model has one layer and one head; a Transformer
    gives every decoder layer's cross attention, head by head.
    """
    from ..models import Seq2Seq
    from .record import record_attention

    if getattr(model, "style", None) == "none":
        raise ValueError("this model has no attention (attention='none'); alignments need one")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            sources = [source_tokenizer.encode(p.source) for p in chunk]
            targets = [target_tokenizer.encode(p.target) for p in chunk]
            batch = collate(sources, targets).to(device)
            if isinstance(model, Seq2Seq):
                weights = model(batch.source, batch.source_lengths, batch.target_in).weights
                if weights is None:
                    raise ValueError(f"{type(model).__name__} returned no attention weights")
                stacked = weights[:, None, None]  # (B, 1, 1, T + 1, S)
            else:
                with record_attention(model) as records:
                    model(batch.source, batch.source_lengths, batch.target_in)
                names = sorted((n for n in records if n.endswith("cross_attn")), key=lambda n: int(n.split(".")[-2]))
                if not names:
                    raise ValueError(f"{type(model).__name__} has no cross-attention module (…layers.N.cross_attn)")
                stacked = torch.stack([records[n][0] for n in names], dim=1)  # (B, layers, H, T + 1, S)
            for k in range(len(chunk)):
                out.append(stacked[k, :, :, : len(targets[k]) + 1, : len(sources[k])].cpu().double().numpy())
    finally:
        model.train(was_training)
    return out


def select_weights(pieces: np.ndarray, *, layer: int = -1, head: int | None = None, shift: bool = False) -> np.ndarray:
    """(T, S) piece-level alignment weights from a (layers, heads, T + 1, S) array of
    :func:`cross_attention_pieces`: one head or the heads' average (``head=None``) of one layer.

    Target piece t takes row t (the step that predicts it) or, with ``shift`` (Chen et al. 2020,
    "shift-att"), row t + 1: the step that reads it as the decoder's input.
    """
    if pieces.ndim != 4:
        raise ValueError(f"pieces must be (layers, heads, T + 1, S), got shape {pieces.shape}")
    layers, heads = pieces.shape[:2]
    if not -layers <= layer < layers:
        raise ValueError(f"layer must be in [{-layers}, {layers}), got {layer}")
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"head must be None (average) or in [0, {heads}), got {head}")
    matrix = pieces[layer].mean(0) if head is None else pieces[layer, head]
    return matrix[1:] if shift else matrix[:-1]


def attention_word_weights(model, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, pairs: Sequence[Pair],
                           *, batch_size: int = 64, layer: int = -1, head: int | None = None,
                           shift: bool = False) -> list[np.ndarray]:
    """Word-level attention of a seq2seq model forced to produce each pair's reference target:
    one (target words, source words) matrix per pair, from :func:`select_weights` (by default the
    last layer's head average, the row that predicts each target piece) pooled to words."""
    out = []
    for pair, pieces in zip(pairs, cross_attention_pieces(model, source_tokenizer, target_tokenizer, pairs,
                                                          batch_size=batch_size)):
        w = select_weights(pieces, layer=layer, head=head, shift=shift)
        out.append(word_weights(w, source_tokenizer.word_ids(pair.source), target_tokenizer.word_ids(pair.target)))
    return out


def _source_token_embedding(model):
    """The nn.Embedding a seq2seq model looks source tokens up in (not shared with the target)."""
    module = getattr(model, "source_embedding", None)
    module = getattr(module, "tokens", module)  # the Transformer wraps its token embedding
    if not isinstance(module, torch.nn.Embedding):
        raise ValueError(f"{type(model).__name__} has no source token embedding (source_embedding) to attribute to")
    target = getattr(model, "target_embedding", None)
    if module is target or module is getattr(target, "tokens", None):
        raise ValueError("source and target share one embedding: attribution to the source alone is not defined here")
    return module


def attribution_word_weights(model, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, pairs: Iterable[Pair],
                             *, steps: int = 8) -> list[np.ndarray]:
    """Alignment weights from attribution instead of attention: for each target piece t of the
    forced reference, the magnitudes of the integrated gradients (Captum, ``steps`` midpoints,
    zero baseline) of log p(y_t | y_<t, x) with respect to the source token embeddings, normalised
    to sum to 1 over the source pieces and pooled to words. One (target words, source words)
    matrix per pair; costs one batch of (target pieces x ``steps``) copies, one forward and one
    backward pass, per pair. ``pairs`` may be any iterable (a progress bar over them)."""
    from .attribution import integrated_gradients

    embedding = _source_token_embedding(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    try:
        for pair in pairs:
            source, target = source_tokenizer.encode(pair.source), target_tokenizer.encode(pair.target)
            batch = collate([source], [target]).to(device)
            T = len(target)
            scores = integrated_gradients(_target_log_probabilities(model, batch, T), embedding, steps=steps, outputs=T)
            magnitude = scores.abs().numpy()  # (T, source pieces)
            total = magnitude.sum(-1, keepdims=True)
            rows = np.where(total > 0, magnitude / np.where(total > 0, total, 1.0), 1.0 / len(source))
            out.append(word_weights(rows, source_tokenizer.word_ids(pair.source),
                                    target_tokenizer.word_ids(pair.target)))
    finally:
        model.train(was_training)
    return out


def _target_log_probabilities(model, batch, pieces: int):
    """forward(m): (m, pieces) log p(y_t | y_<t, x) of each forced target piece (no </s>), m copies."""

    def forward(m: int) -> torch.Tensor:
        logits = model(batch.source.expand(m, -1), batch.source_lengths.expand(m),
                       batch.target_in[:, :pieces].expand(m, -1)).logits  # (m, pieces, V)
        tokens = batch.target_out[:, :pieces].expand(m, -1)
        return logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]

    return forward


SYMMETRIZATIONS = ("intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")

_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def symmetrize(forward: Iterable[tuple[int, int]], reverse: Iterable[tuple[int, int]],
               method: str = "grow-diag-final-and") -> Links:
    """Combine the links of two directional alignments of one sentence pair, both given as
    (source index, target index), by the heuristics of Koehn et al. (2003) as Moses implements them.

    Start from the intersection; "grow-diag" adds, while any can be added, union links next to
    (also diagonally) an intersection link whose source or target word is still unaligned;
    "-final" then adds union links whose source or target word is unaligned, "-final-and" only
    those whose source and target words are both unaligned.
    """
    if method not in SYMMETRIZATIONS:
        raise ValueError(f"method must be one of {SYMMETRIZATIONS}, got {method!r}")
    forward, reverse = set(forward), set(reverse)
    union = forward | reverse
    links = forward & reverse
    if method == "intersection":
        return Links(links)
    if method == "union":
        return Links(union)
    aligned_s = {i for i, _ in links}
    aligned_t = {j for _, j in links}

    def add(i: int, j: int) -> None:
        links.add((i, j))
        aligned_s.add(i)
        aligned_t.add(j)

    added = True
    while added:
        added = False
        for i, j in sorted(links):
            for di, dj in _NEIGHBOURS:
                n = (i + di, j + dj)
                if n in union and n not in links and (n[0] not in aligned_s or n[1] not in aligned_t):
                    add(*n)
                    added = True
    if method.startswith("grow-diag-final"):
        both = method == "grow-diag-final-and"
        for direction in (forward, reverse):
            for i, j in sorted(direction):
                if (i, j) in links:
                    continue
                free_s, free_t = i not in aligned_s, j not in aligned_t
                if (free_s and free_t) if both else (free_s or free_t):
                    add(i, j)
    return Links(links)


def eflomal_align(pairs: Sequence[tuple[Sequence[str], Sequence[str]]], *, model: int = 3,
                  rel_iterations: float = 1.0, samplers: int = 3) -> tuple[list[Links], list[Links]]:
    """Forward (source -> target) and reverse word alignments of (source words, target words) pairs
    by eflomal (Östling & Tiedemann 2016: a Bayesian HMM with fertility, fitted by Gibbs sampling;
    model 3), both as (source index, target index) links. Unsupervised: it reads only the text.
    Lowercases as eflomal does. Sampling is random: runs differ slightly."""
    try:
        import eflomal
    except ImportError as error:
        raise ImportError("eflomal_align needs the eflomal package: pip install 'attnkit[inspect]' (or eflomal)") from error
    if not pairs:
        raise ValueError("pairs is empty")
    for k, (source, target) in enumerate(pairs):
        if not source or not target:
            raise ValueError(f"pair {k} has an empty side: eflomal needs at least one word on each side")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="attnkit-eflomal-") as folder:
        fwd, rev = Path(folder) / "forward", Path(folder) / "reverse"
        aligner = eflomal.Aligner(model=model, rel_iterations=rel_iterations, n_samplers=samplers)
        aligner.align([" ".join(s) for s, _ in pairs], [" ".join(t) for _, t in pairs],
                      links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        result = []
        for path in (fwd, rev):
            lines = path.read_text(encoding="utf-8").splitlines()
            if len(lines) != len(pairs):
                raise RuntimeError(f"eflomal wrote {len(lines)} alignment lines for {len(pairs)} pairs")
            result.append([Links(tuple(int(x) for x in link.split("-")) for link in line.split()) for line in lines])
    return result[0], result[1]


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
            progress: bool = False, tolerance: float = 1e-4) -> IBMModel1:
        """EM on (source words, target words) pairs; t starts uniform. At most ``iterations``
        iterations: EM stops once the log-likelihood per target word improves by less than
        ``tolerance`` (``converged`` then says after how many). ``progress`` shows a tqdm bar."""

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
        self.converged: int | None = None
        words_total = max(1, sum(len(target) for _, target in pairs))
        for _ in progress_bar(range(iterations), progress=progress, desc="IBM Model 1 EM", unit="iteration"):
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
            if len(self.log_likelihoods) > 1 and (
                    self.log_likelihoods[-1] - self.log_likelihoods[-2]) / words_total < tolerance:
                self.converged = len(self.log_likelihoods)
                break
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
