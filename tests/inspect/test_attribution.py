"""Attribution through Captum: integrated gradients (completeness, linear exactness, equal to the
hand-written midpoint rule attnkit used before), gradient x input, sampled Shapley values
(efficiency, exact on an additive model); the rank correlations against SciPy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnkit.inspect.attribution import gradient_x_input, integrated_gradients, kendall, rank, shapley_values, spearman

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


def _midpoint_integrated_gradients(model, ids, steps):
    """The hand-written integrated gradients attnkit had before Captum: zero baseline, midpoints."""
    x = model.embedding(ids).detach()
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    path = (alphas.view(-1, 1, 1) * x).requires_grad_(True)
    values = model.out(torch.tanh(model.hidden(path))).sum((1, 2))
    (grad,) = torch.autograd.grad(values.sum(), path)
    return (x[0] * grad.mean(0)).sum(-1)


def test_captum_integrated_gradients_and_gradient_x_input_equal_the_formulas():
    model = _Tiny().double()
    ids = torch.tensor([[1, 4, 7, 2, 9]])
    forward = lambda m: model(ids.expand(m, -1))  # noqa: E731
    for steps in (2, 7, 32):
        torch.testing.assert_close(integrated_gradients(forward, model.embedding, steps=steps),
                                   _midpoint_integrated_gradients(model, ids, steps), rtol=1e-6, atol=1e-9)  # Captum keeps its alphas in float32
    x = model.embedding(ids).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(model.out(torch.tanh(model.hidden(x))).sum(), x)
    torch.testing.assert_close(gradient_x_input(forward, model.embedding), (x * grad)[0].sum(-1).detach())


def test_integrated_gradients_of_several_outputs_at_once_equal_one_call_per_output():
    model = _Tiny().double()
    ids = torch.tensor([[1, 4, 7, 2, 9]])

    def per_position(m):  # (m, 5): one output per position, each reading the tokens up to it
        values = model.out(torch.tanh(model.hidden(model.embedding(ids.expand(m, -1)))))[..., 0]  # (m, 5)
        return values.cumsum(-1) ** 2

    together = integrated_gradients(per_position, model.embedding, steps=6, outputs=5)
    assert together.shape == (5, 5)
    for k in range(5):
        alone = integrated_gradients(lambda m, k=k: per_position(m)[:, k], model.embedding, steps=6)
        torch.testing.assert_close(together[k], alone)
    assert (together[0, 1:] == 0).all() and (together[4] != 0).all()  # output k depends on tokens <= k only
    with pytest.raises(ValueError, match=r"5 scalars per copy"):
        integrated_gradients(lambda m: per_position(m)[:, :4], model.embedding, steps=2, outputs=5)


def test_shapley_values_are_efficient_and_exact_when_tokens_add_up():
    model = _Tiny().double()
    ids = torch.tensor([[1, 4, 7, 2]])
    forward = lambda m: model(ids.expand(m, -1))  # noqa: E731
    values = shapley_values(forward, model.embedding, samples=10)
    with torch.no_grad():
        full = model(ids)[0]
        empty = model.out(torch.tanh(model.hidden(torch.zeros(1, 4, 6, dtype=torch.float64)))).sum()
    assert values.shape == (4,)
    assert values.sum().item() == pytest.approx((full - empty).item(), rel=1e-6)  # efficiency, every sample
    torch.testing.assert_close(values, shapley_values(forward, model.embedding, samples=10))  # seeded
    # An additive model: each token's value is its own term, whatever the order.
    embedding = nn.Embedding(5, 3).double()
    weight = torch.tensor([0.5, -2.0, 1.0], dtype=torch.float64)
    ids = torch.tensor([[0, 3, 4]])
    linear = lambda m: (embedding(ids.expand(m, -1)) @ weight).sum(-1)  # noqa: E731
    torch.testing.assert_close(shapley_values(linear, embedding, samples=3), (embedding.weight[ids[0]] @ weight).detach())
    with pytest.raises(ValueError, match="samples must be >= 1"):
        shapley_values(linear, embedding, samples=0)


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
    assert torch.allclose(integrated_gradients(forward, embedding, steps=2), expected)
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
