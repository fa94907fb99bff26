"""Training-step speed of the demo's RNN models: Bahdanau's hand-written recurrence
(models/recurrence.py) and the unpacked encoder against the step loop under autograd and the packed
encoder (what the demo ran until 2026-11-23).

The demo's set-up (bundled corpus, BPE 4,000 per side, embedding 128, hidden 256, batch 32, AdamW,
clipping, label smoothing 0.1): each variant trains its own copy of the same initial model on the
same batches (the demo's first epoch order). The variants alternate in rounds of ``--steps`` steps
so that a busy machine slows them alike; the table gives the median over rounds of target tokens
per second and of the per-round ratio. Writes JSON (default benchmarks/results/seq2seq_training.json).

    python benchmarks/seq2seq_training.py [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def packed_read(model, embedded, lengths):
    """The encoder as the demo ran it before: through a packed sequence."""
    packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, final = model.encoder(packed)
    return pad_packed_sequence(out, batch_first=True, total_length=embedded.shape[1])[0], final


def before():
    """The code of 2026-11-22 in effect: the packed encoder (the Bahdanau model also takes its step
    loop under autograd: ``stepwise=True``)."""
    from attnkit.models import Seq2Seq

    return mock.patch.object(Seq2Seq, "_read_unpacked", packed_read)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="optimiser steps per variant per round")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "seq2seq_training.json")
    args = parser.parse_args(argv)

    from tqdm.auto import tqdm

    from attnkit._files import write_json
    from attnkit._markdown import markdown_table
    from attnkit.bench.harness import machine_info
    from attnkit.data.batching import BatchSampler, collate
    from attnkit.data.corpus import bible_corpus
    from attnkit.models import Seq2Seq, Seq2SeqConfig
    from attnkit.training.losses import encode_pairs
    from attnkit.training.setup import build_tokenizers
    from attnkit.workbench import DEMO_MODEL, DEMO_RECIPE

    pairs = bible_corpus("train")
    source, target = build_tokenizers(pairs, vocab_size=4000)
    data = encode_pairs(pairs, source, target)
    order = BatchSampler([(len(s), len(t)) for s, t in data], DEMO_RECIPE["batch_size"], seed=0).epoch(0)
    needed = (args.rounds + 1) * args.steps
    batches = [collate([data[i][0] for i in b], [data[i][1] for i in b]) for b in order[:needed]]

    variants = {  # name -> (attention, stepwise decoder, the code before)
        "bahdanau: before (step loop, packed encoder)": ("bahdanau", True, True),
        "bahdanau: now (AdditiveRecurrence, unpacked encoder)": ("bahdanau", False, False),
        "bottleneck: before (packed encoder)": ("none", False, True),
        "bottleneck: now (unpacked encoder)": ("none", False, False),
    }
    runs = {}
    for name, (attention, stepwise, old) in variants.items():
        torch.manual_seed(0)
        model = Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, attention=attention, **DEMO_MODEL))
        runs[name] = (model, torch.optim.AdamW(model.parameters(), lr=DEMO_RECIPE["lr"]), stepwise, old)

    def train_steps(name: str, chunk) -> tuple[int, float]:
        model, optimizer, stepwise, old = runs[name]
        tokens, started = 0, time.perf_counter()
        with before() if old else nullcontext():
            for batch in chunk:
                logits = model(batch.source, batch.source_lengths, batch.target_in, stepwise=stepwise).logits
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.target_out.flatten(),
                                                         ignore_index=0, label_smoothing=0.1, reduction="sum")
                count = batch.target_tokens
                (loss / count).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                tokens += count
        return tokens, time.perf_counter() - started

    for name in runs:  # warm-up round, not counted
        train_steps(name, batches[: args.steps])
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for r in tqdm(range(args.rounds), desc="rounds"):
        chunk = batches[(r + 1) * args.steps : (r + 2) * args.steps]
        for name in runs:
            tokens, seconds = train_steps(name, chunk)
            rates[name].append(tokens / seconds)
    baselines = {kind: f"{kind}: before " + variants_before for kind, variants_before in
                 (("bahdanau", "(step loop, packed encoder)"), ("bottleneck", "(packed encoder)"))}
    rows, results = [], {}
    for name, values in rates.items():
        baseline = rates[baselines[name.split(":")[0]]]
        ratio = statistics.median(v / b for v, b in zip(values, baseline))
        results[name] = {"tokens_per_s": values, "median_tokens_per_s": statistics.median(values), "ratio": ratio}
        rows.append([name, f"{statistics.median(values):,.0f}", f"{min(values):,.0f}-{max(values):,.0f}", f"{ratio:.2f}x"])
    print("\n".join(markdown_table(["variant", "target tok/s (median)", "range", "vs baseline"], rows)))
    write_json(args.out, {"benchmark": "seq2seq_training", "config": vars(args) | {"out": str(args.out)},
                          "machine": machine_info("cpu"), "threads": torch.get_num_threads(), "results": results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
