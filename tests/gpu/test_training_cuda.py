"""Training on CUDA (marker ``gpu``): a run stopped and resumed on the GPU, with dropout, gives the
same losses and weights as one that never stopped (the checkpoint carries the CUDA generator).
Equal to float32 rounding, not bit for bit: CUDA's embedding backward adds with atomics, so two
uninterrupted runs differ in the last bits too; a different dropout draw would differ by far more."""

from __future__ import annotations

import torch

from attnkit.data import Tokenizer, number_phrases
from attnkit.models import Seq2Seq, Seq2SeqConfig
from attnkit.training import TrainingConfig, load_checkpoint, train


def test_resume_on_cuda_continues_bit_identically(tmp_path):
    pairs = number_phrases(600, seed=0)
    train_pairs, valid = pairs[:400], pairs[400:]
    source = Tokenizer.train([p.source for p in train_pairs], kind="word", vocab_size=100, min_frequency=1)
    target = Tokenizer.train([p.target for p in train_pairs], kind="word", vocab_size=100, min_frequency=1)

    def model():
        torch.manual_seed(0)
        return Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, embedding_dim=32, hidden_size=64,
                                     attention="bahdanau", attention_dim=32, dropout=0.3)).to("cuda")

    config = TrainingConfig(epochs=2, batch_size=32, lr=2e-3, warmup_steps=5, seed=3, patience=0)
    quiet = {"progress": False, "log": lambda _: None}
    whole = train(model(), source, target, train_pairs, valid, config, tmp_path / "whole", **quiet)
    first = train(model(), source, target, train_pairs, valid, TrainingConfig(**{**config.__dict__, "max_steps": 9}),
                  tmp_path / "split", **quiet)
    assert first.steps == 9
    torch.cuda.manual_seed_all(12345)  # whatever the generator did in between, resume puts it back
    rest = train(model(), source, target, train_pairs, valid, config, tmp_path / "split", resume=True, **quiet)
    torch.testing.assert_close(torch.tensor([s["loss"] for s in rest.history["steps"]]),
                               torch.tensor([s["loss"] for s in whole.history["steps"]]), rtol=1e-4, atol=1e-5)
    ours, theirs = load_checkpoint(tmp_path / "split" / "last").model, load_checkpoint(tmp_path / "whole" / "last").model
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
