"""Hostile-input probes of every sub-command: a user mistake ends with exit 2, one message naming the
argument, no traceback, quickly; nothing the user had is lost."""

from __future__ import annotations

import gzip
import hashlib
import json
import time

import pytest

from attnkit.cli import main

TINY = ["--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word", "--quiet"]


def _rehash(folder):
    """Recompute a checkpoint manifest after editing a file (a hostile edit that passes the hash check)."""
    manifest = json.loads((folder / "checkpoint.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "checkpoint.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def world(tmp_path_factory, phrase_file):
    """A tiny trained run and a folder of hostile files."""
    root = tmp_path_factory.mktemp("probes")
    run = root / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "1", "--max-steps", "2",
                 *TINY]) == 0
    files = {"run": run, "pairs": phrase_file, "dir": root / "a-folder", "root": root}
    files["dir"].mkdir()
    (root / "fake.gz").write_bytes(b"not gzip at all\n")
    files["fake.gz"] = root / "fake.gz"
    (root / "list.json").write_text("[1, 2]")
    (root / "partial.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    (root / "stringy.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10, "n_embd": "wide",
                                                   "n_layer": 2, "n_head": 2, "n_positions": 8}))
    (root / "bad-bench.json").write_text("{not json")
    (root / "nonresults.json").write_text(json.dumps({"results": [{"n": 1}]}))
    (root / "tiny.gguf").write_bytes(b"GGUF\x03\x00")
    (root / "empty.tsv").write_text("\n  \n")
    (root / "long.tsv").write_text("a" * 20_000 + "\tb\n")
    hf = root / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10, "n_embd": 8, "n_layer": 1,
                                                "n_head": 2, "n_positions": 8}))
    (hf / "model.safetensors").write_bytes(b"\x00" * 64)
    (hf / "tokenizer.json").write_text("{}")
    user = root / "users-folder"
    (user / "last").mkdir(parents=True)
    (user / "last" / "thesis.tex").write_text("precious")
    files["user"] = user
    for name, edit in {
        "absurd": lambda c: c | {"hidden_size": 10**9},
        "bigger": lambda c: c | {"hidden_size": 4096},
        "typed": lambda c: c | {"bidirectional": "no"},
        "manifest-list": None, "manifest-empty": None, "pickle-trainer": None,
    }.items():
        copy = root / name
        import shutil

        shutil.copytree(run, copy)
        last = copy / "last"
        if name == "manifest-list":
            (last / "checkpoint.json").write_text("[]")
        elif name == "manifest-empty":
            (last / "checkpoint.json").write_text(json.dumps({"format": "attnkit-checkpoint", "version": 1,
                                                              "files": {}}))
        elif name == "pickle-trainer":
            import pickle

            (last / "trainer.safetensors").write_bytes(pickle.dumps({"evil": 1}))
            _rehash(last)
        else:
            config = json.loads((last / "config.json").read_text())
            (last / "config.json").write_text(json.dumps(edit(config)))
            _rehash(last)
        files[name] = copy
    for name in ("fake.gz", "list.json", "partial.json", "stringy.json", "bad-bench.json", "nonresults.json",
                 "tiny.gguf", "empty.tsv", "long.tsv", "hf"):
        files[name] = root / name
    return files


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["train", "--data", "{fake.gz}", "--out", "{root}/new1", *TINY], ["--data", "not a gzip file"]),
    (["evaluate", "--checkpoint", "{run}", "--data", "{fake.gz}"], ["fake.gz", "not a gzip file"]),
    (["train", "--preset", "gpt2-small", "--arch", "transformer", "--out", "{root}/new2"], ["--preset"]),
    (["translate", "--checkpoint", "{run}", "--heatmap", "{dir}", "three cats"], ["--heatmap", "folder"]),
    (["evaluate", "--checkpoint", "{run}", "--json", "{dir}"], ["--json", "folder"]),
    (["cost", "--model", "{list.json}"], ["--model", "JSON object"]),
    (["cost", "--model", "{partial.json}"], ["required key"]),
    (["cost", "--model", "{stringy.json}"], ["d_model", "'wide'"]),
    (["cost", "--model", "gpt2-small", "--seq", "99999999999999"], ["--seq"]),
    (["cost", "--model", "gpt2-small", "--seq", "nan"], ["--seq"]),
    (["translate", "--checkpoint", "{run}", "--beam", "1000000", "one"], ["--beam"]),
    (["translate", "--checkpoint", "{run}", "--beam", "99", "one"], ["--beam", "vocabulary"]),
    (["evaluate", "--checkpoint", "{run}", "--limit", "-5"], ["--limit"]),
    (["train", "--lr", "inf", "--out", "{root}/new3"], ["--lr"]),
    (["train", "--clip", "-5", "--out", "{root}/new4"], ["--clip"]),
    (["train", "--dropout", "nan", "--out", "{root}/new5"], ["--dropout"]),
    (["translate", "--checkpoint", "{run}", "   "], ["text", "whitespace"]),
    (["translate", "--checkpoint", "{run}", "caf\udce9"], ["text", "UTF-8"]),
    (["translate", "--checkpoint", "{run}", "x" * 3000], ["text", "3,000 characters"]),
    (["translate", "--checkpoint", "{root}/missing", "one"], ["not found"]),
    (["train", "--data", "{pairs}", "--out", "{user}", *TINY], ["--out", "not an attnkit run"]),
    (["train", "--data", "{pairs}", "--out", "", *TINY], ["--out", "empty"]),
    (["train", "--data", "{pairs}", "--out", "{run}", *TINY], ["--out", "--resume", "--overwrite"]),
    (["train", "--data", "{pairs}", "--out", "{pairs}", *TINY], ["--out", "is a file"]),
    (["train", "--data", "bible", "--out", "{run}", "--resume", *TINY], ["--resume", "data", "'bible'"]),
    (["train", "--data", "{pairs}", "--out", "{run}", "--resume", "--hidden-size", "64", "--embedding-dim", "16",
      "--vocab-size", "100", "--tokenizer", "word"], ["--resume", "hidden_size"]),
    (["train", "--data", "{pairs}", "--out", "/proc/attnkit-probe", *TINY], ["--out", "/proc/attnkit-probe"]),
    (["train", "--data", "{long.tsv}", "--out", "{root}/new6", *TINY], ["long.tsv:1", "characters"]),
    (["generate", "--prompt", "hi", "--temperature", "nan"], ["--temperature"]),
    (["generate", "--prompt", "hi", "--top-p", "2"], ["--top-p"]),
    (["generate", "--prompt", "hi", "--compile", "--no-cache"], ["--compile", "--no-cache"]),
    (["generate", "--prompt", "hi", "--model", "{tiny.gguf}"], ["tiny.gguf", "not a readable GGUF"]),
    (["generate", "--prompt", "hi", "--model", "{hf}"], ["model.safetensors", "not a readable safetensors"]),
    (["bench", "--render", "{bad-bench.json}"], ["not valid JSON"]),
    (["bench", "--render", "{nonresults.json}"], ["--render", "malformed"]),
    (["bench", "--render", "{root}/nothing.json"], ["--render", "no such file"]),
    (["translate", "--checkpoint", "{absurd}", "one"], ["too large to exist"]),
    (["translate", "--checkpoint", "{bigger}", "one"], ["does not match", "expected shape"]),
    (["translate", "--checkpoint", "{typed}", "one"], ["bidirectional"]),
    (["translate", "--checkpoint", "{manifest-list}", "one"], ["manifest"]),
    (["translate", "--checkpoint", "{manifest-empty}", "one"], ["does not list"]),
    (["train", "--data", "{pairs}", "--out", "{pickle-trainer}", "--resume", *TINY], ["trainer.safetensors",
                                                                                       "not a readable safetensors"]),
    (["inspect", "--model", "{run}", "--file", "{empty.tsv}"], ["--file", "no texts"]),
    (["inspect", "--model", "{run}", "--aer", "--limit", "3"], ["--aer", "grc-en"]),
    (["tour", "--out", "/proc/attnkit-probe"], ["--out", "cannot write"]),
    (["demo", "--out", "/proc/attnkit-probe", "--train-limit", "10"], ["--out", "cannot write"]),
    (["bench", "--out", "/proc/attnkit-probe", "--sizes", "8"], ["--out", "cannot write"]),
    (["inspect", "--model", "{run}", "--out", "/proc/attnkit-probe", "one"], ["--out", "cannot write"]),
    (["translate", "--checkpoint", "{run}", "--heatmap", "/proc/attnkit-probe/a.png", "one"], ["--heatmap"]),
    (["evaluate", "--checkpoint", "{run}", "--json", "/proc/attnkit-probe/s.json"], ["--json"]),
    (["tour", "--out", "{pairs}"], ["--out", "is a file"]),
    (["inspect", "--model", "{run}", "--file", "{dir}"], ["--file", "folder"]),
    (["demo", "--beam", "0"], ["--beam"]),
    (["demo", "--epochs", "-1"], ["--epochs"]),
]


def _fill(argv, files):
    out = []
    for arg in argv:
        for name, path in files.items():
            arg = arg.replace("{" + name + "}", str(path))
        out.append(arg)
    return out


@pytest.mark.parametrize("argv, words", PROBES, ids=[" ".join(a[:3])[:40] + f"-{i}" for i, (a, _) in enumerate(PROBES)])
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    started = time.perf_counter()
    try:
        code = main(_fill(argv, world))
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, f"{word!r} not in: {err}"
    assert time.perf_counter() - started < 60


@pytest.mark.slow  # loads SmolLM2
def test_a_prompt_past_the_context_is_refused(capsys):
    assert main(["generate", "--prompt", "hello", "--max-new-tokens", "9000"]) == 2
    err = capsys.readouterr().err
    assert "--prompt" in err and "8,192-token context" in err and "Traceback" not in err


def test_a_users_files_survive_a_refused_train(world):
    assert (world["user"] / "last" / "thesis.tex").read_text() == "precious"
    assert not (world["root"] / "new1").exists() or not any((world["root"] / "new1").iterdir()) or \
        (world["root"] / "new1" / "attnkit-run.json").exists()


def test_overwrite_replaces_only_the_run(world, phrase_file, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "1", "--max-steps", "1", *TINY]) == 0
    (run / "notes.txt").write_text("mine")
    assert main(["train", "--data", str(phrase_file), "--out", str(run), "--epochs", "1", "--max-steps", "1",
                 "--overwrite", *TINY]) == 0
    assert (run / "notes.txt").read_text() == "mine" and (run / "last" / "checkpoint.json").is_file()


def test_a_pairs_file_with_a_byte_order_mark(tmp_path):
    from attnkit.data import read_pairs

    path = tmp_path / "bom.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\ufeffhello\tbonjour\n")
    assert read_pairs(path)[0].source == "hello"


@pytest.mark.parametrize("data, code, words", [(b"caf\xe9 au lait\n", 2, ["stdin", "not UTF-8"]),
                                               (b"\n   \n", 2, ["no text"]),
                                               (b"\xef\xbb\xbfthree red cats\n\nfive cats\n", 0, [])])
def test_translate_reads_stdin_as_utf8(world, monkeypatch, capsys, data, code, words):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["translate", "--checkpoint", str(world["run"]), "--beam", "1"]) == code
    captured = capsys.readouterr()
    for word in words:
        assert word in captured.err
    if code == 0:
        assert len(captured.out.strip().splitlines()) == 2  # two sentences, the BOM not part of the first
