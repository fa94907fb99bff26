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
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from .._files import write_json
from .._markdown import escape as _md
from .._markdown import markdown_table, write_markdown
from .._progress import progress_bar
from ..data import Pair
from ..data.batching import collate
from ..errors import InputError
from .aer import score_alignments
from .agreement import Agreement, encoder_agreement, seq2seq_agreement, summarise
from .roles import ROLES, SENTENCES, encoder_attentions, head_roles, magnitude_shares
from .rollout import attention_flow, attention_rollout

__all__ = ["inspect_encoder", "inspect_translation", "inspect_encoder_decoder", "evaluate_alignment",
           "evaluate_coreference", "MAX_FLOW_TOKENS"]

logger = logging.getLogger(__name__)

MAX_FLOW_TOKENS = 40  # attention flow solves L^2 max-flow problems: only for short texts


def _count(n: int, noun: str) -> str:
    """"1 text", "3 texts"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _median_iqr(stats: dict) -> str:
    return "-" if not stats["n"] else f"{stats['median']:.2f} [{stats['q25']:.2f}, {stats['q75']:.2f}]"


def _mean(stats: dict) -> str:
    return "-" if not stats["n"] else f"{stats['mean']:.2f}"


def _agreement_section(examples: Sequence[Agreement], out: Path, what: str) -> tuple[list[str], list[dict]]:
    from ..viz import plot_distributions

    rows = summarise(examples)
    samples = {f"{r['attention']} vs {r['attribution']} ({measure})": r[measure]["values"]
               for r in rows for measure in ("spearman", "kendall") if r[measure]["values"]}
    if samples:
        plot_distributions(samples, out / "agreement.png", x_title="rank correlation per example", limits=(-1, 1),
                           title=f"Attention vs attribution ({what})")
    lines = ["## Does attention agree with attribution?", "",
             f"Per example ({what}), rank correlation between attention scores and attribution magnitudes "
             "(Jain & Wallace 2019), and between the attributions themselves (integrated gradients, gradient x "
             "input, sampled Shapley values; Captum). 1 = same ranking, 0 = unrelated.", "",
             ]
    lines += markdown_table(
        ["scores", "against", "examples", "Spearman median [IQR]", "Spearman mean", "Kendall median [IQR]",
         "Kendall mean"],
        ([r["attention"], r["attribution"], r["spearman"]["n"], _median_iqr(r["spearman"]), _mean(r["spearman"]),
          _median_iqr(r["kendall"]), _mean(r["kendall"])] for r in rows))
    unranked = sum(len(e.tokens) < 2 for e in examples)
    if unranked:
        lines += ["", f"{unranked} of {_count(len(examples), 'example')} scored fewer than two "
                  "tokens: nothing to rank, no correlation (left out of the counts above)."]
    lines += ["", "![agreement](agreement.png)" if samples else "(no example to draw)", ""]
    return lines, rows


_IMPLICIT_NOTE = (
    "{heads} (layers {layers}) are a linear or state-space layer's implicit attention (Mamba-2's SSD, the delta "
    "rule): entry (i, j) is how much of token j's input to the layer (for Mamba-2, dt x) reaches output i. Its "
    "entries may be negative and its rows need not sum to one, so they are not probabilities: such a head has no "
    "role share or entropy (\"implicit\" below), its grid is drawn on a diverging scale around zero, rollout and "
    "flow go through the softmax heads only, and the viewer shows each row's shares of its absolute entries, "
    "|a_ij| / sum_j |a_ij|.")


def _viewed(weights: torch.Tensor, implicit: torch.Tensor) -> torch.Tensor:
    """A layer's (H, L, S) weights as the viewer shows them: a head its layer lacks as zeros, an implicit head's rows
    as the shares of their absolute entries (:func:`.roles.magnitude_shares`)."""
    weights = weights.nan_to_num(0.0)
    return torch.where(implicit[:, None, None], magnitude_shares(weights), weights)


def _checked_layers(layers: Sequence[int] | None, count: int) -> list[int]:
    """The layers to draw, in order and once each: every one for None; else each of ``layers`` in [0, count)."""
    if layers is None:
        return list(range(count))
    wrong = [layer for layer in layers if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < count]
    if wrong or not layers:
        raise InputError(f"layers (--layers) must be layer numbers in [0, {count - 1}] of this {count}-layer model, "
                         f"got {list(layers)!r}")
    return sorted(set(layers))


def inspect_encoder(model, tokenizer, texts: Sequence[str] | None, out: str | Path, *, steps: int = 32,
                    top_k: int = 16, layers: Sequence[int] | None = None, progress: bool = False,
                    log: Callable[[str], None] | None = None, kind: str = "encoder") -> Path:
    """Inspect a BERT-style encoder (or a decoder's causal view: ``kind="decoder"``) on ``texts`` (the bundled
    :data:`SENTENCES` when None); returns report.md's path. ``layers``: the layers (from 0) whose head grids are
    drawn, ``heads-layer{n}.png`` (default every one, as BertViz's ``include_layers``: a 30-layer model's 30 grids
    take most of a report's time); the roles, overview, viewer and report cover every layer. Layers of several head
    counts (a hybrid's linear and softmax layers) are shown with the heads a layer lacks empty (NaN in the roles,
    blank in the pictures, zero in the viewer). Messages go to ``log`` (default: this module's logger at INFO)."""
    if kind not in ("encoder", "decoder"):
        raise ValueError(f"kind must be 'encoder' or 'decoder', got {kind!r}")
    log = log or logger.info
    from ..viz import AttentionView, plot_head_values, plot_heads, plot_heatmap, plot_overview, write_viewer

    out = Path(out)
    texts = list(texts) if texts else list(SENTENCES)
    started = time.perf_counter()
    attentions, tokens = encoder_attentions(model, tokenizer, texts)
    attentions = [_same_head_count(per_layer) for per_layer in attentions]
    drawn = _checked_layers(layers, len(attentions[0]))  # before anything is written
    roles = head_roles(attentions, tokens)
    plot_head_values({**{f"share: {r}": roles.shares[r] for r in ROLES}, "entropy (nats)": roles.entropy},
                     out / "roles.png", title=f"Head roles over {_count(len(texts), 'text')} ({roles.tokens} tokens)",
                     vmax={f"share: {r}": 1.0 for r in ROLES})
    implicit = torch.as_tensor(roles.implicit)  # (layers, H): a linear or state-space layer's heads
    first, first_tokens = attentions[0], tokens[0]
    plot_overview(first, out / "overview.png", title=f"All heads on: {texts[0][:80]}")
    for layer in drawn:
        weights = first[layer]
        signed = " (implicit attention: signed, rows need not sum to 1)" if implicit[layer].any() else ""
        plot_heads(weights, out / f"heads-layer{layer}.png", x_labels=first_tokens, y_labels=first_tokens,
                   title=f"layer {layer}{signed}: {texts[0][:80]}", per_head_scale=bool(signed))
    # Rollout and flow compose each layer's head-averaged distribution: through the softmax heads only.
    softmax_layers = [torch.where(implicit[l, :, None, None], math.nan, a) for l, a in enumerate(first)
                      if not implicit[l].all()]
    with_rollout = bool(softmax_layers)
    with_flow = with_rollout and len(first_tokens) <= MAX_FLOW_TOKENS
    if with_rollout:
        plot_heatmap(attention_rollout(softmax_layers), out / "rollout.png", x_labels=first_tokens,
                     y_labels=first_tokens, title="attention rollout", x_title="input token", y_title="output position")
    if with_flow:
        plot_heatmap(attention_flow(softmax_layers), out / "flow.png", x_labels=first_tokens, y_labels=first_tokens,
                     title="attention flow", x_title="input token", y_title="output position")
    views = [AttentionView(f"text {k + 1}: {t[:60]}", tok, [_viewed(a, implicit[l]) for l, a in enumerate(att)])
             for k, (t, tok, att) in enumerate(zip(texts, tokens, attentions))]
    seen_as = "encoder self-attention" if kind == "encoder" else "decoder self-attention (causal)"
    write_viewer(out / "viewer.html", views, title=f"attnkit inspect: {seen_as}", top_k=top_k)
    log(f"head roles, pictures and viewer written; attribution ({steps} integrated-gradient steps per text) ...")
    # One text has no other text to compare with: a bundled sentence that differs from it (its cosine with
    # itself is constant, a degenerate objective whose gradients are noise).
    partners = ([texts[(k + 1) % len(texts)] for k in range(len(texts))] if len(texts) > 1 else
                [next(s for s in SENTENCES if s.strip() != texts[0].strip())])
    examples = encoder_agreement(model, tokenizer, progress_bar(texts, progress=progress, desc="attribution", unit="text"), partners, steps=steps)

    lines = [f"# attnkit inspect: {kind}", "", f"{_count(len(texts), 'text')}, {roles.tokens} tokens, "
             f"{roles.shape[0]} layers x {roles.shape[1]} heads. Interactive view: [viewer.html](viewer.html).", "",
             "## Head roles (Clark et al. 2019)", "",
             "Mean share of each query token's attention on the previous / next token, itself, [CLS], [SEP] and "
             "punctuation, and the mean entropy. Heads above 50%:", "",
             ]
    found = {role: roles.heads(role) for role in ROLES}
    lines += markdown_table(["role", "heads (layer, head: share)"], (
        [role, ", ".join(f"L{l} H{h}: {s:.2f}" for l, h, s in found[role]) if found[role] else
         "none" + ("" if np.isnan(roles.shares[role]).all() else f" (largest {np.nanmax(roles.shares[role]):.2f})")]
        for role in ROLES))
    dominant = roles.dominant()
    if implicit.any():
        lines += ["", _IMPLICIT_NOTE.format(heads=_count(int(implicit.sum()), "head"), layers=", ".join(
            str(l) for l in range(len(implicit)) if implicit[l].any()))]
    lines += ["", "Dominant role and entropy (nats) per head:", ""]
    lines += markdown_table(["layer", *(f"H{h}" for h in range(roles.shape[1]))], (
        [l, *(dominant[l, h] if dominant[l, h] in ("implicit", "-") else f"{dominant[l, h]} {roles.entropy[l, h]:.2f}"
              for h in range(roles.shape[1]))]
        for l in range(roles.shape[0])))
    lines += ["", "![head roles](roles.png)", "", "## All heads on text 1", "", f"> {_md(texts[0])}", "",
              "![overview](overview.png)", ""]
    if with_rollout:
        lines += ["![rollout](rollout.png)", ""]
    if with_flow:
        lines += ["![flow](flow.png)", ""]
    lines += ["Per-layer head grids: " + ", ".join(f"[layer {l}](heads-layer{l}.png)" for l in drawn)
              + ("" if len(drawn) == len(first) else f" (of {len(first)} layers: --layers)"), ""]
    target = ("the next text's" if len(texts) > 1 else
              f"that of the bundled sentence \"{_md(partners[0])}\" (one text: its cosine with itself would be a "
              "constant, a degenerate objective)")
    section, rows = _agreement_section(
        examples, out, f"output: cosine similarity of the mean-pooled embedding to {target}")
    lines += section
    write_markdown(out / "report.md", lines)
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

    batch = collate([source.encode(text)], [target.encode(forced)]).to(next(model.parameters()).device)
    keys = source.tokens(text)
    pieces = target.tokens(forced)
    outputs, inputs = [*pieces, "</s>"], ["<s>", *pieces]
    model.eval()
    with torch.no_grad():
        if isinstance(model, Seq2Seq):
            weights = model(batch.source, batch.source_lengths, batch.target_in).weights[0].cpu()  # (T, S)
            return [AttentionView(f"text {number}: cross attention (rows: the token predicted)", outputs, weights[None, None],
                                  keys=keys)], weights, keys, outputs
        with record_attention(model) as records:
            model(batch.source, batch.source_lengths, batch.target_in)

    def stack(prefix: str, suffix: str) -> torch.Tensor:  # (layers, H, L, S) of the one sentence
        names = sorted((n for n in records if n.startswith(prefix) and n.endswith(suffix)), key=lambda n: int(n.split(".")[2]))
        return torch.stack([records[n][0][0] for n in names]).cpu()

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
    rows: list[dict] = []
    if isinstance(model, Seq2Seq):
        examples = seq2seq_agreement(model, source, target, progress_bar(pairs, progress=progress, desc="attribution", unit="text"), steps=steps)
        what = "output: log-probability of each " + ("reference" if references is not None else "output") + " token"
        section, rows = _agreement_section(examples, out, what)
        lines += section
    else:
        lines += ["Attribution agreement is computed for RNN seq2seq checkpoints only.", ""]
    write_markdown(out / "report.md", lines)
    write_json(out / "results.json", {"texts": list(texts), "outputs": [t.text for t in translations],
                                      "forced": forced, "agreement": rows})
    return out / "report.md"


def _same_head_count(per_layer: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-layer (H_l, L, L) weights as (H, L, L) with H the most heads a layer has, the heads a layer lacks NaN
    (a hybrid's linear layers may have other head counts than its softmax ones); as they are where all agree."""
    heads = max(a.shape[0] for a in per_layer)
    return [a if a.shape[0] == heads else torch.cat([a, a.new_full((heads - a.shape[0], *a.shape[1:]), math.nan)])
            for a in per_layer]


def inspect_encoder_decoder(runs: Sequence[dict], texts: Sequence[str], out: str | Path, *, source: str,
                            references: Sequence[str] | None = None, top_k: int = 16) -> Path:
    """Report on an encoder-decoder's attention from precomputed runs (one per text, as
    :func:`attnkit.inspect.hf_models.seq2seq_attentions` returns them: tokens, encoder self / decoder self / cross
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
    write_markdown(out / "report.md", lines)
    write_json(out / "results.json", {"texts": list(texts), "outputs": [r["output_text"] for r in runs],
                                      "forced": references is not None})
    return out / "report.md"


def _dev_verses(used: int, total: int) -> str:
    return f"{used} dev verses" if used == total else f"first {used} of the {total} dev verses (--dev-limit)"


def evaluate_alignment(checkpoints, out: str | Path, *, limit: int | None = None, dev_limit: int | None = None,
                       ibm_iterations: int = 5,
                       thresholds: Sequence[float] = (0.2, 0.3, 0.5), eflomal: bool = True,
                       attribution_steps: int = 0, progress: bool = False,
                       log: Callable[[str], None] | None = None) -> dict:
    """:func:`attnkit.inspect.aer.score_alignments` (its arguments and result), written to ``out``:
    ``alignment.md``, ``alignment.json`` and an example PNG (the first checkpoint's best reading)."""
    from ..viz import plot_heatmap

    out = Path(out)
    result, (pair, attention_matrix, gold_matrix) = score_alignments(
        checkpoints, limit=limit, dev_limit=dev_limit, ibm_iterations=ibm_iterations, thresholds=thresholds, eflomal=eflomal,
        attribution_steps=attribution_steps, progress=progress, log=log)
    for name, matrix in (("attention", attention_matrix), ("gold", gold_matrix)):
        plot_heatmap(matrix, out / f"alignment-{name}.png", x_labels=pair.source.split(), y_labels=pair.target.split(),
                     title=f"{name}: {pair.reference}", x_title="Greek (SBLGNT)", y_title="English (BSB)", cmap="Greys")
    scores, dev_aer, best, per_layer = result["scores"], result["dev_aer"], result["best_on_dev"], result["per_layer"]
    test_count, dev_count, corpus_count = result["verses"], result["dev_verses"], result["corpus_verses"]
    tried = sum(b["readings_tried"] for b in best)
    lines = ["# Alignment quality: attention vs eflomal, IBM Model 1 and the diagonal", "",
             f"{test_count} held-out verses (Mark, Philippians, 1 John) of the bundled SBLGNT -> BSB corpus, "
             f"{result['gold_links']:,} hand-made links (all treated as sure, so AER = 1 - F1). "
             "Every method links English words to Greek words; attention comes from each checkpoint forced "
             "to produce the reference English, pooled from subword pieces to words. "
             f"{tried} attention readings (layer, head or head average, shift-att or not, rule) were scored on "
             f"the {_dev_verses(dev_count, result.get('dev_verses_total', dev_count))}; each model's best is marked. eflomal and IBM Model 1 learn from the text of "
             f"all {corpus_count:,} verses, without gold links.", "",
             ]
    lines += markdown_table(["method", "precision", "recall", "AER (test)", "AER (dev)", "links"], (
        [name, f"{s['precision']:.3f}", f"{s['recall']:.3f}", f"{s['aer']:.3f}",
         f"{dev_aer[name]:.3f}" if name in dev_aer else "-", f"{s['predicted']:,}"]
        for name, s in sorted(scores.items(), key=lambda item: item[1]["aer"])))
    rule = f"weight >= {thresholds[0]}"
    lines += ["", "Head average per decoder layer (AER):", ""]
    lines += markdown_table(["model", "layer", "row", "dev, argmax", "test, argmax", f"dev, {rule}", f"test, {rule}"], (
        [row["model"], row["layer"], "reads the word (shift-att)" if row["shift"] else "predicts the word",
         f"{row['argmax']['dev']:.3f}", f"{row['argmax']['test']:.3f}", f"{row[rule]['dev']:.3f}",
         f"{row[rule]['test']:.3f}"] for row in per_layer))
    lines += ["", f"Example, {pair.reference}: attention of {best[0]['model']}'s best reading on dev (left) and gold "
              "links (right).", "", "![attention](alignment-attention.png) ![gold](alignment-gold.png)", ""]
    out.mkdir(parents=True, exist_ok=True)
    write_markdown(out / "alignment.md", lines)
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
    margins = coreference_picks(model, tokenizer, list(progress_bar(items, progress=progress, desc="coreference", unit="sentence")))
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
             ]
    ranked = sorted(result["per_head"], key=lambda s: -s["accuracy"])
    lines += markdown_table(["head", "correct", "accuracy", "95% interval", "p (vs 50%)"], (
        [f"L{s['layer']} H{s['head']}", f"{s['correct']}/{s['total']}", f"{s['accuracy']:.1%}",
         f"{s['low']:.1%}-{s['high']:.1%}", f"{s['p_value']:.3f}"] for s in ranked[:10]))
    lines += ["", f"Best head in sample: L{best['layer']} H{best['head']}, {best['accuracy']:.1%} (chosen and scored "
              "on the same sentences, so optimistic).", "", "Chosen on one half of the pairs, scored on the other:", ""]
    lines += markdown_table(
        ["chosen on", "head", "accuracy where chosen", "held-out accuracy", "95% interval", "p (vs 50%)"],
        ([h["chosen_on"], f"L{h['layer']} H{h['head']}", f"{h['chosen_accuracy']:.1%}",
          f"{h['correct']}/{h['total']} = {h['accuracy']:.1%}", f"{h['low']:.1%}-{h['high']:.1%}", f"{h['p_value']:.3f}"]
         for h in result["held_out"]))
    lines += ["", "![accuracy per head](coref.png)", ""]
    out.mkdir(parents=True, exist_ok=True)
    write_markdown(out / "coref.md", lines)
    write_json(out / "coref.json", result)
    return result
