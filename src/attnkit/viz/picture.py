"""A finished picture: a matplotlib Figure that shows itself inline in Jupyter and saves atomically.

Every plot function of :mod:`attnkit.viz` builds a bare :class:`matplotlib.figure.Figure` with
:func:`subplots` (no pyplot: no global state, the user's backend left alone), ends with
:func:`finish` and returns a :class:`Picture`: written to a path where one is given, displayed by
a notebook (``_repr_png_``), and adjustable through ``.figure`` before ``.save(path)``.
"""

from __future__ import annotations

import io
import os

from .. import __version__
from .._files import WRITTEN_BY, atomic_path

__all__ = ["Picture", "finish", "subplots"]

DPI = 120


def subplots(nrows: int = 1, ncols: int = 1, *, figsize, constrained_layout: bool = False, **options):
    """``plt.subplots`` without pyplot: a bare :class:`matplotlib.figure.Figure` (saving picks the
    canvas from the file's suffix)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - matplotlib is a core dependency
        raise ImportError("attnkit.viz needs matplotlib: pip install matplotlib") from error
    fig = Figure(figsize=figsize, layout="constrained" if constrained_layout else None)
    return fig, fig.subplots(nrows, ncols, **options)


class Picture:
    """A plot: ``figure`` (the matplotlib Figure, to adjust), ``save(path)`` (PNG or SVG by the suffix,
    atomically), and ``_repr_png_`` so that a notebook cell ending in a plot call shows it inline."""

    def __init__(self, figure):
        self.figure = figure

    def save(self, path: str | os.PathLike) -> Picture:
        """Write the picture to ``path`` (PNG, SVG or another of matplotlib's formats by its suffix, PNG
        without one), atomically."""
        _plain_texts(self.figure)
        kind = os.path.splitext(str(path))[1][1:] or "png"
        signed = f"{WRITTEN_BY} {__version__}"  # whose file it is: a PNG's Software text, an SVG's creator
        mark = {"png": {"metadata": {"Software": signed}}, "svg": {"metadata": {"Creator": signed}}}.get(kind, {})
        with atomic_path(path) as tmp:
            self.figure.savefig(tmp, dpi=DPI, bbox_inches="tight", format=kind, **mark)
        return self

    def png(self) -> bytes:
        """The picture as PNG bytes."""
        _plain_texts(self.figure)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, dpi=DPI, bbox_inches="tight", format="png")
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def __repr__(self) -> str:
        width, height = self.figure.get_size_inches()
        return f"Picture({len(self.figure.axes)} axes, {width:.1f} x {height:.1f} in)"


def finish(fig, path: str | os.PathLike | None) -> Picture:
    """``fig`` as a :class:`Picture`, written to ``path`` first where one is given."""
    picture = Picture(fig)
    if path is not None:
        picture.save(path)
    return picture


def _plain_texts(fig) -> None:
    """Text a user gave (titles, axis titles, legends, annotations, tick labels set as words) is plain
    text: "$5 and $6" is not mathematics, so its dollar signs are escaped (idempotent: a picture shown,
    then saved, is escaped once). The tick labels matplotlib's own formatters write (a log axis's 10^2)
    stay mathematics: they are rewritten at every draw from the formatter, which this leaves alone."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatter = axis.get_major_formatter()
            # Words given as tick labels (set_ticklabels makes a FixedFormatter, or a FuncFormatter in newer
            # matplotlib): escaped as they are drawn. matplotlib's numeric formatters are left alone.
            if isinstance(formatter, (FixedFormatter, FuncFormatter)) and not getattr(formatter, "_attnkit_plain", False):
                plain = FuncFormatter(lambda x, pos=None, words=formatter: _plain(words(x, pos)))
                plain._attnkit_plain = True  # type: ignore[attr-defined]
                axis.set_major_formatter(plain)
    ticks = {id(label) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for label in axis.get_ticklabels(which="both")}
    for text in fig.findobj(Text):
        if id(text) not in ticks:
            text.set_text(_plain(text.get_text()))


def _plain(text: str) -> str:
    """``text`` shown as written: its dollar signs escaped (matplotlib reads $...$ as mathematics)."""
    return text.replace("\\$", "$").replace("$", "\\$") if "$" in text else text
