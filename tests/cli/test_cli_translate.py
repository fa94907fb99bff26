"""``attnkit translate``: heatmaps, beams, stdin, broken and missing checkpoints."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from attnkit.cli import main

from cli_helpers import assert_probe, probe_ids, refused, rehash, run_cli


def test_numbered_heatmaps_never_replace_a_users_file(run, tmp_path, capsys):
    (tmp_path / "pic-2.png").write_bytes(b"my picture")
    refused(["translate", "--checkpoint", run, "--heatmap", tmp_path / "pic.png", "one two", "three"], capsys,
             "--heatmap", "pic-2.png")
    assert (tmp_path / "pic-2.png").read_bytes() == b"my picture" and not (tmp_path / "pic-1.png").exists()


def test_a_wide_beam_on_a_long_sentence_is_refused_quickly(run, capsys):
    sentence = " ".join(["one two three four five six seven eight nine ten"] * 19)[:959]
    refused(["translate", "--checkpoint", run, "--beam", "30", sentence], capsys, "--beam 30", "beam x tokens")


@pytest.mark.parametrize("data, code, words", [(b"caf\xe9 au lait\n", 2, ["stdin", "not UTF-8"]),
                                               (b"\n   \n", 2, ["no text"]),
                                               (b"\xef\xbb\xbfthree red cats\n\nfive cats\n", 0, [])])
def test_translate_reads_stdin_as_utf8(world, monkeypatch, capsys, data, code, words):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["translate", "--checkpoint", str(world["run"]), "--beam", "1"]) == code
    captured = capsys.readouterr()
    for word in words:
        assert word in captured.err
    if code == 0:  # two sentences, the BOM not part of the first, and the blank line between them kept in its place
        lines = captured.out.splitlines()
        assert len(lines) == 3 and lines[0].strip() and lines[1] == "" and lines[2].strip()


@pytest.mark.parametrize("how", ["nan", "integer"])
def test_a_checkpoint_with_broken_weights_is_refused(how, run, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "broken"
    shutil.copytree(run, copy)
    weights = copy / "last" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(iter(tensors))
    tensors[name] = tensors[name].fill_(float("nan")) if how == "nan" else tensors[name].to(torch.int32)
    save_file(tensors, str(weights))
    rehash(copy / "last")
    shutil.rmtree(copy / "best", ignore_errors=True)
    refused(["translate", "--checkpoint", copy / "last", "one"], capsys, name)


@pytest.mark.parametrize("command", [["translate", "--checkpoint", "missing-run", "x"],
                                     ["evaluate", "--checkpoint", "missing-run"]])
def test_missing_checkpoint_is_a_clear_error(command, capsys):
    assert main(command) == 2
    assert "checkpoint folder not found" in capsys.readouterr().err


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["translate", "--checkpoint", "{run}", "--heatmap", "{dir}", "three cats"], ["--heatmap", "folder"]),
    (["translate", "--checkpoint", "{run}", "--beam", "1000000", "one"], ["--beam"]),
    (["translate", "--checkpoint", "{run}", "--beam", "99", "one"], ["--beam", "vocabulary"]),
    (["translate", "--checkpoint", "{run}", "   "], ["text", "whitespace"]),
    (["translate", "--checkpoint", "{run}", "caf\udce9"], ["text", "UTF-8"]),
    (["translate", "--checkpoint", "{run}", "x" * 3000], ["text", "3,000 characters"]),
    (["translate", "--checkpoint", "{root}/missing", "one"], ["not found"]),
    (["translate", "--checkpoint", "{absurd}", "one"], ["too large to exist"]),
    (["translate", "--checkpoint", "{bigger}", "one"], ["does not match", "expected shape"]),
    (["translate", "--checkpoint", "{typed}", "one"], ["bidirectional"]),
    (["translate", "--checkpoint", "{manifest-list}", "one"], ["manifest"]),
    (["translate", "--checkpoint", "{manifest-empty}", "one"], ["does not list"]),
    (["translate", "--checkpoint", "{run}", "--heatmap", "/proc/attnkit-probe/a.png", "one"], ["--heatmap"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


def test_a_heatmap_path_is_checked_before_any_translation(run, tmp_path, capsys):
    """--heatmap x.txt failed in matplotlib after the translation printed; a missing folder was created."""
    code, out, err = run_cli(["translate", "--checkpoint", run, "--heatmap", tmp_path / "x.txt", "three cats"],
                                capsys)
    assert code == 2 and out == "" and "--heatmap" in err and ".png or .svg" in err and len(err.splitlines()) == 1
    missing = tmp_path / "no" / "such" / "dir"
    refused(["translate", "--checkpoint", run, "--heatmap", missing / "x.png", "three cats"], capsys, "--heatmap",
            "does not create folders")
    assert not (tmp_path / "no").exists()


def test_a_single_output_file_is_replaced_only_if_attnkit_wrote_it(run, phrase_file, tmp_path, capsys):
    """The rule of --out folders for single files: translate --heatmap, evaluate --json and
    align --out write a new file, replace one attnkit wrote (its mark), and refuse any other file unless
    --overwrite."""
    picture, scores, links = tmp_path / "pic.png", tmp_path / "scores.json", tmp_path / "links.txt"
    for path in (picture, scores, links):
        path.write_text("the user's own file")
    refused(["translate", "--checkpoint", run, "--heatmap", picture, "one two"], capsys, "--heatmap", "--overwrite")
    refused(["evaluate", "--checkpoint", run, "--data", phrase_file, "--json", scores], capsys, "--json", "--overwrite")
    refused(["align", "--data", phrase_file, "--aligner", "ibm1", "--out", links], capsys, "--out", "--overwrite")
    assert all(p.read_text() == "the user's own file" for p in (picture, scores, links))
    assert run_cli(["translate", "--checkpoint", run, "--heatmap", picture, "--overwrite", "one two"], capsys)[0] == 0
    assert run_cli(["translate", "--checkpoint", run, "--heatmap", picture, "two three"], capsys)[0] == 0  # attnkit's
    argv = ["evaluate", "--checkpoint", run, "--data", phrase_file, "--limit", "5", "--beam", "1", "--quiet", "--json",
            scores]
    assert run_cli([*argv, "--overwrite"], capsys)[0] == 0 and run_cli(argv, capsys)[0] == 0
    assert run_cli(["align", "--data", phrase_file, "--aligner", "ibm1", "--out", links, "--overwrite", "--quiet"],
                   capsys)[0] == 0
    refused(["align", "--data", phrase_file, "--aligner", "ibm1", "--out", links], capsys, "--overwrite")  # no mark
