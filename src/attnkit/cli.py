"""The ``attnkit`` command: thin argument parsing, one sub-command per tool."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


def _tour(args: argparse.Namespace) -> int:
    from .tour import run_tour

    for number, stop in enumerate(run_tour(args.out, seed=args.seed), 1):
        print(f"[{number:2d}] {stop.name}")
        for name, value in stop.facts.items():
            print(f"       {name}: {value}")
        if stop.picture is not None:
            print(f"       heatmap: {stop.picture}")
    print(f"\nheatmaps written to {Path(args.out).resolve()}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .workbench import run_demo

    run_demo(args.out, models=args.models, epochs=args.epochs, train_limit=args.train_limit,
             test_limit=args.test_limit, beam_size=args.beam, seed=args.seed, progress=not args.quiet)
    return 0


def _train(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from .data import Tokenizer
    from .models import Seq2SeqConfig, build_model, preset
    from .training import TrainingConfig, train
    from .training.distributed import broadcast_text, is_main, setup_distributed
    from .workbench import build_tokenizers, load_split

    setup_distributed()
    torch.manual_seed(args.seed)
    train_pairs = load_split(args.data, "train", direction=args.direction)
    valid_pairs = load_split(args.valid, "test") if args.valid else load_split(args.data, "valid", direction=args.direction)
    if args.resume:
        from .training import load_checkpoint

        checkpoint = load_checkpoint(args.out / "last")
        model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    else:
        texts = None
        if is_main():  # train the tokenisers once and share them, so every rank has the same ids
            source, target = build_tokenizers(train_pairs, kind=args.tokenizer, vocab_size=args.vocab_size)
            texts = source.to_json() + "\0" + target.to_json()
        source_json, target_json = broadcast_text(texts).split("\0")
        source, target = Tokenizer.from_json(source_json), Tokenizer.from_json(target_json)
        vocab = {"source_vocab": source.vocab_size, "target_vocab": target.vocab_size}
        if args.arch == "transformer":
            config = preset(args.preset, **vocab, dropout=args.dropout)
        else:
            config = Seq2SeqConfig(**vocab, attention=args.attention, cell=args.cell, embedding_dim=args.embedding_dim,
                                   hidden_size=args.hidden_size, num_layers=args.layers, dropout=args.dropout)
        model = build_model(config)
    warmup = args.warmup if args.warmup is not None else (4000 if args.arch == "transformer" else 0)
    training = TrainingConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, clip_norm=args.clip,
                              label_smoothing=args.label_smoothing, warmup_steps=warmup, patience=args.patience,
                              seed=args.seed, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every)
    if args.arch == "transformer":
        training = dataclasses.replace(training, betas=(0.9, 0.98))
    result = train(model, source, target, train_pairs, valid_pairs, training, args.out, resume=args.resume,
                   progress=not args.quiet)
    if is_main():
        print(f"{result.stopped} after {result.steps} steps; checkpoints in {args.out.resolve()} (best/, last/)")
    return 130 if result.stopped == "interrupted" else 0


def _resolve_checkpoint(path: Path) -> Path:
    """A run folder means its best/ (or last/) checkpoint."""
    for name in ("best", "last"):
        if not (path / "checkpoint.json").exists() and (path / name / "checkpoint.json").exists():
            return path / name
    return path


def _translate(args: argparse.Namespace) -> int:
    from .decoding import translate
    from .training import load_checkpoint
    from .workbench import plot_alignment

    checkpoint = load_checkpoint(_resolve_checkpoint(args.checkpoint))
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    outputs = translate(checkpoint.model, texts, checkpoint.source_tokenizer, checkpoint.target_tokenizer,
                        beam_size=args.beam)
    for number, output in enumerate(outputs, 1):
        print(output.text)
        if args.heatmap is not None and output.weights is not None:
            path = args.heatmap if len(outputs) == 1 else args.heatmap.with_name(f"{args.heatmap.stem}-{number}{args.heatmap.suffix}")
            plot_alignment(output, path, title=output.source[:80])
            print(f"  alignment: {path}", file=sys.stderr)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .training import load_checkpoint
    from .workbench import evaluate_model, load_split

    checkpoint = load_checkpoint(_resolve_checkpoint(args.checkpoint))
    pairs = load_split(args.data, "test", direction=args.direction)[: args.limit]
    scores, _ = evaluate_model(checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer, pairs,
                               beam_size=args.beam, progress=not args.quiet)
    print(f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['sentences']} sentences, beam {args.beam})")
    for row in scores["by_length"]:
        print(f"  source {row['bucket']:>5} words: BLEU {row['bleu']:6.2f}  ({row['sentences']} sentences)")
    if args.json is not None:
        from ._files import write_json

        write_json(args.json, scores)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description="Attention mechanisms: library and workbench.")
    commands = parser.add_subparsers(dest="command", required=True)
    tour = commands.add_parser("tour", help="run every mechanism once and write one heatmap PNG per mechanism")
    tour.add_argument("--out", type=Path, default=Path("out/tour"), help="folder for the PNGs (default out/tour)")
    tour.add_argument("--seed", type=int, default=0)
    tour.set_defaults(run=_tour)

    from .models.config import PRESETS, SEQ2SEQ_ATTENTIONS
    from .workbench import DEMO_MODELS

    demo = commands.add_parser("demo", help="the main job: bottleneck vs attention on the bundled corpus, with a report")
    demo.add_argument("--out", type=Path, default=Path("out/demo"))
    demo.add_argument("--models", nargs="+", default=["bottleneck", "bahdanau"], choices=sorted(DEMO_MODELS))
    demo.add_argument("--epochs", type=int, default=3)
    demo.add_argument("--train-limit", type=int, help="use only the first N training pairs (quick runs)")
    demo.add_argument("--test-limit", type=int, help="evaluate on the first N test pairs only")
    demo.add_argument("--beam", type=int, default=5)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(run=_demo)

    data_help = "'bible' (bundled KJV/Louis Segond) or a source<TAB>target file"
    train = commands.add_parser("train", help="train a translation model (also under torchrun for data parallelism)")
    train.add_argument("--data", default="bible", help=data_help)
    train.add_argument("--valid", help="a separate source<TAB>target validation file")
    train.add_argument("--direction", default="en-fr", choices=["en-fr", "fr-en"], help="for --data bible")
    train.add_argument("--out", type=Path, required=True, help="run folder: last/, best/, history.json")
    train.add_argument("--arch", default="seq2seq", choices=["seq2seq", "transformer"])
    train.add_argument("--attention", default="bahdanau", choices=SEQ2SEQ_ATTENTIONS)
    train.add_argument("--cell", default="gru", choices=["gru", "lstm"])
    train.add_argument("--embedding-dim", type=int, default=128)
    train.add_argument("--hidden-size", type=int, default=256)
    train.add_argument("--layers", type=int, default=1)
    train.add_argument("--preset", default="transformer-small", choices=sorted(PRESETS), help="for --arch transformer")
    train.add_argument("--tokenizer", default="bpe", choices=["bpe", "word"])
    train.add_argument("--vocab-size", type=int, default=4000)
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--lr", type=float, default=2e-3)
    train.add_argument("--clip", type=float, default=1.0)
    train.add_argument("--label-smoothing", type=float, default=0.1)
    train.add_argument("--dropout", type=float, default=0.2)
    train.add_argument("--warmup", type=int, help="warm-up steps (default 4000 for the Transformer, 0 otherwise)")
    train.add_argument("--patience", type=int, default=3)
    train.add_argument("--max-steps", type=int)
    train.add_argument("--checkpoint-every", type=int, default=0)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--resume", action="store_true", help="continue from OUT/last exactly where it stopped")
    train.add_argument("--quiet", action="store_true")
    train.set_defaults(run=_train)

    translate = commands.add_parser("translate", help="translate text and draw its alignment")
    translate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run folder")
    translate.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    translate.add_argument("--beam", type=int, default=5)
    translate.add_argument("--heatmap", type=Path, help="write the alignment heatmap PNG here")
    translate.set_defaults(run=_translate)

    evaluate = commands.add_parser("evaluate", help="BLEU, chrF and BLEU by source length on a test set")
    evaluate.add_argument("--checkpoint", type=Path, required=True)
    evaluate.add_argument("--data", default="bible", help=data_help + " (the test split of the bible)")
    evaluate.add_argument("--direction", default="en-fr", choices=["en-fr", "fr-en"])
    evaluate.add_argument("--beam", type=int, default=5)
    evaluate.add_argument("--limit", type=int)
    evaluate.add_argument("--json", type=Path, help="also write the scores as JSON")
    evaluate.add_argument("--quiet", action="store_true")
    evaluate.set_defaults(run=_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as error:  # bad input: a message, not a traceback
        print(f"attnkit {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
