"""The ``attnkit`` command itself, whatever the sub-command: its parser and help, the error policy (a user
mistake is one line and exit 2, a bug keeps its traceback), Ctrl-C, --device cuda without a GPU, and
the output folders a command owns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from attnkit.cli import main

from cli_helpers import TINY, refused, run_cli, snapshot


def test_unknown_command_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["nope"])
    assert exit.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_bare_attnkit_prints_its_help_and_the_help_lists_no_retired_command(capsys):
    code, out, err = run_cli([], capsys)
    assert code == 0 and not err and out.startswith("usage: attnkit") and "generate" in out
    assert "build-ext" not in out


def test_version_answers_without_importing_torch():
    """``attnkit --version`` reads the installed version (the entry point, src/_attnkit_entry.py): no second of
    torch's import."""
    from importlib import metadata

    script = ("import sys; sys.argv = ['attnkit', '--version']; import _attnkit_entry; code = _attnkit_entry.main(); "
              "print('torch' in sys.modules, code)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout == f"attnkit {metadata.version('attnkit')}\nFalse 0\n", done.stderr


def test_every_option_of_every_command_has_help_text():
    import argparse

    from attnkit.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = {name: [a.dest for a in parser._actions if not a.help] for name, parser in commands.choices.items()}
    assert not any(missing.values()), missing


@pytest.mark.slow
def test_version_and_python_dash_m(capsys):

    from attnkit import __version__

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.strip() == f"attnkit {__version__}"
    result = subprocess.run([sys.executable, "-m", "attnkit", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"attnkit {__version__}"


def test_user_mistakes_are_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    """Error policy: a UsageError / InputError / OSError ends with one line and exit 2; any other
    exception (a ValueError from a bug included) propagates with its traceback; --debug shows the
    traceback of a user mistake too."""
    import attnkit.cli.language_models as lm
    from attnkit.cli import UsageError

    assert main(["cost", "--model", "gpt2-small", "--seq", "1024", "--pattern", "window",
                 "--pattern-options", "globals=3"]) == 2
    assert "--pattern-options" in capsys.readouterr().err  # the library's ValueError, named by option
    with pytest.raises(UsageError):
        main(["--debug", "cost", "--model", "gpt2-small", "--seq", "1024", "--pattern", "window",
              "--pattern-options", "globals=3"])

    def bug(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(lm, "_model_config", bug)  # outside the call that receives the user's values
    with pytest.raises(ValueError, match="an internal bug"):
        main(["cost", "--model", "gpt2-small", "--seq", "1024"])


def test_ctrl_c_while_starting_is_a_clean_exit(monkeypatch, capsys):
    import attnkit.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(attnkit.cli, "build_parser", interrupted)
    code, _, err = run_cli(["tour"], capsys)
    assert code == 130 and "interrupted" in err and "Traceback" not in err


def test_ctrl_c_while_torch_imports_is_a_clean_exit(monkeypatch, capsys):
    """The console script's entry imports attnkit inside a guard (src/_attnkit_entry.py)."""
    import builtins

    import _attnkit_entry

    real_import = builtins.__import__

    def interrupted_import(name, *args, **kwargs):
        if name == "attnkit.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    assert _attnkit_entry.main() == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_device_cuda_is_refused_with_the_reason_without_a_gpu(capsys, tmp_path):
    """``--device cuda`` (generate, bench, train, inspect) on a machine without CUDA: one line, exit 2, before any
    model is loaded or folder made."""
    refused(["generate", "--prompt", "hi", "--device", "cuda"], capsys, "--device cuda", "no usable CUDA GPU")
    refused(["bench", "--device", "cuda", "--sizes", "256", "--out", tmp_path / "b"], capsys, "--device cuda")
    refused(["train", "--device", "cuda", *TINY, "--out", tmp_path / "t"], capsys, "--device cuda")
    refused(["inspect", "--model", "minilm", "--device", "cuda", "--out", tmp_path / "i"], capsys, "--device cuda")
    assert not (tmp_path / "b").exists() and not (tmp_path / "t").exists() and not (tmp_path / "i").exists()
    code, _, err = run_cli(["generate", "--prompt", "hi", "--device", "tpu"], capsys)  # argparse: usage + error
    assert code == 2 and "argument --device: invalid choice: 'tpu'" in err


@pytest.mark.parametrize("command", [["demo", "--train-limit", "10"], ["tour"], ["bench", "--sizes", "8"],
                                     ["inspect", "--model", "minilm"]])
def test_a_folder_with_the_users_files_is_refused_and_left_alone(command, tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "runs" / "bahdanau").mkdir(parents=True)
    (out / "runs" / "bahdanau" / "attnkit-run.json").write_text("my own run")
    (out / "report").mkdir()
    (out / "report" / "report.md").write_text("my report")
    (out / "attention.json").write_text("my numbers")
    before = snapshot(out)
    refused([*command, "--out", out], capsys, "--out", "attnkit did not write")
    assert snapshot(out) == before


@pytest.mark.slow
def test_a_command_may_write_again_over_its_own_output_but_not_beside_a_users_file(tmp_path, capsys):
    out = tmp_path / "tour"
    assert run_cli(["tour", "--out", out], capsys)[0] == 0
    marker = json.loads((out / "attnkit-output.json").read_text())
    assert marker["command"] == "tour" and marker["files"]
    assert run_cli(["tour", "--out", out], capsys)[0] == 0  # its own files: written again
    (out / "notes.txt").write_text("mine")
    refused(["tour", "--out", out], capsys, "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


def test_an_input_is_never_an_output(run, phrase_file, tmp_path, capsys):
    data = tmp_path / "pairs.tsv"
    data.write_bytes(phrase_file.read_bytes())
    before = data.read_bytes()
    refused(["evaluate", "--checkpoint", run, "--data", data, "--json", data], capsys, "--json", "--data input")
    refused(["align", "--data", data, "--aligner", "ibm1", "--out", data, "--quiet"], capsys, "--out", "--data")
    assert data.read_bytes() == before


@pytest.mark.parametrize("argv", [
    ["train", "--epochs", "x"], ["translate", "--checkpoint"], ["generate"], ["cost", "--model"],
    ["demo", "--beam", "0"], ["tour", "--seed", "-1"], ["bench", "--sizes", "x"], ["inspect", "--steps", "y"],
    ["evaluate", "--beam"], ["align", "--aligner", "nope"], ["trian"],
])
def test_an_argument_mistake_is_one_line_without_the_usage_block(argv, capsys):
    """argparse printed its whole usage block before the one line."""
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err and "error:" in err and "--help" in err, err


@pytest.mark.parametrize("command", [
    ["demo", "--figure2", "--minutes", "5"],  # refused inside the folder: --figure2 takes no --minutes
    ["inspect", "--model", "minilm", "--aer"],  # --aer needs a translation checkpoint
    ["inspect", "--model", "minilm", "--also", "x"],
])
def test_a_refused_command_leaves_no_empty_output_folder(command, tmp_path, capsys):
    out = tmp_path / "new" / "out"
    code, _, err = run_cli([*command, "--out", out], capsys)
    assert code == 2, err
    assert not out.exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["generate", "--seed", "3", "--prompt", "hi"], ["--seed", "sampling"]),
    (["inspect", "--model", "minilm", "--beam", "3", "hello there"], ["--beam", "translation checkpoint"]),
    (["inspect", "--model", "minilm", "--limit", "3", "hello there"], ["--limit", "--aer only"]),
    (["inspect", "--model", "minilm", "--no-eflomal", "hello there"], ["--no-eflomal", "--aer only"]),
    (["inspect", "--model", "minilm", "--dev-limit", "3", "hello there"], ["--dev-limit", "--aer only"]),
    (["inspect", "--model", "minilm", "--ibm-iterations", "3", "hello there"], ["--ibm-iterations", "--aer only"]),
    (["bench", "--render", "README.md", "--sizes", "512"], ["--sizes", "--render"]),
    (["demo", "--models", "bahdanau", "bahdanau"], ["--models", "bahdanau", "twice"]),
], ids=["generate-seed", "inspect-beam", "inspect-limit", "inspect-no-eflomal", "inspect-dev-limit", "inspect-ibm", "bench-render",
        "demo-models"])
def test_options_that_would_change_nothing_are_refused_by_name(argv, words, capsys, tmp_path):
    """docs/workbench.md promises it: an option the command would ignore is named."""
    if argv[0] in ("inspect", "demo"):
        argv = [*argv, "--out", str(tmp_path / "out")]
    refused(argv, capsys, *words)
    assert not (tmp_path / "out").exists()
