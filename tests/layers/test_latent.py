"""LatentAttention's own promises (transformers' DeepseekV3Attention and DeepseekV32Attention hold it to
theirs in tests/external/test_hf_deepseek.py): naive and absorbed give one answer, cached decoding the full
pass's with padding and beam reordering, the cache holds the latent alone, and wrong inputs are named."""

from __future__ import annotations

import pytest
import torch

from attnkit.layers import KVCache, LatentAttention, LatentCache, LightningIndexer, MultiHeadAttention, RotaryEmbedding

from helpers import randn


def _layer(sparse=False, q_lora_rank=12):
    torch.manual_seed(0)
    indexer = LightningIndexer(32, 12, num_heads=4, head_dim=8, rope_dim=4, topk=3) if sparse else None
    return LatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                           q_lora_rank=q_lora_rank, indexer=indexer).double()


@pytest.mark.parametrize("sparse", [False, True], ids=["mla", "dsa"])
def test_decoding_a_left_padded_batch_equals_the_full_pass_on_real_rows(sparse, rng):
    layer = _layer(sparse)
    x = randn(2, 8, 32, dtype=torch.float64, generator=rng)
    real = torch.ones(2, 8, dtype=torch.bool)
    real[1, :3] = False
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    want = layer(x, key_mask=real, positions=positions).output
    cache = LatentCache()
    steps = [layer(x[:, :4], key_mask=real[:, :4], positions=positions[:, :4], cache=cache).output]
    for t in range(4, 8):
        steps.append(layer(x[:, t:t + 1], key_mask=real[:, :t + 1], positions=positions[:, t:t + 1], cache=cache).output)
    got = torch.cat(steps, dim=1)
    torch.testing.assert_close(got[real], want[real], rtol=1e-10, atol=1e-10)


def test_the_cache_holds_the_latent_and_follows_a_beam_search(rng):
    layer = _layer()
    x = randn(3, 5, 32, dtype=torch.float64, generator=rng)
    cache = LatentCache()
    layer(x, cache=cache)
    assert cache.numbers_per_token() == 8 + 4 and cache.keys.shape == (3, 1, 5, 8)  # no per-head key or value
    order = torch.tensor([2, 0, 0])
    cache.reorder(order)
    step = randn(3, 1, 32, dtype=torch.float64, generator=rng)
    got = layer(step, cache=cache).output
    fresh = LatentCache()
    layer(x[order], cache=fresh)
    torch.testing.assert_close(got, layer(step, cache=fresh).output, rtol=1e-12, atol=1e-12)
    cache.reset()
    assert cache.length == 0 and cache.numbers_per_token() == 0


def test_absorbed_equals_naive_without_a_query_latent_too(rng):
    layer = _layer(q_lora_rank=None)
    x = randn(2, 6, 32, dtype=torch.float64, generator=rng)
    torch.testing.assert_close(layer(x, absorbed=True).output, layer(x, absorbed=False).output, rtol=1e-12, atol=1e-12)
    weights = layer(x, need_weights=True).weights
    assert weights.shape == (2, 4, 6, 6) and torch.allclose(weights.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))


def test_without_rope_positions_change_nothing_and_the_scores_are_the_plain_dot_products(rng):
    """rope=False (Kimi Linear's MLA): no rotation, so shifted positions give the same output, and the weights are
    softmax((q_nope k_nope + q_rope k_rope) scale) computed here from the layer's own projections."""
    torch.manual_seed(0)
    layer = LatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                            rope=False).double()
    assert layer.rotary is None
    x = randn(2, 6, 32, dtype=torch.float64, generator=rng)
    plain = layer(x, need_weights=True)
    shifted = layer(x, positions=torch.arange(100, 106), need_weights=True)
    torch.testing.assert_close(shifted.output, plain.output, rtol=1e-12, atol=1e-12)
    q = layer.q_proj(x).view(2, 6, 4, 10).transpose(1, 2)
    latent, shared = layer.kv_a_proj(x).split([8, 4], dim=-1)
    up = layer.kv_b_proj(layer.kv_a_norm(latent)).view(2, 6, 4, 11).transpose(1, 2)
    k = torch.cat([up[..., :6], shared[:, None].expand(-1, 4, -1, -1)], dim=-1)
    scores = (q @ k.transpose(-1, -2)) * 10**-0.5
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(plain.weights, scores.softmax(-1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="rope=False rotates nothing"):
        LatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, rope=False,
                        rotary=RotaryEmbedding(4))


def test_wrong_inputs_are_named(rng):
    layer = _layer()
    with pytest.raises(ValueError, match=r"x must have 3 dimensions"):
        layer(randn(2, 32, generator=rng, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"last dim d_model=32"):
        layer(randn(2, 3, 31, generator=rng, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"cache must be a LatentCache"):
        layer(randn(2, 3, 32, generator=rng, dtype=torch.float64), cache=KVCache())
    with pytest.raises(TypeError, match=r"cache: a LatentCache serves LatentAttention layers only; MultiHeadAttention"):
        MultiHeadAttention(32, 4)(randn(2, 3, 32, generator=rng), cache=LatentCache())
    with pytest.raises(ValueError, match=r"indexer: .* q_lora_rank"):
        LatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, q_lora_rank=None,
                        indexer=LightningIndexer(32, 12, num_heads=2, head_dim=8, rope_dim=4, topk=2))


def test_sparse_attention_applies_the_mask_in_its_selection_and_its_attention(rng, monkeypatch):
    """``mask=`` with a LightningIndexer: with the indexer selecting every key, DSA is the
    dense layer, and both follow a restrictive mask alike; a key the mask rules out is never selected."""
    dense, sparse = _layer(), _layer(sparse=True)
    sparse.indexer.topk = 16  # every key: DSA must equal the dense layer under any mask
    state = {name: value for name, value in sparse.state_dict().items() if not name.startswith("indexer.")}
    dense.load_state_dict(state)
    x = randn(2, 9, 32, dtype=torch.float64, generator=rng)
    mask = torch.rand(2, 1, 9, 9, generator=rng) < 0.5
    mask[..., 0] = True  # every query keeps a key
    for absorbed in (False, True):
        want = dense(x, mask=mask, absorbed=absorbed).output
        torch.testing.assert_close(sparse(x, mask=mask, absorbed=absorbed).output, want, rtol=1e-10, atol=1e-10)
    assert (sparse(x, mask=mask).output - sparse(x).output).abs().max() > 1e-3  # the mask changes something
    chosen = []
    select = sparse.indexer.select
    monkeypatch.setattr(sparse.indexer, "select", lambda *a, **k: chosen.append(select(*a, **k)) or chosen[-1])
    sparse.indexer.topk = 3
    sparse(x, mask=mask)
    picked = chosen[0]  # (B, L, 3)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    allowed = (mask[:, 0] & causal).gather(-1, picked.clamp(min=0))
    assert (allowed | (picked < 0)).all()
    with pytest.raises(ValueError, match="shared by the heads"):
        sparse(x, mask=torch.ones(2, 4, 9, 9, dtype=torch.bool))


@pytest.mark.parametrize("absorbed", [False, True], ids=["naive", "absorbed"])
def test_a_call_of_no_token_gives_an_empty_output(absorbed, rng):
    """L = 0 (and so S = 0 without a cache): an empty (B, 0, D) output, not a reshape error (the naive path's
    up-projection names every size of its view)."""
    layer = _layer()
    out = layer(randn(2, 0, 32, dtype=torch.float64, generator=rng), absorbed=absorbed).output
    assert out.shape == (2, 0, 32)
