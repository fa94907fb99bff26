"""``attnkit generate``: the context refused by name, streamed text, refusals."""

from __future__ import annotations

import pytest

from attnkit.cli import main

from cli_helpers import assert_probe, fill, probe_ids, refused


@pytest.mark.slow  # loads SmolLM2
def test_a_prompt_past_the_context_is_refused(capsys):
    assert main(["generate", "--prompt", "hello", "--max-new-tokens", "9000"]) == 2
    err = capsys.readouterr().err
    assert "--prompt" in err and "8,192-token context" in err and "Traceback" not in err


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


PROBES = [
    # (argv with {placeholders}, words the message must contain)
    (["generate", "--prompt", "hi", "--temperature", "nan"], ["--temperature"]),
    (["generate", "--prompt", "hi", "--top-p", "2"], ["--top-p"]),
    (["generate", "--prompt", "hi", "--compile", "--no-cache"], ["--compile", "--no-cache"]),
    (["generate", "--prompt", "hi", "--model", "{tiny.gguf}"], ["tiny.gguf", "not a readable GGUF"]),
    (["generate", "--prompt", "hi", "--model", "{hf}"], ["model.safetensors", "not a readable safetensors"]),
]


@pytest.mark.parametrize("argv, words", PROBES, ids=probe_ids(PROBES))
def test_bad_input_gives_exit_2_and_a_message_naming_it(world, argv, words, capsys):
    assert_probe(argv, world, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["generate", "--prompt", "hi", "--top-k", "5"], ["--top-k", "greedy"]),
    (["generate", "--prompt", "hi", "--top-p", "0.5"], ["--top-p", "greedy"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)
