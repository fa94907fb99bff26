"""``attnkit serve`` on real weights and on the hybrids, through the official ``openai`` client: SmolLM2-135M (its
GGUF, its own chat template) and tiny Qwen3-Next and Mamba-2 checkpoints saved by transformers (a word-level
tokenizer and a chat template beside them): completions and chat completions, streaming or not, greedy and seeded
sampling, give ``generate_many``'s tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
transformers = pytest.importorskip("transformers")

from attnkit.serving import Engine, generate_many  # noqa: E402
from attnkit.serving.server import EngineLoop, ServedModel, serve  # noqa: E402

from helpers import free_port  # noqa: E402
from serving_families import VOCAB, family_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}{% if add_generation_prompt %}w3{% endif %}")


def _word_folder(family: str, folder):
    """A tiny checkpoint of ``family`` with a word-level tokenizer (``w0`` .. ``w59``) and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    _, model = family_checkpoint(family, folder)
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return model, tokenizer


def _start(model, tokenizer, chat, name: str):
    import threading

    served = ServedModel(EngineLoop(Engine(model)), name, tokenizer, chat, tuple(chat.eos_ids),
                         getattr(model.config, "max_len", float("inf")))
    port, ready = free_port(), threading.Event()
    thread = threading.Thread(target=serve, args=(served,), kwargs=dict(port=port, on_ready=ready.set), daemon=True)
    thread.start()
    assert ready.wait(120)
    from openai import OpenAI

    return served, thread, OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)


def _check(model, tokenizer, chat, name: str, prompt: str, messages: list[dict]) -> None:
    from attnkit.models.chat import render_messages

    served, thread, client = _start(model, tokenizer, chat, name)
    try:
        def expected(ids, **options) -> str:
            tokens = generate_many(model, [ids], stop_tokens=chat.eos_ids, **options)[0]
            return tokenizer.decode([t for t in tokens if t not in chat.eos_ids])

        ids = tokenizer.encode(prompt).ids
        chat_ids = tokenizer.encode(render_messages(chat, messages), add_special_tokens=False).ids
        # greedy and seeded sampling, each through both routes, one streamed and the other not
        for sampling, stream in (({"temperature": 0}, False), ({"temperature": 0.8, "seed": 4}, True)):
            options = dict(max_new_tokens=8, temperature=sampling["temperature"], seed=sampling.get("seed"))
            want, want_chat = expected(ids, **options), expected(chat_ids, **options)
            result = client.completions.create(model=name, prompt=prompt, max_tokens=8, stream=stream, **sampling)
            text = "".join(c.choices[0].text for c in result if c.choices) if stream else result.choices[0].text
            assert text == want, (name, sampling, stream)
            result = client.chat.completions.create(model=name, messages=messages, max_tokens=8, stream=not stream,
                                                    **sampling)
            text = ("".join(c.choices[0].delta.content or "" for c in result if c.choices) if not stream
                    else result.choices[0].message.content)
            assert text == want_chat, (name, sampling, not stream, "chat")
    finally:
        served.draining.set()
        thread.join(timeout=60)


@pytest.mark.parametrize("family", ["qwen3_next", "mamba2"])
def test_a_hybrid_served_gives_generate_manys_tokens(family, tmp_path):
    from attnkit.models.chat import chat_format_of_folder

    model, tokenizer = _word_folder(family, tmp_path)
    chat = chat_format_of_folder(tmp_path, tokenizer)
    _check(model, tokenizer, chat, family, " ".join(f"w{i}" for i in (5, 9, 13, 22, 7, 31)),
           [{"role": "user", "content": "w5 w6 w7"}])


@pytest.mark.requires("smollm2")
def test_smollm2_served_gives_generate_manys_tokens():
    from attnkit.models.chat import chat_format_of_gguf
    from attnkit.models.pretrained import load_gguf, smollm2_gguf

    model, tokenizer, _ = load_gguf(smollm2_gguf())
    chat = chat_format_of_gguf(smollm2_gguf())
    _check(model, tokenizer, chat, "smollm2", "The capital of France is",
           [{"role": "user", "content": "What is the capital of France?"}])
