"""The bundled corpus, users' pair files, the generated task, tokenisers and batching."""

from __future__ import annotations

import gzip

import pytest
import torch

from attnkit.data import BatchSampler, Tokenizer, bible_corpus, collate, number_phrases, read_pairs
from attnkit.data.tokenizer import BOS, EOS, PAD, SPECIALS, UNK


def test_bible_splits_have_the_documented_sizes_and_no_book_in_two_splits():
    splits = {name: bible_corpus(name) for name in ("train", "valid", "test")}
    assert {k: len(v) for k, v in splits.items()} == {"train": 14561, "valid": 369, "test": 706}
    books = {name: {p.reference.split(":")[0] for p in pairs} for name, pairs in splits.items()}
    assert not books["train"] & books["valid"] and not books["train"] & books["test"] and not books["valid"] & books["test"]
    assert splits["train"][0].source == "In the beginning God created the heaven and the earth."
    assert splits["train"][0].target == "Au commencement, Dieu créa les cieux et la terre."
    for pair in splits["test"]:
        assert len(pair.source.split()) <= 25 and len(pair.target.split()) <= 25
        assert "[" not in pair.target and "  " not in pair.source and "\t" not in pair.target


def test_long_splits_hold_the_long_verses_of_the_held_out_books_only():
    short = {name: bible_corpus(name) for name in ("valid", "test")}
    for name, count in (("valid-long", 443), ("test-long", 455)):
        pairs = bible_corpus(name)
        assert len(pairs) == count
        base = name.removesuffix("-long")
        assert {p.reference.split(":")[0] for p in pairs} <= {p.reference.split(":")[0] for p in short[base]}
        assert not {p.reference for p in pairs} & {p.reference for p in short[base]}
        for pair in pairs:
            words = max(len(pair.source.split()), len(pair.target.split()))
            assert 26 <= words <= 80, pair.reference
    from attnkit.data import aligned_corpus

    with pytest.raises(ValueError, match="split must be one of"):
        aligned_corpus("test-long")


def test_train_long_holds_the_training_books_verses_of_26_to_50_words():
    """Figure 2's "-50" models train on train + train-long; no held-out book leaks into it."""
    train, long = bible_corpus("train"), bible_corpus("train-long")
    assert len(long) == 12_322
    held_out = {p.reference.split(":")[0] for name in ("valid", "test") for p in bible_corpus(name)}
    assert not {p.reference.split(":")[0] for p in long} & held_out
    assert not {p.reference for p in long} & {p.reference for p in train}
    lengths = [max(len(p.source.split()), len(p.target.split())) for p in long]
    assert min(lengths) == 26 and max(lengths) == 50  # only the Bible corpus has long splits


def test_bible_direction_swaps_sides():
    en_fr, fr_en = bible_corpus("valid"), bible_corpus("valid", direction="fr-en")
    assert [(p.target, p.source) for p in en_fr] == [(p.source, p.target) for p in fr_en]
    with pytest.raises(ValueError, match="split must be one of"):
        bible_corpus("dev")


def test_read_pairs_reads_plain_and_gzipped_files(tmp_path):
    text = "the cat\tle chat\n\nthe dog \t le chien\n"
    (tmp_path / "pairs.tsv").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "pairs.tsv.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    for name in ("pairs.tsv", "pairs.tsv.gz"):
        pairs = read_pairs(tmp_path / name)
        assert [(p.source, p.target) for p in pairs] == [("the cat", "le chat"), ("the dog", "le chien")]


@pytest.mark.parametrize(
    "line, message",
    [("no tab here", "expected 'source<TAB>target' .* got 1"), ("a\tb\tc", "expected .* got 3"), ("a\t  ", "empty target")],
)
def test_read_pairs_names_file_and_line_of_a_malformed_line(tmp_path, line, message):
    path = tmp_path / "bad.tsv"
    path.write_text(f"good\tbon\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"bad.tsv:2: {message}"):
        read_pairs(path)


def test_number_phrases_alignment_links_translate_word_for_word():
    lexicon = {"red": "rouges", "cats": "chats", "and": "et", "three": "trois", "twelve": "douze"}
    pairs = number_phrases(300, seed=3)
    assert len({p.source for p in pairs}) > 200
    for pair in pairs:
        source, target = pair.source.split(), pair.target.split()
        assert sorted(t for _, t in pair.alignment) == list(range(len(target)))  # one link per target word
        for s, t in pair.alignment:
            if source[s] in lexicon:
                assert target[t] == lexicon[source[s]]
    assert number_phrases(5, seed=1) == number_phrases(5, seed=1)


@pytest.mark.parametrize("kind", ["bpe", "word"])
def test_tokenizer_round_trips_text_and_keeps_special_ids(tmp_path, kind):
    texts = [p.target for p in bible_corpus("valid")]
    tokenizer = Tokenizer.train(texts, kind=kind, vocab_size=3000)
    assert [tokenizer.id_to_token(i) for i in range(4)] == list(SPECIALS)
    for text in texts[:100]:
        ids = tokenizer.encode(text, bos=True, eos=True)
        assert ids[0] == BOS and ids[-1] == EOS
        if kind == "bpe" or UNK not in ids:
            assert tokenizer.decode(ids[1:] + [PAD]) == text  # decode stops at <eos>, drops <bos>/<pad>
    tokenizer.save(tmp_path / "tok.json")
    again = Tokenizer.load(tmp_path / "tok.json")
    assert again.encode(texts[0]) == tokenizer.encode(texts[0])
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        Tokenizer.load(tmp_path / "broken.json")


def test_collate_pads_and_shifts_targets():
    batch = collate([[5, 6, 7], [8]], [[9], [10, 11]])
    assert batch.source.tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert batch.source_lengths.tolist() == [3, 1]
    assert batch.source_mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.target_in.tolist() == [[BOS, 9, PAD], [BOS, 10, 11]]
    assert batch.target_out.tolist() == [[9, EOS, PAD], [10, 11, EOS]]
    assert batch.target_tokens == 5
    with pytest.raises(ValueError, match="at least one token"):
        collate([[1], []])


def test_batch_sampler_is_seeded_bucketed_and_shards_each_global_batch():
    generator = torch.Generator().manual_seed(0)
    lengths = [(int(a), int(b)) for a, b in torch.randint(1, 40, (203, 2), generator=generator)]
    sampler = BatchSampler(lengths, 16, seed=7)
    epoch0 = sampler.epoch(0)
    assert sorted(i for b in epoch0 for i in b) == list(range(203))
    assert epoch0 == BatchSampler(lengths, 16, seed=7).epoch(0)
    assert epoch0 != sampler.epoch(1)
    spread = sum(max(lengths[i] for i in b)[0] - min(lengths[i] for i in b)[0] for b in epoch0) / len(epoch0)
    assert spread <= 4  # bucketing: similar source lengths share a batch
    shards = [sampler.epoch(0, rank=r, world_size=2) for r in range(2)]
    for whole, first, second in zip(epoch0, *shards):
        assert sorted(first + second) == sorted(whole)


def test_the_tokenisers_pad_id_is_the_models():
    from attnkit.data.tokenizer import PAD
    from attnkit.models.config import PAD_ID

    assert PAD == PAD_ID


def test_a_pairs_file_with_a_byte_order_mark(tmp_path):
    from attnkit.data import read_pairs

    path = tmp_path / "bom.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\ufeffhello\tbonjour\n")
    assert read_pairs(path)[0].source == "hello"
