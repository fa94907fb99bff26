"""Closed-form block masks: the tiles written from a few numbers per block must be the tiles that
evaluating the same mask_mod on every pair gives (attnkit.masks.block_mask), at random lengths,
block sizes (dividing the lengths or not), offsets and per-example tables."""

from __future__ import annotations

import random

import pytest
import torch

from attnkit import masks
from attnkit.functional import block_patterns as patterns


def _dense_kinds(built):
    B, H, L, S = built.shape
    return masks.block_mask(built.mask_mod, B, H, L, S, block=built.block_size).kinds


def _random_documents(rng: random.Random, B: int, L: int) -> torch.Tensor:
    rows = []
    for _ in range(B):
        lengths = [rng.randint(0, 40) for _ in range(rng.randint(1, 12))]
        ids = patterns.document_ids(lengths, total=max(L, sum(lengths)))[:L].clone()
        if rng.random() < 0.3:  # padding anywhere, not only at the end
            ids[torch.rand(L, generator=torch.Generator().manual_seed(rng.randint(0, 10**6))) < 0.2] = -1
        rows.append(ids)
    return torch.stack(rows) if B > 1 else rows[0]


def _build(kind: str, rng: random.Random):
    L, S = rng.randint(1, 300), rng.randint(1, 300)
    block = (rng.choice([1, 3, 16, 32, 64]), rng.choice([1, 5, 16, 32, 64]))
    align = rng.choice(masks.ALIGNMENTS)
    if kind == "causal":
        return patterns.causal_block_mask(L, S, causal_align=align, block=block)
    if kind == "window":
        return patterns.window_block_mask(L, S, window=rng.randint(0, 80), block=block)
    if kind == "causal-window":
        return patterns.window_block_mask(L, S, window=rng.randint(1, 80), causal=True, causal_align=align, block=block)
    if kind == "longformer":
        flags = torch.rand(rng.choice([1, 2]), L, generator=torch.Generator().manual_seed(rng.randint(0, 10**6)))
        flags = flags < rng.choice([0.0, 0.02, 0.3, 1.0])
        return patterns.longformer_block_mask(rng.randint(0, 60), flags if rng.random() < 0.5 else flags[0], block=block)
    if kind == "documents":
        causal = rng.random() < 0.6
        return patterns.document_block_mask(_random_documents(rng, rng.choice([1, 2]), L), causal=causal,
                                            block=(block[0], block[0]) if causal else block)
    if kind == "prefix-lm":
        prefix = rng.randint(0, L) if rng.random() < 0.5 else torch.randint(0, L + 1, (2,))
        return patterns.prefix_lm_block_mask(L, prefix, S, block=block)
    assert kind == "sinks"
    return patterns.sinks_block_mask(L, S, sinks=rng.randint(0, 20), window=rng.randint(1, 60), causal_align=align,
                                     block=block)


KINDS = ["causal", "window", "causal-window", "longformer", "documents", "prefix-lm", "sinks"]


@pytest.mark.parametrize("kind", KINDS)
def test_closed_form_tiles_equal_dense_evaluation(kind):
    rng = random.Random(KINDS.index(kind))
    for _ in range(40):
        built = _build(kind, rng)
        assert built.kinds.dtype == torch.int8
        assert torch.equal(built.kinds, _dense_kinds(built)), (kind, built)


def test_documents_in_any_order_fall_back_to_dense_evaluation():
    ids = torch.tensor([0, 0, 1, 1, 0, 0, 2, 2] * 8)  # document 0 comes back: not packed
    built = patterns.document_block_mask(ids, block=4)
    assert torch.equal(built.kinds, _dense_kinds(built))


def test_document_ids_from_lengths():
    assert patterns.document_ids([2, 0, 3], total=7).tolist() == [0, 0, 2, 2, 2, -1, -1]
    with pytest.raises(ValueError, match="total must be at least sum"):
        patterns.document_ids([4, 4], total=5)
    with pytest.raises(ValueError, match="non-negative integers"):
        patterns.document_ids([3, -1])


@pytest.mark.parametrize("name", ["causal", "window", "longformer", "documents", "prefix-lm", "sinks"])
def test_named_patterns_use_the_closed_form_with_the_same_tiles(name, monkeypatch):
    """pattern_block_mask builds these in closed form: no mask_mod is evaluated to classify tiles."""
    options = {"width": 40} if name in ("window", "longformer") else {"window": 40} if name == "sinks" else {}
    dense = masks.block_mask(masks.PATTERNS[name](300, 300, **options), 1, 1, 300, 300, block=32)
    monkeypatch.setattr("attnkit.functional.block_mask._classify", lambda *_: pytest.fail("evaluated densely"))
    built = masks.pattern_block_mask(name, 300, block=32, **options)
    assert torch.equal(built.kinds, dense.kinds)


@pytest.mark.slow
def test_closed_form_at_16k_tokens_equals_dense_evaluation():
    flags = torch.zeros(16384, dtype=torch.bool)
    flags[:16] = True
    flags[9000] = True
    built = patterns.longformer_block_mask(512, flags)
    assert torch.equal(built.kinds, _dense_kinds(built))
    docs = patterns.document_block_mask(patterns.document_ids([5000, 3000, 100, 8284]))
    assert torch.equal(docs.kinds, _dense_kinds(docs))
