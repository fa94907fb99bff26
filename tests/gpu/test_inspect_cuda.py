"""``attnkit inspect`` on CUDA (marker ``gpu``): every piece that runs a model (encoder attentions,
coreference margins, attribution agreement, forced cross attention, attribution alignments) gives
on a CUDA copy of a model what it gives on the CPU copy with the same weights, and hands its
results back on the CPU; the command runs end to end with ``--device cuda``."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as WordTokenizer
from tokenizers import models as tokenizer_models
from tokenizers import pre_tokenizers

from attnkit.cli import main
from attnkit.data import Pair, Tokenizer
from attnkit.data.corpus import winograd_pairs
from attnkit.inspect.agreement import encoder_agreement, seq2seq_agreement
from attnkit.inspect.alignment import attribution_word_weights, cross_attention_pieces
from attnkit.inspect.coref import coreference_picks
from attnkit.inspect.roles import encoder_attentions
from attnkit.models import (
    EncoderConfig,
    EncoderModel,
    Seq2Seq,
    Seq2SeqConfig,
    TransformerConfig,
    TransformerEncoderDecoder,
)

SENTENCES = ["the cat sat on the mat .", "a dog ran to the park ."]
PARTNERS = ["a dog ran to the park .", "the cat sat on the mat ."]
PAIRS = [Pair("le chat noir dort", "the black cat sleeps"), Pair("un chien court", "a dog runs")]


def _encoder_and_tokenizer():
    words = sorted({w.lower() for text in SENTENCES + [item.sentence for item in winograd_pairs()]
                    for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(text)})
    tokenizer = WordTokenizer(tokenizer_models.WordLevel({w: k for k, w in enumerate(words)}, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=len(words), d_model=64, num_layers=2, num_heads=4, d_ff=96,
                                       max_len=64, dropout=0.0)).eval()
    return model, copy.deepcopy(model).cuda(), tokenizer


def _seq2seq_models():
    source = Tokenizer.train([p.source for p in PAIRS], kind="word", vocab_size=20, min_frequency=1)
    target = Tokenizer.train([p.target for p in PAIRS], kind="word", vocab_size=20, min_frequency=1)
    torch.manual_seed(0)
    rnn = Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, embedding_dim=16, hidden_size=16,
                                attention="bahdanau", dropout=0.0)).eval()
    transformer = TransformerEncoderDecoder(TransformerConfig(source.vocab_size, target.vocab_size, d_model=32,
                                                              num_heads=4, d_ff=48, encoder_layers=2,
                                                              decoder_layers=2, dropout=0.0)).eval()
    return [(m, copy.deepcopy(m).cuda()) for m in (rnn, transformer)], source, target


def _on_cpu(value):
    assert value.device.type == "cpu", f"a result left on {value.device}"
    return value


def test_encoder_attentions_coreference_and_agreement_follow_the_model_to_cuda():
    cpu, gpu, tokenizer = _encoder_and_tokenizer()
    (want,), _ = encoder_attentions(cpu, tokenizer, SENTENCES[:1])
    (got,), _ = encoder_attentions(gpu, tokenizer, SENTENCES[:1])
    for a, b in zip(got, want):
        torch.testing.assert_close(_on_cpu(a), b, atol=1e-5, rtol=1e-4)
    items = winograd_pairs()[:6]
    np.testing.assert_allclose(coreference_picks(gpu, tokenizer, items), coreference_picks(cpu, tokenizer, items),
                               atol=1e-5)
    want = encoder_agreement(cpu, tokenizer, SENTENCES, PARTNERS, steps=8, shapley_samples=2)
    got = encoder_agreement(gpu, tokenizer, SENTENCES, PARTNERS, steps=8, shapley_samples=2)
    for a, b in zip(got, want):
        for name in b.attribution:
            np.testing.assert_allclose(a.attribution[name], b.attribution[name], atol=1e-4, rtol=1e-3)


def test_seq2seq_alignments_and_attribution_follow_the_model_to_cuda():
    models, source, target = _seq2seq_models()
    for cpu, gpu in models:
        for a, b in zip(cross_attention_pieces(gpu, source, target, PAIRS),
                        cross_attention_pieces(cpu, source, target, PAIRS)):
            np.testing.assert_allclose(a, b, atol=1e-5)
        for a, b in zip(attribution_word_weights(gpu, source, target, PAIRS, steps=4),
                        attribution_word_weights(cpu, source, target, PAIRS, steps=4)):
            np.testing.assert_allclose(a, b, atol=1e-4)
    cpu, gpu = models[0]
    for a, b in zip(seq2seq_agreement(gpu, source, target, PAIRS, steps=4),
                    seq2seq_agreement(cpu, source, target, PAIRS, steps=4)):
        np.testing.assert_allclose(a.attention["attention"], b.attention["attention"], atol=1e-5)
        np.testing.assert_allclose(a.attribution["integrated-gradients"], b.attribution["integrated-gradients"],
                                   atol=1e-4, rtol=1e-3)


def test_inspect_command_on_cuda_writes_the_same_report(tmp_path):
    """A translation checkpoint trained on the CPU, inspected with --device cuda and on the CPU:
    the same alignment weights in the viewer (to float32 rounding), the same AER table."""
    run = tmp_path / "run"
    assert main(["train", "--data", "grc-en", "--out", str(run), "--max-steps", "2", "--epochs", "1",
                 "--embedding-dim", "8", "--hidden-size", "16", "--vocab-size", "300", "--quiet"]) == 0
    results = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        assert main(["inspect", "--model", str(run), "--out", str(out), "--steps", "2", "--beam", "1", "--aer",
                     "--limit", "4", "--no-eflomal", "--device", device, "--quiet",
                     "Ἐν ἀρχῇ ἦν ὁ λόγος"]) == 0
        results[device] = json.loads((out / "alignment.json").read_text())
    for name, scores in results["cpu"]["scores"].items():
        assert results["cuda"]["scores"][name]["aer"] == pytest.approx(scores["aer"], abs=0.02), name
