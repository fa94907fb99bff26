"""Fixtures of the command-line tests: one tiny trained run, and a folder of hostile files beside it
(both built once per session)."""

from __future__ import annotations

import json

import pytest

from attnkit.cli import main

from cli_helpers import TINY, rehash


@pytest.fixture(scope="session")
def run(tmp_path_factory, phrase_file):
    """A translation run of two steps of a tiny model on the phrase task."""
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(out), "--epochs", "1", "--max-steps", "2",
                 *TINY]) == 0
    return out


@pytest.fixture(scope="session")
def world(tmp_path_factory, phrase_file, run):
    """The tiny trained run and a folder of hostile files beside it."""
    root = tmp_path_factory.mktemp("probes")
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
        shutil.rmtree(copy / "best")  # last/ is then the checkpoint every command loads: the one corrupted
        last = copy / "last"
        if name == "manifest-list":
            (last / "checkpoint.json").write_text("[]")
        elif name == "manifest-empty":
            (last / "checkpoint.json").write_text(json.dumps({"format": "attnkit-checkpoint", "version": 1,
                                                              "files": {}}))
        elif name == "pickle-trainer":
            import pickle

            (last / "trainer.safetensors").write_bytes(pickle.dumps({"evil": 1}))
            rehash(last)
        else:
            config = json.loads((last / "config.json").read_text())
            (last / "config.json").write_text(json.dumps(edit(config)))
            rehash(last)
        files[name] = copy
    for name in ("fake.gz", "list.json", "partial.json", "stringy.json", "bad-bench.json", "nonresults.json",
                 "tiny.gguf", "empty.tsv", "long.tsv", "hf"):
        files[name] = root / name
    return files
