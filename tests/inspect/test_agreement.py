"""Attention-vs-attribution agreement on a seq2seq model: one example per target step, and the
integrated gradients of each step add up to the change in its log-probability."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.data import Pair, Tokenizer
from attnkit.inspect.agreement import seq2seq_agreement, summarise
from attnkit.models import Seq2Seq, Seq2SeqConfig


@pytest.fixture(scope="module")
def setup():
    pairs = [Pair("le chat noir dort", "the black cat sleeps"), Pair("un chien", "a dog")]
    source = Tokenizer.train([p.source for p in pairs], kind="word", vocab_size=20, min_frequency=1)
    target = Tokenizer.train([p.target for p in pairs], kind="word", vocab_size=20, min_frequency=1)
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, embedding_dim=8, hidden_size=8,
                                  attention="luong-general", dropout=0.0)).double()
    return model, source, target, pairs


def test_one_example_per_target_step_with_correlations(setup):
    model, source, target, pairs = setup
    examples = seq2seq_agreement(model, source, target, pairs, steps=8)
    assert len(examples) == 4 + 2
    first = examples[0]
    assert first.tokens == source.tokens(pairs[0].source) and len(first.tokens) == 4
    assert np.isclose(first.attention["attention"].sum(), 1.0)
    assert set(first.correlations) == {("attention", "integrated-gradients"), ("attention", "gradient-x-input"),
                                       ("integrated-gradients", "gradient-x-input")}
    rows = summarise(examples)
    assert all(row["spearman"]["n"] <= 6 for row in rows)
    limited = seq2seq_agreement(model, source, target, pairs[:1], steps=2, max_steps_per_pair=2, shapley_samples=4)
    assert len(limited) == 2
    assert ("attention", "shapley") in limited[0].correlations and ("integrated-gradients", "shapley") in limited[0].correlations
    # Shapley values add up to the output change from the all-zero source embeddings, as IG nearly does.
    ig, shap = limited[1].attribution["integrated-gradients"], limited[1].attribution["shapley"]
    assert shap.shape == ig.shape and np.isfinite(shap).all()


def test_integrated_gradients_complete_on_the_seq2seq_step(setup):
    from attnkit.data.batching import collate

    model, source, target, pairs = setup
    examples = seq2seq_agreement(model, source, target, pairs[:1], steps=512, max_steps_per_pair=2)
    batch = collate([source.encode(pairs[0].source)], [target.encode(pairs[0].target)])
    y = target.encode(pairs[0].target)[1]
    with torch.no_grad():
        full = model(batch.source, batch.source_lengths, batch.target_in[:, :2]).logits[0, 1].log_softmax(-1)[y]
        embedding = model.source_embedding.weight.data.clone()
        model.source_embedding.weight.data.zero_()  # the all-zero baseline the attribution starts from
        base = model(batch.source, batch.source_lengths, batch.target_in[:, :2]).logits[0, 1].log_softmax(-1)[y]
        model.source_embedding.weight.data.copy_(embedding)
    total = examples[1].attribution["integrated-gradients"].sum()
    assert total == pytest.approx((full - base).item(), rel=1e-3, abs=1e-5)


def test_a_sentence_is_never_its_own_partner():
    from attnkit.inspect.agreement import encoder_agreement

    with pytest.raises(ValueError, match="its own partner"):
        encoder_agreement(None, None, ["The cat sat."], [" The cat sat. "])


def test_an_example_of_one_scored_token_is_reported_not_fatal(tmp_path):
    """`attnkit inspect ... hello`: one word ranks nothing: no correlation, counted, and the
    report section says so instead of raising."""
    import numpy as np

    from attnkit.inspect.agreement import Agreement, summarise
    from attnkit.inspect.report import _agreement_section

    one = Agreement("hello", ["hello"], {"last-layer": np.ones(1)}, {"integrated-gradients": np.ones(1),
                                                                      "gradient-x-input": np.ones(1)}).correlate()
    assert all(np.isnan(v).all() for v in one.correlations.values()) and len(one.correlations) == 3
    rows = summarise([one])
    assert all(r["spearman"]["n"] == 0 and r["spearman"]["median"] is None for r in rows)
    two = Agreement("a b", ["a", "b"], {"last-layer": np.array([0.2, 0.8])},
                    {"integrated-gradients": np.array([0.1, 0.9]), "gradient-x-input": np.array([0.3, -0.1])}).correlate()
    lines, rows = _agreement_section([one, two], tmp_path, "test")
    assert "1 of 2 examples scored fewer than two tokens" in "\n".join(lines)
    assert rows[0]["spearman"]["n"] == 1 and (tmp_path / "agreement.png").is_file()
    lines, _ = _agreement_section([one], tmp_path / "none", "test")
    assert "(no example to draw)" in lines
