"""attnkit.inspect on the real all-MiniLM-L6-v2: its attention weights equal transformers' on the
same weights, the head roles it finds, and attribution agreement on real sentences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit.inspect.agreement import encoder_agreement, summarise
from attnkit.inspect.roles import SENTENCES, encoder_attentions, head_roles
from attnkit.models.pretrained import load_minilm, minilm_folder

pytestmark = [pytest.mark.slow, pytest.mark.requires("minilm")]  # loads the real MiniLM weights

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


@pytest.fixture(scope="module")
def attentions(minilm):
    return encoder_attentions(*minilm, SENTENCES)


def test_attention_weights_equal_transformers_eager_attention(minilm, attentions):
    _, tokenizer = minilm
    hf = transformers.BertModel.from_pretrained(str(minilm_folder()), attn_implementation="eager").eval()
    for sentence, ours in zip(SENTENCES[:3], attentions[0][:3]):
        ids = torch.tensor([tokenizer.encode(sentence).ids])
        with torch.no_grad():
            theirs = hf(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True).attentions
        assert len(theirs) == len(ours) == 6
        for layer, (a, b) in enumerate(zip(ours, theirs)):
            assert a.shape == b[0].shape == (12, ids.shape[1], ids.shape[1])
            assert (a - b[0]).abs().max() <= 1e-5, f"layer {layer}"


def test_head_roles_on_minilm(attentions):
    roles = head_roles(*attentions)
    assert roles.shape == (6, 12) and roles.sentences == len(SENTENCES)
    previous = roles.heads("previous")
    assert previous[0][:2] == (0, 2) and previous[0][2] > 0.99  # layer 0 head 2 attends to the previous token
    assert roles.heads("cls")  # several heads park their attention on [CLS] ...
    assert roles.shares["sep"].max() < 0.5  # ... and none on [SEP], unlike BERT-base
    assert np.allclose(sum(roles.shares[r] for r in ("cls", "sep")) <= 1 + 1e-9, True)


def test_attribution_agreement_is_measured_per_sentence(minilm):
    model, tokenizer = minilm
    sentences = list(SENTENCES[:2])
    examples = encoder_agreement(model, tokenizer, sentences, sentences[::-1], steps=4)
    assert len(examples) == 2
    assert "[CLS]" not in examples[0].tokens and "trophy" in examples[0].tokens
    for example in examples:
        attention_vs_attribution = {(a, b) for a in ("last-layer", "rollout")
                                    for b in ("integrated-gradients", "gradient-x-input", "shapley")}
        attribution_vs_attribution = {("integrated-gradients", "gradient-x-input"),
                                      ("integrated-gradients", "shapley"), ("gradient-x-input", "shapley")}
        assert set(example.correlations) == attention_vs_attribution | attribution_vs_attribution
        for rho, tau in example.correlations.values():
            assert -1 <= rho <= 1 and -1 <= tau <= 1
    rows = summarise(examples)
    assert len(rows) == 9 and rows[0]["spearman"]["n"] == 2
