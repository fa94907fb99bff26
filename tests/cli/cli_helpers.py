"""Helpers of the command-line tests (a module of its own, imported by name): running ``attnkit`` in
the process or as a subprocess, the one-line refusal every user mistake must be, placeholders in
argument lists, and tiny Hugging Face folders."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from attnkit.cli import main

TINY = ["--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word", "--quiet"]
"""Options of a tiny translation model that trains in a second."""
PNG = b"\x89PNG\r\n\x1a\n"


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of ``attnkit argv`` in this process."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(argv, capsys, *words):
    """Assert ``attnkit argv`` is a user mistake: exit 2, one line naming every word, no traceback."""
    code, _, err = run_cli(argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    return err


def run_attnkit(*args, **kwargs) -> subprocess.CompletedProcess:
    """``python -m attnkit.cli args`` as a subprocess with one thread (Ctrl-C, torchrun)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "attnkit.cli", *args], capture_output=True, text=True, env=env,
                          timeout=240, **kwargs)


def snapshot(folder):
    """Every file under ``folder`` with its bytes: a user's files must come out of a refusal unchanged."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fill(argv, files):
    """``argv`` with ``{name}`` placeholders replaced by the paths in ``files``."""
    out = []
    for arg in argv:
        for name, path in files.items():
            arg = arg.replace("{" + name + "}", str(path))
        out.append(arg)
    return out


def probe_ids(probes) -> list[str]:
    return [" ".join(a[:3])[:40] + f"-{i}" for i, (a, _) in enumerate(probes)]


def assert_probe(argv, files, words, capsys):
    """A hostile input: exit 2, a message naming each word, no traceback."""
    try:
        code = main(fill(argv, files))
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, f"{word!r} not in: {err}"


def rehash(folder):
    """Recompute a checkpoint manifest after editing a file (a hostile edit that passes the hash check)."""
    manifest = json.loads((folder / "checkpoint.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "checkpoint.json").write_text(json.dumps(manifest))


def hf_folder(root, name="bert"):
    """A tiny BERT folder as transformers saves it (safetensors) with a word-level tokenizer.json."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = root / name
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(folder)
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "down"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def broken_hf_folder(root, how):
    import shutil

    folder = hf_folder(root, how)
    weights = folder / "model.safetensors"
    if how == "pickle-only":
        import pickle

        weights.unlink()
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"evil": 1}))
    elif how == "pickle-named-safetensors":
        import pickle

        weights.write_bytes(pickle.dumps({"evil": 1}))
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "bad-tokenizer":
        (folder / "tokenizer.json").write_text("{not json")
    elif how == "other-sizes":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"hidden_size": 32, "intermediate_size": 32}))
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)
    return folder

