"""Which signal last asked the running command to stop, Ctrl-C's SIGINT or SIGTERM: a stopped command's exit status
says which (128 + its number: 130 or 143, as shells count). Signals are the process's, and so is this record:
whoever handles one (the command line, a training loop that checkpoints first) records it here."""

from __future__ import annotations

__all__ = ["record", "last", "reset"]

_last: int | None = None


def record(signum: int) -> None:
    global _last
    _last = signum


def last() -> int | None:
    return _last


def reset() -> None:
    global _last
    _last = None
