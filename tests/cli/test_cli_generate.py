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


def test_a_folder_without_tokenizer_json_or_no_folder_at_all_is_named(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    refused(["generate", "--prompt", "hi", "--model", tmp_path], capsys, "needs tokenizer.json beside config.json")
    refused(["generate", "--prompt", "hi", "--model", tmp_path / "nowhere"], capsys, "no such file or folder")


def test_a_completion_that_ends_at_its_first_token_says_so(monkeypatch, capsys):
    """An end-of-text first token: an empty completion, and a note that says why (it printed nothing before)."""
    import torch

    import attnkit.cli.language_models as lm
    import attnkit.decoding as decoding

    class Tokenizer:
        def encode(self, text, add_special_tokens=True):
            return type("Encoding", (), {"ids": [5, 6]})()

        def decode(self, ids):
            return "".join(chr(97 + i) for i in ids)

        def token_to_id(self, text):
            return None

    chat = type("Chat", (), {"eos_ids": [2], "eos": "</s>"})()
    model = type("Model", (torch.nn.Module,), {})()
    model.config = type("Config", (), {"max_len": 100})()
    monkeypatch.setattr(lm, "_load_lm", lambda spec: (model, Tokenizer(), chat))

    def ends_at_once(model, ids, **options):
        if options.get("on_tokens"):
            options["on_tokens"](torch.tensor([2]))
        return type("Result", (), {"tokens": torch.tensor([[2]] * ids.shape[0]), "lengths": [1] * ids.shape[0]})()

    monkeypatch.setattr(decoding, "generate", ends_at_once)
    assert main(["generate", "--prompt", "hi"]) == 0
    out, err = capsys.readouterr()
    assert out == "\n" and "an empty completion: the model's first token ended it" in err
    assert main(["generate", "--prompt", "hi", "ho", "--no-cache"]) == 0  # (a static batch: the engine needs a model)
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("[2] (an empty completion"), out


@pytest.mark.parametrize("argv, words", [
    (["generate", "--prompt", "hi", "--top-k", "5"], ["--top-k", "greedy"]),
    (["generate", "--prompt", "hi", "--top-p", "0.5"], ["--top-p", "greedy"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, words, run, phrase_file, tmp_path, capsys):
    files = {"pairs": phrase_file, "run": run, "tmp": tmp_path}
    refused(fill(argv, files), capsys, *words)


def test_a_seed_torch_cannot_take_is_refused_by_name(capsys):
    refused(["generate", "--prompt", "hi", "--seed", "99999999999999999999999"], capsys, "--seed",
            "[0, 9,223,372,036,854,775,807]")


@pytest.mark.slow  # loads SmolLM2
@pytest.mark.requires("smollm2")
def test_a_stop_that_is_not_one_token_is_refused(capsys):
    refused(["generate", "--prompt", "hi", "--stop", "the end"], capsys, "--stop 'the end' is not one token")


@pytest.mark.slow
@pytest.mark.requires("smollm2")
def test_chat_uses_the_models_own_template_as_transformers_renders_it():
    """--chat wrapped every prompt in a hard-coded ChatML; SmolLM2's GGUF carries its own template (with its
    default system turn): rendered as transformers renders it, and its EOS is a default stop."""
    pytest.importorskip("transformers")
    from attnkit.models.chat import chat_format_of_gguf, render_chat
    from attnkit.models.pretrained import smollm2_gguf

    chat = chat_format_of_gguf(smollm2_gguf())
    assert chat.template is not None and chat.eos == "<|im_end|>" and chat.eos_ids == (2,)
    ours = render_chat(chat, "What is the capital of France?")
    from transformers.utils.chat_template_utils import render_jinja_template

    theirs, _ = render_jinja_template(conversations=[[{"role": "user", "content": "What is the capital of France?"}]],
                                      chat_template=chat.template, add_generation_prompt=True,
                                      bos_token=chat.bos, eos_token=chat.eos)
    assert ours == theirs[0]
    assert "You are a helpful AI assistant named SmolLM" in ours and ours.endswith("<|im_start|>assistant\n")


def test_a_model_without_a_chat_template_refuses_chat():
    from attnkit.errors import InputError
    from attnkit.models.chat import ChatFormat, render_chat

    with pytest.raises(InputError, match="has no chat template"):
        render_chat(ChatFormat(template=None), "hi", source="--model x")


def _prompts_file(tmp_path):
    import json

    path = tmp_path / "prompts.txt"
    path.write_text("the cat sat\n\n" + json.dumps({"prompt": "a dog ran", "max_new_tokens": 3}) + "\n"
                    + json.dumps({"prompt": "the mat", "temperature": 0.8, "seed": 5, "stop": ["."]}) + "\n")
    return path


def test_many_prompts_run_through_the_engine_with_their_own_parameters(tmp_path, capsys):
    """--prompts FILE: a plain line and JSON lines with their own parameters, each completion printed as it finishes
    with its line number, the same tokens as generate on each alone; --out the completions as JSON lines; a closing
    line of figures."""
    import json

    import torch
    from tokenizers import Tokenizer

    pytest.importorskip("transformers")
    from attnkit.decoding import generate
    from attnkit.models.pretrained import load_hf_folder

    from helpers import lm_folder

    folder = lm_folder(tmp_path)
    capsys.readouterr()
    out = tmp_path / "completions.jsonl"
    assert main(["generate", "--model", str(folder), "--prompts", str(_prompts_file(tmp_path)), "--max-new-tokens", "5",
                 "--out", str(out), "--block-size", "4", "--quiet"]) == 0
    printed, err = capsys.readouterr()
    assert sorted(line.split("]")[0] for line in printed.splitlines()) == ["[1", "[3", "[4"]
    assert "3 of 3 requests" in err and "tokens/s" in err and "prefix hits" in err
    rows = {row["line"]: row for row in map(json.loads, out.read_text().splitlines())}
    model, tokenizer = load_hf_folder(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for line, prompt, new in ((1, "the cat sat", 5), (3, "a dog ran", 3)):
        ids = tokenizer.encode(prompt).ids
        want = generate(model, torch.tensor([ids]), max_new_tokens=new, stop_tokens=[3]).tokens[0].tolist()
        assert rows[line]["tokens"] == (want[:want.index(3) + 1] if 3 in want else want)
    assert rows[4]["finish_reason"] in ("stop", "length") and rows[1]["prompt"] == "the cat sat"


@pytest.mark.parametrize("content, words", [
    ('{"prompt": "the cat", "max_new_tokens": "3"}\n', ["line 1", "max_new_tokens must be int", "'3'"]),
    ('the cat\n{"prompt": "a", "beam": 3}\n', ["line 2", "unknown field 'beam'"]),
    ('{"prompt": "the cat"\n', ["line 1", "not valid JSON"]),
    ("\n\n", ["no prompt in the file"]),
])
def test_a_prompts_file_mistake_is_named_with_its_line(tmp_path, capsys, content, words):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    refused(["generate", "--prompts", path], capsys, *words)


def test_a_prompts_folder_or_missing_file_is_refused_by_what_it_is(tmp_path, capsys):
    refused(["generate", "--prompts", tmp_path], capsys, "a folder, not a file of prompts")
    refused(["generate", "--prompts", tmp_path / "absent.txt"], capsys, "absent.txt: no such file")


def test_prompt_and_prompts_together_or_neither_are_refused(tmp_path, capsys):
    path = tmp_path / "p.txt"
    path.write_text("the cat\n")
    refused(["generate", "--prompt", "hi", "--prompts", path], capsys, "--prompt TEXT... or --prompts FILE")
    refused(["generate"], capsys, "--prompt TEXT... or --prompts FILE")


def test_ctrl_c_keeps_what_finished(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the first completion: exit 130 without a traceback, the closing line, --out with what finished."""
    pytest.importorskip("transformers")
    import attnkit.serving.engine as engine

    from helpers import lm_folder

    folder = lm_folder(tmp_path)
    real_step, calls = engine.Engine.step, []

    def step(self):
        calls.append(1)
        if any(r.status == "finished" for r in self.requests.values()):
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(engine.Engine, "step", step)
    path = tmp_path / "p.txt"
    path.write_text('{"prompt": "the cat", "max_new_tokens": 1}\nthe dog ran\n')
    out = tmp_path / "done.jsonl"
    capsys.readouterr()
    code = main(["generate", "--model", str(folder), "--prompts", str(path), "--max-new-tokens", "40", "--out", str(out),
                 "--quiet"])
    _, err = capsys.readouterr()
    assert code == 130 and "Traceback" not in err and "1 of 2 requests" in err and "interrupted" in err
    assert len(out.read_text().splitlines()) == 1
