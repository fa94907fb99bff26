"""Pictures of attention: matplotlib heatmaps and plots (PNG, SVG by the path's suffix) and a
self-contained interactive HTML viewer. Each returns an object a notebook shows inline
(:class:`Picture`, :class:`Viewer`); a path, where given, gets the file as well."""

from .curves import plot_distributions, plot_lines, plot_scaling
from .heatmap import label_step, plot_head_values, plot_heads, plot_heatmap, plot_overview
from .html import AttentionView, Viewer, viewer, write_viewer
from .picture import Picture

__all__ = [
    "plot_heatmap",
    "plot_heads",
    "plot_overview",
    "plot_head_values",
    "plot_lines",
    "plot_scaling",
    "plot_distributions",
    "label_step",
    "AttentionView",
    "Viewer",
    "viewer",
    "write_viewer",
    "Picture",
]
