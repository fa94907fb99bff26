"""Integrated gradients (completeness, linear exactness), gradient x input, and the rank
correlations against SciPy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnkit.inspect.attribution import gradient_x_input, integrated_gradients, kendall, rank, spearman

scipy_stats = pytest.importorskip("scipy.stats")


class _Tiny(nn.Module):
    """Embedding -> tanh MLP -> one scalar per sequence: smooth and non-linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(10, 6)
        self.hidden = nn.Linear(6, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, ids):
        return self.out(torch.tanh(self.hidden(self.embedding(ids)))).sum((1, 2))


def test_integrated_gradients_add_up_to_the_output_change():
    model = _Tiny().double()
    ids = torch.tensor([[1, 4, 7, 2]])
    forward = lambda m: model(ids.expand(m, -1))  # noqa: E731
    ig = integrated_gradients(forward, model.embedding, steps=256)
    with torch.no_grad():
        full = model(ids)[0]
        baseline = model.out(torch.tanh(model.hidden(torch.zeros(1, 4, 6, dtype=torch.float64)))).sum()
    assert ig.shape == (4,)
    assert ig.sum().item() == pytest.approx((full - baseline).item(), rel=1e-4, abs=1e-6)


def test_linear_model_attributions_are_exact():
    embedding = nn.Embedding(5, 3).double()
    weight = torch.tensor([0.5, -2.0, 1.0], dtype=torch.float64)
    ids = torch.tensor([[0, 3, 4]])
    forward = lambda m: (embedding(ids.expand(m, -1)) @ weight).sum(-1)  # noqa: E731
    expected = (embedding.weight[ids[0]] @ weight).detach()
    assert torch.allclose(integrated_gradients(forward, embedding, steps=1), expected)
    assert torch.allclose(gradient_x_input(forward, embedding), expected)
    with pytest.raises(ValueError, match="one scalar per step"):
        integrated_gradients(lambda m: embedding(ids.expand(m, -1)).sum((1, 2))[:1], embedding, steps=3)


@pytest.mark.parametrize("seed", range(5))
def test_rank_correlations_equal_scipy(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6, size=15).astype(float)  # with ties
    b = a + rng.normal(size=15)
    assert spearman(a, b) == pytest.approx(scipy_stats.spearmanr(a, b).statistic, abs=1e-12)
    assert kendall(a, b) == pytest.approx(scipy_stats.kendalltau(a, b).statistic, abs=1e-12)
    assert np.array_equal(rank(a), scipy_stats.rankdata(a))


def test_rank_correlation_edge_cases():
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert kendall([1, 2, 3], [1, 2, 3]) == pytest.approx(1)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\)"):
        kendall([1, 2, 3], [1, 2])
