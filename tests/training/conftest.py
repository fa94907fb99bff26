"""A tiny generated translation task shared by the training tests."""

from __future__ import annotations

import pytest

from attnkit.data import Tokenizer, number_phrases


@pytest.fixture(scope="session")
def phrases():
    """(train, valid, test) pairs and word-level (source, target) tokenisers of the number-phrase task."""
    pairs = number_phrases(2200, seed=0)
    train, valid, test = pairs[:1800], pairs[1800:2000], pairs[2000:]
    source = Tokenizer.train([p.source for p in train], kind="word", vocab_size=100, min_frequency=1)
    target = Tokenizer.train([p.target for p in train], kind="word", vocab_size=100, min_frequency=1)
    return train, valid, test, source, target


@pytest.fixture(scope="session")
def phrase_file(tmp_path_factory, phrases):
    """The training pairs as a user's source<TAB>target file."""
    path = tmp_path_factory.mktemp("data") / "phrases.tsv"
    path.write_text("".join(f"{p.source}\t{p.target}\n" for p in phrases[0]), encoding="utf-8")
    return path
