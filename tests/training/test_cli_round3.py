"""Issue 22's CLI cases, each as a user would meet it: a refusal with exit 2 and one line naming the
option, the user's files byte-identical afterwards; or a bounded run; or a run that now works."""

from __future__ import annotations

import json
import time

import pytest
import torch

from attnkit.cli import main

TINY = ["--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word", "--quiet"]


def _run(argv, capsys):
    started = time.perf_counter()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err, time.perf_counter() - started


def _refused(argv, capsys, *words):
    code, _, err, seconds = _run(argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    assert seconds < 60
    return err


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory, phrase_file):
    out = tmp_path_factory.mktemp("round3") / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(out), "--epochs", "1", "--max-steps", "2",
                 *TINY]) == 0
    return out


# -- data loss: a command owns only what it wrote --


@pytest.mark.parametrize("command", [["demo", "--train-limit", "10"], ["tour"], ["bench", "--sizes", "8"],
                                     ["inspect", "--model", "minilm"]])
def test_a_folder_with_the_users_files_is_refused_and_left_alone(command, tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "runs" / "bahdanau").mkdir(parents=True)
    (out / "runs" / "bahdanau" / "attnkit-run.json").write_text("my own run")
    (out / "report").mkdir()
    (out / "report" / "report.md").write_text("my report")
    (out / "attention.json").write_text("my numbers")
    before = _snapshot(out)
    _refused([*command, "--out", out], capsys, "--out", "attnkit did not write")
    assert _snapshot(out) == before


@pytest.mark.slow
def test_a_command_may_write_again_over_its_own_output_but_not_beside_a_users_file(tmp_path, capsys):
    out = tmp_path / "tour"
    assert _run(["tour", "--out", out], capsys)[0] == 0
    marker = json.loads((out / "attnkit-output.json").read_text())
    assert marker["command"] == "tour" and marker["files"]
    assert _run(["tour", "--out", out], capsys)[0] == 0  # its own files: written again
    (out / "notes.txt").write_text("mine")
    _refused(["tour", "--out", out], capsys, "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


def test_numbered_heatmaps_never_replace_a_users_file(run, tmp_path, capsys):
    (tmp_path / "pic-2.png").write_bytes(b"my picture")
    _refused(["translate", "--checkpoint", run, "--heatmap", tmp_path / "pic.png", "one two", "three"], capsys,
             "--heatmap", "pic-2.png")
    assert (tmp_path / "pic-2.png").read_bytes() == b"my picture" and not (tmp_path / "pic-1.png").exists()


def test_an_input_is_never_an_output(run, phrase_file, tmp_path, capsys):
    data = tmp_path / "pairs.tsv"
    data.write_bytes(phrase_file.read_bytes())
    before = data.read_bytes()
    _refused(["evaluate", "--checkpoint", run, "--data", data, "--json", data], capsys, "--json", "--data input")
    _refused(["align", "--data", data, "--aligner", "ibm1", "--out", data, "--quiet"], capsys, "--out", "--data")
    assert data.read_bytes() == before


def test_overwrite_refuses_to_delete_a_users_file_inside_a_checkpoint(phrase_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(phrase_file), "--out", str(out), "--epochs", "1", "--max-steps", "1",
                 *TINY]) == 0
    (out / "last" / "my-notes.txt").write_text("mine")
    _refused(["train", "--data", phrase_file, "--out", out, "--overwrite", "--max-steps", "1", *TINY], capsys,
             "--overwrite", "last/my-notes.txt")
    assert (out / "last" / "my-notes.txt").read_text() == "mine"


# -- no tracebacks --


def test_train_with_a_separate_validation_file(phrase_file, tmp_path, capsys):
    code, _, err, _ = _run(["train", "--data", phrase_file, "--valid", phrase_file, "--out", tmp_path / "r",
                            "--max-steps", "1", "--epochs", "1", *TINY], capsys)
    assert code == 0, err
    recorded = json.loads((tmp_path / "r" / "attnkit-run.json").read_text())["options"]
    assert recorded["valid"] == str(phrase_file.resolve())


def test_an_absurd_model_size_is_refused_before_allocating(phrase_file, tmp_path, capsys):
    _refused(["train", "--data", phrase_file, "--out", tmp_path / "r", "--hidden-size", "65536"], capsys,
             "--hidden-size 65536", "billion parameters")


def test_cost_of_a_translation_checkpoint_config(run, capsys):
    _refused(["cost", "--model", run / "last" / "config.json"], capsys, "--model", "RNN translation model")


def test_a_tiny_top_p_keeps_the_most_likely_token():
    from attnkit.decoding import sample_next

    logits = torch.tensor([[0.1, 3.0, 0.2, 2.9]])
    for _ in range(5):
        assert sample_next(logits, temperature=1.0, top_p=1e-300).item() == 1


def test_ctrl_c_while_starting_is_a_clean_exit(monkeypatch, capsys):
    import attnkit.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(attnkit.cli, "build_parser", interrupted)
    code, _, err, _ = _run(["tour"], capsys)
    assert code == 130 and "interrupted" in err and "Traceback" not in err


def _hf_folder(root, name="bert"):
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


def _broken(root, how):
    import shutil

    folder = _hf_folder(root, how)
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


@pytest.mark.parametrize("how, words", [
    ("pickle-only", ["no model.safetensors"]),
    ("pickle-named-safetensors", ["cannot load its weights"]),
    ("truncated", ["cannot load its weights"]),
    ("bad-tokenizer", ["tokenizer.json"]),
    ("other-sizes", ["weights"]),
])
def test_a_broken_hugging_face_folder_is_named_not_a_traceback(how, words, tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = _broken(tmp_path, how)
    capsys.readouterr()  # transformers' own progress bars while saving the folder
    _refused(["inspect", "--model", folder, "--out", tmp_path / "out", "the cat sat"], capsys, str(folder), *words)


@pytest.mark.slow
def test_a_working_hugging_face_folder_inspects(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = _hf_folder(tmp_path)
    capsys.readouterr()
    code, _, err, _ = _run(["inspect", "--model", folder, "--out", tmp_path / "out", "--steps", "2", "--quiet",
                            "the cat sat down"], capsys)
    assert code == 0, err


# -- silent: combinations that would do nothing are refused by name --


@pytest.mark.parametrize("argv, words", [
    (["train", "--data", "{pairs}", "--direction", "fr-en", "--out", "{tmp}/a"], ["--direction", "--data bible"]),
    (["evaluate", "--checkpoint", "{run}", "--data", "{pairs}", "--direction", "fr-en"], ["--direction"]),
    (["train", "--arch", "transformer", "--attention", "luong-dot", "--out", "{tmp}/b"], ["--attention", "seq2seq"]),
    (["train", "--arch", "transformer", "--hidden-size", "64", "--out", "{tmp}/c"], ["--hidden-size", "seq2seq"]),
    (["train", "--preset", "transformer-small", "--out", "{tmp}/d"], ["--preset", "--arch transformer"]),
    (["train", "--alignment-weight", "0.5", "--out", "{tmp}/e"], ["--alignment-weight", "--guided-alignment"]),
    (["align", "--aligner", "ibm1", "--symmetrize", "union", "--out", "{tmp}/l.txt"], ["--symmetrize", "eflomal"]),
    (["align", "--aligner", "eflomal", "--ibm-iterations", "9", "--out", "{tmp}/l.txt"], ["--ibm-iterations"]),
    (["generate", "--prompt", "hi", "--top-k", "5"], ["--top-k", "greedy"]),
    (["generate", "--prompt", "hi", "--top-p", "0.5"], ["--top-p", "greedy"]),
    (["inspect", "--model", "minilm", "--coref", "the cat sat"], ["--coref", "reads no texts"]),
    (["bench", "--context-parallel", "64", "--sizes", "8", "--out", "{tmp}/f"], ["--sizes", "--context-parallel"]),
    (["bench", "--context-parallel", "64", "--masks", "causal", "--out", "{tmp}/g"], ["--masks"]),
    (["bench", "--sizes", "8", "--worlds", "2", "--out", "{tmp}/h"], ["--worlds", "--context-parallel only"]),
    (["cost", "--model", "gpt2-small", "--pattern", "bigbird", "--pattern-options", "block=0"], ["block", ">= 1"]),
    (["cost", "--model", "gpt2-small", "--pattern", "dilated", "--pattern-options", "dilation=0"], ["dilation"]),
    (["evaluate", "--checkpoint", "{run}", "--data", "grc-en"], ["--data grc-en", "unknown"]),
    (["evaluate", "--checkpoint", "{run}", "--data", "bible", "--direction", "fr-en"], ["--data bible", "unknown"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    filled = [a.replace("{pairs}", str(phrase_file)).replace("{run}", str(run)).replace("{tmp}", str(tmp_path))
              for a in argv]
    _refused(filled, capsys, *words)


@pytest.mark.parametrize("how", ["nan", "integer"])
def test_a_checkpoint_with_broken_weights_is_refused(how, run, tmp_path, capsys):
    import shutil

    from safetensors.torch import load_file, save_file
    from test_cli_probes import _rehash

    copy = tmp_path / "broken"
    shutil.copytree(run, copy)
    weights = copy / "last" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(iter(tensors))
    tensors[name] = tensors[name].fill_(float("nan")) if how == "nan" else tensors[name].to(torch.int32)
    save_file(tensors, str(weights))
    _rehash(copy / "last")
    shutil.rmtree(copy / "best", ignore_errors=True)
    _refused(["translate", "--checkpoint", copy / "last", "one"], capsys, name)


def test_bench_render_escapes_and_handles_no_rows():
    from attnkit.bench.report import format_markdown

    assert format_markdown([]) == "(no results)"
    table = format_markdown([{"mode": "fwd", "dtype": "f|32", "mask": "<b>x</b>", "n": 8, "impl": "sdpa",
                              "time_s": 0.001}])
    assert "f\\|32" in table and "&lt;b&gt;" in table and "<b>" not in table


def test_resume_sees_through_the_path_and_refuses_another_corpus(phrase_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pairs.tsv").write_bytes(phrase_file.read_bytes())
    common = ["--out", "r", "--epochs", "1", *TINY]
    assert _run(["train", "--data", "pairs.tsv", "--max-steps", "1", *common], capsys)[0] == 0
    code, _, err, _ = _run(["train", "--data", "./pairs.tsv", "--max-steps", "2", "--resume", *common], capsys)
    assert code == 0, err  # the same file by another spelling
    (tmp_path / "pairs.tsv").write_text("another\tcorpus\n" * 50)
    _refused(["train", "--data", "pairs.tsv", "--max-steps", "3", "--resume", *common], capsys, "data_sha256")


def test_resume_takes_the_runs_data_and_model_options_and_refuses_only_given_ones(phrase_file, tmp_path, capsys):
    """train --out RUN --resume needs no repetition of the run's options (its marker holds them); an
    option given that differs from the run's is refused by name."""
    run = tmp_path / "run"
    first = ["train", "--data", phrase_file, "--out", run, "--epochs", "1", "--max-steps", "2",
             "--embedding-dim", "16", "--hidden-size", "32", "--vocab-size", "100", "--tokenizer", "word",
             "--dropout", "0.1", "--attention", "luong-general", "--quiet"]
    assert _run(first, capsys)[0] == 0
    code, out, err, _ = _run(["train", "--out", run, "--resume", "--epochs", "1", "--max-steps", "3", "--quiet"], capsys)
    assert code == 0, err
    assert "max-steps after 3 steps" in out
    assert json.loads((run / "attnkit-run.json").read_text())["options"]["attention"] == "luong-general"
    _refused(["train", "--out", run, "--resume", "--hidden-size", "64", "--max-steps", "4"], capsys,
             "--resume", "hidden_size (run: 32, now: 64)")


def test_a_resume_whose_limits_are_reached_trains_nothing_and_says_so(phrase_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert _run(["train", "--data", phrase_file, "--out", run, "--epochs", "1", "--max-steps", "5", *TINY], capsys)[0] == 0
    before = _snapshot(run)
    for limits in (["--max-steps", "3"], ["--max-steps", "5"]):
        code, out, err, _ = _run(["train", "--out", run, "--resume", "--epochs", "1", *limits, "--quiet"], capsys)
        assert code == 0, err
        assert "nothing to train: the run is at step 5" in out and "max-steps" in out
    assert _snapshot(run) == before  # no step, no checkpoint rewritten


def test_a_run_that_stopped_before_writing_anything_is_not_an_existing_run(phrase_file, tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "attnkit-run.json").write_text(json.dumps({"format": "attnkit-run", "version": 1, "options": {}}))
    code, _, err, _ = _run(["train", "--data", phrase_file, "--out", out, "--max-steps", "1", "--epochs", "1", *TINY],
                           capsys)
    assert code == 0, err


# -- unbounded: bounded now --


def test_context_parallel_bench_is_capped_by_the_machine(tmp_path, capsys):
    import os

    _refused(["bench", "--context-parallel", "128", "--worlds", "64", "--out", tmp_path / "b"], capsys, "--worlds 64",
             f"{os.cpu_count()} cores")


def test_a_wide_beam_on_a_long_sentence_is_refused_quickly(run, capsys):
    sentence = " ".join(["one two three four five six seven eight nine ten"] * 19)[:959]
    _refused(["translate", "--checkpoint", run, "--beam", "30", sentence], capsys, "--beam 30", "beam x tokens")


def test_ibm_model_1_stops_at_convergence(phrase_file, tmp_path, capsys):
    code, out, err, seconds = _run(["align", "--data", phrase_file, "--aligner", "ibm1", "--ibm-iterations", "1000",
                                    "--out", tmp_path / "links.txt", "--quiet"], capsys)
    assert code == 0, err
    assert "converged" in out and seconds < 60


class _Bytes:
    """A byte-level tokenizer: token id = byte value."""

    @staticmethod
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("cut", [0, 1])
def test_streamed_text_keeps_a_trailing_partial_character(cut):
    import io

    from attnkit.cli.language_models import Stream

    out = io.StringIO()
    stream = Stream(_Bytes(), stops=[0], out=out)
    ids = list("a😀".encode())
    for token in ids[: len(ids) - cut] + [0]:  # 0: a stop token, never printed
        stream.add(token)
    stream.finish()
    assert out.getvalue() == ("a😀" if cut == 0 else "a\ufffd")  # the old loop printed "a" alone for cut=1


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
    _refused(["generate", "--prompt", "hi", "--device", "cuda"], capsys, "--device cuda", "no usable CUDA GPU")
    _refused(["bench", "--device", "cuda", "--sizes", "256", "--out", tmp_path / "b"], capsys, "--device cuda")
    _refused(["train", "--device", "cuda", *TINY, "--out", tmp_path / "t"], capsys, "--device cuda")
    _refused(["inspect", "--model", "minilm", "--device", "cuda", "--out", tmp_path / "i"], capsys, "--device cuda")
    assert not (tmp_path / "b").exists() and not (tmp_path / "t").exists() and not (tmp_path / "i").exists()
    code, _, err, _ = _run(["generate", "--prompt", "hi", "--device", "tpu"], capsys)  # argparse: usage + error
    assert code == 2 and "argument --device: invalid choice: 'tpu'" in err
