"""Models with the sequence split across processes (gloo, CPU): a 20-step training run of a small
LM on the bundled corpus gives the same losses with 2 or 3 processes as with one on the same
global batch (Llama-style RoPE + GQA by ring attention, GPT-2-style learned positions + window by
Ulysses); a BERT-style encoder with padding gives the same hidden states and gradients sharded."""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

import pytest
import torch

from attnkit.data import Tokenizer, bible_corpus
from attnkit.distributed import ContextParallel, all_reduce_gradients, lm_shards
from attnkit.models.config import DecoderConfig, EncoderConfig
from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderModel

from helpers import spawn_workers, torchrun_and_one_process

pytestmark = [pytest.mark.slow]  # spawns gloo processes and trains

STEPS = 20
LMS = {  # name: (config changes, ContextParallel)
    "llama-ring-zigzag": ({"positional": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "num_kv_heads": 2},
                          {"layout": "zigzag", "method": "ring"}),
    "gpt2-ulysses-striped": ({"window": 9}, {"layout": "striped", "method": "ulysses"}),
}


def _corpus_batch(n: int) -> torch.Tensor:
    """(2, n) token ids of consecutive verses of the bundled corpus (word-level, 200 types)."""
    verses = [p.source for p in bible_corpus("train")[:400]]
    tokenizer = Tokenizer.train(verses, kind="word", vocab_size=200)
    ids = [i for verse in verses for i in tokenizer.encode(verse)]
    return torch.tensor(ids[: 2 * n]).view(2, n), tokenizer.vocab_size


def _lm_losses(config: DecoderConfig, batch: torch.Tensor, cp: ContextParallel | None) -> list[float]:
    torch.manual_seed(0)
    model = DecoderLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if cp is not None:
        ids, labels = lm_shards(batch, cp)
    else:  # the whole sequence on this process
        ids, labels = batch, torch.cat([batch[:, 1:], torch.full_like(batch[:, :1], -100)], 1)
    count = batch.shape[0] * (batch.shape[1] - 1)  # labelled tokens of the global batch
    losses = []
    for _ in range(STEPS):
        logits = model(ids, context_parallel=cp).logits
        loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                     reduction="sum")
        (loss_sum / count).backward()
        total = loss_sum.detach().clone()
        if cp is not None:
            all_reduce_gradients(model.parameters())
            torch.distributed.all_reduce(total)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(total) / count)
    return losses


def _worker(rank: int, world: int, port: int, errors) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    try:
        batch, vocab = _corpus_batch(n=24 * world)
        for name, (changes, spec) in LMS.items():
            if spec["method"] == "ulysses" and 4 % world:
                continue  # Ulysses needs W to divide the heads
            config = DecoderConfig(vocab_size=vocab, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=128,
                                   **changes)
            expected = _lm_losses(config, batch, None)  # one process, whole sequences (each rank computes it)
            got = _lm_losses(config, batch, ContextParallel(**spec))
            torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")
            assert expected[-1] < 0.8 * expected[0], f"{name}: the run must learn, {expected[0]} -> {expected[-1]}"
        # Encoder with padding: the second row's last 5 tokens are padding, some on every rank.
        torch.manual_seed(0)
        encoder = EncoderModel(EncoderConfig(vocab_size=vocab, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                                             max_len=128, dropout=0.0)).double()
        mask = torch.ones_like(batch, dtype=torch.bool)
        mask[1, -5:] = False
        full = encoder(batch, mask).hidden_states
        weight = torch.randn(full.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (full * weight).sum().backward()
        want = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        encoder.zero_grad()
        cp = ContextParallel(layout="zigzag")
        out = encoder(cp.shard(batch), cp.shard(mask), context_parallel=cp)
        assert out.pooled is None
        torch.testing.assert_close(out.hidden_states, cp.shard(full.detach()), rtol=1e-10, atol=1e-10)
        (out.hidden_states * cp.shard(weight)).sum().backward()
        all_reduce_gradients(encoder.parameters())
        for n, p in encoder.named_parameters():
            if n in want:
                torch.testing.assert_close(p.grad, want[n], rtol=1e-9, atol=1e-10, msg=lambda m, n=n: f"d{n}: {m}")
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    finally:
        torch.distributed.destroy_process_group()
        os._exit(0)  # results went through the queue; gloo can abort in interpreter teardown (torch 2.13)


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_training_gives_the_losses_of_one_process(world):
    spawn_workers(_worker, world, timeout=240)


def test_context_parallel_refuses_what_it_cannot_do_exactly():
    config = DecoderConfig(vocab_size=50, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=64, dropout=0.1)
    model = DecoderLM(config)
    ids = torch.randint(0, 50, (1, 8))
    with pytest.raises(ValueError, match="no attention dropout"):
        model(ids, context_parallel=ContextParallel())
    model.eval()
    torch.testing.assert_close(model(ids, context_parallel=ContextParallel()).logits, model(ids).logits)  # W = 1
    with pytest.raises(ValueError, match="no cache, document_ids"):
        model(ids, context_parallel=ContextParallel(), need_weights=True)
    with pytest.raises(ValueError, match="layout must be one of"):
        ContextParallel(layout="diagonal")
    with pytest.raises(TypeError, match="context_parallel must be an attnkit.distributed.ContextParallel or None, got str"):
        model(ids, context_parallel="zigzag")
    encoder = EncoderModel(EncoderConfig(vocab_size=50, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=16))
    with pytest.raises(TypeError, match="got dict"):
        encoder(ids, context_parallel={"layout": "zigzag"})
    with pytest.raises(ValueError, match="more than max_len=16"):  # 32 tokens on one process
        encoder.eval()(torch.randint(0, 50, (1, 32)), context_parallel=ContextParallel())


def test_the_readme_torchrun_example_prints_the_losses_of_one_process():
    from pathlib import Path

    script = Path(__file__).parents[1] / "examples" / "context_parallel_train.py"
    (stdout, losses), (_, single) = torchrun_and_one_process(script, ["--steps", "3", "--length", "256"])
    assert "2 process(es), 128 of 256 tokens each" in stdout
    assert len(losses) == 3 and losses == pytest.approx(single, rel=1e-5)
