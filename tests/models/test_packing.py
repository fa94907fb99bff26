"""Packed-sequence training of a DecoderLM with document masking: the same logits, per-document
losses and training trajectory as training on each document alone."""

from __future__ import annotations

import pytest
import torch

from attnkit.models import document_positions, pack_documents, packed_lm_losses
from attnkit.models.config import DecoderConfig
from attnkit.models.decoder import DecoderLM

CONFIGS = {
    "gpt2": DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=4, d_ff=40, max_len=64),
    "llama-gqa": DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=40,
                               positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False),
}


def _documents(generator):
    lengths = [5, 9, 3, 12, 7, 2, 10]
    return [torch.randint(1, 61, (n,), generator=generator) for n in lengths]


def test_pack_documents_first_fit_and_positions(rng):
    docs = _documents(rng)
    input_ids, document_ids = pack_documents(docs, 20)
    assert input_ids.shape == (3, 20)  # 5+9+3 | 12+7 | 2+10 (+ padding)
    for index, doc in enumerate(docs):
        row, cols = (document_ids == index).nonzero(as_tuple=True)
        assert row.unique().numel() == 1 and torch.equal(input_ids[row, cols], doc)
    positions = document_positions(document_ids)
    assert positions[0].tolist()[:17] == list(range(5)) + list(range(9)) + list(range(3))
    with pytest.raises(ValueError, match="documents\\[0\\] has 25 tokens > length=20"):
        pack_documents([torch.ones(25, dtype=torch.long)], 20)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_logits_equal_each_document_alone(name, rng):
    torch.manual_seed(0)
    model = DecoderLM(CONFIGS[name]).eval()
    docs = _documents(rng)
    input_ids, document_ids = pack_documents(docs, 20)
    with torch.no_grad():
        packed = model(input_ids, document_ids=document_ids).logits
        for index, doc in enumerate(docs):
            alone = model(doc[None]).logits[0]
            row, cols = (document_ids == index).nonzero(as_tuple=True)
            torch.testing.assert_close(packed[row, cols], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_training_gives_the_per_document_losses_of_unpacked_training(name, rng):
    """Five AdamW steps on the summed loss, packed (3 rows) and unpacked (7 separate forwards):
    every document's loss equals at every step (fp32, 1e-5)."""
    docs = _documents(rng)
    input_ids, document_ids = pack_documents(docs, 20)
    torch.manual_seed(0)
    packed_model = DecoderLM(CONFIGS[name])
    unpacked_model = DecoderLM(CONFIGS[name])
    unpacked_model.load_state_dict(packed_model.state_dict())
    optimisers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (packed_model, unpacked_model)]
    history = []
    for step in range(5):
        logits = packed_model(input_ids, document_ids=document_ids).logits
        packed_losses = packed_lm_losses(logits, input_ids, document_ids, len(docs))
        unpacked_losses = torch.stack([
            torch.nn.functional.cross_entropy(unpacked_model(doc[None]).logits[0, :-1], doc[1:], reduction="sum")
            for doc in docs
        ])
        torch.testing.assert_close(packed_losses, unpacked_losses, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        history.append(float(packed_losses.sum()))
        for optimiser, loss in zip(optimisers, (packed_losses.sum(), unpacked_losses.sum())):
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    assert history[-1] < 0.9 * history[0], f"the models did not train: {history}"


def test_document_ids_are_checked(rng):
    model = DecoderLM(CONFIGS["gpt2"])
    ids = torch.randint(1, 61, (2, 8), generator=rng)
    with pytest.raises(ValueError, match="document_ids must be integers of shape"):
        model(ids, document_ids=torch.zeros(2, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="document_ids replaces attention_mask"):
        model(ids, attention_mask=torch.ones(2, 8), document_ids=torch.zeros(2, 8, dtype=torch.long))
