"""attnkit inspect on Hugging Face folders, through attn_implementation="attnkit": the real MiniLM
gives the same attention as attnkit's native loader, and tiny saved folders of an encoder and a
decoder get the full report; an encoder-decoder folder is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.cli import main  # noqa: E402
from attnkit.inspect.roles import SENTENCES, encoder_attentions  # noqa: E402

from hybrid_checks import tiny_config  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "."]


def _tokenizer_json(folder, *, bert: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if bert:
        tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                                 special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.save(str(folder / "tokenizer.json"))


@pytest.mark.requires("minilm")
def test_minilm_through_transformers_equals_the_native_path():
    from attnkit.inspect.hf_models import load_for_inspection
    from attnkit.models.pretrained import load_minilm, minilm_folder

    native, tokenizer = load_minilm()
    bridged, bridged_tokenizer, kind = load_for_inspection(minilm_folder())
    assert kind == "encoder"
    texts = SENTENCES[:4]
    expected, tokens = encoder_attentions(native, tokenizer, texts)
    got, bridged_tokens = encoder_attentions(bridged, bridged_tokenizer, texts)
    assert tokens == bridged_tokens
    for a_layers, b_layers in zip(expected, got):
        for a, b in zip(a_layers, b_layers):
            assert (a - b).abs().max() <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_inspect_cli_on_a_saved_folder(tmp_path, family, capsys):
    folder = tmp_path / family
    if family == "bert":
        config = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
        transformers.BertModel(config).save_pretrained(folder)
    else:
        config = transformers.LlamaConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=37)
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
    _tokenizer_json(folder, bert=family == "bert")
    out = tmp_path / "report"
    assert main(["inspect", "--model", str(folder), "--out", str(out), "--steps", "2", "--quiet",
                 "the cat sat on the mat .", "a dog ran ."]) == 0
    printed = capsys.readouterr().out
    assert ("encoder" if family == "bert" else "decoder") in printed
    assert (out / "report.md").is_file() and (out / "viewer.html").is_file() and (out / "roles.png").is_file()
    results = json.loads((out / "results.json").read_text())
    assert len(results["texts"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("forced", [False, True])
def test_inspect_cli_on_an_encoder_decoder_folder(tmp_path, forced, capsys):
    from attnkit.inspect.hf_models import load_for_inspection, seq2seq_attentions

    folder = tmp_path / "bart"
    config = transformers.BartConfig(vocab_size=len(WORDS), d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                                     decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=0, bos_token_id=2,
                                     eos_token_id=3, decoder_start_token_id=3, forced_bos_token_id=None)
    eager = transformers.BartForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    eager.save_pretrained(folder)
    _tokenizer_json(folder, bert=False)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("the cat sat .\ta dog ran .\n" if forced else "the cat sat .\n")
    out = tmp_path / "report"
    assert main(["inspect", "--model", str(folder), "--file", str(pairs), "--out", str(out), "--quiet"]) == 0
    assert "encoder-decoder" in capsys.readouterr().out
    assert (out / "report.md").is_file() and (out / "viewer.html").is_file() and (out / "alignment-1.png").is_file()
    # The captured attention equals eager's on the same forced target.
    model, tokenizer, _ = load_for_inspection(folder)
    run = seq2seq_attentions(model, tokenizer, "the cat sat .", "a dog ran .")
    target = tokenizer.encode("a dog ran .").ids
    with torch.no_grad():
        expected = eager(input_ids=torch.tensor([tokenizer.encode("the cat sat .").ids]),
                         decoder_input_ids=torch.tensor([[3, *target[:-1]]]), output_attentions=True)
    assert (run["cross"] - torch.stack([a[0] for a in expected.cross_attentions])).abs().max() <= 1e-5
    assert (run["encoder"] - torch.stack([a[0] for a in expected.encoder_attentions])).abs().max() <= 1e-5


def test_a_whisper_folder_is_refused_by_name(tmp_path, capsys):
    folder = tmp_path / "whisper"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper", "is_encoder_decoder": True}))
    (folder / "tokenizer.json").write_text("{}")
    assert main(["inspect", "--model", str(folder), "one text"]) == 2
    assert "audio" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.requires("smollm2")
def test_smollm2_through_transformers_gives_the_native_attention(smollm2_model):
    from attnkit.inspect.hf_models import load_gguf_for_inspection
    from attnkit.models.pretrained import smollm2_gguf

    bridged, tokenizer, kind = load_gguf_for_inspection(smollm2_gguf())
    native, native_tokenizer = smollm2_model
    ids = torch.tensor([native_tokenizer.encode("The history of attention in neural networks").ids])
    assert tokenizer.encode("The history of attention in neural networks").ids == ids[0].tolist()
    with torch.no_grad():
        expected = native(ids, need_weights=True).attentions
        got = bridged(ids, torch.ones_like(ids), need_weights=True).attentions
    assert kind == "decoder" and len(got) == len(expected) == 30
    assert max((a - b).abs().max().item() for a, b in zip(expected, got)) <= 1e-4


@pytest.fixture(scope="module")
def smollm2_model():
    from attnkit.models.pretrained import load_gguf, smollm2_gguf

    model, tokenizer, _ = load_gguf(smollm2_gguf())
    return model, tokenizer


@pytest.mark.slow
@pytest.mark.requires("smollm2")
def test_inspect_cli_on_smollm2(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["inspect", "--model", "smollm2", "--out", str(out), "--steps", "2", "--quiet", "--layers", "29,0",
                 "The trophy did not fit in the suitcase because it was too big."]) == 0
    assert "decoder" in capsys.readouterr().out
    assert (out / "report.md").is_file() and (out / "viewer.html").is_file()
    # --layers: the grids of the first and last layer only (30 grids were most of the report's time); the
    # report links those two and says of how many
    assert sorted(p.name for p in out.glob("heads-layer*.png")) == ["heads-layer0.png", "heads-layer29.png"]
    assert "[layer 0](heads-layer0.png), [layer 29](heads-layer29.png) (of 30 layers: --layers)" in (out / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.requires("minilm")
def test_coreference_through_transformers_equals_the_native_minilm(tmp_path, capsys):
    from attnkit.models.pretrained import minilm_folder

    assert main(["inspect", "--model", "minilm", "--coref", "--out", str(tmp_path / "native"), "--quiet"]) == 0
    assert main(["inspect", "--model", str(minilm_folder()), "--coref", "--out", str(tmp_path / "bridged"),
                 "--quiet"]) == 0
    native = json.loads((tmp_path / "native" / "coref.json").read_text())
    bridged = json.loads((tmp_path / "bridged" / "coref.json").read_text())
    assert native["items"] == bridged["items"] == 128
    assert native["best_in_sample"] == bridged["best_in_sample"]
    assert native["mean_head_accuracy"] == pytest.approx(bridged["mean_head_accuracy"])
    assert (tmp_path / "bridged" / "coref.png").read_bytes()[:4] == b"\x89PNG"


def test_coreference_on_a_gguf_decoder_is_refused_before_its_load(tmp_path, monkeypatch, capsys):
    from attnkit.inspect import hf_models

    def load(path):
        raise AssertionError(f"loaded {path} only to refuse it")

    monkeypatch.setattr(hf_models, "load_gguf_for_inspection", load)
    model = tmp_path / "decoder.gguf"
    model.write_bytes(b"GGUF")
    assert main(["inspect", "--model", str(model), "--coref", "--quiet"]) == 2
    assert "the word that decides the referent comes after the pronoun" in capsys.readouterr().err


def test_an_unreadable_gguf_file_is_named_and_gguf_is_itself_again(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader
    model = tmp_path / "broken.gguf"
    model.write_bytes(b"GGUF" + bytes(20))
    assert main(["inspect", "--model", str(model), "a text"]) == 2
    assert f"{model}: not a readable GGUF file" in capsys.readouterr().err
    assert gguf.GGUFReader is reader


def test_coreference_on_a_decoder_folder_is_refused_with_the_reason(tmp_path, capsys):
    folder = tmp_path / "llama"
    config = transformers.LlamaConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=37)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    _tokenizer_json(folder, bert=False)
    assert main(["inspect", "--model", str(folder), "--coref", "--quiet"]) == 2
    assert "the word that decides the referent comes after the pronoun" in capsys.readouterr().err


def test_a_gguf_file_is_parsed_once_within_a_load_and_gguf_is_itself_again_after(tmp_path):
    gguf = pytest.importorskip("gguf")
    from attnkit.inspect.hf_models import _gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="inside"), _gguf_parsed_once(), _gguf_parsed_once():  # nested: the same
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is first and gguf.GGUFReader(str(path), "r") is first
        assert first.tensors[0].name == "token_embd.weight" and first.tensors[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        raise RuntimeError("inside")  # an error in the block leaves gguf as it was too
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(str(path)) is not first


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear", "granitemoehybrid", "mamba2", "nemotron_h",
                                    "falcon_h1"])
def test_inspect_cli_on_a_hybrid_folder_reads_every_layer(tmp_path, family, capsys):
    """A hybrid folder is inspected through attnkit's own model: every layer is recorded (a linear layer's implicit
    attention beside a softmax layer's weights, 4 layers numbered as the model numbers them, of several head counts
    for Kimi Linear; Mamba-2's and Falcon-H1's 3; the 3 of Nemotron-H's 5 that mix tokens), the report says it is a
    decoder's, and the linear heads are read as implicit attention, not probabilities."""
    from attnkit.inspect.hf_models import InspectedDecoder, load_for_inspection

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, vocab_size=len(WORDS)),
                                                          attn_implementation="eager")
    model.save_pretrained(tmp_path)
    _tokenizer_json(tmp_path, bert=False)
    inspected, tokenizer, kind = load_for_inspection(tmp_path)
    assert isinstance(inspected, InspectedDecoder) and kind == "decoder"
    (attentions,), _ = encoder_attentions(inspected, tokenizer, ["the cat sat on the mat"])
    layers = {"mamba2": 3, "nemotron_h": 3, "falcon_h1": 3}.get(family, 4)
    assert len(attentions) == layers
    for layer, weights in enumerate(attentions):
        assert weights.shape[-2:] == (6, 6) and (weights.triu(1) == 0).all(), layer  # causal, linear or softmax
    out = tmp_path / "report"
    assert main(["inspect", "--model", str(tmp_path), "--out", str(out), "--steps", "2", "--quiet",
                 "the cat sat on the mat", "a dog ran ."]) == 0
    text = (out / "report.md").read_text()
    assert text.startswith("# attnkit inspect: decoder") and f"{layers} layers" in text
    assert all((out / f"heads-layer{layer}.png").is_file() for layer in range(layers))
    assert "through attnkit's own model" in capsys.readouterr().out
    # a linear layer's heads are implicit attention, not probabilities: no role share or entropy, and the report
    # says what their numbers mean; every entropy and share given is a distribution's
    roles = json.loads((out / "results.json").read_text())["roles"]
    implicit = [row for row in roles if row["role"] == "implicit"]
    assert implicit and all(row["entropy"] is None and row["previous"] is None for row in implicit)
    defined = [row for row in roles if row["entropy"] is not None]
    assert all(row["entropy"] >= 0 and 0 <= row["self"] <= 1 + 1e-6 for row in defined)
    assert "are a linear or state-space layer's implicit attention" in text
