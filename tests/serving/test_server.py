"""``attnkit serve`` through the official ``openai`` client, on a server started on a free port: completions and chat
completions, streaming or not, give ``generate_many``'s tokens (greedy and seeded sampling); 32 concurrent streams
each equal their request alone; a client that drops its stream gives its blocks back; every bad request gets
OpenAI's error shape with a 4xx status while a good one is still served; /health and /metrics; an API key; Ctrl-C
and SIGTERM during streams end with exit status 0 and no traceback. The tiny Llama here; SmolLM2 and the hybrids
(Qwen3-Next, Mamba-2): tests/external/test_serving_server.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from attnkit.serving import Engine, generate_many  # noqa: E402
from attnkit.serving.server import EngineLoop, ServedModel, serve  # noqa: E402

from helpers import free_port  # noqa: E402

pytestmark = pytest.mark.slow  # (a server started on a port, real HTTP round trips: seconds)

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant{% endif %}")


class Running:
    """A server in a thread of this process (its engine loop in another), stopped by setting ``draining``."""

    def __init__(self, folder, api_key: str | None = None, **engine_options):
        from tokenizers import Tokenizer

        from attnkit.models.chat import chat_format_of_folder
        from attnkit.models.pretrained import load_hf_folder

        self.model = load_hf_folder(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.chat = chat_format_of_folder(folder, self.tokenizer)
        self.engine = Engine(self.model, **engine_options)
        self.served = ServedModel(EngineLoop(self.engine), "tiny", self.tokenizer, self.chat, tuple(self.chat.eos_ids),
                                  self.model.config.max_len, api_key)
        self.port = free_port()
        ready = threading.Event()
        self.thread = threading.Thread(target=serve, args=(self.served,),
                                       kwargs=dict(port=self.port, on_ready=ready.set), daemon=True)
        self.thread.start()
        assert ready.wait(60), "the server did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key: str = "none"):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def stop(self) -> None:
        self.served.draining.set()  # (the server stops at its next tick)
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from helpers import lm_folder

    folder = lm_folder(tmp_path_factory.mktemp("serve"))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def server(folder):
    running = Running(folder)
    yield running
    running.stop()


def _text(running: Running, tokens: list[int]) -> str:
    return running.tokenizer.decode([t for t in tokens if t not in running.chat.eos_ids])


def _expected(running: Running, prompt_ids: list[int], **options) -> str:
    return _text(running, generate_many(running.model, [prompt_ids], stop_tokens=running.chat.eos_ids, **options)[0])


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 7, "top_p": 0.9}], ids=["greedy", "seeded"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_gives_generate_manys_tokens(server, sampling, stream):
    client = server.client()
    prompt = "the cat sat on"
    ids = server.tokenizer.encode(prompt).ids
    want = _expected(server, ids, max_new_tokens=12, temperature=sampling["temperature"], seed=sampling.get("seed"),
                     top_p=sampling.get("top_p"))
    result = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, stream=stream, **sampling)
    if stream:
        chunks = list(result)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    else:
        text = result.choices[0].text
        assert result.usage.prompt_tokens == len(ids) and result.usage.completion_tokens >= 1
    assert text == want


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_completion_renders_the_models_template_and_gives_its_tokens(server, stream):
    from attnkit.models.chat import render_messages

    messages = [{"role": "system", "content": "a dog"}, {"role": "user", "content": "the cat sat"}]
    ids = server.tokenizer.encode(render_messages(server.chat, messages), add_special_tokens=False).ids
    want = _expected(server, ids, max_new_tokens=10)
    result = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                                     stream=stream)
    if stream:
        chunks = list(result)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = result.choices[0].message.content
        assert result.choices[0].message.role == "assistant" and result.object == "chat.completion"
    assert text == want


def test_thirty_two_concurrent_streams_each_equal_their_request_alone(server):
    prompts = [" ".join(["the", "cat", "dog", "sat", "on", "mat", "a", "ran"][i % 8:] + ["far"] * (i % 5))
               for i in range(32)]
    results: dict[int, str] = {}

    def one(index: int) -> None:
        chunks = server.client().completions.create(model="tiny", prompt=prompts[index], max_tokens=8, temperature=0,
                                                    stream=True)
        results[index] = "".join(c.choices[0].text for c in chunks if c.choices)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 32
    for index, prompt in enumerate(prompts):
        assert results[index] == _expected(server, server.tokenizer.encode(prompt).ids, max_new_tokens=8), index


def test_a_client_that_drops_its_stream_gives_its_blocks_back(server):
    def held() -> int:
        return server.served.loop.stats["blocks_in_use"]

    before = held()
    stream = server.client().completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=200,
                                                temperature=0, stream=True)
    for count, _ in enumerate(stream, 1):
        if count == 3:
            break
    stream.close()
    deadline = time.time() + 30
    while held() != before and time.time() < deadline:
        time.sleep(0.1)
    assert held() == before and not server.engine.has_unfinished()


def _post(running: Running, path: str, body, key: str | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(running.url + path, data=data, headers={"Content-Type": "application/json"} | (
        {"Authorization": f"Bearer {key}"} if key else {}))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


GOOD = {"model": "tiny", "prompt": "the cat", "max_tokens": 3, "temperature": 0}
BAD = [
    (b"{not json", 400, None),
    (GOOD | {"model": "gpt-4"}, 404, "model"),
    (GOOD | {"max_tokens": -3}, 400, "max_tokens"),
    (GOOD | {"max_tokens": 10**9}, 400, "max_tokens"),
    (GOOD | {"prompt": "the " * 300}, 400, "prompt"),
    (GOOD | {"temperature": "hot"}, 400, "temperature"),
    (GOOD | {"top_p": 0}, 400, "top_p"),
    (GOOD | {"seed": 1.5}, 400, "seed"),
    (GOOD | {"n": 0}, 400, "n"),
    (GOOD | {"stop": 3}, 400, "stop"),
    (GOOD | {"stream": "yes"}, 400, "stream"),
    (GOOD | {"prompt": ""}, 400, "prompt"),
    (GOOD | {"prompt": 7}, 400, "prompt"),
    (GOOD | {"prompt": ["the cat", "a dog"]}, 400, "prompt"),
    (GOOD | {"prompt": [5, 6]}, 400, "prompt"),
    (GOOD | {"logprobs": 2}, 400, "logprobs"),
    (GOOD | {"beam_width": 2}, 400, "beam_width"),
    ([1, 2], 400, None),
]


@pytest.mark.parametrize("body, status, param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_bad_completion_request_gets_openais_error_shape_and_the_server_goes_on(server, body, status, param):
    code, answer = _post(server, "/v1/completions", body)
    assert code == status, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["param"] == param
    code, answer = _post(server, "/v1/completions", GOOD)
    assert code == 200 and answer["choices"][0]["text"]


@pytest.mark.parametrize("messages", [[], "hello", [{"role": "user"}], [{"role": "wizard", "content": "x"}]])
def test_a_bad_chat_request_is_refused_by_name(server, messages):
    code, answer = _post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 2})
    assert code == 400 and answer["error"]["param"] == "messages"


def test_a_model_without_a_chat_template_refuses_chat_by_name(tmp_path):
    from helpers import lm_folder

    running = Running(lm_folder(tmp_path))
    try:
        code, answer = _post(running, "/v1/chat/completions", {"model": "tiny", "messages": [
            {"role": "user", "content": "the cat"}], "max_tokens": 2})
        assert code == 400 and "has no chat template" in answer["error"]["message"]
    finally:
        running.stop()


def test_n_choices_share_the_prompts_blocks(server):
    before = server.engine.stats()["prefix_hit_tokens"]
    result = server.client().completions.create(model="tiny", prompt="the cat sat on the mat " * 6, max_tokens=4,
                                                temperature=0.8, seed=3, n=3)
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    assert server.engine.stats()["prefix_hit_tokens"] > before  # the second and third took the first's blocks


def test_health_metrics_and_models(server):
    with urllib.request.urlopen(server.url + "/health", timeout=30) as response:
        assert response.status == 200
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    assert '# TYPE attnkit_blocks_in_use gauge' in text and 'attnkit_prefix_hit_tokens{model="tiny"}' in text
    assert [m.id for m in server.client().models.list().data] == ["tiny"]


def test_an_api_key_is_asked_for_when_set(folder):
    running = Running(folder, api_key="sesame")
    try:
        code, answer = _post(running, "/v1/completions", GOOD)
        assert code == 401 and answer["error"]["type"] == "authentication_error"
        code, _ = _post(running, "/v1/completions", GOOD, key="sesame")
        assert code == 200
        assert running.client("sesame").completions.create(**GOOD).choices[0].text
    finally:
        running.stop()


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_during_streams_ends_them_and_exits_0(folder, signal_name):
    """The command itself in a process of its own: two streams open, then the signal: each stream ends (an error
    chunk, then [DONE]), the process exits 0 within seconds, no traceback."""
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", str(folder), "--port", str(port), "--name",
                                "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = process.stderr.readline()
        assert "serving 'tiny'" in line, line + process.stderr.read()
        ended: list[str] = []

        def stream() -> None:
            from openai import OpenAI

            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
            try:
                for _ in client.completions.create(model="tiny", prompt="the cat", max_tokens=100000 // 1000,
                                                   temperature=0, stream=True, stop=["never"]):
                    time.sleep(0.05)
                ended.append("done")
            except Exception as error:  # the error chunk: the client raises it
                ended.append(type(error).__name__)

        threads = [threading.Thread(target=stream) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        process.send_signal(getattr(signal, signal_name))
        for thread in threads:
            thread.join(timeout=30)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and "Traceback" not in err, err
    assert len(ended) == 2
