"""routed_experts (the mixtures' SwiGLU experts, transformers' fused weights): each token's chosen experts weighted and
summed, against the sum written out in float64; one token (a decoding step, its own path) as the batch's row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.models.blocks import routed_experts


def _written_out(x, gate_up_proj, down_proj, experts, weights):
    rows = []
    for n in range(x.shape[0]):
        row = torch.zeros_like(x[n])
        for slot, expert in enumerate(experts[n].tolist()):
            gate, up = (gate_up_proj[expert] @ x[n]).chunk(2)
            row = row + weights[n, slot] * (down_proj[expert] @ (F.silu(gate) * up))
        rows.append(row)
    return torch.stack(rows)


def _case(rng, N=5, E=6, D=16, Fd=8, k=2, dtype=torch.float64):
    x = torch.randn(N, D, generator=rng, dtype=torch.float64)
    gate_up_proj = torch.randn(E, 2 * Fd, D, generator=rng, dtype=torch.float64) / 4
    down_proj = torch.randn(E, D, Fd, generator=rng, dtype=torch.float64) / 4
    experts = torch.stack([torch.randperm(E, generator=rng)[:k] for _ in range(N)])
    weights = torch.rand(N, k, generator=rng, dtype=torch.float64)
    return x.to(dtype), gate_up_proj.to(dtype), down_proj.to(dtype), experts, weights


def test_a_batch_and_each_token_alone_give_the_written_out_sum(rng):
    x, gate_up_proj, down_proj, experts, weights = _case(rng)
    want = _written_out(x, gate_up_proj, down_proj, experts, weights)
    torch.testing.assert_close(routed_experts(x, gate_up_proj, down_proj, experts, weights), want, rtol=1e-12, atol=1e-12)
    alone = torch.cat([routed_experts(x[n:n + 1], gate_up_proj, down_proj, experts[n:n + 1], weights[n:n + 1])
                       for n in range(x.shape[0])])
    torch.testing.assert_close(alone, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)], ids=str)
def test_one_token_equals_the_batchs_row_in_the_models_dtype(dtype, tol, rng):
    """The decoding step's path adds the same products in the same order as the batch's (each expert in the order of
    the expert numbers), float32 weights rounded to the model's dtype once, when added: the batch's row to its
    matrix products' rounding (one row against two)."""
    x, gate_up_proj, down_proj, experts, weights = _case(rng, N=1, dtype=dtype)
    weights = weights.float()
    batch = torch.cat([x, x])  # the same token twice: the general path, whose rows equal each other
    got = routed_experts(x, gate_up_proj, down_proj, experts, weights)
    want = routed_experts(batch, gate_up_proj, down_proj, experts.expand(2, -1), weights.expand(2, -1))
    assert got.dtype == dtype
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)


def test_an_expert_chosen_twice_counts_twice(rng):
    x, gate_up_proj, down_proj, _, weights = _case(rng, N=1)
    experts = torch.tensor([[3, 3]])
    want = _written_out(x, gate_up_proj, down_proj, experts, weights)
    torch.testing.assert_close(routed_experts(x, gate_up_proj, down_proj, experts, weights), want, rtol=1e-12, atol=1e-12)
