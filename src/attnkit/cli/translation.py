"""The translation workbench: ``demo``, ``train``, ``translate``, ``evaluate``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

from .arguments import (
    MAX_BEAM,
    MAX_TEXT_CHARS,
    MAX_UNKNOWN_SOURCE,
    UsageError,
    add_device_argument,
    check_beam,
    check_device,
    check_new_file,
    check_not_input,
    check_replaceable,
    check_texts,
    check_writable,
    float_in,
    input_file,
    int_in,
    made_folder,
    output_dir,
    output_file,
    owned_folder,
    picture_file,
    refuse_unused,
    resolve_checkpoint,
    run_options,
    seed,
    stdin_lines,
    unknown_source_fraction,
)

__all__ = ["add_demo_parser", "add_train_parser", "add_translate_parser", "add_evaluate_parser", "add_align_parser"]


_DATA_HELP = "'bible' (bundled KJV/Louis Segond), 'grc-en' (bundled word-aligned Greek NT/BSB) or a source<TAB>target file"


BUNDLED_DATA = ("bible", "grc-en")


def resolve_direction(args: argparse.Namespace) -> None:
    """--direction means something for --data bible only: refuse it elsewhere, default it there."""
    if args.data != "bible":
        refuse_unused(args, ["direction"], f"applies to --data bible only, not to --data {args.data}")
    elif args.direction is None:
        args.direction = "en-fr"


def data_identity(data: str) -> dict:
    """What a run records of its data: a bundled corpus by name, a file by absolute path and SHA-256
    (so --resume sees through ./pairs.tsv vs pairs.tsv, and refuses another corpus at the same path)."""
    if data in BUNDLED_DATA or not Path(data).is_file():
        return {"data": data}
    import hashlib

    digest = hashlib.sha256(Path(data).read_bytes()).hexdigest()
    return {"data": str(Path(data).resolve()), "data_sha256": digest}


def data_split(name: str, data: str, split: str, **kwargs):
    """load_split with the argument's name in any error about the data."""
    from ..workbench import load_split

    try:
        return load_split(data, split, **kwargs)
    except ValueError as error:
        raise UsageError(f"{name} {data}: {error}") from None
    except OSError as error:
        raise OSError(f"{name} {data}: {error}") from None


def check_data_fits(checkpoint, args: argparse.Namespace, pairs) -> None:
    """Refuse test data the model cannot read: where the run recorded its data and direction, they
    must match (an en->fr model on fr-en gives a BLEU without a word); and in any case at most half
    of the source tokens of the first 50 ``pairs`` may be unknown to the model's source vocabulary."""
    recorded = run_options(Path(args.checkpoint))
    if args.data == "bible" and recorded.get("data") == "bible" and recorded.get("direction") not in (None, args.direction):
        raise UsageError(f"--direction {args.direction}: the model was trained on bible {recorded['direction']}")
    unknown = unknown_source_fraction(checkpoint, pairs)
    if unknown > MAX_UNKNOWN_SOURCE:
        raise UsageError(f"--data {args.data}: {unknown:.0%} of its source tokens are unknown to this model's source "
                         "vocabulary; it was trained on another language or direction")


def _demo(args: argparse.Namespace) -> int:
    from ..workbench import run_demo

    device = check_device(args.device)
    with owned_folder(args.out, "demo"):
        if args.models is not None and len(set(args.models)) != len(args.models):
            twice = sorted({m for m in args.models if args.models.count(m) > 1})
            raise UsageError(f"--models names {', '.join(twice)} twice: each model is trained once")
        extra = [o for o, v in (("--models", args.models), ("--minutes", args.minutes)) if args.figure2 and v is not None]
        if extra:
            raise UsageError(f"--figure2 trains its own four models for the same optimiser steps: leave out {' and '.join(extra)}")
        run_demo(args.out, models=args.models, figure2=args.figure2, minutes=args.minutes, epochs=args.epochs,
                 train_limit=args.train_limit, test_limit=args.test_limit, beam_size=args.beam, seed=args.seed,
                 progress=not args.quiet, device=device)
    return 0


def add_demo_parser(commands) -> None:
    """The ``demo`` sub-command's arguments."""
    from ..workbench import DEMO_EPOCHS, DEMO_MODELS, FIGURE2_EPOCHS

    demo = commands.add_parser("demo", help="the main job: bottleneck vs attention on the bundled corpus, with a report")
    demo.add_argument("--out", type=output_dir, default=Path("out/demo"), help="folder for runs/ and report/")
    demo.add_argument("--models", nargs="+", choices=sorted(DEMO_MODELS),
                      help="models to train and compare (default: bottleneck bahdanau)")
    demo.add_argument("--figure2", action="store_true",
                      help="Bahdanau et al.'s Figure 2 whole: the bottleneck and Bahdanau each trained on verses of "
                           "at most 25 words and of at most 50, the same optimiser steps for all four (the long "
                           "ones on 26,883 pairs, longer ones: more than twice the default job)")
    demo.add_argument("--minutes", type=float_in(0, low_open=True),
                      help="instead of the default fixed epochs: a wall-clock budget for the whole job; each model "
                           "trains for an equal share of what the set-up and the test translations leave (results "
                           "then depend on the machine)")
    demo.add_argument("--epochs", type=int_in(1, 1000),
                      help=f"epochs per model (default {DEMO_EPOCHS}: a fixed amount of training, the same numbers "
                           f"on the same machine; with --figure2 {FIGURE2_EPOCHS}, chosen on dev verses); with "
                           "--minutes, at most this many (default: as many as the budget allows)")
    demo.add_argument("--train-limit", type=int_in(1), help="use only the first N training pairs (quick runs)")
    demo.add_argument("--test-limit", type=int_in(1), help="evaluate on the first N test pairs only")
    demo.add_argument("--beam", type=int_in(1, MAX_BEAM), default=5, help="beam width for the test translations")
    demo.add_argument("--seed", type=seed, default=0, help="seed of initialisation and batching")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    add_device_argument(demo, "training and translation")
    demo.set_defaults(run=_demo)


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
    train.add_argument("--data", help=_DATA_HELP + " (default bible; with --resume, the run's)")
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


def _align(args: argparse.Namespace) -> int:
    from ..inspect.alignment import IBMModel1, eflomal_align, symmetrize, write_links

    resolve_direction(args)
    if args.aligner == "ibm1":
        refuse_unused(args, ["symmetrize"], "applies to --aligner eflomal only (IBM Model 1 aligns one direction)")
    else:
        refuse_unused(args, ["ibm_iterations"], "applies to --aligner ibm1 only")
    args.symmetrize = args.symmetrize or "grow-diag-final-and"
    args.ibm_iterations = args.ibm_iterations or 5
    check_not_input(args.out, "--out", {"--data": args.data})
    check_writable(args.out.parent, "--out", create=False)
    check_replaceable(args.out, "--out", args.overwrite)  # a links file carries no mark: --overwrite replaces one
    pairs = data_split("--data", args.data, args.split, direction=args.direction)
    words = [(p.source.lower().split(), p.target.lower().split()) for p in pairs]
    if args.aligner == "eflomal":
        forward, reverse = eflomal_align(words)
        links = [symmetrize(f, r, args.symmetrize) for f, r in zip(forward, reverse)]
    else:
        model = IBMModel1().fit(words, iterations=args.ibm_iterations, progress=not args.quiet)
        links = [model.align(s, t) for s, t in words]
        done = len(model.log_likelihoods)
        print(f"IBM Model 1: {done} EM iterations" + (", converged (log-likelihood per word gained < 1e-4)"
                                                      if model.converged else " (the --ibm-iterations limit)"))
    write_links(args.out, links)
    print(f"{sum(len(x) for x in links):,} links for {len(links):,} {args.split} pairs of {args.data} "
          f"({args.aligner}) in {args.out}")
    return 0


def add_align_parser(commands) -> None:
    """The ``align`` sub-command's arguments."""
    from ..inspect.alignment import SYMMETRIZATIONS

    align = commands.add_parser("align", help="word-align a corpus split with eflomal or IBM Model 1 "
                                              "(for train --guided-alignment)")
    align.add_argument("--data", default="bible", help=_DATA_HELP + " (the default of every command)")
    align.add_argument("--direction", choices=["en-fr", "fr-en"], help="for --data bible (default en-fr)")
    align.add_argument("--split", default="train", choices=["train", "valid", "test"], help="which pairs")
    align.add_argument("--aligner", default="eflomal", choices=["eflomal", "ibm1"],
                       help="eflomal (both directions, symmetrised) or IBM Model 1 (source -> target)")
    align.add_argument("--symmetrize", choices=SYMMETRIZATIONS, help="for eflomal (default grow-diag-final-and)")
    align.add_argument("--ibm-iterations", type=int_in(1, 1000),
                       help="for ibm1: EM iterations at most (default 5; stops earlier at convergence)")
    align.add_argument("--out", type=output_file, required=True, help="the Pharaoh-format links file to write")
    align.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    align.add_argument("--quiet", action="store_true", help="no progress bars")
    align.set_defaults(run=_align)


def _translate(args: argparse.Namespace) -> int:
    from ..decoding import translate
    from ..training import load_checkpoint
    from ..workbench import plot_alignment

    texts = check_texts("text", args.text, max_chars=MAX_TEXT_CHARS) if args.text else stdin_lines(MAX_TEXT_CHARS)
    lines = texts  # stdin's blank lines keep their places: a blank line out for each
    texts = [text for text in lines if text.strip()]
    paths = []
    if args.heatmap is not None:
        check_writable(args.heatmap.parent, "--heatmap", create=False)
        if len(texts) == 1:
            check_replaceable(args.heatmap, "--heatmap", args.overwrite)
        paths = [args.heatmap] if len(texts) == 1 else [
            args.heatmap.with_name(f"{args.heatmap.stem}-{n}{args.heatmap.suffix}") for n in range(1, len(texts) + 1)]
        if len(paths) > 1:
            for path in paths:
                check_new_file(path, "--heatmap")
    checkpoint = load_checkpoint(resolve_checkpoint(args.checkpoint))
    check_beam(args.beam, checkpoint, texts)
    outputs = iter(translate(checkpoint.model, texts, checkpoint.source_tokenizer, checkpoint.target_tokenizer,
                             beam_size=args.beam))
    number = 0
    for line in lines:
        if not line.strip():
            print()
            continue
        output = next(outputs)
        number += 1
        print(output.text)
        if args.heatmap is not None and output.weights is not None:
            path = paths[number - 1]
            plot_alignment(output, path, title=output.source[:80])
            print(f"  alignment: {path}", file=sys.stderr)
    return 0


def add_translate_parser(commands) -> None:
    """The ``translate`` sub-command's arguments."""
    translate = commands.add_parser("translate", help="translate text and draw its alignment")
    translate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run folder")
    translate.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    translate.add_argument("--beam", type=int_in(1, MAX_BEAM), default=5, help="beam width (1: greedy)")
    translate.add_argument("--heatmap", type=picture_file,
                           help="write the alignment heatmap here (.png or .svg; several texts: NAME-1.png, ...)")
    translate.add_argument("--overwrite", action="store_true",
                           help="replace an existing --heatmap file attnkit did not write")
    translate.set_defaults(run=_translate)


def _evaluate(args: argparse.Namespace) -> int:
    from ..training import load_checkpoint
    from ..workbench import evaluate_model

    resolve_direction(args)
    check_not_input(args.json, "--json", {"--data": args.data, "--checkpoint": args.checkpoint})
    if args.json is not None:
        check_writable(args.json.parent, "--json", create=False)
        check_replaceable(args.json, "--json", args.overwrite)
    checkpoint = load_checkpoint(resolve_checkpoint(args.checkpoint))
    check_beam(args.beam, checkpoint)
    pairs = data_split("--data", args.data, "test", direction=args.direction)
    check_data_fits(checkpoint, args, pairs)
    pairs = pairs[: args.limit]
    if args.long and args.data != "bible":
        raise UsageError("--long: only the bundled bible corpus has a test-long split (--data bible)")
    trained_on = _trained_on_this_file(args)
    if trained_on:
        print(trained_on, file=sys.stderr)
    scores, outputs = evaluate_model(checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer, pairs,
                                     beam_size=args.beam, progress=not args.quiet)
    print(f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['sentences']} sentences, beam {args.beam})")
    for row in scores["by_length"]:
        print(f"  source {row['bucket']:>5} words: BLEU {row['bleu']:6.2f}  ({row['sentences']} sentences)")
    if args.long:
        scores |= _by_length_with_intervals(args, checkpoint, pairs, [o.text for o in outputs])
    if args.json is not None:
        from .._files import WRITTEN_BY, write_json

        write_json(args.json, {"written_by": f"{WRITTEN_BY} evaluate"} | scores
                   | ({"warning": trained_on} if trained_on else {}))
    return 0


def _trained_on_this_file(args: argparse.Namespace) -> str | None:
    """A warning where ``--data`` is the very file the checkpoint's run trained on (the run recorded its path and
    SHA-256): its pairs were training pairs (all but every 20th), so the score is not a held-out one."""
    if args.data in BUNDLED_DATA or not Path(args.data).is_file():
        return None
    recorded = run_options(Path(args.checkpoint))
    if not recorded.get("data_sha256") or recorded["data_sha256"] != data_identity(args.data).get("data_sha256"):
        return None
    return (f"warning: --data {args.data} is the file this model was trained on (the same SHA-256 as its run "
            "recorded): all but every 20th of its pairs were training pairs, so this BLEU is a training-set score, "
            "not a test score; give a file of held-out pairs")


def _by_length_with_intervals(args: argparse.Namespace, checkpoint, pairs, hypotheses: list[str]) -> dict:
    """--long: the test-long verses too, then BLEU and chrF per source-length bucket over both with
    95% bootstrap intervals, and the BLEU ratio of 41-80-word to 11-20-word sources."""
    from ..workbench import evaluate_model, quality_against_length

    long_pairs = data_split("--data", "bible", "test-long", direction=args.direction)[: args.limit]
    long_scores, long_outputs = evaluate_model(checkpoint.model, checkpoint.source_tokenizer,
                                               checkpoint.target_tokenizer, long_pairs, beam_size=args.beam,
                                               progress=not args.quiet)
    length = quality_against_length(list(pairs) + long_pairs, {"model": hypotheses + [o.text for o in long_outputs]})
    rows, ratio = length["buckets"], length["ratios"]["model"]
    print(f"test-long: BLEU {long_scores['bleu']:.2f}  chrF {long_scores['chrf']:.2f}  ({len(long_pairs)} sentences); "
          f"by source length over test + test-long, 95% bootstrap intervals:")
    for row in rows:
        c = row["systems"]["model"]
        print(f"  source {row['bucket']:>5} words: BLEU {c['bleu']:6.2f} [{c['bleu_mean'] - c['bleu_ci']:.2f}, "
              f"{c['bleu_mean'] + c['bleu_ci']:.2f}]  chrF {c['chrf']:6.2f}  ({row['sentences']} sentences)")
    if "error" not in ratio:  # --limit may leave no long source
        print(f"  BLEU 41-80 / 11-20 words: {ratio['ratio']:.2f} [{ratio['ratio_low']:.2f}, {ratio['ratio_high']:.2f}]")
    return {"test_long": {key: long_scores[key] for key in ("bleu", "chrf", "sentences")},
            "quality_by_length": rows, "length_ratio": ratio}


def add_evaluate_parser(commands) -> None:
    """The ``evaluate`` sub-command's arguments."""
    evaluate = commands.add_parser("evaluate", help="BLEU, chrF and BLEU by source length on a test set")
    evaluate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run folder")
    evaluate.add_argument("--data", default="bible",
                          help=_DATA_HELP + " (default bible: its test split; a file of yours is scored whole: a run "
                               "trained on a file held out every 20th pair for validation and none for testing, so "
                               "give held-out pairs)")
    evaluate.add_argument("--direction", choices=["en-fr", "fr-en"], help="for --data bible (default en-fr)")
    evaluate.add_argument("--beam", type=int_in(1, MAX_BEAM), default=5, help="beam width (1: greedy)")
    evaluate.add_argument("--limit", type=int_in(1), help="the first N test pairs only")
    evaluate.add_argument("--long", action="store_true",
                          help="--data bible: also the test-long verses (26-80 words), then BLEU and chrF by source "
                               "length over both with 95%% bootstrap intervals (sacreBLEU)")
    evaluate.add_argument("--json", type=output_file, help="also write the scores as JSON")
    evaluate.add_argument("--overwrite", action="store_true", help="replace an existing --json file attnkit did not write")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")
    evaluate.set_defaults(run=_evaluate)
