"""Data: the bundled parallel corpus, user pair files, generated tasks, tokenisers, batching."""

from .batching import Batch, BatchSampler, collate
from .corpus import CorefItem, Pair, aligned_corpus, bible_corpus, read_pairs, read_texts, winograd_pairs
from .synthetic import number_phrases
from .tokenizer import Tokenizer

__all__ = [
    "Pair",
    "CorefItem",
    "winograd_pairs",
    "bible_corpus",
    "aligned_corpus",
    "read_pairs",
    "read_texts",
    "number_phrases",
    "Tokenizer",
    "Batch",
    "BatchSampler",
    "collate",
]
