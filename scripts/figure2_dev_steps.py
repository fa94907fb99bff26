"""An experiment for a missed target, on dev verses only (valid + valid-long, never test): does the
long-trained attention model keep more of its BLEU on long sources with more optimiser steps?

Trains bahdanau-50 (the demo's recipe on train + train-long, seed 0) for ``steps`` steps, and gives the BLEU
ratio of 41-80-word to 11-20-word dev sources (95% bootstrap) of its best checkpoint and of a checkpoint
given with ``--compare`` (the recorded --figure2 run's bahdanau-50, 2,280 steps). Writes JSON.

    python scripts/figure2_dev_steps.py 4560 out/fig2-dev --compare out/figure2/runs/bahdanau-50/best
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.data import bible_corpus
from attnkit.decoding import translate
from attnkit.models import Seq2Seq, Seq2SeqConfig
from attnkit.training import TrainingConfig, load_checkpoint, train
from attnkit.training.metrics import bleu_ratio
from attnkit.training.setup import build_tokenizers
from attnkit.workbench import DEMO_MODEL, DEMO_RECIPE


def dev_ratio(checkpoint: Path) -> dict:
    dev = bible_corpus("valid") + bible_corpus("valid-long")
    best = load_checkpoint(checkpoint)
    outputs = translate(best.model, [p.source for p in dev], best.source_tokenizer, best.target_tokenizer, beam_size=5)
    return bleu_ratio([p.source for p in dev], [o.text for o in outputs], [p.target for p in dev]) | {"verses": len(dev)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="a best/ checkpoint to judge the same way")
    args = parser.parse_args()
    train_pairs = bible_corpus("train")
    pairs = train_pairs + bible_corpus("train-long")
    source, target = build_tokenizers(train_pairs, vocab_size=4000)  # as the demo: learnt on train
    per_epoch = math.ceil(len(pairs) / DEMO_RECIPE["batch_size"])
    training = TrainingConfig(epochs=math.ceil(args.steps / per_epoch), patience=0, seed=0, max_steps=args.steps,
                              **DEMO_RECIPE)
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, attention="bahdanau", **DEMO_MODEL))
    started = time.perf_counter()
    train(model, source, target, pairs, bible_corpus("valid"), training, args.out / "run", overwrite=True)
    result = {f"steps_{args.steps}": dev_ratio(args.out / "run" / "best"), "seconds": time.perf_counter() - started}
    if args.compare:
        result["compared"] = {"checkpoint": str(args.compare), **dev_ratio(args.compare)}
    write_json(args.out / "result.json", result)
    print(result)


if __name__ == "__main__":
    main()
