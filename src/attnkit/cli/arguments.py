"""What every sub-command's arguments share: argparse types that refuse a bad value before any
work ("argument --x: ..." and exit 2), and checks of texts and output folders."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError

__all__ = ["UsageError", "user_values", "MAX_TEXT_CHARS", "MAX_BEAM", "SEED", "int_in", "int_list", "float_in", "output_file",
           "picture_file", "seed", "made_folder", "output_dir", "input_file",
           "check_texts", "stdin_lines", "check_writable", "owned_folder", "check_not_input", "check_new_file",
           "refuse_unused", "resolve_checkpoint", "check_beam", "check_trained_on_grc_en",
           "unknown_source_fraction", "run_options", "MAX_BEAM_TOKENS", "MAX_UNKNOWN_SOURCE", "OUTPUT_MARKER", "DEVICES", "add_device_argument", "check_device"]


class UsageError(InputError):
    """A mistake in how a command was called (a value, a file, a combination of options): the
    command prints its message on one line and exits with status 2. Any other exception is a bug and
    keeps its traceback."""


@contextlib.contextmanager
def user_values(*options: str) -> Iterator[None]:
    """A ``ValueError`` the library raises about these command-line values is the user's mistake:
    it becomes a :class:`UsageError` naming the options (one line, exit 2) instead of a traceback.
    Wrap only the call that receives the values, so that a bug elsewhere keeps its traceback."""
    try:
        yield
    except InputError:
        raise
    except ValueError as error:
        raise UsageError(f"{', '.join(options)}: {error}") from error


MAX_TEXT_CHARS = 1_000
"""Longest sentence ``translate`` and ``inspect`` take (a translation model is trained on verses and a beam
search's work grows with the sentence; a report draws L x L attention views). ``generate``'s prompts are
bounded by their model's context, in tokens, instead."""
SEED = (0, 2**63 - 1)
"""The seeds torch takes (a 64-bit signed integer): every --seed is checked against them."""
MAX_BEAM = 100
"""Widest beam any command accepts (and never wider than the target vocabulary)."""


DEVICES = ("cpu", "cuda")


def add_device_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--device cpu|cuda`` (default cpu), the same on every command that runs a model or attention."""
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help=f"where {what} runs: cpu, or cuda (one GPU; attention then runs on PyTorch's fused "
                             "kernels: SDPA, FlexAttention)")


def check_device(name: str):
    """The torch.device for ``--device``; cuda refused with the reason on a machine without it."""
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: this machine has no usable CUDA GPU (torch.cuda.is_available() is False; "
                         f"torch {torch.__version__})")
    return torch.device(name)


# -- argument types: a bad value is refused by argparse ("argument --x: ...", exit 2) before any work --


def int_in(low: int, high: int | None = None):
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


def int_list(low: int):
    """Comma-separated integers, each >= ``low`` ("0,29"): one argument, so that it cannot swallow the positional
    texts that follow it as ``nargs="+"`` would."""
    one = int_in(low)

    def parse(text: str) -> list[int]:
        parts = text.split(",")
        if not all(part.strip() for part in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,5, got {text!r}")
        return [one(part.strip()) for part in parts]

    return parse


def float_in(low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False):
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


def output_file(text: str) -> Path:
    """A file to write: not a folder, in a folder that exists (attnkit creates folders it is given as
    --out, never the parents of a file)."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file path")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no folder {str(path.parent)!r} to write it in (attnkit does not "
                                         "create folders for a file)")
    return path


PICTURE_SUFFIXES = (".png", ".svg")


def picture_file(text: str) -> Path:
    """An :func:`output_file` whose name says PNG or SVG (what the heatmaps write), checked before any work."""
    path = output_file(text)
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text!r}: a picture is written as PNG or SVG; give a name ending in "
                                         f"{' or '.join(PICTURE_SUFFIXES)}")
    return path


def seed(text: str) -> int:
    """A seed torch takes: an integer in [0, 2**63 - 1]."""
    return int_in(*SEED)(text)


def output_dir(text: str) -> Path:
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty string")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder")
    return path


def input_file(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return path


def check_texts(name: str, texts: list[str], *, max_chars: int | None = None, blank: bool = False) -> list[str]:
    """User texts: valid UTF-8 (argv undecodable bytes arrive as surrogates), not blank (unless ``blank``:
    lines of stdin keep their places), at most ``max_chars`` where the command has a bound in characters
    (a model's context bounds the others in tokens, where they are encoded)."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{name}: not valid UTF-8 text: {text.encode('utf-8', 'replace')[:60]!r}") from None
        if not text.strip() and not blank:
            raise UsageError(f"{name}: an empty or whitespace-only text")
        if max_chars is not None and len(text) > max_chars:
            raise UsageError(f"{name}: a text of {len(text):,} characters; at most {max_chars:,} (one sentence)")
    return texts


def stdin_lines(max_chars: int | None = None) -> list[str]:
    """The lines of stdin, blank ones kept in their places (the output lines up with the input); at least
    one must hold text."""
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(f"stdin: not UTF-8 text (byte {error.start}: {error.reason})") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise UsageError("no text: give sentences as arguments or one per line on stdin")
    return check_texts("stdin", lines, max_chars=max_chars, blank=True)


def check_writable(folder: Path, name: str, *, create: bool = True) -> None:
    """Fail now, not after an hour of training, if ``folder`` cannot be written. ``create``: a folder given
    as an output folder is made (with its parents); the folder of an output file must exist."""
    import tempfile

    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise UsageError(f"{name}: no folder {folder} to write in (attnkit does not create folders for a file)")
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OSError(f"{name} {folder}: cannot write there ({error.strerror})") from None


# -- what a command may write: only what it wrote (one rule for every command that writes) --

OUTPUT_MARKER = "attnkit-output.json"
"""Written into every --out folder a command fills: the command and the files it wrote there."""


@contextlib.contextmanager
def made_folder(folder: Path, markers: tuple[str, ...] = (OUTPUT_MARKER,)) -> Iterator[None]:
    """Remove ``folder`` again if the block fails (a refusal, an error, Ctrl-C) while it holds nothing but
    ``markers`` (files naming what attnkit meant to write) and did not exist before: a refused command
    leaves no empty --out folder behind."""
    existed = folder.exists()
    try:
        yield
    except BaseException:
        if not existed and folder.is_dir() and all(p.name in markers for p in folder.rglob("*") if p.is_file()):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        raise


def _files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()}


@contextlib.contextmanager
def owned_folder(folder: Path, command: str, name: str = "--out") -> Iterator[Path]:
    """Let ``command`` write into ``folder`` only if the folder is new, empty, or holds nothing but
    what an attnkit command wrote there before (listed in :data:`OUTPUT_MARKER`); otherwise raise
    before any work, naming the files that are not attnkit's. On the way out (an error or Ctrl-C
    included) the marker lists every file now in the folder, all of them attnkit's."""
    from .._files import read_json, write_json

    folder = Path(folder)
    existed = folder.exists()
    present = _files_under(folder) if folder.is_dir() else set()
    present.discard(OUTPUT_MARKER)
    if present:
        marker = folder / OUTPUT_MARKER
        if not marker.is_file():
            raise UsageError(f"{name} {folder} is not empty and attnkit did not write it (no {OUTPUT_MARKER}); "
                             "give a new or empty folder")
        data = read_json(marker, "output marker")
        if not isinstance(data, dict) or not isinstance(data.get("files"), list):
            raise UsageError(f"{marker} is not an attnkit output marker")
        foreign = sorted(present - {str(f) for f in data["files"]})
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise UsageError(f"{name} {folder} holds files attnkit did not write ({shown}); attnkit {command} "
                             "writes only over its own output: give another folder or move them")
    check_writable(folder, name)
    try:
        yield folder
    finally:
        files = sorted(_files_under(folder) - {OUTPUT_MARKER})
        if not files and not existed:  # refused or stopped before writing anything: no empty folder left
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                write_json(folder / OUTPUT_MARKER, {"format": "attnkit-output", "command": command, "files": files})


def check_not_input(path: Path | None, name: str, inputs: dict[str, object]) -> None:
    """Refuse an output path that is one of the command's inputs (``inputs``: option -> path)."""
    if path is None:
        return
    for input_name, value in inputs.items():
        if value is None:
            continue
        candidate = Path(str(value))
        if candidate.exists() and path.exists() and path.resolve() == candidate.resolve():
            raise UsageError(f"{name} {path} is the {input_name} input; attnkit never writes over its inputs")


def check_new_file(path: Path, name: str) -> None:
    """Refuse to write a file name the user did not give (a numbered sibling) over an existing file."""
    if path.exists():
        raise UsageError(f"{name}: {path} exists and is not a name you gave; attnkit writes numbered files "
                         "only where none exists (move it, or give another name)")


def check_replaceable(path: Path, name: str, overwrite: bool) -> None:
    """The rule of --out folders for a single output file: a new file is written; an existing one is replaced
    only if attnkit wrote it (its mark: :func:`attnkit._files.written_by_attnkit`) or with ``--overwrite``."""
    from .._files import written_by_attnkit

    if path.is_dir():
        raise UsageError(f"{name} {path} is a folder; give a file name")
    if path.exists() and not overwrite and not written_by_attnkit(path):
        raise UsageError(f"{name} {path} exists and attnkit did not write it; give another name, or --overwrite to "
                         "replace it")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's default in its ``--help``, where it has one (not None or False) and the help does not
    already give it: argparse's ArgumentDefaultsHelpFormatter without its "(default: None)"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or default in (None, False, argparse.SUPPRESS)
                or text == argparse.SUPPRESS):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def refuse_unused(args: argparse.Namespace, names: list[str], why: str) -> None:
    """Refuse options that would do nothing in this combination: each of ``names`` (options whose
    parser default is None) that the user gave raises one line naming it and ``why``."""
    for option in names:
        if getattr(args, option) not in (None, False, []):
            raise UsageError(f"--{option.replace('_', '-')} {why}")


# -- checkpoints: shared by translate, evaluate and inspect --


def resolve_checkpoint(path: Path) -> Path:
    """A run folder means its best/ checkpoint, or its last/ where it has no best/ yet (said on stderr: the
    weights no validation has chosen)."""
    for name in ("best", "last"):
        if not (path / "checkpoint.json").exists() and (path / name / "checkpoint.json").exists():
            if name == "last":
                print(f"note: {path} has no best/ checkpoint yet (no validation has run); using last/", file=sys.stderr)
            return path / name
    return path


MAX_BEAM_TOKENS = 5_000
"""Most beam width x source tokens a command decodes per sentence: a beam search's work grows with
both (beam 100 allows 50 source tokens, beam 5 the longest text any command accepts)."""


def check_beam(beam: int, checkpoint, texts=()) -> None:
    vocabulary = checkpoint.target_tokenizer.vocab_size
    if beam > vocabulary:
        raise UsageError(f"--beam {beam} is wider than the target vocabulary ({vocabulary} tokens)")
    for text in texts:
        tokens = len(checkpoint.source_tokenizer.encode(text))
        if beam * tokens > MAX_BEAM_TOKENS:
            raise UsageError(f"--beam {beam} on a text of {tokens} source tokens: beam x tokens = {beam * tokens:,} "
                             f"exceeds {MAX_BEAM_TOKENS:,}; lower --beam or split the text ({text[:40]!r}...)")


MAX_UNKNOWN_SOURCE = 0.5


def run_options(path: Path) -> dict:
    """The data and model options a run recorded (its attnkit-run.json), or {} for a bare checkpoint."""
    from .._files import read_json
    from ..training.run import MARKER

    for folder in (path, path.parent):
        if (folder / MARKER).is_file():
            data = read_json(folder / MARKER, "run marker")
            return data.get("options", {}) if isinstance(data, dict) else {}
    return {}


def unknown_source_fraction(checkpoint, pairs) -> float:
    """The share of the source tokens of ``pairs`` (the first 50) that the model's source vocabulary
    does not know: above MAX_UNKNOWN_SOURCE the model was trained on another language."""
    from ..data.tokenizer import UNK

    ids = [i for pair in pairs[:50] for i in checkpoint.source_tokenizer.encode(pair.source)]
    return sum(i == UNK for i in ids) / max(1, len(ids))


def check_trained_on_grc_en(checkpoint) -> None:
    """--aer scores alignments on the Greek -> English verses: refuse a model whose source vocabulary
    does not know Greek (more than half of the held-out verses' tokens unknown)."""
    from ..data import aligned_corpus

    unknown = unknown_source_fraction(checkpoint, aligned_corpus("test"))
    if unknown > MAX_UNKNOWN_SOURCE:
        raise UsageError(f"--aer needs a model trained with --data grc-en: this one's source vocabulary leaves "
                         f"{unknown:.0%} of the held-out Greek tokens unknown")
