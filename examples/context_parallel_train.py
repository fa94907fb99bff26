"""Train a small Llama-style LM on the bundled corpus with each sequence split across processes.

    torchrun --nproc_per_node 2 examples/context_parallel_train.py            # CPU, gloo
    torchrun --nproc_per_node 4 examples/context_parallel_train.py --length 8192 --layout zigzag
    python examples/context_parallel_train.py                                 # one process, the same losses

Every process holds length / W tokens of each sequence (zigzag layout by default); attention is
exact over the whole sequence (ring attention over torch.distributed), so the printed losses are
the ones a single process gets on the same global batch. Across machines: torchrun --nnodes N
--node_rank R --rdzv_backend c10d --rdzv_endpoint HOST:29500, and nccl on GPUs (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from attnkit.data import Tokenizer, bible_corpus
from attnkit.distributed import ContextParallel, all_reduce_gradients, lm_shards
from attnkit.models.config import DecoderConfig
from attnkit.models.decoder import DecoderLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=2048, help="tokens per sequence (all processes together)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layout", default="zigzag", choices=["zigzag", "contiguous", "striped"])
    parser.add_argument("--method", default="ring", choices=["ring", "ulysses"])
    args = parser.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
    cp = ContextParallel(layout=args.layout, method=args.method)
    verses = [p.target for p in bible_corpus("train")]
    tokenizer = Tokenizer.train(verses[:4000], kind="bpe", vocab_size=2000)
    ids = [i for verse in verses[: 4 * args.length // 20] for i in tokenizer.encode(verse)]
    batch = torch.tensor(ids[: 2 * args.length]).view(2, args.length)  # the global batch: 2 sequences
    torch.manual_seed(0)  # the same initial weights on every process
    model = DecoderLM(DecoderConfig(vocab_size=tokenizer.vocab_size, d_model=128, num_layers=2, num_heads=4,
                                    num_kv_heads=2, d_ff=256, positional="rope", norm="rmsnorm", mlp="swiglu",
                                    bias=False, tie_embeddings=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    inputs, labels = lm_shards(batch, cp)  # this process's tokens, and their next tokens
    count = batch.shape[0] * (batch.shape[1] - 1)
    for step in range(1, args.steps + 1):
        logits = model(inputs, context_parallel=cp).logits
        loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        (loss_sum / count).backward()
        all_reduce_gradients(model.parameters())
        total = loss_sum.detach()
        if cp.world > 1:
            dist.all_reduce(total)
        optimizer.step()
        optimizer.zero_grad()
        if cp.rank == 0:
            print(f"step {step:3d}  loss {float(total) / count:.6f}  ({cp.world} process(es), "
                  f"{inputs.shape[1]} of {args.length} tokens each)", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
