"""Benchmark results as a terminal table, a markdown table and log-log plots."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .attention import BASELINE, ratios

__all__ = ["format_table", "format_markdown", "plot_attention"]


def _key(row: dict) -> tuple:
    return row["mode"], row["dtype"], row["mask"], row["n"]


def format_table(rows: Sequence[dict]) -> str:
    """One line per (point, implementation): time, ratio to torch-sdpa, peak extra memory."""
    header = f"{'mode':<8} {'dtype':<9} {'mask':<8} {'n':>6} {'impl':<11} {'time ms':>10} {'x sdpa':>7} {'peak MB':>9}"
    lines = [header, "-" * len(header)]
    for r in ratios(rows):
        prefix = f"{r['mode']:<8} {r['dtype']:<9} {r['mask']:<8} {r['n']:>6} {r['impl']:<11}"
        if "skipped" in r:
            lines.append(f"{prefix} skipped: {r['skipped']}")
            continue
        ratio = f"{r['x_sdpa']:.2f}" if "x_sdpa" in r else "-"
        peak = r.get("peak_extra_mb")
        peak_text = f"{peak:>9.0f}" if peak is not None else f"{'?':>9}"
        lines.append(f"{prefix} {1000 * r['time_s']:>10.1f} {ratio:>7} {peak_text}")
    lines.append(f"x sdpa = {BASELINE} time / this time, same rounds (throughput ratio; above 1 is faster)")
    return "\n".join(lines)


def _cell(value) -> str:
    """A table cell's text: pipes, backslashes and HTML escaped, line breaks flattened."""
    import html

    text = " ".join(str(value).split())
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|")


def format_markdown(rows: Sequence[dict], impls: Sequence[str] | None = None) -> str:
    """One table row per point; each cell ``ms (x sdpa, MB)`` for one implementation. User text
    (names from a JSON file) is escaped; no rows give a line saying so, not a broken table."""
    if not rows:
        return "(no results)"
    rows = ratios(rows)
    impls = list(impls or dict.fromkeys(r["impl"] for r in rows))
    lines = [
        "| mode | dtype | mask | n | " + " | ".join(_cell(i) for i in impls) + " |",
        "|" + "---|" * (4 + len(impls)),
    ]
    for key in dict.fromkeys(_key(r) for r in rows):
        by_impl = {r["impl"]: r for r in rows if _key(r) == key}
        cells = []
        for impl in impls:
            r = by_impl.get(impl, {})
            if "time_s" not in r:
                cells.append("-")
                continue
            ratio = f"{r['x_sdpa']:.2f}x" if "x_sdpa" in r else "-"
            peak = r.get("peak_extra_mb")
            peak_text = f", {peak:.0f} MB" if peak is not None else ""
            cells.append(f"{1000 * r['time_s']:.1f} ({ratio}{peak_text})")
        lines.append("| " + " | ".join(_cell(x) for x in key) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_attention(rows: Sequence[dict], folder: str | os.PathLike) -> list[Path]:
    """Per (mode, dtype): time vs n and peak memory vs n, log-log, one panel per mask, with the
    n and n^2 slopes drawn. Returns the PNG paths written."""
    from ..viz import plot_scaling

    folder = Path(folder)
    written = []
    for mode, dtype in dict.fromkeys((r["mode"], r["dtype"]) for r in rows):
        subset = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
        masks = list(dict.fromkeys(r["mask"] for r in subset))
        impls = list(dict.fromkeys(r["impl"] for r in subset))
        for quantity, field, scale, unit in (("time", "time_s", 1000.0, "ms per call"), ("memory", "peak_extra_mb", 1.0, "peak extra MB")):
            panels = {}
            for mask in masks:
                panel = {}
                for impl in impls:
                    points = sorted(
                        (r["n"], r[field] * scale) for r in subset
                        if r["mask"] == mask and r["impl"] == impl and r.get(field) is not None and r[field] > 0
                    )
                    if points:
                        panel[impl] = ([n for n, _ in points], [y for _, y in points])
                panels[mask] = panel
            if not any(panels.values()):
                continue
            path = folder / f"attention_{quantity}_{mode.replace('+', '_')}_{dtype}.png"
            plot_scaling(panels, path, x_title="sequence length n", y_title=unit,
                         title=f"attention {quantity}, {mode}, {dtype}")
            written.append(path)
    return written
