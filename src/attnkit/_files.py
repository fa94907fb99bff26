"""Atomic file writes: a crash or Ctrl-C never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import InputError

__all__ = ["atomic_path", "write_json", "read_json", "WRITTEN_BY", "written_by_attnkit"]

WRITTEN_BY = "attnkit"
"""The mark of a single file attnkit wrote: a PNG's "Software" text, a JSON object's "written_by" entry (a file
without a mark may be replaced only when the user says so: attnkit.cli.arguments.check_replaceable)."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private (0600); give it the usual mode
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, data) -> None:
    """Write ``data`` as indented UTF-8 JSON, atomically. A NaN or infinite number is written as null:
    JSON has no such numbers (Python's bare ``NaN`` is not JSON, and other readers refuse it)."""
    import json

    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(_finite(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n",
                       encoding="utf-8")


def _finite(data):
    """``data`` with every NaN or infinite float replaced by None, at any depth of dicts, lists and tuples."""
    import math

    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def read_json(path: str | os.PathLike, what: str = "file"):
    """Parse a JSON file; a missing file or bad JSON raises an error naming ``what`` and the path."""
    import json

    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from error


def written_by_attnkit(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` carries attnkit's mark (:data:`WRITTEN_BY`): a PNG whose "Software" text
    chunk starts with it, an SVG whose metadata names it as creator, or a JSON object whose "written_by" does.
    Reads at most the first 64 KiB of a picture."""
    import json

    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return b"tEXtSoftware\x00" + WRITTEN_BY.encode() in head
    if head.lstrip().startswith(b"<?xml") and b"<svg" in head:  # an SVG: its metadata's creator
        creator = head.find(b"<dc:creator>")
        return creator >= 0 and b"<dc:title>" + WRITTEN_BY.encode() in head[creator:creator + 200]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and str(data.get("written_by", "")).startswith(WRITTEN_BY)
