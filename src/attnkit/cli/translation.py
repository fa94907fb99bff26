"""The translation workbench around a trained model: ``demo``, ``translate``, ``evaluate``, ``align`` (``train``
is :mod:`.training`; the ``--data`` they share, :mod:`.data`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .arguments import (
    MAX_BEAM,
    MAX_TEXT_CHARS,
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
    int_in,
    output_dir,
    output_file,
    owned_folder,
    picture_file,
    refuse_unused,
    resolve_checkpoint,
    run_options,
    seed,
    stdin_lines,
)
from .data import BUNDLED_DATA, DATA_HELP, check_data_fits, data_identity, data_split, resolve_direction

__all__ = ["add_demo_parser", "add_translate_parser", "add_evaluate_parser", "add_align_parser"]


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
        if args.resume and args.overwrite:
            raise UsageError("--resume continues the demo in --out; --overwrite starts it again: give one")
        runs = args.out / "runs"
        if runs.is_dir() and any(runs.iterdir()) and not (args.resume or args.overwrite):
            raise UsageError(f"--out {args.out} holds a demo's runs{' and report' if (args.out / 'report').is_dir() else ''}: "
                             "--resume continues it (the same options), --overwrite starts it again (replacing them), "
                             "or give another --out")
        if args.resume and not runs.is_dir():
            raise UsageError(f"--resume: --out {args.out} holds no demo runs to continue")
        try:
            run_demo(args.out, models=args.models, figure2=args.figure2, minutes=args.minutes, epochs=args.epochs,
                     train_limit=args.train_limit, test_limit=args.test_limit, beam_size=args.beam, seed=args.seed,
                     progress=not args.quiet, device=device, resume=args.resume)
        except KeyboardInterrupt:
            print(f"interrupted: continue with the same command and --resume (attnkit demo --out {args.out} ... "
                  "--resume)", file=sys.stderr)
            return 130
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
    demo.add_argument("--resume", action="store_true",
                      help="continue a demo stopped in --out (Ctrl-C, SIGTERM), with the same options: each model's "
                           "run resumes where it stopped, or, finished, is tested again")
    demo.add_argument("--overwrite", action="store_true", help="replace the runs and report of a demo in --out")
    add_device_argument(demo, "training and translation")
    demo.set_defaults(run=_demo)


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
    align.add_argument("--data", default="bible", help=DATA_HELP + " (the default of every command)")
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
                          help=DATA_HELP + " (default bible: its test split; a file of yours is scored whole: a run "
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
