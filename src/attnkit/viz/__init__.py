"""Pictures of attention: matplotlib heatmaps (PNG, SVG)."""

from .curves import plot_lines, plot_scaling
from .heatmap import plot_heads, plot_heatmap

__all__ = ["plot_heatmap", "plot_heads", "plot_lines", "plot_scaling"]
