"""``attnkit inspect`` end to end: MiniLM with the report, viewer and pictures; a translation
checkpoint trained on the bundled Greek -> English corpus, with --aer; Hugging Face folders; clear errors."""

from __future__ import annotations

import json
import shutil

import pytest

from attnkit.cli import main

from cli_helpers import PNG, assert_probe, broken_hf_folder, fill, hf_folder, probe_ids, refused, run_cli


@pytest.fixture(scope="module")
def greek_checkpoint(tmp_path_factory):
    run = tmp_path_factory.mktemp("grc") / "run"
    assert main(["train", "--data", "grc-en", "--out", str(run), "--max-steps", "2", "--epochs", "1",
                 "--embedding-dim", "8", "--hidden-size", "16", "--vocab-size", "300", "--quiet"]) == 0
    return run


@pytest.fixture(scope="module")
def phrase_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tf")
    data = folder / "pairs.tsv"
    data.write_text("three red cats\ttrois chats rouges\ntwo red dogs\tdeux chiens rouges\n" * 20, encoding="utf-8")
    assert main(["train", "--data", str(data), "--out", str(folder / "run"), "--arch", "transformer", "--max-steps", "1",
                 "--epochs", "1", "--tokenizer", "word", "--vocab-size", "50", "--quiet"]) == 0
    return folder / "run"



@pytest.mark.slow
def test_inspect_minilm_writes_report_viewer_and_pictures(tmp_path, capsys):
    out = tmp_path / "minilm"
    text = "The trophy didn't fit in the <b>suitcase</b>."
    assert main(["inspect", "--model", "minilm", "--out", str(out), "--steps", "2", "--quiet", text]) == 0
    assert "report:" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert "| previous | L0 H2: 1.00 |" in report  # MiniLM's previous-token head, even on one sentence
    assert "Spearman median" in report and "&lt;b&gt;suitcase&lt;/b&gt;" in report
    for name in ("roles.png", "overview.png", "rollout.png", "flow.png", "agreement.png", "heads-layer5.png"):
        assert (out / name).read_bytes()[:8] == PNG, name
    page = (out / "viewer.html").read_text()
    assert "suitcase" in page and "<b>" not in page.split("<body>")[1]
    results = json.loads((out / "results.json").read_text())
    assert len(results["roles"]) == 6 * 12 and results["texts"] == [text]


@pytest.mark.slow
def test_inspect_checkpoint_and_alignment_error_rate(greek_checkpoint, tmp_path, capsys):
    out = tmp_path / "grc"
    also = tmp_path / "also"
    shutil.copytree(greek_checkpoint, also)  # a second run in the same table
    assert main(["inspect", "--model", str(greek_checkpoint), "--out", str(out), "--steps", "2", "--beam", "1",
                 "--aer", "--limit", "20", "--dev-limit", "12", "--ibm-iterations", "1", "--quiet", "--also", str(also), "--aer-attribution", "2",
                 "Ἐν ἀρχῇ ἦν ὁ λόγος", "--reference", "In the beginning was the Word"]) == 0
    printed = capsys.readouterr().out
    assert "IBM Model 1" in printed and "diagonal" in printed
    assert (out / "alignment-1.png").read_bytes()[:8] == PNG
    assert (out / "alignment-attention.png").read_bytes()[:8] == PNG
    result = json.loads((out / "alignment.json").read_text())
    assert result["verses"] == 20 and result["dev_verses"] == 12 and result["dev_verses_total"] == 154
    names = {name.removesuffix(" (best on dev)") for name in result["scores"]}  # the dev-best reading is marked
    assert sum(name.endswith(" (best on dev)") for name in result["scores"]) == 3  # run, also, and run by gradients
    assert names >= {"run: attention, head average, argmax", "run: shift-att, head average, argmax",
                                     "IBM Model 1", "diagonal", "eflomal, grow-diag-final-and", "eflomal, intersection",
                                     "also: attention, head average, argmax", "run: integrated gradients (2 steps), argmax"}
    for best in result["best_on_dev"]:  # chosen on dev, never on test
        label = best["model"]
        assert best["dev_aer"] == min(aer for name, aer in result["dev_aer"].items()
                                      if name.startswith(f"{label}: ") and "integrated gradients" not in name)
        assert best["readings_tried"] == 2 * 4  # one layer, one head: two rows x (argmax + three thresholds)
    assert [b["model"] for b in result["best_on_dev"]] == ["run", "also"]
    for scores in result["scores"].values():
        assert 0 <= scores["aer"] <= 1 and 0 <= scores["precision"] <= 1 and 0 <= scores["recall"] <= 1
    assert "| IBM Model 1 |" in (out / "alignment.md").read_text()
    assert "attention | integrated-gradients" in (out / "report.md").read_text()
    assert "cross attention" in (out / "viewer.html").read_text()


@pytest.mark.parametrize("args, message", [
    (["--model", "minilm", "--aer"], "need a translation checkpoint"),
    (["--model", "no/such/folder", "text"], "neither 'minilm' nor an existing checkpoint"),
])
def test_bad_inspect_arguments_are_clear_errors(args, message, capsys):
    assert main(["inspect", *args]) == 2
    assert message in capsys.readouterr().err


def test_coref_on_a_translation_checkpoint_is_a_clear_error(phrase_checkpoint, capsys):
    assert main(["inspect", "--model", str(phrase_checkpoint), "--coref", "--quiet"]) == 2
    assert "--coref needs an encoder (minilm or a Hugging Face encoder folder), not a translation" in capsys.readouterr().err


def test_layers_on_a_translation_checkpoint_is_refused_by_name(phrase_checkpoint, tmp_path, capsys):
    assert main(["inspect", "--model", str(phrase_checkpoint), "--layers", "0", "--out", str(tmp_path / "o"),
                 "--quiet", "three red cats"]) == 2
    assert "--layers chooses an encoder or decoder report's head grids, not a translation checkpoint's" in capsys.readouterr().err


def test_inspect_transformer_checkpoint_shows_every_layer_and_kind(phrase_checkpoint, tmp_path):
    out = tmp_path / "tf"
    texts = tmp_path / "texts.tsv"
    texts.write_text("three red cats\ttrois chats rouges\n", encoding="utf-8")
    assert main(["inspect", "--model", str(phrase_checkpoint), "--out", str(out), "--beam", "1", "--quiet",
                 "--file", str(texts)]) == 0
    page = (out / "viewer.html").read_text()
    for kind in ("encoder self-attention", "decoder self-attention", "cross attention"):
        assert f"text 1: {kind}" in page
    payload = json.loads(page.split('type="application/json">')[1].split("</script>")[0])
    layers = {v["name"].split(": ")[1].split(" (")[0]: (v["layers"], v["heads"], v["L"], v["S"]) for v in payload["views"]}
    assert layers["encoder self-attention"] == (2, 4, 3, 3)
    assert layers["cross attention"] == (2, 4, 4, 3)  # "trois chats rouges" + </s> rows over 3 source words
    assert "RNN seq2seq checkpoints only" in (out / "report.md").read_text()


def test_a_file_mixing_plain_and_tab_lines_is_refused(tmp_path, capsys):
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("a sentence\nsource\treference\n", encoding="utf-8")
    assert main(["inspect", "--model", "minilm", "--file", str(mixed)]) == 2
    assert "either every line is 'source<TAB>reference' or none" in capsys.readouterr().err


@pytest.mark.parametrize("how, words", [
    ("pickle-only", ["no model.safetensors"]),
    ("pickle-named-safetensors", ["cannot load its weights"]),
    ("truncated", ["cannot load its weights"]),
    ("bad-tokenizer", ["tokenizer.json"]),
    ("other-sizes", ["weights"]),
])
def test_a_broken_hugging_face_folder_is_named_not_a_traceback(how, words, tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = broken_hf_folder(tmp_path, how)
    capsys.readouterr()  # transformers' own progress bars while saving the folder
    refused(["inspect", "--model", folder, "--out", tmp_path / "out", "the cat sat"], capsys, str(folder), *words)


def test_a_folder_that_is_no_model_names_both_kinds_of_model_folder(tmp_path, capsys):
    refused(["inspect", "--model", tmp_path, "--out", tmp_path / "out", "the cat sat"], capsys,
            "neither an attnkit checkpoint", "nor a Hugging Face model folder (config.json)")


@pytest.mark.slow
def test_a_working_hugging_face_folder_inspects(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = hf_folder(tmp_path)
    capsys.readouterr()
    code, _, err = run_cli(["inspect", "--model", folder, "--out", tmp_path / "out", "--steps", "2", "--quiet",
                            "the cat sat down"], capsys)
    assert code == 0, err


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["inspect", "--model", "{run}", "--file", "{empty.tsv}"], ["--file", "no texts"]),
    (["inspect", "--model", "{run}", "--aer", "--limit", "3"], ["--aer", "grc-en"]),
    (["inspect", "--model", "{run}", "--out", "/proc/attnkit-probe", "one"], ["--out", "cannot write"]),
    (["inspect", "--model", "{run}", "--file", "{dir}"], ["--file", "folder"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["inspect", "--model", "minilm", "--coref", "the cat sat"], ["--coref", "reads no texts"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)
