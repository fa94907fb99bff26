"""Fine-tune a transformers model with each sequence split across processes (attnkit.hf.context_parallel).

    torchrun --nproc_per_node 2 examples/hf_context_parallel.py            # CPU, gloo
    python examples/hf_context_parallel.py                                 # one process: the same losses
    torchrun --nproc_per_node 8 examples/hf_context_parallel.py --length 131072 --method ring   # GPUs, nccl

A tiny random Llama (any family of attnkit.hf.CONTEXT_PARALLEL_FAMILIES works the same way, loaded with
from_pretrained(..., attn_implementation="attnkit")) trains on verses of the bundled corpus, two
sequences a step with the second left-padded. Each process runs the model on its shard of the
sequence (zigzag layout); attention is exact over the whole sequence, so the printed losses are those
one process gets on the same global batch. On GPUs torchrun picks nccl (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import attnkit.hf
from attnkit.data import Tokenizer, bible_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=512, help="tokens per sequence (all processes together)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layout", default="zigzag", choices=["zigzag", "contiguous", "striped"])
    parser.add_argument("--method", default="ring", choices=["ring", "ulysses"])
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    if "RANK" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    attnkit.hf.register()
    verses = [p.target for p in bible_corpus("train")]
    tokenizer = Tokenizer.train(verses[:4000], kind="bpe", vocab_size=2000)
    ids = [i for verse in verses[: 4 * args.length // 20] for i in tokenizer.encode(verse)]
    batch = torch.tensor(ids[: 2 * args.length]).view(2, args.length)  # the global batch: 2 sequences
    mask = torch.ones_like(batch)
    mask[1, : args.length // 8] = 0  # the second one left-padded
    labels = batch.masked_fill(mask == 0, -100)
    torch.manual_seed(0)  # the same initial weights on every process
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.length)
    model = LlamaForCausalLM._from_config(config, attn_implementation="attnkit").to(device)
    cp = attnkit.hf.context_parallel(model, layout=args.layout, method=args.method)
    shard = {k: v.to(device) if isinstance(v, torch.Tensor) else v
             for k, v in cp.shard(batch, labels=labels, attention_mask=mask).items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(1, args.steps + 1):
        loss = model(**shard).loss  # this process's part of the global mean loss
        loss.backward()
        cp.all_reduce_gradients()  # the sum over processes: the global gradient
        optimizer.step()
        optimizer.zero_grad()
        total = cp.all_reduce_loss(loss)
        if cp.rank == 0:
            print(f"step {step:3d}  loss {float(total):.6f}  ({cp.world} process(es), "
                  f"{shard['input_ids'].shape[1]} of {args.length} tokens each)", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
