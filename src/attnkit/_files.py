"""Atomic file writes: a crash or Ctrl-C never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import InputError

__all__ = ["atomic_path", "write_json", "read_json"]


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
