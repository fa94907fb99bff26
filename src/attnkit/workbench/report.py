"""The demo's report: README.md with tables, plots (PNG) and results.json, written from measured numbers.

The sentences that judge the numbers (Figure 2's shape, the targets of a four-model run) are generated
from them, so the report never says more than was measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from .._files import atomic_path, write_json
from .._markdown import markdown_table
from ..data import Pair
from ..decoding import Translation
from .evaluation import plot_alignment

__all__ = ["write_report", "length_trend", "figure2_targets"]


def write_report(out: Path, results: dict[str, dict], histories: dict[str, dict],
                 examples: dict[str, list[Translation]], test: Sequence[Pair], settings: dict, length: dict) -> Path:
    """``out/report``: README.md, the plots, one alignment picture per shown verse of each attention
    model, and results.json (settings, per-model results, quality by length)."""
    report = out / "report"
    names = list(results)
    _plots(report, names, results, histories, settings, length)
    pictures = _alignment_pictures(report, examples, test)
    lines = _summary(names, results, settings)
    lines += _length_section(names, settings, length)
    lines += ["## Five test verses", ""]
    for k, pair in enumerate(test):
        lines += [f"**{pair.reference}** ({len(pair.source.split())} words): {pair.source}", "",
                  f"- reference: {pair.target}"]
        lines += [f"- {name}: {examples[name][k].text}" for name in names]
        lines.append("")
    lines += ["## Alignments learnt by attention", ""]
    for name, pair, translation, path in pictures:
        lines += [f"**{name}, {pair.reference}**: {pair.source}", "", f"- output: {translation.text}",
                  f"- reference: {pair.target}", "", f"![{name} {pair.reference}]({path})", ""]
    lines += [f"sacreBLEU signature: `{results[names[0]]['signature']}`", ""]
    with atomic_path(report / "README.md") as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    write_json(report / "results.json", {"settings": settings, "results": results, "quality_by_length": length})
    return report


def _styles(names: Sequence[str], results: dict[str, dict]) -> dict[str, dict]:
    """One colour per kind of model; a model trained on long verses solid, on short ones dashed."""
    kinds = list(dict.fromkeys(results[n]["attention"] for n in names))
    return {n: {"color": f"C{kinds.index(results[n]['attention'])}"}
            | ({"linestyle": "--"} if results[n].get("max_train_words") == 25 and len(names) > len(kinds) else {})
            for n in names}


def _plots(report: Path, names: list[str], results: dict[str, dict], histories: dict[str, dict], settings: dict,
           length: dict) -> None:
    from ..viz import plot_lines

    rows = length["buckets"]
    buckets = [row["bucket"] for row in rows]
    cells = {n: [row["systems"][n] for row in rows] for n in names}
    plot_lines({n: (range(len(buckets)), [c["bleu"] for c in cells[n]]) for n in names},
               report / "bleu_by_length.png", x_ticks=[f"{b}\n({row['sentences']})" for b, row in zip(buckets, rows)],
               x_title="source length in words (verses), test + test-long", y_title="BLEU",
               title="BLEU by source length, 95% bootstrap intervals (Bahdanau et al. 2015, figure 2)",
               styles=_styles(names, results) if settings.get("figure2") else None,
               errors={n: ([c["bleu_mean"] - c["bleu_ci"] for c in cells[n]],
                           [c["bleu_mean"] + c["bleu_ci"] for c in cells[n]]) for n in names})
    train_curves = {f"{n} (train)": ([s["step"] for s in histories[n]["steps"]],
                                     _smooth([s["loss"] for s in histories[n]["steps"]])) for n in names}
    valid_curves = {f"{n} (valid)": ([e["step"] for e in histories[n]["epochs"]],
                                     [e["valid_loss"] for e in histories[n]["epochs"]]) for n in names}
    styles = {}
    for i, n in enumerate(names):
        styles[f"{n} (train)"] = {"color": f"C{i}"}
        styles[f"{n} (valid)"] = {"color": f"C{i}", "linestyle": "--", "marker": "o"}
    plot_lines(train_curves | valid_curves, report / "loss_curves.png", x_title="optimiser step",
               y_title="cross entropy (nats per token)", markers=False, styles=styles,
               title="Loss: training (label smoothing 0.1, running mean) and validation")
    curves = {n: ([e["train_seconds"] / 60 for e in histories[n]["epochs"]],
                  [e["valid_bleu"] for e in histories[n]["epochs"]]) for n in names}
    threads = settings["threads"]
    plot_lines(curves, report / "bleu_vs_minutes.png", y_title="BLEU (greedy, dev verses)",
               x_title="training minutes (2 cores)" if threads == 2 else f"training minutes ({threads} threads)",
               title="Quality against training time")


def _alignment_pictures(report: Path, examples: dict[str, list[Translation]], test: Sequence[Pair]) -> list[tuple]:
    pictures = []
    for name, translations in examples.items():
        for translation, pair in list(zip(translations, test))[:3]:
            if translation.weights is None:
                continue
            path = report / "alignments" / f"{name}-{pair.reference.replace(':', '_')}.png"
            plot_alignment(translation, path, title=f"{name}: {pair.reference}")
            pictures.append((name, pair, translation, path.relative_to(report)))
    return pictures


def _summary(names: list[str], results: dict[str, dict], settings: dict) -> list[str]:
    if settings["minutes"]:
        mode = (f"Mode: a wall-clock budget of {settings['minutes']:g} minutes in all, "
                f"{settings['train_seconds_per_model']:.0f} s of training per model (results depend on the machine).")
    else:
        mode = ("Mode: a fixed amount of training, " + ", ".join(f"{n} {s:,} optimiser steps"
                                                                   for n, s in settings["steps"].items())
                + " (the same numbers on the same machine for the seed; other machines round differently).")
    figure2 = settings.get("figure2")
    title = ("# attnkit demo --figure2: the four models of Bahdanau et al. (2015), Figure 2" if figure2 else
             "# attnkit demo: does attention beat the fixed-length bottleneck?")
    corpus = (f"{settings['train_pairs']:,} training pairs of at most 25 words, "
              f"{settings['train_pairs'] + settings.get('train_long_pairs', 0):,} of at most 50 words"
              if figure2 else f"{settings['train_pairs']:,} training pairs")
    lines = [title, "",
             f"Corpus: bundled KJV -> Louis Segond, {corpus}, {settings['test_pairs']} test verses (held-out books). "
             f"Beam {settings['beam_size']}, sacreBLEU. {mode} {settings['threads']} threads on {settings['device']}; "
             f"the whole job took {settings['wall_seconds'] / 60:.1f} minutes.", ""]
    longest = results[names[0]]["by_length"][-1]["bucket"]  # the test split's longest bucket (test-long: below)
    lines += markdown_table(
        ["model", "attention", "trained on", "parameters", "epochs", "steps", "train time", "test BLEU", "chrF",
         f"test BLEU, {longest} words"],
        ([name, r["attention"], f"<= {r.get('max_train_words', 25)} words", f"{r['parameters']:,}", r["epochs"],
          f"{r['steps']:,}", f"{r['train_seconds']:.0f} s", f"{r['bleu']:.2f}", f"{r['chrf']:.2f}",
          f"{r['by_length'][-1]['bleu']:.2f}"] for name, r in ((n, results[n]) for n in names)))
    return lines


def _length_section(names: list[str], settings: dict, length: dict) -> list[str]:
    rows = length["buckets"]
    trained = ("the short models saw verses of at most 25 words, the long ones of at most 50"
               if settings.get("figure2") else "training saw verses of at most 25 words")
    lines = ["", "## Quality against sentence length", "",
             f"Over the {settings['test_pairs']} test verses and the {settings['test_long_pairs']} test-long verses "
             f"(the same held-out books, 26 to 80 words; {trained}). BLEU and chrF per bucket of source length, with "
             "sacreBLEU's paired bootstrap: the 95% interval around the bootstrap mean, and the p-value of each "
             "model's difference from the first.", ""]
    lines += markdown_table(
        ["source words", "verses", *(f"{n} BLEU [95%]" for n in names), *(f"{n} chrF" for n in names),
         *(f"p, {n} vs {names[0]}" for n in names[1:])],
        ([row["bucket"], row["sentences"],
          *(f"{c['bleu']:.2f} [{c['bleu_mean'] - c['bleu_ci']:.2f}, {c['bleu_mean'] + c['bleu_ci']:.2f}]"
            for c in (row["systems"][n] for n in names)),
          *(f"{row['systems'][n]['chrf']:.2f}" for n in names),
          *(_p(row['systems'][n]['bleu_p']) for n in names[1:])] for row in rows))
    lines += ["", length_trend(length["ratios"], settings.get("attention", {})), ""]
    if "figure2" in length:
        lines += figure2_targets(length["figure2"]) + [""]
    lines += ["![BLEU by source length](bleu_by_length.png)", "",
              "![BLEU against training minutes](bleu_vs_minutes.png)", "", "![loss curves](loss_curves.png)", ""]
    return lines


def length_trend(ratios: dict[str, dict], attention: dict[str, str]) -> str:
    """The report's sentence about Figure 2's shape, generated from the measured ratios (BLEU on
    41-80-word sources over BLEU on 11-20-word ones, with bootstrap intervals): attention holding
    means a ratio of at least 0.8, the bottleneck falling a ratio below 0.5. ``attention`` names each
    model's attention ("none": the bottleneck); where models trained on long verses are present
    (names ending in -50), the verdict is theirs, as in the paper."""
    parts, verdicts = [], []
    for name, r in ratios.items():
        if "error" in r:
            parts.append(f"{name}: no ratio ({r['error']})")
            continue
        if not _finite(r["ratio"]):  # BLEU 0 on the short sources: the quotient says nothing
            parts.append(f"{name}: no ratio (BLEU {r['long_bleu']:.2f} over {r['short_bleu']:.2f})")
            continue
        parts.append(f"{name} {r['long_bleu']:.2f} / {r['short_bleu']:.2f} = {_interval(r)}")
        verdicts.append((name, r))
    text = ("BLEU on the longest sources (41-80 words) over BLEU on 11-20-word sources, with 95% bootstrap "
            "intervals: " + "; ".join(parts) + ".")
    if any(name.endswith("-50") for name, _ in verdicts):
        verdicts = [(name, r) for name, r in verdicts if name.endswith("-50")]
    with_attention = [r for name, r in verdicts if attention.get(name, "none") != "none"]
    bottleneck = [r for name, r in verdicts if attention.get(name) == "none"]
    if not with_attention or not bottleneck:
        text += (" Figure 2's shape cannot be judged here: a ratio is missing for "
                 + ("the attention model" if not with_attention else "the bottleneck") + ".") if ratios else ""
    else:
        holds = all(r["ratio"] >= 0.8 for r in with_attention)
        falls = all(r["ratio"] < 0.5 for r in bottleneck)
        shape = ("Figure 2's shape appears: attention holds (>= 0.8) while the bottleneck falls (< 0.5)."
                 if holds and falls else
                 "Figure 2's shape does not fully appear: attention "
                 + ("holds (>= 0.8)" if holds else "does not hold (< 0.8)") + ", the bottleneck "
                 + ("falls (< 0.5)." if falls else "does not fall below 0.5."))
        text += " " + shape
    return text


def figure2_targets(figure2: dict) -> list[str]:
    """The targets of the four-model run, each met or not, from ``figure2`` (ratios of the long-trained
    models, and the long- against the short-trained attention model per bucket past 25 words)."""
    attention, bottleneck = figure2["attention_ratio"], figure2["bottleneck_ratio"]

    def verdict(met: bool | None) -> str:
        return "**cannot tell** (no ratio)" if met is None else "**met**" if met else "**missed**"

    def ratio_verdict(ratio: float, met) -> str:
        return verdict(met(ratio) if _finite(ratio) else None)

    lines = ["### Targets of the four-model run", ""]
    lines += markdown_table(["target", "measured", ""], [
        ["bahdanau-50: BLEU 41-80 words >= 0.8x its BLEU 11-20",
         _interval(attention), ratio_verdict(attention["ratio"], lambda r: r >= 0.8)],
        ["bottleneck-50: the same ratio < 0.5",
         _interval(bottleneck), ratio_verdict(bottleneck["ratio"], lambda r: r < 0.5)],
        *([f"bahdanau-50 >= bahdanau-25, {row['bucket']} words ({row['sentences']} verses)",
           f"{row['long']:.2f} vs {row['short']:.2f}, p = {_p(row['p'])}", verdict(row["long"] >= row["short"])]
          for row in figure2["long_vs_short"]),
    ])
    return lines


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _p(value) -> str:
    """A p-value for the report: None (the two scored the same) says so instead of a number."""
    return "n/a (equal scores)" if value is None else f"{value:.3f}"


def _interval(r: dict) -> str:
    """A ratio and its interval, or why there is none."""
    if not _finite(r.get("ratio")):
        return f"no ratio (BLEU {r.get('long_bleu', 0.0):.2f} over {r.get('short_bleu', 0.0):.2f})"
    if not (_finite(r.get("ratio_low")) and _finite(r.get("ratio_high"))):
        return f"{r['ratio']:.2f} (no interval: no bootstrap sample had a finite ratio)"
    return f"{r['ratio']:.2f} [{r['ratio_low']:.2f}, {r['ratio_high']:.2f}]"


def _smooth(values: list[float], window: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out
