"""``attnkit serve``: an HTTP server in OpenAI's shape on the engine (Starlette and uvicorn).

    GET  /v1/models               the served model
    POST /v1/completions          prompt (a string, or a list of one), streaming or not
    POST /v1/chat/completions     messages, in the model's own chat template, streaming or not
    GET  /health                  200 while the engine runs
    GET  /metrics                 the engine's counters in Prometheus' text format

One thread owns the engine (:class:`EngineLoop`): it takes requests and cancellations from the HTTP handlers, steps
the engine while anything is unfinished, and hands each step's outputs to the handlers' asyncio queues. A request's
text is decoded as its tokens come (a piece that ends inside a multi-byte character waits for the next token); a
``stop`` string ends it where it first appears (the text before it is the completion, the request is cancelled). A
client that goes away mid-stream cancels its request: its blocks come back. A shutdown (Ctrl-C, SIGTERM) stops
accepting, ends the open streams with an error chunk and ``[DONE]``, and returns.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with a 4xx status for the caller's
mistakes; the server goes on serving the others.
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .engine import Engine, RequestOutput

__all__ = ["EngineLoop", "ServedModel", "create_app", "serve", "prometheus_text", "MAX_N"]

MAX_N = 16
"""Choices one request may ask for (``n``)."""


class EngineLoop(threading.Thread):
    """The thread that owns the engine: :meth:`submit` and :meth:`cancel` from any thread, outputs delivered to each
    request's ``deliver`` callback (in this thread); :attr:`stats` the engine's counters after the last step."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(name="attnkit-engine", daemon=True)
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._deliver: dict[int, Callable[[RequestOutput], None]] = {}
        self._stopped = threading.Event()
        self.stats = engine.stats()
        self.error: BaseException | None = None

    def submit(self, prompt_ids: list[int], options: dict, deliver: Callable[[RequestOutput], None]) -> Future:
        """Queue a request; the future holds its id (or the engine's refusal, a ValueError or TypeError)."""
        future: Future = Future()
        self._commands.put(("add", prompt_ids, options, deliver, future))
        return future

    def cancel(self, request_id: int) -> None:
        self._commands.put(("cancel", request_id))

    def stop(self) -> None:
        self._stopped.set()
        self._commands.put(("wake",))

    def run(self) -> None:
        engine = self.engine
        try:
            while not self._stopped.is_set():
                self._take_commands(block=not engine.has_unfinished())
                if engine.has_unfinished():
                    for out in engine.step():
                        deliver = self._deliver.get(out.request_id)
                        if deliver is not None:
                            deliver(out)
                        if out.finished:
                            self._deliver.pop(out.request_id, None)
                            engine.forget(out.request_id)
                    self.stats = engine.stats()
        except BaseException as error:  # a bug: every waiting handler hears of it, and /health says so
            self.error = error
            for deliver in list(self._deliver.values()):
                deliver(RequestOutput(-1, [], True, "error"))
            raise

    def _take_commands(self, block: bool) -> None:
        while True:
            try:
                command = self._commands.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if command[0] == "add":
                _, prompt_ids, options, deliver, future = command
                try:
                    request_id = self.engine.add_request(prompt_ids, **options)
                except (ValueError, TypeError) as error:
                    future.set_exception(error)
                    continue
                self._deliver[request_id] = deliver
                future.set_result(request_id)
            elif command[0] == "cancel":
                request_id = command[1]
                if request_id in self.engine.requests:  # one already finished and forgotten needs nothing
                    self.engine.cancel(request_id)


@dataclass
class ServedModel:
    """What the server serves: the engine's loop, the model's name, its tokenizer (``tokenizers.Tokenizer``) and chat
    format (:class:`~attnkit.models.chat.ChatFormat`), the token ids that end a completion, its positions."""

    loop: EngineLoop
    name: str
    tokenizer: object
    chat: object
    stop_ids: tuple[int, ...]
    max_len: float
    api_key: str | None = None
    draining: threading.Event = field(default_factory=threading.Event)


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.kind, self.code = param, status, kind, code


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def prometheus_text(stats: dict, model: str) -> str:
    """The engine's counters in Prometheus' text exposition format (``attnkit_`` names, the model as a label)."""
    lines = []
    label = '{model="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    for key, value in stats.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = f"attnkit_{key}"
        kind = "counter" if key in ("prefix_hit_tokens", "evictions", "preemptions", "steps", "generated_tokens",
                                    "computed_tokens", "finished") else "gauge"
        lines += [f"# TYPE {name} {kind}", f"{name}{label} {value}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ requests
_COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
                      "stream_options", "user", "stop_token_ids", "frequency_penalty", "presence_penalty", "logprobs",
                      "echo", "best_of", "logit_bias", "suffix"}
_CHAT_FIELDS = (_COMPLETION_FIELDS - {"prompt", "echo", "best_of", "suffix", "logprobs"}) | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
    "parallel_tool_calls"}
_UNSUPPORTED: dict[str, tuple] = {"logprobs": (None, False, 0), "echo": (None, False), "best_of": (None, 1), "logit_bias": (None, {}),
                "suffix": (None, ""), "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0),
                "tools": (None, []), "tool_choice": (None, "none"), "top_logprobs": (None, 0),
                "response_format": (None, {"type": "text"}), "parallel_tool_calls": (None, False, True)}


def _number(body: dict, key: str, default, low: float, high: float, *, integer: bool = False, low_open=False):
    value = body.get(key, default)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or (not integer and not math.isfinite(value)):
        raise _BadRequest(f"{key} must be {'an integer' if integer else 'a number'}, got {value!r}", key)
    if value < low or value > high or (low_open and value == low):
        bounds = f"{'(' if low_open else '['}{low}, {high}]"
        raise _BadRequest(f"{key} must lie in {bounds}, got {value!r}", key)
    return value


def _options(body: dict, served: ServedModel, fields: set[str], prompt_tokens: int) -> tuple[dict, list[str], int]:
    """The engine's options of a request (its sampling and stops), its stop strings, and ``n``; every field checked
    by name."""
    unknown = sorted(set(body) - fields)
    if unknown:
        raise _BadRequest(f"unknown field(s) {unknown}", unknown[0])
    for key, allowed in _UNSUPPORTED.items():
        if key in body and body[key] not in allowed:
            raise _BadRequest(f"{key} is not supported by attnkit serve (docs/serving.md), got {body[key]!r}", key)
    model = body.get("model")
    if not isinstance(model, str):
        raise _BadRequest(f"model must be a string, got {model!r}", "model")
    if model != served.name:
        raise _BadRequest(f"the model {model!r} does not exist: this server serves {served.name!r}", "model", 404,
                          code="model_not_found")
    room = int(min(served.max_len - prompt_tokens, 1 << 20))
    if room < 1:
        raise _BadRequest(f"the prompt ({prompt_tokens:,} tokens) fills the model's {served.max_len:,} positions",
                          "messages" if "messages" in body else "prompt", code="context_length_exceeded")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if key in body and body[key] is not None and isinstance(body[key], int) and not isinstance(body[key], bool) \
            and body[key] > room:
        raise _BadRequest(f"{key}={body[key]:,}: the prompt ({prompt_tokens:,} tokens) and the completion exceed the "
                          f"model's {served.max_len:,} positions (at most {room:,} new tokens)", key,
                          code="context_length_exceeded")
    max_tokens = _number(body, key, min(room, 16 if "prompt" in body else room), 1, room, integer=True)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _number(body, "top_k", None, 1, 1 << 30, integer=True)
    seed = _number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True)
    n = _number(body, "n", 1, 1, MAX_N, integer=True)
    stop = body.get("stop")
    strings = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if stop is not None and (not isinstance(stop, (str, list)) or not all(isinstance(s, str) and s for s in strings)
                             or len(strings) > 4):
        raise _BadRequest(f"stop must be a non-empty string or a list of at most 4 of them, got {stop!r}", "stop")
    token_ids = body.get("stop_token_ids") or []
    vocab = served.tokenizer.get_vocab_size()  # type: ignore[attr-defined]
    if not isinstance(token_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                  for t in token_ids):
        raise _BadRequest(f"stop_token_ids must be a list of token ids in [0, {vocab}), got {token_ids!r}",
                          "stop_token_ids")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _BadRequest(f"stream must be true or false, got {body['stream']!r}", "stream")
    options = {"max_new_tokens": max_tokens, "temperature": float(temperature),
               "top_p": None if top_p == 1 else float(top_p), "top_k": top_k, "seed": seed,
               "stop_tokens": list(dict.fromkeys([*served.stop_ids, *token_ids]))}
    return options, strings, n


def _prompt_ids(served: ServedModel, body: dict, chat: bool) -> tuple[list[int], str]:
    """The prompt's token ids and text: a completion's ``prompt`` (a string), a chat's ``messages`` in the model's
    template."""
    from ..errors import InputError
    from ..models.chat import render_messages

    tokenizer = served.tokenizer
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
        for index, message in enumerate(messages):
            if (not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "developer")
                    or not isinstance(message.get("content"), str)):
                raise _BadRequest(f"messages[{index}] must be {{\"role\": \"system\" | \"user\" | \"assistant\", "
                                  f"\"content\": a string}}, got {message!r}", "messages")
        if served.chat.template is None:  # type: ignore[attr-defined]
            raise _BadRequest(f"the model {served.name!r} has no chat template: use /v1/completions", "messages",
                              code="no_chat_template")
        try:
            text = render_messages(served.chat, [{"role": m["role"], "content": m["content"]} for m in messages],  # type: ignore[arg-type]
                                   source=served.name)
        except InputError as error:
            raise _BadRequest(str(error), "messages") from None
        return tokenizer.encode(text, add_special_tokens=False).ids, text  # type: ignore[attr-defined]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt:  # (OpenAI's batch of prompts, or token ids: one string a request here)
        raise _BadRequest(f"prompt must be one string (a request a prompt; token ids are not taken), got a list of "
                          f"{len(prompt)}", "prompt")
    if not isinstance(prompt, str) or not prompt:
        raise _BadRequest(f"prompt must be a non-empty string, got {prompt!r}", "prompt")
    ids = tokenizer.encode(prompt).ids  # type: ignore[attr-defined]
    if not ids:
        raise _BadRequest("prompt has no tokens", "prompt")
    return ids, prompt


@dataclass
class _Choice:
    """One choice's state while it generates: its engine request, its tokens, the text sent so far."""

    index: int
    request_id: int = -1
    tokens: list[int] = field(default_factory=list)
    sent: str = ""
    finish: str | None = None


class _Generation:
    """One HTTP request's choices, fed by the engine loop, read by the handler (its asyncio queue)."""

    def __init__(self, served: ServedModel, prompt_ids: list[int], options: dict, stops: list[str], n: int):
        self.served, self.prompt_ids, self.options, self.stops = served, prompt_ids, options, stops
        self.choices = [_Choice(i) for i in range(n)]
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    async def start(self) -> None:
        """Submit the n requests (their seeds seed, seed + 1, ...: n samples, not one n times). Where the engine
        caches prefixes, the first is submitted alone and the others once its prompt is computed, so that they take
        its prompt's blocks instead of computing them again (requests admitted in one step cannot: a block is
        hashed once it is computed)."""
        prompt_done = asyncio.Event()
        for choice in self.choices:
            options = dict(self.options)
            if options["seed"] is not None:
                options["seed"] += choice.index
            index = choice.index

            def deliver(out: RequestOutput, index: int = index) -> None:  # (the engine thread)
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, out))
                if index == 0 and (out.new_tokens or out.finished):
                    self.loop.call_soon_threadsafe(prompt_done.set)

            if index == 1 and self.served.loop.engine.prefix_caching_off is None:
                await prompt_done.wait()
            future = self.served.loop.submit(self.prompt_ids, options, deliver)
            try:
                choice.request_id = await asyncio.wrap_future(future)
            except (ValueError, TypeError) as error:
                self.cancel()
                raise _BadRequest(str(error)) from None

    def cancel(self) -> None:
        for choice in self.choices:
            if choice.request_id >= 0 and choice.finish is None:
                self.served.loop.cancel(choice.request_id)

    async def events(self) -> AsyncIterator[tuple[_Choice, str]]:
        """(choice, new text) as tokens come, until every choice has finished (``choice.finish`` set)."""
        tokenizer = self.served.tokenizer
        while any(choice.finish is None for choice in self.choices):
            if self.served.draining.is_set():
                raise _Draining
            try:
                index, out = await asyncio.wait_for(self.queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            choice = self.choices[index]
            if choice.finish is not None:
                continue
            if out.finish_reason == "error":
                raise RuntimeError("the engine stopped")
            choice.tokens.extend(t for t in out.new_tokens if t not in self.served.stop_ids)
            text = tokenizer.decode(choice.tokens)  # type: ignore[attr-defined]
            cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
            if cut >= 0:  # a stop string: the text before it, and the request ends here
                text, reason = text[:cut], "stop"
                if not out.finished:
                    self.served.loop.cancel(choice.request_id)
            elif out.finished:
                reason = "length" if out.finish_reason == "length" else "stop"
            else:
                if text.endswith("\ufffd"):
                    continue  # (a character cut between tokens: wait for the rest)
                reason = None
                text = text[:len(text) - _held_back(text, self.stops)]  # (what may begin a stop string waits)
            new = text[len(choice.sent):] if len(text) >= len(choice.sent) else ""
            choice.sent = max(text, choice.sent, key=len)
            choice.finish = reason
            yield choice, new


def _held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a stop string (sent once they cannot)."""
    return max((k for stop in stops for k in range(min(len(stop) - 1, len(text)), 0, -1) if text.endswith(stop[:k])),
               default=0)


class _Draining(Exception):
    """The server is shutting down: an open stream ends with an error chunk."""


def create_app(served: ServedModel):
    """The Starlette application serving ``served`` (module docstring)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def authorised(request: Request):
        if served.api_key is None:
            return None
        header = request.headers.get("authorization", "")
        if header != f"Bearer {served.api_key}":
            return _error(401, "missing or wrong API key (Authorization: Bearer <key>)", "authentication_error",
                          code="invalid_api_key")
        return None

    async def models(request: Request):
        refused = authorised(request)
        if refused is not None:
            return refused
        return JSONResponse({"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                                         "owned_by": "attnkit"}]})

    async def health(request: Request):
        if served.loop.error is not None or not served.loop.is_alive():
            return _error(503, "the engine stopped", "server_error")
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request):
        return PlainTextResponse(prometheus_text(served.loop.stats, served.name),
                                 media_type="text/plain; version=0.0.4")

    async def completions(request: Request):
        return await _generate(request, chat=False)

    async def chat_completions(request: Request):
        return await _generate(request, chat=True)

    async def _generate(request: Request, chat: bool):
        refused = authorised(request)
        if refused is not None:
            return refused
        if served.draining.is_set():
            return _error(503, "the server is shutting down", "server_error")
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return _error(400, f"the body is not valid JSON: {error}")
        try:
            if not isinstance(body, dict):
                raise _BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
            prompt_ids, _ = _prompt_ids(served, body, chat)
            options, stops, n = _options(body, served, _CHAT_FIELDS if chat else _COMPLETION_FIELDS, len(prompt_ids))
            generation = _Generation(served, prompt_ids, options, stops, n)
            await generation.start()
        except _BadRequest as error:
            return _error(error.status, str(error), error.kind, error.param, error.code)
        identifier = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())

        def usage() -> dict:
            completion = sum(len(choice.tokens) for choice in generation.choices)
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                    "total_tokens": len(prompt_ids) + completion}

        if body.get("stream"):
            return StreamingResponse(_stream(request, generation, identifier, created, chat, body, usage),
                                     media_type="text/event-stream")
        try:
            async for _ in generation.events():
                if await request.is_disconnected():
                    generation.cancel()
                    return _error(499, "the client went away", "client_closed")
        except _Draining:
            generation.cancel()
            return _error(503, "the server is shutting down", "server_error")
        choices = [({"index": c.index, "message": {"role": "assistant", "content": c.sent}, "logprobs": None,
                     "finish_reason": c.finish} if chat else
                    {"index": c.index, "text": c.sent, "logprobs": None, "finish_reason": c.finish})
                   for c in generation.choices]
        return JSONResponse({"id": identifier, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": served.name, "choices": choices, "usage": usage()})

    async def _stream(request, generation: _Generation, identifier: str, created: int, chat: bool, body: dict, usage):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: _Choice, text: str | None, finish: str | None, first: bool = False) -> str:
            if chat:
                delta = ({"role": "assistant", "content": ""} if first else {} if text is None else {"content": text})
                entry = {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                entry = {"index": choice.index, "text": text or "", "logprobs": None, "finish_reason": finish}
            return "data: " + json.dumps({"id": identifier, "object": kind, "created": created, "model": served.name,
                                          "choices": [entry]}) + "\n\n"

        try:
            if chat:
                for choice in generation.choices:
                    yield chunk(choice, None, None, first=True)
            async for choice, text in generation.events():
                if await request.is_disconnected():
                    generation.cancel()
                    return
                if text or choice.finish is None:
                    yield chunk(choice, text, None)
                if choice.finish is not None:
                    yield chunk(choice, None if chat else "", choice.finish)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield "data: " + json.dumps({"id": identifier, "object": kind, "created": created,
                                             "model": served.name, "choices": [], "usage": usage()}) + "\n\n"
        except _Draining:
            generation.cancel()
            yield "data: " + json.dumps({"error": {"message": "the server is shutting down", "type": "server_error",
                                                   "param": None, "code": None}}) + "\n\n"
        except asyncio.CancelledError:  # the client went away: its requests' blocks come back
            generation.cancel()
            raise
        finally:
            generation.cancel()
        yield "data: [DONE]\n\n"

    routes = [Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]), Route("/health", health),
              Route("/metrics", metrics)]
    app = Starlette(routes=routes)

    async def not_found(request, exc):
        return _error(404, f"no route {request.url.path}", code="not_found")

    async def method_not_allowed(request, exc):
        return _error(405, f"{request.method} is not served at {request.url.path}")

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, method_not_allowed)
    return app


def serve(served: ServedModel, *, host: str = "127.0.0.1", port: int = 8000, on_ready=None) -> None:
    """Serve until Ctrl-C or SIGTERM (or ``served.draining`` is set): the engine loop started, uvicorn run on
    ``host:port``; a signal stops accepting, ends the open streams (an error chunk, then ``[DONE]``) and returns
    normally (uvicorn would raise the signal again after its graceful shutdown: a command's exit status would then be
    130, not 0). ``on_ready()`` is called once the socket listens."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            served.draining.set()
            if self.should_exit and sig == 2:  # a second Ctrl-C: at once
                self.force_exit = True
            self.should_exit = True

        async def on_tick(self, counter: int) -> bool:  # (also stops when ``draining`` is set from elsewhere)
            return served.draining.is_set() or await super().on_tick(counter)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if on_ready is not None and not self.should_exit:
                on_ready()

    config = uvicorn.Config(create_app(served), host=host, port=port, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=5, access_log=False)
    served.loop.start()
    try:
        _Server(config).run()
    finally:
        served.draining.set()
        served.loop.stop()
        served.loop.join(timeout=10)
