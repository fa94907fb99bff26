"""The ``--data`` of the translation commands: the bundled corpora by name or a user's file, its splits, what a
run records of it, and whether a checkpoint can read it. Shared by ``train`` (:mod:`.training`) and ``demo``,
``translate``, ``evaluate`` and ``align`` (:mod:`.translation`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import (
    MAX_UNKNOWN_SOURCE,
    UsageError,
    refuse_unused,
    run_options,
    unknown_source_fraction,
)

__all__ = ["DATA_HELP", "BUNDLED_DATA", "resolve_direction", "data_identity", "data_split", "check_data_fits"]


DATA_HELP = "'bible' (bundled KJV/Louis Segond), 'grc-en' (bundled word-aligned Greek NT/BSB) or a source<TAB>target file"


BUNDLED_DATA = ("bible", "grc-en")


def resolve_direction(args: argparse.Namespace) -> None:
    """--direction means something for --data bible only: refuse it elsewhere, default it there."""
    if args.data != "bible":
        refuse_unused(args, ["direction"], f"applies to --data bible only, not to --data {args.data}")
    elif args.direction is None:
        args.direction = "en-fr"


def data_identity(data: str) -> dict:
    """What a run records of its data: a bundled corpus by name, a file by absolute path and SHA-256
    (so --resume sees through ./pairs.tsv vs pairs.tsv, and refuses another corpus at the same path)."""
    if data in BUNDLED_DATA or not Path(data).is_file():
        return {"data": data}
    import hashlib

    digest = hashlib.sha256(Path(data).read_bytes()).hexdigest()
    return {"data": str(Path(data).resolve()), "data_sha256": digest}


def data_split(name: str, data: str, split: str, **kwargs):
    """load_split with the argument's name in any error about the data."""
    from ..workbench import load_split

    try:
        return load_split(data, split, **kwargs)
    except ValueError as error:
        raise UsageError(f"{name} {data}: {error}") from None
    except OSError as error:
        raise OSError(f"{name} {data}: {error}") from None


def check_data_fits(checkpoint, args: argparse.Namespace, pairs) -> None:
    """Refuse test data the model cannot read: where the run recorded its data and direction, they
    must match (an en->fr model on fr-en gives a BLEU without a word); and in any case at most half
    of the source tokens of the first 50 ``pairs`` may be unknown to the model's source vocabulary."""
    recorded = run_options(Path(args.checkpoint))
    if args.data == "bible" and recorded.get("data") == "bible" and recorded.get("direction") not in (None, args.direction):
        raise UsageError(f"--direction {args.direction}: the model was trained on bible {recorded['direction']}")
    unknown = unknown_source_fraction(checkpoint, pairs)
    if unknown > MAX_UNKNOWN_SOURCE:
        raise UsageError(f"--data {args.data}: {unknown:.0%} of its source tokens are unknown to this model's source "
                         "vocabulary; it was trained on another language or direction")
