"""The ``train`` command: a new run or a resumed one, its options (a resumed run takes its own), the run folder's
rules, and training itself (:func:`attnkit.training.train`), also under torchrun."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

from .arguments import (
    UsageError,
    add_device_argument,
    check_device,
    check_writable,
    float_in,
    input_file,
    int_in,
    made_folder,
    output_dir,
    refuse_unused,
    run_options,
    seed,
)
from .data import DATA_HELP, data_identity, data_split, resolve_direction

__all__ = ["add_train_parser"]


NEW_RUN_DEFAULTS = {"data": "bible", "arch": "seq2seq", "tokenizer": "bpe", "vocab_size": 4000, "dropout": 0.2}
"""Data and model options a new run takes when they are not given (a resumed run takes its own)."""
TRAINING_OPTIONS = {
    # option: (its TrainingConfig field, a new run's default; None where the model kind's recipe decides)
    "epochs": ("epochs", 10), "batch_size": ("batch_size", 64), "lr": ("lr", 2e-3), "clip": ("clip_norm", 1.0),
    "label_smoothing": ("label_smoothing", 0.1), "warmup": ("warmup_steps", None), "patience": ("patience", 3),
    "max_steps": ("max_steps", None), "max_minutes": ("max_seconds", None), "checkpoint_every": ("checkpoint_every", 0),
    "seed": ("seed", 0), "alignment_weight": ("alignment_weight", None), "alignment_layer": ("alignment_layer", None),
    "alignment_head": ("alignment_head", None),
}
"""The training options of ``train``: a new run takes the default of each not given; a resumed run the
value its marker recorded (an option given that differs applies from the step it resumes at, recorded in
the marker's ``changes``)."""


def _take_training_options(args: argparse.Namespace) -> None:
    """Fill the training options left out: on --resume from the run's record, else the defaults."""
    from ..training.run import MARKER, recorded_training

    recorded = recorded_training(args.out) if args.resume and args.out.is_dir() else None
    if args.resume and recorded is None and (args.out / MARKER).is_file():  # a run, from before the record
        print("--resume: this run recorded no training options (made by an older attnkit): those not given take "
              "the defaults", file=sys.stderr)
    for option, (field, default) in TRAINING_OPTIONS.items():
        if getattr(args, option) is not None:  # given: a change on resume is applied, logged and recorded by train()
            continue
        if recorded is not None and field in recorded:
            value = recorded[field]
            setattr(args, option, value / 60 if option == "max_minutes" and value is not None else value)
        else:
            setattr(args, option, default)


def _take_run_options(args: argparse.Namespace) -> None:
    """On --resume, every data or model option the command line leaves out is the run's (its marker);
    only options given that differ are refused (by check_run_folder). Then the defaults of a new run."""
    recorded = run_options(args.out) if args.resume and args.out.is_dir() else {}
    if args.arch is not None and recorded.get("arch") not in (None, args.arch):
        raise UsageError(f"--arch {args.arch}: {args.out} is a run of --arch {recorded['arch']}, and a resumed run "
                         "keeps its architecture (start a new run in another --out)")
    for name, value in recorded.items():
        if name == "data_sha256" or not hasattr(args, name) or getattr(args, name) is not None:
            continue
        setattr(args, name, Path(value) if name in ("valid", "guided_alignment") and value is not None else value)
    for name, default in NEW_RUN_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def _train(args: argparse.Namespace) -> int:
    from ..training import check_run_folder
    from ..training.run import MARKER

    _take_run_options(args)
    _take_training_options(args)
    resolve_direction(args)
    device = check_device(args.device)
    seq2seq_options = {"attention": "bahdanau", "cell": "gru", "embedding_dim": 128, "hidden_size": 256, "layers": 1}
    if args.arch == "transformer":
        refuse_unused(args, list(seq2seq_options), "applies to --arch seq2seq only (the Transformer takes --preset)")
        args.preset = args.preset or "transformer-small"
    else:
        refuse_unused(args, ["preset"], "applies to --arch transformer only")
        for name, default in seq2seq_options.items():
            setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    if args.guided_alignment is None and not args.resume:
        refuse_unused(args, ["alignment_weight", "alignment_layer", "alignment_head"],
                      "applies with --guided-alignment only")
    if args.guided_alignment is not None:
        args.alignment_weight = 0.05 if not args.alignment_weight else args.alignment_weight
    args.alignment_head = 0 if args.alignment_head is None else args.alignment_head
    if args.hidden_size is not None and args.embedding_dim is not None:
        _check_size(args)
    model_options = (["preset"] if args.arch == "transformer"
                     else ["attention", "cell", "embedding_dim", "hidden_size", "layers"])
    options = {name: getattr(args, name) for name in
               ["direction", "arch", *model_options, "tokenizer", "vocab_size", "dropout"]}
    options |= data_identity(args.data)
    options["valid"] = None if args.valid is None else data_identity(str(args.valid))["data"]
    if args.guided_alignment is not None:
        options["guided_alignment"] = str(args.guided_alignment)
    check_run_folder(args.out, resume=args.resume, overwrite=args.overwrite, options=options)
    train_pairs = data_split("--data", args.data, "train", direction=args.direction)
    alignments = None
    if args.guided_alignment is not None:
        from ..inspect.alignment import read_links

        try:
            alignments = read_links(args.guided_alignment)
        except ValueError as error:
            raise UsageError(f"--guided-alignment {error}") from None
        if len(alignments) != len(train_pairs):
            raise UsageError(f"--guided-alignment {args.guided_alignment} has {len(alignments)} lines for "
                             f"{len(train_pairs)} training pairs of --data {args.data} (make it with attnkit align)")
    valid_pairs = (data_split("--valid", str(args.valid), "test") if args.valid else
                   data_split("--data", args.data, "valid", direction=args.direction))
    if not train_pairs or not valid_pairs:
        raise UsageError(f"--data {args.data}: {len(train_pairs)} training and {len(valid_pairs)} validation pairs; "
                         "a run needs both (a file of yours gives every 20th pair to validation: with fewer than 20 "
                         "pairs give --valid FILE)")
    with made_folder(args.out, (MARKER,)):
        return _run_training(args, options, train_pairs, valid_pairs, alignments, device)


def _run_training(args: argparse.Namespace, options: dict, train_pairs, valid_pairs, alignments, device) -> int:
    """The training itself, once every option and the data are known to be usable."""
    import torch

    from ..training import TrainingConfig, train
    from ..training.distributed import is_main, setup_distributed
    from ..training.setup import new_translation_model, shared_tokenizers

    check_writable(args.out, "--out")
    setup_distributed()
    torch.manual_seed(args.seed)
    if args.resume:
        from ..training import load_checkpoint

        checkpoint = load_checkpoint(args.out / "last")
        model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    else:
        source, target = shared_tokenizers(train_pairs, kind=args.tokenizer, vocab_size=args.vocab_size)
        model = new_translation_model(source, target, arch=args.arch, dropout=args.dropout, preset_name=args.preset,
                                      attention=args.attention, cell=args.cell, embedding_dim=args.embedding_dim,
                                      hidden_size=args.hidden_size, layers=args.layers)
    model = model.to(device)  # batches follow the model's device
    schedule = {} if args.warmup is None else {"warmup_steps": args.warmup}
    guided = {} if alignments is None else {"alignment_weight": args.alignment_weight,
                                            "alignment_layer": args.alignment_layer, "alignment_head": args.alignment_head}
    training = TrainingConfig.recipe(cast(Any, model).config.kind, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                     clip_norm=args.clip, label_smoothing=args.label_smoothing, patience=args.patience,
                                     seed=args.seed, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
                                     max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
                                     **schedule, **guided)
    result = train(model, source, target, train_pairs, valid_pairs, training, args.out, resume=args.resume,
                   overwrite=args.overwrite, options=options, progress=not args.quiet, alignments=alignments)
    if is_main() and args.resume and result.new_steps == 0:
        print("raise --max-steps, --epochs or --max-minutes to train on (no option change was recorded)")
    elif is_main():
        kept = [name + "/" for name in ("best", "last") if (args.out / name / "checkpoint.json").is_file()]
        where = f"checkpoints in {args.out.resolve()} ({', '.join(kept)})" if kept else "no checkpoint written yet"
        print(f"{result.stopped} after {result.steps} steps; {where}")
    return 130 if result.stopped == "interrupted" else 0


MAX_TRAIN_PARAMETERS = 2_000_000_000
"""The largest RNN translation model ``train`` builds (checked before anything is allocated)."""


def _check_size(args: argparse.Namespace) -> None:
    """An upper bound on the RNN model's parameters from the options alone, before allocating."""
    gates = 4 if args.cell == "lstm" else 3
    h, e, v, layers = args.hidden_size, args.embedding_dim, args.vocab_size, args.layers
    rnn = gates * (h * (e + h) + 2 * h) * layers * 3  # encoder (two directions) and decoder, upper bound
    total = 2 * v * e + rnn + 4 * h * h + v * h
    if total > MAX_TRAIN_PARAMETERS:
        raise UsageError(f"--hidden-size {h} with --embedding-dim {e}, --layers {layers}, --vocab-size {v} makes a "
                         f"model of about {total / 1e9:.1f} billion parameters; at most {MAX_TRAIN_PARAMETERS / 1e9:.0f} "
                         "billion (lower --hidden-size)")


def add_train_parser(commands) -> None:
    """The ``train`` sub-command's arguments."""
    from ..models.config import PRESETS, SEQ2SEQ_ATTENTIONS

    train = commands.add_parser("train", help="train a translation model (also under torchrun for data parallelism)")
    train.add_argument("--data", help=DATA_HELP + " (default bible; with --resume, the run's)")
    train.add_argument("--valid", type=input_file, help="a separate source<TAB>target validation file")
    train.add_argument("--direction", choices=["en-fr", "fr-en"], help="for --data bible (default en-fr)")
    train.add_argument("--out", type=output_dir, required=True,
                       help="run folder: last/, best/, history.json (new, empty, or an attnkit run)")
    train.add_argument("--arch", choices=["seq2seq", "transformer"], help="model family (default seq2seq)")
    add_device_argument(train, "training")
    train.add_argument("--attention", choices=SEQ2SEQ_ATTENTIONS,
                       help="for --arch seq2seq (default bahdanau): 'none' is the fixed-length bottleneck")
    train.add_argument("--cell", choices=["gru", "lstm"], help="for --arch seq2seq: the RNN cell (default gru)")
    train.add_argument("--embedding-dim", type=int_in(1, 65536), help="for --arch seq2seq (default 128)")
    train.add_argument("--hidden-size", type=int_in(1, 65536), help="for --arch seq2seq (default 256)")
    train.add_argument("--layers", type=int_in(1, 64), help="for --arch seq2seq: stacked RNN layers (default 1)")
    transformer_presets = sorted(name for name, config in PRESETS.items() if config.kind == "transformer")
    train.add_argument("--preset", choices=transformer_presets, help="for --arch transformer (default transformer-small)")
    train.add_argument("--tokenizer", choices=["bpe", "word"], help="subword (BPE, the default) or word level")
    train.add_argument("--vocab-size", type=int_in(8, 1_000_000), help="per side (default 4000)")
    train.add_argument("--epochs", type=int_in(1, 100_000), help="epochs at most (default 10; early stopping may end sooner)")
    train.add_argument("--batch-size", type=int_in(1, 1_000_000), help="sentences per batch (default 64)")
    train.add_argument("--lr", type=float_in(0.0, 10.0, low_open=True), help="peak learning rate (default 0.002)")
    train.add_argument("--clip", type=float_in(0.0), help="max gradient norm; 0 disables clipping (default 1)")
    train.add_argument("--label-smoothing", type=float_in(0.0, 1.0, high_open=True), help="in [0, 1) (default 0.1)")
    train.add_argument("--dropout", type=float_in(0.0, 1.0, high_open=True), help="in [0, 1) (default 0.2)")
    train.add_argument("--warmup", type=int_in(0), help="warm-up steps (default 4000 for the Transformer, 0 otherwise)")
    train.add_argument("--patience", type=int_in(0), help="epochs without a better validation loss (default 3)")
    train.add_argument("--max-steps", type=int_in(1), help="stop after this many optimiser steps")
    train.add_argument("--max-minutes", type=float_in(0, low_open=True),
                       help="stop after this much training wall clock (validation included; the run resumes with "
                            "its clock), validating the part of the epoch done")
    train.add_argument("--checkpoint-every", type=int_in(0), help="also save last/ every N steps (default 0: each epoch)")
    train.add_argument("--seed", type=seed, help="seed of initialisation, batching and dropout (default 0)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in OUT exactly where it stopped, with every option it recorded: data and "
                            "model options given must match the run's; a training option given that differs applies "
                            "from where the run stopped and is recorded in the run's attnkit-run.json")
    train.add_argument("--overwrite", action="store_true",
                       help="start again in OUT, deleting the attnkit run there (never other files)")
    train.add_argument("--guided-alignment", type=input_file,
                       help="word alignments of the training pairs, one Pharaoh line (0-0 1-2 ...) per pair "
                            "(attnkit align writes them): trains one attention head towards them")
    train.add_argument("--alignment-weight", type=float_in(0.0, 1e6, low_open=True),
                       help="weight of the guided-alignment loss (default 0.05, Garg et al. 2019)")
    train.add_argument("--alignment-layer", type=int,
                       help="Transformer decoder layer the guide trains (default the penultimate)")
    train.add_argument("--alignment-head", type=int_in(0), help="Transformer head the guide trains (default 0)")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(run=_train)
