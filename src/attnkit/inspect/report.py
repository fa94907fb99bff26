"""What ``attnkit inspect`` writes: PNGs, the HTML viewer, ``report.md`` and ``results.json``.

- :func:`inspect_encoder`: a BERT-style encoder (all-MiniLM-L6-v2): head roles and entropy over
  the texts, the first text's layer x head overview, per-layer head grids, rollout and flow, the
  viewer with every text, and attention-vs-attribution agreement;
- :func:`inspect_translation`: a trained translation checkpoint: alignments of the given texts
  (translated, or forced to given references), the viewer with the cross attention, agreement;
- :func:`evaluate_alignment`: a checkpoint trained on the bundled Greek -> English corpus
  (``--data grc-en``): AER of its attention, read every way and chosen on dev, on the held-out
  verses next to eflomal, IBM Model 1 and the diagonal baseline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from .._files import atomic_path, write_json
from ..data import Pair, aligned_corpus
from ..data.batching import collate
from .agreement import Agreement, encoder_agreement, seq2seq_agreement, summarise
from .alignment import (
    IBMModel1,
    alignment_error_rate,
    cross_attention_pieces,
    diagonal_alignment,
    eflomal_align,
    links_from_weights,
    select_weights,
    symmetrize,
    word_weights,
)
from .roles import ROLES, SENTENCES, encoder_attentions, head_roles
from .rollout import attention_flow, attention_rollout

__all__ = ["inspect_encoder", "inspect_translation", "inspect_encoder_decoder", "evaluate_alignment",
           "evaluate_coreference", "MAX_FLOW_TOKENS"]

logger = logging.getLogger(__name__)

MAX_FLOW_TOKENS = 40  # attention flow solves L^2 max-flow problems: only for short texts


def _bar(items: Sequence, progress: bool, **options):
    """A tqdm bar over ``items`` when ``progress``: the progress convention of every attnkit tool."""
    from tqdm.auto import tqdm

    return tqdm(items, leave=False, dynamic_ncols=True, disable=not progress, **options)


def _write_markdown(path: Path, lines: list[str]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")


_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_[]()#!|"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _md(text: str) -> str:
    """User text in report.md: plain text. Markdown and HTML characters are escaped (no link, image or
    heading can be injected) and line breaks of every kind (\\r, \\n, U+2028 ...) become spaces."""
    return " ".join(text.splitlines()).translate(_MARKDOWN)


def _agreement_section(examples: Sequence[Agreement], out: Path, what: str) -> tuple[list[str], list[dict]]:
    from ..viz import plot_distributions

    rows = summarise(examples)
    samples = {f"{r['attention']} vs {r['attribution']} ({measure})": r[measure]["values"]
               for r in rows for measure in ("spearman", "kendall")}
    plot_distributions(samples, out / "agreement.png", x_title="rank correlation per example", limits=(-1, 1),
                       title=f"Attention vs attribution ({what})")
    lines = ["## Does attention agree with attribution?", "",
             f"Per example ({what}), rank correlation between attention scores and attribution magnitudes "
             "(Jain & Wallace 2019), and between the attributions themselves (integrated gradients, gradient x "
             "input, sampled Shapley values; Captum). 1 = same ranking, 0 = unrelated.", "",
             "| scores | against | examples | Spearman median [IQR] | Spearman mean | Kendall median [IQR] | Kendall mean |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        s, k = r["spearman"], r["kendall"]
        lines.append(f"| {r['attention']} | {r['attribution']} | {s['n']} | {s['median']:.2f} [{s['q25']:.2f}, {s['q75']:.2f}] | "
                     f"{s['mean']:.2f} | {k['median']:.2f} [{k['q25']:.2f}, {k['q75']:.2f}] | {k['mean']:.2f} |")
    lines += ["", "![agreement](agreement.png)", ""]
    return lines, rows


def inspect_encoder(model, tokenizer, texts: Sequence[str] | None, out: str | Path, *, steps: int = 32,
                    top_k: int = 16, progress: bool = False, log: Callable[[str], None] | None = None) -> Path:
    """Inspect a BERT-style encoder on ``texts`` (the bundled :data:`SENTENCES` when None); returns report.md's path.
    Messages go to ``log`` (default: this module's logger at INFO)."""
    log = log or logger.info
    from ..viz import AttentionView, plot_head_values, plot_heads, plot_heatmap, plot_overview, write_viewer

    out = Path(out)
    texts = list(texts) if texts else list(SENTENCES)
    started = time.perf_counter()
    attentions, tokens = encoder_attentions(model, tokenizer, texts)
    roles = head_roles(attentions, tokens)
    plot_head_values({**{f"share: {r}": roles.shares[r] for r in ROLES}, "entropy (nats)": roles.entropy},
                     out / "roles.png", title=f"Head roles over {len(texts)} texts ({roles.tokens} tokens)",
                     vmax={f"share: {r}": 1.0 for r in ROLES})
    first, first_tokens = attentions[0], tokens[0]
    plot_overview(first, out / "overview.png", title=f"All heads on: {texts[0][:80]}")
    for layer, weights in enumerate(first):
        plot_heads(weights, out / f"heads-layer{layer}.png", x_labels=first_tokens, y_labels=first_tokens,
                   title=f"layer {layer}: {texts[0][:80]}")
    rollout = attention_rollout(first)
    plot_heatmap(rollout, out / "rollout.png", x_labels=first_tokens, y_labels=first_tokens, title="attention rollout",
                 x_title="input token", y_title="output position")
    with_flow = len(first_tokens) <= MAX_FLOW_TOKENS
    if with_flow:
        plot_heatmap(attention_flow(first), out / "flow.png", x_labels=first_tokens, y_labels=first_tokens,
                     title="attention flow", x_title="input token", y_title="output position")
    views = [AttentionView(f"text {k + 1}: {t[:60]}", tok, att) for k, (t, tok, att) in enumerate(zip(texts, tokens, attentions))]
    write_viewer(out / "viewer.html", views, title="attnkit inspect: encoder self-attention", top_k=top_k)
    log(f"head roles, pictures and viewer written; attribution ({steps} integrated-gradient steps per text) ...")
    # One text has no other text to compare with: a bundled sentence that differs from it (its cosine with
    # itself is constant, a degenerate objective whose gradients are noise).
    partners = ([texts[(k + 1) % len(texts)] for k in range(len(texts))] if len(texts) > 1 else
                [next(s for s in SENTENCES if s.strip() != texts[0].strip())])
    examples = encoder_agreement(model, tokenizer, _bar(texts, progress, desc="attribution", unit="text"), partners, steps=steps)

    lines = ["# attnkit inspect: encoder", "", f"{len(texts)} texts, {roles.tokens} tokens, "
             f"{roles.shape[0]} layers x {roles.shape[1]} heads. Interactive view: [viewer.html](viewer.html).", "",
             "## Head roles (Clark et al. 2019)", "",
             "Mean share of each query token's attention on the previous / next token, itself, [CLS], [SEP] and "
             "punctuation, and the mean entropy. Heads above 50%:", "",
             "| role | heads (layer, head: share) |", "|---|---|"]
    for role in ROLES:
        found = roles.heads(role)
        lines.append(f"| {role} | " + (", ".join(f"L{l} H{h}: {s:.2f}" for l, h, s in found) if found else
                                        f"none (largest {roles.shares[role].max():.2f})") + " |")
    dominant = roles.dominant()
    lines += ["", "Dominant role and entropy (nats) per head:", "",
              "| layer | " + " | ".join(f"H{h}" for h in range(roles.shape[1])) + " |",
              "|---|" + "---|" * roles.shape[1]]
    for l in range(roles.shape[0]):
        lines.append(f"| {l} | " + " | ".join(f"{dominant[l, h]} {roles.entropy[l, h]:.2f}" for h in range(roles.shape[1])) + " |")
    lines += ["", "![head roles](roles.png)", "", "## All heads on text 1", "", f"> {_md(texts[0])}", "",
              "![overview](overview.png)", "", "![rollout](rollout.png)", ""]
    if with_flow:
        lines += ["![flow](flow.png)", ""]
    lines += ["Per-layer head grids: " + ", ".join(f"[layer {l}](heads-layer{l}.png)" for l in range(len(first))), ""]
    target = ("the next text's" if len(texts) > 1 else
              f"that of the bundled sentence \"{_md(partners[0])}\" (one text: its cosine with itself would be a "
              "constant, a degenerate objective)")
    section, rows = _agreement_section(
        examples, out, f"output: cosine similarity of the mean-pooled embedding to {target}")
    lines += section
    _write_markdown(out / "report.md", lines)
    write_json(out / "results.json", {
        "texts": texts, "roles": roles.table(), "agreement": rows, "seconds": time.perf_counter() - started,
        "examples": [{"text": e.name, "tokens": e.tokens,
                      "attention": {k: v.tolist() for k, v in e.attention.items()},
                      "attribution": {k: v.tolist() for k, v in e.attribution.items()}} for e in examples]})
    return out / "report.md"


def _translation_views(model, source, target, text: str, forced: str, number: int):
    """Teacher-force ``forced`` after ``text``: (views, cross-attention matrix for the alignment
    picture, source pieces, output pieces). An RNN seq2seq model has one alignment per output
    token; a Transformer has encoder self, decoder self and cross attention per layer and head."""
    from ..models import Seq2Seq
    from ..viz import AttentionView
    from .record import record_attention

    batch = collate([source.encode(text)], [target.encode(forced)])
    keys = source.tokens(text)
    pieces = target.tokens(forced)
    outputs, inputs = [*pieces, "</s>"], ["<s>", *pieces]
    model.eval()
    with torch.no_grad():
        if isinstance(model, Seq2Seq):
            weights = model(batch.source, batch.source_lengths, batch.target_in).weights[0]  # (T, S)
            return [AttentionView(f"text {number}: cross attention (rows: the token predicted)", outputs, weights[None, None],
                                  keys=keys)], weights, keys, outputs
        with record_attention(model) as records:
            model(batch.source, batch.source_lengths, batch.target_in)

    def stack(prefix: str, suffix: str) -> torch.Tensor:  # (layers, H, L, S) of the one sentence
        names = sorted((n for n in records if n.startswith(prefix) and n.endswith(suffix)), key=lambda n: int(n.split(".")[2]))
        return torch.stack([records[n][0][0] for n in names])

    cross = stack("decoder.layers.", "cross_attn")
    views = [AttentionView(f"text {number}: encoder self-attention", keys, stack("encoder.layers.", "self_attn")),
             AttentionView(f"text {number}: decoder self-attention (decoder inputs)", inputs, stack("decoder.layers.", "self_attn")),
             AttentionView(f"text {number}: cross attention (rows: the token predicted)", outputs, cross, keys=keys)]
    return views, cross[-1].mean(0), keys, outputs


def inspect_translation(checkpoint, texts: Sequence[str], out: str | Path, *, references: Sequence[str] | None = None,
                        beam_size: int = 5, steps: int = 32, top_k: int = 16, progress: bool = False,
                        log: Callable[[str], None] | None = None) -> Path:
    """Inspect a translation checkpoint on ``texts``: alignments, viewer, agreement; returns report.md's path.

    The model's own translation (beam search) is forced through it unless ``references`` are given.
    Messages go to ``log`` (default: this module's logger at INFO).
    """
    log = log or logger.info
    from ..decoding import translate
    from ..models import Seq2Seq
    from ..viz import plot_heatmap, write_viewer

    if not texts:
        raise ValueError("texts is empty: give at least one source sentence")
    if references is not None and len(references) != len(texts):
        raise ValueError(f"references must match texts in number: {len(references)} and {len(texts)}")
    if isinstance(checkpoint.model, Seq2Seq) and checkpoint.model.style == "none":
        raise ValueError("this model has no attention (attention='none'): nothing to inspect")
    out = Path(out)
    model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    translations = translate(model, list(texts), source, target, beam_size=beam_size)
    forced = list(references) if references is not None else [t.text for t in translations]
    lines = ["# attnkit inspect: translation model", "", f"Checkpoint `{_md(str(checkpoint.folder))}`. "
             "Interactive view: [viewer.html](viewer.html).", "", "## Alignments", ""]
    views, pairs = [], []
    for k, (text, t, f) in enumerate(zip(texts, translations, forced), 1):
        if not f.strip():
            lines += [f"**{k}.** {_md(text)}", "", "- the model's output is empty: nothing to align", ""]
            continue
        text_views, alignment, keys, outputs = _translation_views(model, source, target, text, f, k)
        views += text_views
        pairs.append(Pair(text, f, reference=f"text {k}"))
        plot_heatmap(alignment, out / f"alignment-{k}.png", x_labels=keys, y_labels=outputs, title=text[:80],
                     x_title="source", y_title="output" if references is None else "reference", cmap="Greys")
        lines += [f"**{k}.** {_md(text)}", "", f"- output: {_md(t.text)}"]
        if references is not None:
            lines.append(f"- reference (forced): {_md(f)}")
        lines += ["", f"![alignment {k}](alignment-{k}.png)", ""]
    if not views:
        raise ValueError("nothing to inspect: every output is empty")
    write_viewer(out / "viewer.html", views, title="attnkit inspect: translation", top_k=top_k)
    rows = []
    if isinstance(model, Seq2Seq):
        examples = seq2seq_agreement(model, source, target, _bar(pairs, progress, desc="attribution", unit="text"), steps=steps)
        what = "output: log-probability of each " + ("reference" if references is not None else "output") + " token"
        section, rows = _agreement_section(examples, out, what)
        lines += section
    else:
        lines += ["Attribution agreement is computed for RNN seq2seq checkpoints only.", ""]
    _write_markdown(out / "report.md", lines)
    write_json(out / "results.json", {"texts": list(texts), "outputs": [t.text for t in translations],
                                      "forced": forced, "agreement": rows})
    return out / "report.md"


def inspect_encoder_decoder(runs: Sequence[dict], texts: Sequence[str], out: str | Path, *, source: str,
                            references: Sequence[str] | None = None, top_k: int = 16) -> Path:
    """Report on an encoder-decoder's attention from precomputed runs (one per text, as
    :func:`attnkit.hf.seq2seq_attentions` returns them: tokens, encoder self / decoder self / cross
    attention (layers, H, L, S), the output): alignment pictures (last layer's cross attention, mean
    over heads), the viewer with all three kinds per text, report.md and results.json."""
    from ..viz import AttentionView, plot_heatmap, write_viewer

    out = Path(out)
    lines = ["# attnkit inspect: encoder-decoder", "", f"Model `{_md(source)}`. Interactive view: "
             "[viewer.html](viewer.html).", "", "## Alignments (last layer's cross attention, mean over heads)", ""]
    views = []
    for k, (text, run) in enumerate(zip(texts, runs), 1):
        views += [AttentionView(f"text {k}: encoder self-attention", run["keys"], run["encoder"]),
                  AttentionView(f"text {k}: decoder self-attention (decoder inputs)", run["inputs"], run["decoder"]),
                  AttentionView(f"text {k}: cross attention (rows: the token predicted)", run["outputs"], run["cross"],
                                keys=run["keys"])]
        plot_heatmap(run["cross"][-1].mean(0), out / f"alignment-{k}.png", x_labels=run["keys"], y_labels=run["outputs"],
                     title=text[:80], x_title="source", y_title="output" if references is None else "reference",
                     cmap="Greys")
        lines += [f"**{k}.** {_md(text)}", "", f"- {'reference (forced)' if references is not None else 'output'}: "
                  f"{_md(run['output_text'])}", "", f"![alignment {k}](alignment-{k}.png)", ""]
    write_viewer(out / "viewer.html", views, title="attnkit inspect: encoder-decoder", top_k=top_k)
    _write_markdown(out / "report.md", lines)
    write_json(out / "results.json", {"texts": list(texts), "outputs": [r["output_text"] for r in runs],
                                      "forced": references is not None})
    return out / "report.md"


def _readings(pieces: np.ndarray) -> list[tuple[int, int | None, bool]]:
    """Every (layer, head or None for the heads' average, shift) reading of a cross-attention stack."""
    layers, heads = pieces.shape[:2]
    choices = (None, *range(heads)) if heads > 1 else (None,)
    return [(layer, head, shift) for layer in range(layers) for head in choices for shift in (False, True)]


def _reading_name(reading: tuple[int, int | None, bool], layers: int) -> str:
    layer, head, shift = reading
    where = f"layer {layer + 1}/{layers}, " if layers > 1 else ""
    return f"{'shift-att' if shift else 'attention'}, {where}{'head average' if head is None else f'head {head}'}"


def _links(weights: np.ndarray, rule: str):
    if rule == "argmax":
        return links_from_weights(weights)
    return links_from_weights(weights, method="threshold", threshold=float(rule.split(">= ")[1]))


def _attention_methods(label: str, checkpoint, test, dev, thresholds, progress) -> dict:
    """Every attention reading of one checkpoint scored on dev; on test: the last layer's head
    average (plain and shift-att) with every rule, the dev-best reading, and per-layer rows."""
    model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    gold, dev_gold = [p.alignment for p in test], [p.alignment for p in dev]
    test_pieces = cross_attention_pieces(model, source, target, test)
    dev_pieces = cross_attention_pieces(model, source, target, dev)
    layers, heads = test_pieces[0].shape[:2]
    rules = ["argmax", *(f"weight >= {t}" for t in thresholds)]

    def words(pairs, pieces, reading):
        layer, head, shift = reading
        return [word_weights(select_weights(p, layer=layer, head=head, shift=shift), source.word_ids(pair.source),
                             target.word_ids(pair.target)) for pair, p in zip(pairs, pieces)]

    grid = {}  # (reading, rule) -> dev AER
    for reading in _bar(_readings(test_pieces[0]), progress, desc=f"{label}: readings on dev", unit="reading"):
        dev_words = words(dev, dev_pieces, reading)
        for rule in rules:
            grid[reading, rule] = alignment_error_rate([_links(w, rule) for w in dev_words], dev_gold).aer
    (best_reading, best_rule), best_dev = min(grid.items(), key=lambda item: item[1])
    methods, dev_aer, test_words = {}, {}, {}
    for reading in dict.fromkeys([(layers - 1, None, False), (layers - 1, None, True), best_reading]):
        test_words[reading] = words(test, test_pieces, reading)
        for rule in rules:
            name = f"{label}: {_reading_name(reading, layers)}, {rule}"
            if (reading, rule) == (best_reading, best_rule):
                name += " (best on dev)"
            methods[name] = [_links(w, rule) for w in test_words[reading]]
            dev_aer[name] = grid[reading, rule]
    per_layer = []
    for layer in range(layers):
        for shift in (False, True):
            reading = (layer, None, shift)
            layer_words = test_words.get(reading) or words(test, test_pieces, reading)
            per_layer.append({"model": label, "layer": layer + 1, "shift": shift, **{
                rule: {"dev": grid[reading, rule],
                       "test": alignment_error_rate([_links(w, rule) for w in layer_words], gold).aer}
                for rule in ("argmax", f"weight >= {thresholds[0]}")}})
    best = {"model": label, "checkpoint": str(checkpoint.folder), "layer": best_reading[0] + 1,
            "head": best_reading[1], "shift": best_reading[2], "rule": best_rule, "dev_aer": best_dev,
            "readings_tried": len(grid), "layers": layers, "heads": heads,
            "method": next(name for name in methods if name.endswith("(best on dev)"))}
    return {"methods": methods, "dev_aer": dev_aer, "per_layer": per_layer, "best": best,
            "example_words": test_words[best_reading]}


def _attribution_methods(label: str, checkpoint, test, dev, thresholds, steps: int, progress) -> dict:
    """Alignments from integrated gradients (instead of attention): the rule chosen on dev."""
    from .alignment import attribution_word_weights

    model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    rules = ["argmax", *(f"weight >= {t}" for t in thresholds)]
    dev_words = attribution_word_weights(model, source, target, _bar(dev, progress, desc=f"{label}: IG on dev"),
                                         steps=steps)
    dev_aer = {rule: alignment_error_rate([_links(w, rule) for w in dev_words], [p.alignment for p in dev]).aer
               for rule in rules}
    best_rule = min(dev_aer, key=dev_aer.get)
    test_words = attribution_word_weights(model, source, target, _bar(test, progress, desc=f"{label}: IG on test"),
                                          steps=steps)
    methods, named_dev = {}, {}
    for rule in dict.fromkeys(["argmax", best_rule]):
        name = f"{label}: integrated gradients ({steps} steps), {rule}" + (" (best on dev)" if rule == best_rule else "")
        methods[name] = [_links(w, rule) for w in test_words]
        named_dev[name] = dev_aer[rule]
    return {"methods": methods, "dev_aer": named_dev}


def evaluate_alignment(checkpoints, out: str | Path, *, limit: int | None = None, ibm_iterations: int = 5,
                       thresholds: Sequence[float] = (0.2, 0.3, 0.5), eflomal: bool = True,
                       attribution_steps: int = 0, progress: bool = False,
                       log: Callable[[str], None] | None = None) -> dict:
    """AER on the held-out verses of the bundled Greek -> English corpus, in one table: each
    checkpoint's attention read every way (each decoder layer, each head and the heads' average,
    the row that predicts a word or, shift-att, the row that reads it; argmax or a weight
    threshold), next to eflomal (both directions, intersection, grow-diag-final-and), IBM Model 1
    and the diagonal; with ``attribution_steps`` > 0 also alignments of the first checkpoint from
    integrated gradients (:func:`~attnkit.inspect.alignment.attribution_word_weights`; costly, so
    for one model), their rule chosen on dev.

    ``checkpoints``: one checkpoint, or a dict label -> checkpoint. For each, the reading with the
    lowest AER on the dev verses (the "valid" split) is reported on test; nothing is chosen on
    test. The statistical aligners learn from the text of every verse (train, dev and test)
    without gold links, as aligners are used. Writes ``alignment.md``, ``alignment.json`` and an
    example PNG (the first checkpoint's best reading).
    """
    log = log or logger.info
    from ..viz import plot_heatmap

    if not isinstance(checkpoints, dict):
        checkpoints = {"attention": checkpoints}
    if not checkpoints:
        raise ValueError("checkpoints is empty: give at least one checkpoint")
    out = Path(out)
    test, dev, train = aligned_corpus("test")[:limit], aligned_corpus("valid"), aligned_corpus("train")
    gold = [p.alignment for p in test]
    seconds, methods, dev_aer, per_layer, best = {}, {}, {}, [], []
    example_words = None
    for label, checkpoint in checkpoints.items():
        tick = time.perf_counter()
        found = _attention_methods(label, checkpoint, test, dev, thresholds, progress)
        methods |= found["methods"]
        dev_aer |= found["dev_aer"]
        per_layer += found["per_layer"]
        best.append(found["best"])
        example_words = example_words or found["example_words"]
        seconds[label] = time.perf_counter() - tick
        log(f"{label}: {found['best']['readings_tried']} attention readings in {seconds[label]:.1f} s")
        if attribution_steps and label == next(iter(checkpoints)):
            tick = time.perf_counter()
            attributed = _attribution_methods(label, checkpoint, test, dev, thresholds, attribution_steps, progress)
            methods |= attributed["methods"]
            dev_aer |= attributed["dev_aer"]
            seconds[f"{label}: integrated gradients"] = time.perf_counter() - tick
            log(f"{label}: integrated-gradient alignments in {seconds[f'{label}: integrated gradients']:.1f} s")
    log(f"IBM Model 1 ({ibm_iterations} EM iterations) ...")
    words_of = lambda p: (p.source.lower().split(), p.target.lower().split())  # noqa: E731
    corpus = [words_of(p) for p in train + dev + test]
    ibm = IBMModel1().fit(corpus, iterations=ibm_iterations, progress=progress)
    methods["IBM Model 1"] = [ibm.align(*words_of(p)) for p in test]
    if eflomal:
        tick = time.perf_counter()
        log(f"eflomal on {len(corpus):,} verses ...")
        forward, reverse = eflomal_align(corpus)
        tail = slice(len(corpus) - len(test), len(corpus))
        forward, reverse = forward[tail], reverse[tail]
        methods["eflomal, Greek -> English"] = forward
        methods["eflomal, English -> Greek"] = reverse
        for how in ("intersection", "grow-diag-final-and"):
            methods[f"eflomal, {how}"] = [symmetrize(f, r, how) for f, r in zip(forward, reverse)]
        seconds["eflomal"] = time.perf_counter() - tick
    methods["diagonal"] = [diagonal_alignment(len(p.source.split()), len(p.target.split())) for p in test]
    scores = {name: alignment_error_rate(links, gold)._asdict() for name, links in methods.items()}
    example = max(range(len(test)), key=lambda k: -abs(len(test[k].source.split()) - 14))  # a verse of ~14 words
    pair = test[example]
    gold_matrix = np.zeros_like(example_words[example])
    for i, j in pair.alignment:
        gold_matrix[j, i] = 1.0
    for name, matrix in (("attention", example_words[example]), ("gold", gold_matrix)):
        plot_heatmap(matrix, out / f"alignment-{name}.png", x_labels=pair.source.split(), y_labels=pair.target.split(),
                     title=f"{name}: {pair.reference}", x_title="Greek (SBLGNT)", y_title="English (BSB)", cmap="Greys")
    result = {"verses": len(test), "dev_verses": len(dev), "gold_links": sum(len(g) for g in gold), "scores": scores,
              "dev_aer": dev_aer, "best_on_dev": best, "per_layer": per_layer,
              "ibm_iterations": ibm_iterations, "ibm_log_likelihoods": ibm.log_likelihoods,
              "checkpoints": {label: str(c.folder) for label, c in checkpoints.items()}, "example": pair.reference,
              "seconds": seconds}
    tried = sum(b["readings_tried"] for b in best)
    lines = ["# Alignment quality: attention vs eflomal, IBM Model 1 and the diagonal", "",
             f"{len(test)} held-out verses (Mark, Philippians, 1 John) of the bundled SBLGNT -> BSB corpus, "
             f"{result['gold_links']:,} hand-made links (all treated as sure, so AER = 1 - F1). "
             "Every method links English words to Greek words; attention comes from each checkpoint forced "
             "to produce the reference English, pooled from subword pieces to words. "
             f"{tried} attention readings (layer, head or head average, shift-att or not, rule) were scored on "
             f"the {len(dev)} dev verses; each model's best is marked. eflomal and IBM Model 1 learn from the text of "
             f"all {len(corpus):,} verses, without gold links.", "",
             "| method | precision | recall | AER (test) | AER (dev) | links |", "|---|---|---|---|---|---|"]
    for name, s in sorted(scores.items(), key=lambda item: item[1]["aer"]):
        dev_cell = f"{dev_aer[name]:.3f}" if name in dev_aer else "-"
        lines.append(f"| {name} | {s['precision']:.3f} | {s['recall']:.3f} | {s['aer']:.3f} | {dev_cell} | {s['predicted']:,} |")
    lines += ["", "Head average per decoder layer (AER):", "",
              f"| model | layer | row | dev, argmax | test, argmax | dev, weight >= {thresholds[0]} | "
              f"test, weight >= {thresholds[0]} |", "|---|---|---|---|---|---|---|"]
    for row in per_layer:
        a, t = row["argmax"], row[f"weight >= {thresholds[0]}"]
        lines.append(f"| {row['model']} | {row['layer']} | {'reads the word (shift-att)' if row['shift'] else 'predicts the word'} | "
                     f"{a['dev']:.3f} | {a['test']:.3f} | {t['dev']:.3f} | {t['test']:.3f} |")
    lines += ["", f"Example, {pair.reference}: attention of {best[0]['model']}'s best reading on dev (left) and gold "
              "links (right).", "", "![attention](alignment-attention.png) ![gold](alignment-gold.png)", ""]
    out.mkdir(parents=True, exist_ok=True)
    _write_markdown(out / "alignment.md", lines)
    write_json(out / "alignment.json", result)
    return result


def evaluate_coreference(model, tokenizer, out: str | Path, *, progress: bool = False) -> dict:
    """Per-head pronoun resolution of an encoder on the bundled Winograd-style pairs
    (:func:`attnkit.data.winograd_pairs`): ``coref.md``, ``coref.json`` and ``coref.png`` (accuracy
    per layer and head)."""
    from ..data import winograd_pairs
    from ..viz import plot_heatmap
    from .coref import coreference_picks, coreference_scores

    out = Path(out)
    items = winograd_pairs()
    margins = coreference_picks(model, tokenizer, list(_bar(items, progress, desc="coreference", unit="sentence")))
    result = coreference_scores(margins, items)
    layers, heads = margins.shape[1:]
    accuracy = (margins > 0).mean(0)
    plot_heatmap(accuracy, out / "coref.png", x_labels=[str(h) for h in range(heads)],
                 y_labels=[str(layer) for layer in range(layers)], title="pronoun attends more to the right antecedent",
                 x_title="head", y_title="layer", annotate=True, cmap="RdBu", vmin=0.0, vmax=1.0)
    best = result["best_in_sample"]
    lines = ["# Coreference: does a head attend from the pronoun to its antecedent?", "",
             f"{result['items']} sentences in {result['pairs']} Winograd-style pairs (one word changed flips the "
             "antecedent). A head picks correctly when the pronoun's attention mass on the antecedent's pieces exceeds "
             "that on the other candidate's. A head blind to the changed word picks the same candidate in both "
             "sentences of a pair: exactly 50%.", "",
             f"Mean over all {layers * heads} heads: {result['mean_head_accuracy']:.1%}.", "",
             "| head | correct | accuracy | 95% interval | p (vs 50%) |", "|---|---|---|---|---|"]
    ranked = sorted(result["per_head"], key=lambda s: -s["accuracy"])
    for s in ranked[:10]:
        lines.append(f"| L{s['layer']} H{s['head']} | {s['correct']}/{s['total']} | {s['accuracy']:.1%} | "
                     f"{s['low']:.1%}-{s['high']:.1%} | {s['p_value']:.3f} |")
    lines += ["", f"Best head in sample: L{best['layer']} H{best['head']}, {best['accuracy']:.1%} (chosen and scored "
              "on the same sentences, so optimistic).", "", "Chosen on one half of the pairs, scored on the other:", "",
              "| chosen on | head | accuracy where chosen | held-out accuracy | 95% interval | p (vs 50%) |",
              "|---|---|---|---|---|---|"]
    for h in result["held_out"]:
        lines.append(f"| {h['chosen_on']} | L{h['layer']} H{h['head']} | {h['chosen_accuracy']:.1%} | "
                     f"{h['correct']}/{h['total']} = {h['accuracy']:.1%} | {h['low']:.1%}-{h['high']:.1%} | "
                     f"{h['p_value']:.3f} |")
    lines += ["", "![accuracy per head](coref.png)", ""]
    out.mkdir(parents=True, exist_ok=True)
    _write_markdown(out / "coref.md", lines)
    write_json(out / "coref.json", result)
    return result
