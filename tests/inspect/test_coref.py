"""Coreference per head on Winograd-style pairs: constructed encoders whose right answer is known
(an oracle head, a head blind to the changed word that must score exactly 50%), the binomial statistics against
SciPy, held-out head choice, the bundled pairs' integrity, and the CLI on MiniLM."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from tokenizers import Tokenizer, models, pre_tokenizers

from attnkit.data import winograd_pairs
from attnkit.inspect.coref import _pieces_of, coreference_picks, coreference_scores


@pytest.fixture(scope="module")
def word_tokenizer():
    items = winograd_pairs()
    words = sorted({w for item in items for w in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(item.sentence)
                    for w in [w[0].lower()]})
    tokenizer = Tokenizer(models.WordLevel({w: k for k, w in enumerate(words)}, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


class FakeEncoder:
    """Two layers x two heads: head 0 of layer 1 sends the pronoun to the antecedent of the next
    item (an oracle); every other head is blind to meaning, attending in proportion to position."""

    def __init__(self, tokenizer, items):
        self.tokenizer, self.items = tokenizer, list(items)

    def eval(self):
        return self

    def parameters(self):  # the inputs follow the model's device: this one's is the CPU
        return iter([torch.zeros(0)])

    def __call__(self, ids, mask, type_ids, need_weights):
        item = self.items.pop(0)
        L = ids.shape[1]
        by_position = torch.arange(1.0, L + 1).expand(1, 2, L, L)
        blind = by_position / by_position.sum(-1, keepdim=True)
        oracle = blind.clone()
        encoding = self.tokenizer.encode(item.sentence)
        pronoun = _pieces_of(item.pronoun, item.sentence, encoding.offsets)
        antecedent = _pieces_of(item.antecedent, item.sentence, encoding.offsets)
        oracle[0, 0, pronoun] = 0.0
        oracle[0, 0, pronoun, antecedent[0]] = 1.0
        return SimpleNamespace(attentions=[blind, oracle])


def test_oracle_head_is_always_right_and_a_blind_head_exactly_at_chance(word_tokenizer):
    items = winograd_pairs()
    margins = coreference_picks(FakeEncoder(word_tokenizer, items), word_tokenizer, items)
    assert margins.shape == (128, 2, 2)
    accuracy = (margins > 0).mean(0)
    assert accuracy[1, 0] == 1.0
    # A head blind to the changed word gives both sentences of a pair the same margin sign (same
    # candidates): one right, one wrong, 50% exactly; the paired design makes blindness score chance.
    for layer, head in [(0, 0), (0, 1), (1, 1)]:
        assert accuracy[layer, head] == 0.5
    result = coreference_scores(margins, items)
    assert result["best_in_sample"]["layer"] == 1 and result["best_in_sample"]["head"] == 0
    assert all(h["layer"] == 1 and h["head"] == 0 and h["accuracy"] == 1.0 and h["total"] == 64
               for h in result["held_out"])


def test_scores_match_scipy_and_choose_on_the_other_half():
    rng = np.random.default_rng(0)
    items = [SimpleNamespace(pair=k // 2 + 1) for k in range(40)]
    margins = rng.normal(size=(40, 2, 3))
    margins[[k for k in range(40) if items[k].pair % 2 == 1], 0, 2] = 1.0  # head (0, 2) right on odd pairs only
    result = coreference_scores(margins, items)
    for s in result["per_head"]:
        correct = int((margins[:, s["layer"], s["head"]] > 0).sum())
        test = binomtest(correct, 40, 0.5)
        assert s["correct"] == correct and s["p_value"] == pytest.approx(test.pvalue)
        assert (s["low"], s["high"]) == pytest.approx(tuple(test.proportion_ci(0.95)))
    chosen_on_odd = result["held_out"][0]
    assert (chosen_on_odd["layer"], chosen_on_odd["head"], chosen_on_odd["chosen_accuracy"]) == (0, 2, 1.0)
    even = [k for k in range(40) if items[k].pair % 2 == 0]
    assert chosen_on_odd["accuracy"] == pytest.approx((margins[even, 0, 2] > 0).mean())
    with pytest.raises(ValueError, match="margins must be"):
        coreference_scores(margins[:3], items)


def test_bundled_pairs_flip_the_antecedent_with_one_word():
    items = winograd_pairs()
    assert len(items) == 128 and len({i.pair for i in items}) == 64
    for a, b in zip(items[::2], items[1::2]):
        assert a.pair == b.pair and (a.antecedent, a.other) == (b.other, b.antecedent) and a.pronoun == b.pronoun
        wa, wb = a.sentence.split(), b.sentence.split()
        assert len(wa) == len(wb) and sum(x != y for x, y in zip(wa, wb)) == 1, a.sentence


def test_pieces_of_names_a_missing_or_repeated_word():
    offsets = [(0, 3), (4, 7), (8, 11)]
    assert _pieces_of("cat", "the cat sat", offsets) == [1]
    with pytest.raises(ValueError, match="exactly once"):
        _pieces_of("dog", "the cat sat", offsets)


@pytest.mark.slow
def test_inspect_coref_on_minilm_writes_the_report(tmp_path, capsys):
    from attnkit.cli import main

    assert main(["inspect", "--model", "minilm", "--coref", "--out", str(tmp_path), "--quiet"]) == 0
    assert "coreference report" in capsys.readouterr().out
    result = json.loads((tmp_path / "coref.json").read_text())
    assert len(result["per_head"]) == 6 * 12 and len(result["held_out"]) == 2
    assert (tmp_path / "coref.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| chosen on |" in (tmp_path / "coref.md").read_text()


def test_word_pieces_are_found_when_byte_level_pieces_carry_the_space_before_them():
    from attnkit.inspect.coref import _pieces_of

    sentence = "The cat sat because it was tired"
    # GPT-2/Llama byte-level BPE: " cat" is one piece whose offsets include the space
    offsets = [(0, 3), (3, 7), (7, 11), (11, 19), (19, 22), (22, 26), (26, 29), (29, 32)]  # " tired" split in two
    assert _pieces_of("it", sentence, offsets) == [4]
    assert _pieces_of("cat", sentence, offsets) == [1]
    assert _pieces_of("tired", sentence, offsets) == [6, 7]
    with pytest.raises(ValueError, match="no token of"):  # a piece that spills over the word does not count
        _pieces_of("it", sentence, [(0, 3), (3, 22), (22, 32)])
