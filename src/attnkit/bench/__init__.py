"""Speed and memory benchmarks: a harness (round-robin timing, peak memory in fresh processes,
machine facts), the attention sweep behind ``attnkit bench``, tables and log-log plots."""

from .attention import DEFAULT_MASKS, IMPLEMENTATIONS, MASKS, MODES, AttentionBench, naive_attention, ratios, run
from .harness import machine_info, peak_extra_mb, run_worker, time_round_robin
from .report import format_markdown, format_table, plot_attention

__all__ = [
    "AttentionBench",
    "IMPLEMENTATIONS",
    "MASKS",
    "DEFAULT_MASKS",
    "MODES",
    "run",
    "ratios",
    "naive_attention",
    "time_round_robin",
    "peak_extra_mb",
    "run_worker",
    "machine_info",
    "format_table",
    "format_markdown",
    "plot_attention",
]
