"""The ``attnkit`` command: thin argument parsing, one sub-command per tool.

    arguments.py        argparse types and checks every sub-command shares
    translation.py      demo, translate, evaluate, align
    training.py         train
    data.py             the --data the translation commands share
    language_models.py  cost, generate
    serving.py          serve
    tools.py            tour, bench
    inspection.py       inspect (one handler per kind of model)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Iterator

from .. import _signals
from ..errors import InputError
from . import inspection, language_models, serving, tools, training, translation
from .arguments import DefaultsHelpFormatter, UsageError

__all__ = ["main", "build_parser", "USER_ERRORS", "UsageError"]


class _Parser(argparse.ArgumentParser):
    """argparse, with two of its habits changed for every sub-command: an option must be spelt out
    (``--se 128`` is not ``--seq``), and a mistake is one line naming it (not the usage block first)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="attnkit", description="Attention mechanisms: library and workbench.")
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of every error, user mistakes included")
    commands = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    # every sub-command's --help shows the defaults its help text does not already give
    commands.add_parser = functools.partial(commands.add_parser, formatter_class=DefaultsHelpFormatter)  # type: ignore[method-assign]
    tools.add_tour_parser(commands)
    translation.add_demo_parser(commands)
    training.add_train_parser(commands)
    translation.add_translate_parser(commands)
    translation.add_evaluate_parser(commands)
    translation.add_align_parser(commands)
    language_models.add_cost_parser(commands)
    language_models.add_generate_parser(commands)
    serving.add_serve_parser(commands)
    tools.add_bench_parser(commands)
    inspection.add_inspect_parser(commands)
    tools.add_build_ext_parser(commands)
    return parser


COMMANDS = ("tour", "demo", "train", "translate", "evaluate", "align", "cost", "generate", "serve", "bench", "inspect")
"""The sub-commands ``--help`` lists (the retired ``build-ext`` still answers, unlisted)."""


USER_ERRORS: tuple[type[BaseException], ...] = (InputError, OSError, ImportError)
"""What ends a command with one line and exit status 2: a mistake in how it was called
(:class:`~attnkit.cli.arguments.UsageError`) or a file or config it was given that cannot be used
(:class:`~attnkit.errors.InputError`: a checkpoint, a run folder, a model config), a missing,
unreadable or unwritable file, a missing optional package. Anything else is a bug: its traceback
is shown (``--debug`` shows it for these too)."""


def main(argv: list[str] | None = None) -> int:
    """Run the ``attnkit`` command; errors as :data:`USER_ERRORS` says."""
    import logging

    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the parsers import their tools
        print("interrupted", file=sys.stderr)
        return 130
    if args.command is None:  # bare `attnkit`: what it can do
        parser.print_help()
        return 0
    # The library logs; the command shows its INFO messages (epochs, steps of a report) on stdout.
    # --quiet turns progress bars off, not messages.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("attnkit")
    root.addHandler(handler)
    previous_level = root.level
    root.setLevel(logging.INFO)
    _signals.reset()
    try:
        with _sigterm_as_ctrl_c():
            code = args.run(args)
        return 143 if code == 130 and _signals.last() == signal.SIGTERM else code  # (a command that caught it)
    except KeyboardInterrupt:
        terminated = _signals.last() == signal.SIGTERM
        print("terminated" if terminated else "interrupted", file=sys.stderr)
        return 143 if terminated else 130
    except USER_ERRORS as error:  # a user mistake: a message, not a traceback
        if args.debug:
            raise
        print(f"attnkit {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:  # main() may be called again in one process (tests, notebooks): leave logging as it was
        root.removeHandler(handler)
        root.setLevel(previous_level)


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit, ``timeout``, a closed terminal) ends a command as Ctrl-C does: the
    folders it was filling are left as Ctrl-C leaves them (a training run checkpoints, an unfinished --out
    folder is removed or marked), with exit status 143, the shells' 128 + 15. In the main thread only (signals
    are delivered there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        _signals.record(signum)  # (the exit status says SIGTERM: 143)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
