"""A model's own chat template and end-of-text tokens, from where its weights came from.

An instruction-tuned model expects its conversations in the format it was trained on: the Jinja
template its tokenizer ships (a GGUF file's ``tokenizer.chat_template``; a Hugging Face folder's
``chat_template.jinja`` or ``tokenizer_config.json``), rendered as transformers renders it (a sandboxed
Jinja environment, ``add_generation_prompt``, ``raise_exception``), with the tokenizer's BOS and EOS
tokens. A model without a template has none: nothing is guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .._files import read_json
from ..errors import InputError

__all__ = ["ChatFormat", "chat_format_of_gguf", "chat_format_of_folder", "render_chat", "render_messages"]


@dataclass(frozen=True)
class ChatFormat:
    """A model's chat template (None: it has none) and its special tokens: ``bos`` / ``eos`` as text,
    ``eos_ids`` the token ids that end a generation."""

    template: str | None
    bos: str | None = None
    eos: str | None = None
    eos_ids: tuple[int, ...] = ()


def chat_format_of_gguf(path: str | os.PathLike) -> ChatFormat:
    """The chat template and special tokens a GGUF file records (``tokenizer.chat_template``,
    ``tokenizer.ggml.bos_token_id`` / ``eos_token_id``)."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(name: str):
        value = reader.fields.get(name)
        return None if value is None else value.contents()

    tokens = field("tokenizer.ggml.tokens") or []
    bos_id, eos_id = field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.eos_token_id")
    token = (lambda i: tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None)  # noqa: E731
    return ChatFormat(template=field("tokenizer.chat_template"), bos=token(bos_id), eos=token(eos_id),
                      eos_ids=() if token(eos_id) is None else (int(eos_id),))


def chat_format_of_folder(folder: str | os.PathLike, tokenizer) -> ChatFormat:
    """The chat template and special tokens of a Hugging Face folder: ``chat_template.jinja`` or
    ``tokenizer_config.json``'s ``chat_template``; BOS / EOS from ``tokenizer_config.json``, the EOS ids
    also from ``config.json``'s ``eos_token_id`` (an int or a list)."""
    folder = Path(folder)
    config = read_json(folder / "tokenizer_config.json", "tokenizer config") if (folder / "tokenizer_config.json").is_file() else {}
    template = config.get("chat_template") if isinstance(config, dict) else None
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)

    def text(value):
        return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None

    bos, eos = text(config.get("bos_token")), text(config.get("eos_token"))
    eos_ids: list[int] = []
    model_config = read_json(folder / "config.json", "Hugging Face config") if (folder / "config.json").is_file() else {}
    listed = model_config.get("eos_token_id") if isinstance(model_config, dict) else None
    eos_ids += [listed] if isinstance(listed, int) else [i for i in listed or [] if isinstance(i, int)]
    if eos is not None and tokenizer.token_to_id(eos) is not None:
        eos_ids.append(tokenizer.token_to_id(eos))
    return ChatFormat(template=template if isinstance(template, str) else None, bos=bos, eos=eos,
                      eos_ids=tuple(dict.fromkeys(eos_ids)))


def render_chat(chat: ChatFormat, prompt: str, *, source: str = "the model") -> str:
    """``prompt`` as one user turn, in the model's template, ready for the assistant's reply
    (``add_generation_prompt``). Raises :class:`InputError` where the model has no template, or where
    the template raises (its own ``raise_exception``)."""
    return render_messages(chat, [{"role": "user", "content": prompt}], source=source)


def render_messages(chat: ChatFormat, messages: list[dict], *, source: str = "the model") -> str:
    """A conversation (``[{"role": ..., "content": ...}, ...]``, as OpenAI's chat API and transformers take it) in
    the model's template, ready for the assistant's reply; refused as :func:`render_chat` refuses."""
    if chat.template is None:
        raise InputError(f"{source} has no chat template (its tokenizer ships none): leave out --chat and give the "
                         "prompt in the format the model expects")
    import json

    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    # transformers' environment for chat templates: trimmed blocks, loop controls, a JSON filter that
    # escapes no HTML, raise_exception
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = lambda x, ensure_ascii=False, indent=None: json.dumps(x, ensure_ascii=ensure_ascii,
                                                                                          indent=indent)
    environment.globals["raise_exception"] = raise_exception
    try:
        return environment.from_string(chat.template).render(
            messages=messages, add_generation_prompt=True,
            bos_token=chat.bos or "", eos_token=chat.eos or "")
    except TemplateError as error:
        raise InputError(f"{source}'s chat template refused the conversation: {error}") from error
