"""Head roles on constructed heads, attention rollout against a float64 product, attention flow
against max-flow values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit.inspect.roles import ROLES, entropy, head_roles, implicit_heads, magnitude_shares
from attnkit.inspect.rollout import attention_flow, attention_rollout, residual_attention

TOKENS = ["[CLS]", "the", "cat", ",", "sat", ".", "[SEP]"]


def _heads() -> torch.Tensor:
    """(H=4, L, L): previous token, next token, all on [SEP], uniform."""
    L = len(TOKENS)
    w = torch.zeros(4, L, L, dtype=torch.float64)
    w[0, 0, 0] = 1
    w[0, torch.arange(1, L), torch.arange(L - 1)] = 1
    w[1, torch.arange(L - 1), torch.arange(1, L)] = 1
    w[1, L - 1, L - 1] = 1
    w[2, :, L - 1] = 1
    w[3] = 1 / L
    return w


def test_constructed_heads_get_their_roles():
    roles = head_roles([[_heads()]], [TOKENS])
    assert roles.shape == (1, 4) and roles.tokens == len(TOKENS)
    assert [h for _, h, _ in roles.heads("previous")] == [0] and roles.shares["previous"][0, 0] == 1
    assert [h for _, h, _ in roles.heads("next")] == [1]
    assert [h for _, h, _ in roles.heads("sep")] == [2] and roles.shares["sep"][0, 2] == 1
    assert roles.shares["punctuation"][0, 3] == pytest.approx(2 / 7)  # "," and "." of 7 tokens
    assert roles.shares["cls"][0, 3] == pytest.approx(1 / 7)
    assert roles.entropy[0, :3].tolist() == [0, 0, 0] and roles.entropy[0, 3] == pytest.approx(math.log(7))
    assert roles.dominant()[0].tolist() == ["previous", "next", "sep", "broad"]
    row = roles.table()[2]
    assert row["role"] == "sep" and set(ROLES) <= set(row)
    with pytest.raises(ValueError, match="role must be one of"):
        roles.heads("verbs")
    with pytest.raises(ValueError, match="does not fit 6 tokens"):
        head_roles([[_heads()]], [TOKENS[:-1]])


def test_a_head_that_is_not_a_distribution_gets_no_role_or_entropy():
    """A state-space head's implicit attention (a negative entry, rows summing to 0.85 and -0.46) is not a
    distribution: NaN shares and entropy, the role "implicit"; a softmax head beside it in the same layer keeps its
    numbers, and a head a layer lacks (NaN) is neither."""
    weights = _heads()
    weights[1] = torch.tril(torch.randn(len(TOKENS), len(TOKENS), dtype=torch.float64,
                                        generator=torch.Generator().manual_seed(0)))
    weights[2, :, :] = weights[2].clone()
    weights[2, 3, 3] = 1e-4  # a softmax head's row off by float32-ish rounding stays a distribution
    weights[3] = math.nan
    assert implicit_heads([[weights]]).tolist() == [[False, True, False, False]]
    roles = head_roles([[weights]], [TOKENS])
    assert np.isnan(roles.entropy[0, 1]) and all(np.isnan(roles.shares[r][0, 1]) for r in ROLES)
    assert roles.shares["previous"][0, 0] == 1 and roles.entropy[0, 0] == 0
    assert roles.dominant()[0].tolist() == ["previous", "implicit", "sep", "-"]
    assert roles.table()[1]["role"] == "implicit"


def test_magnitude_shares_split_each_rows_absolute_entries():
    rows = torch.tensor([[0.5, -1.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert magnitude_shares(rows).tolist() == [[0.25, 0.75, 0.0], [0.0, 0.0, 0.0]]


def test_entropy_ignores_zero_weights():
    assert entropy(torch.tensor([[1.0, 0.0], [0.5, 0.5]])).tolist() == pytest.approx([0.0, math.log(2)])


def _random_layers(layers=3, heads=2, L=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(torch.randn(heads, L, L, generator=g), -1) for _ in range(layers)]


def test_rollout_is_the_product_of_residual_averaged_layers():
    attentions = _random_layers()
    expected = np.eye(5)
    for a in attentions:
        m = 0.5 * a.double().mean(0).numpy() + 0.5 * np.eye(5)
        expected = (m / m.sum(1, keepdims=True)) @ expected
    rollout = attention_rollout(attentions)
    assert np.allclose(rollout.numpy(), expected, atol=1e-12)
    assert torch.allclose(rollout.sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.allclose(attention_rollout(attentions, residual=0.0), attentions[2].double().mean(0)
                          @ attentions[1].double().mean(0) @ attentions[0].double().mean(0))
    with pytest.raises(ValueError, match=r"attentions\[1\] has shape"):
        attention_rollout([torch.ones(2, 3, 3), torch.ones(2, 4, 4)])


def test_flow_through_one_layer_is_the_edge_capacity():
    attentions = _random_layers(layers=1)
    flow = attention_flow(attentions)
    assert torch.allclose(flow, residual_attention(attentions)[0], atol=2e-6)


def test_flow_through_two_layers_by_hand():
    # Two tokens, no residual. Layer 1: token 0 <- (0.9 from 0, 0.1 from 1), token 1 <- (0.5, 0.5).
    # Layer 2: output 0 <- (0.2 from 0, 0.8 from 1). Input 1 reaches output 0 along 1->0->0
    # (min(0.1, 0.2) = 0.1) and 1->1->0 (min(0.5, 0.8) = 0.5): max flow 0.6. Input 0: 0.2 + 0.5 = 0.7.
    first = torch.tensor([[0.9, 0.1], [0.5, 0.5]])
    second = torch.tensor([[0.2, 0.8], [0.6, 0.4]])
    flow = attention_flow([first, second], residual=0.0, outputs=[0])
    assert flow.tolist()[0] == pytest.approx([0.7, 0.6], abs=2e-6)
    rollout = attention_rollout([first, second], residual=0.0)
    assert rollout[0].tolist() == pytest.approx([0.2 * 0.9 + 0.8 * 0.5, 0.2 * 0.1 + 0.8 * 0.5])
    with pytest.raises(ValueError, match=r"outputs must be token positions in \[0, 2\)"):
        attention_flow([first], outputs=[2])


def test_user_text_in_report_markdown_is_plain_text():
    from attnkit._markdown import escape as _md

    text = "![x](http://evil.example/a.png)\r# heading <script>|cell\u2028more"
    escaped = _md(text)
    assert "![" not in escaped and "](" not in escaped and "<script>" not in escaped
    assert "\r" not in escaped and "\u2028" not in escaped and "\\# heading" in escaped and "\\|cell" in escaped
