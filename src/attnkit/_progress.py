"""The progress convention of every attnkit tool: library functions take ``progress: bool`` and
show one tqdm bar (``leave=False``, fitted to the terminal) when it is True and the output is a
terminal (tqdm's ``disable=None``: no bars written into pipes and log files); ``--quiet`` turns the
command-line bars off."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["progress_bar"]


def progress_bar(items: Iterable | None = None, *, progress: bool, **options):
    """A tqdm bar over ``items`` (or, with ``total=``, one updated by hand), shown when ``progress``."""
    from tqdm import tqdm  # not tqdm.auto: its notebook form warns without ipywidgets, and bars go to a terminal only

    return tqdm(items, leave=options.pop("leave", False), dynamic_ncols=True, disable=None if progress else True,
                **options)
