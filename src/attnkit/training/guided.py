"""Guided alignment (Garg et al. 2019): word links of the training pairs (e.g. eflomal's, from
``attnkit align``) turned into per-piece target distributions that one attention head is trained
towards, next to the translation loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..data import Pair, Tokenizer

__all__ = ["Guide", "piece_guides"]


Guide = tuple[torch.Tensor, torch.Tensor]  # (target piece, source piece) index pairs of one training pair


def piece_guides(pairs: Sequence[Pair], alignments: Sequence, source: Tokenizer, target: Tokenizer) -> list[Guide]:
    """Word links (source word, target word) of each pair as (target piece, source piece) index
    pairs: every piece of a linked target word to every piece of its linked source words.
    Raises ValueError naming the pair whose links fall outside its words."""
    if len(alignments) != len(pairs):
        raise ValueError(f"alignments must have one line per training pair: got {len(alignments)} for {len(pairs)} pairs")
    guides = []
    for k, (pair, links) in enumerate(zip(pairs, alignments)):
        source_words, target_words = source.word_ids(pair.source), target.word_ids(pair.target)
        n_source, n_target = len(pair.source.split()), len(pair.target.split())
        bad = [(i, j) for i, j in links if not (0 <= i < n_source and 0 <= j < n_target)]
        if bad:
            raise ValueError(f"alignment of training pair {k} links words outside its {n_source} source and "
                             f"{n_target} target words: {sorted(bad)[:5]}")
        by_target: dict[int, list[int]] = {}
        for i, j in links:
            by_target.setdefault(j, []).append(i)
        pieces_of_source: dict[int, list[int]] = {}
        for s, w in enumerate(source_words):
            pieces_of_source.setdefault(w, []).append(s)
        rows, cols = [], []
        for t, w in enumerate(target_words):
            for i in by_target.get(w, ()):
                for s in pieces_of_source.get(i, ()):
                    rows.append(t)
                    cols.append(s)
        guides.append((torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)))
    return guides


def _guide_matrix(guides: Sequence[Guide], shape: tuple[int, int, int]) -> torch.Tensor:
    """(B, T, S) target distributions: each guided row uniform over its linked source pieces."""
    matrix = torch.zeros(shape)
    for b, (rows, cols) in enumerate(guides):
        matrix[b, rows, cols] = 1.0
    return matrix / matrix.sum(-1, keepdim=True).clamp_min(1.0)
