"""Decoding for encoder-decoder models: greedy and beam search, batched, with alignments.

Works with any model that has ``encode(source, source_lengths) -> state``,
``step(state, tokens) -> StepOutput(logits (B, V), weights (B, S) | None)`` and a state with
``reorder(index)`` (:class:`~attnkit.models.Seq2Seq`, :class:`~attnkit.models.TransformerEncoderDecoder`).

Beam search keeps ``beam_size`` hypotheses per sentence, ranked by summed log-probability; a
hypothesis that has produced <eos> is frozen. The final choice divides each score by
``length ** length_penalty`` (length counts <eos>), so longer translations are not penalised
for having more factors below one (Wu et al. 2016 use a similar normalisation).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ._progress import progress_bar
from .data.batching import collate
from .data.tokenizer import BOS, EOS, PAD, Tokenizer

__all__ = ["Hypothesis", "Translation", "beam_search", "translate", "sample_next", "generate", "pad_prompts",
           "takes_fixed_caches"]


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # target ids without <bos>, ending before <eos>
    score: float  # summed log-probability including <eos>
    normalized_score: float  # score / (len(tokens) + 1) ** length_penalty
    weights: Tensor | None  # (steps, S) alignment: one row per output token (and <eos> if finished)
    finished: bool  # produced <eos> within max_length


@torch.no_grad()
def beam_search(
    model,
    source: Tensor,
    source_lengths: Tensor,
    *,
    beam_size: int = 5,
    max_length: int | None = None,
    length_penalty: float = 1.0,
) -> list[Hypothesis]:
    """The best hypothesis per source sentence; ``beam_size=1`` is greedy decoding.

    Args:
        source: (B, S) ids, source_lengths: (B,).
        max_length: most output tokens (default 2 S + 10); unfinished hypotheses stop there.
        length_penalty: alpha in score / length ** alpha; 0 ranks by raw log-probability.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    B, S = source.shape
    K = beam_size
    max_length = 2 * S + 10 if max_length is None else max_length
    state = model.encode(source, source_lengths)
    state.reorder(torch.arange(B, device=source.device).repeat_interleave(K))  # (B K) rows
    scores = torch.full((B, K), float("-inf"), device=source.device)
    scores[:, 0] = 0.0  # K identical start beams: keep one so the first step does not repeat it
    tokens = torch.full((B * K, 1), BOS, dtype=torch.long, device=source.device)
    finished = torch.zeros(B, K, dtype=torch.bool, device=source.device)
    lengths = torch.zeros(B, K, dtype=torch.long, device=source.device)
    history: Tensor | None = None  # (B K, t, S) alignment rows
    for _ in range(max_length):
        step = model.step(state, tokens[:, -1])
        log_probs = torch.log_softmax(step.logits.to(torch.promote_types(step.logits.dtype, torch.float32)), -1).view(B, K, -1)
        V = log_probs.shape[-1]
        # A finished hypothesis can only continue with <pad>, at no cost.
        frozen = torch.full_like(log_probs[0, 0], float("-inf"))
        frozen[PAD] = 0.0
        log_probs = torch.where(finished[..., None], frozen, log_probs)
        candidates = (scores[..., None] + log_probs).view(B, K * V)
        scores, flat = candidates.topk(K, dim=-1)  # (B, K)
        origin, token = flat // V, flat % V
        rows = (origin + torch.arange(B, device=source.device)[:, None] * K).view(-1)  # (B K,)
        state.reorder(rows, within_source=True)  # beams stay with their source
        was_finished = finished.gather(1, origin)
        lengths = lengths.gather(1, origin) + (~was_finished).long()
        finished = was_finished | (token == EOS)
        tokens = torch.cat([tokens.index_select(0, rows), token.view(-1, 1)], 1)
        if step.weights is not None:
            new = step.weights.float().index_select(0, rows)[:, None]  # (B K, 1, S)
            history = new if history is None else torch.cat([history.index_select(0, rows), new], 1)
        if finished.all():
            break
    normalized = scores / lengths.clamp(min=1).float() ** length_penalty
    best = normalized.argmax(-1)  # (B,)
    results = []
    for b in range(B):
        row = b * K + int(best[b])
        n = int(lengths[b, best[b]])
        ids = tokens[row, 1 : n + 1].tolist()
        done = bool(ids) and ids[-1] == EOS
        if done:
            ids = ids[:-1]
        weights = None if history is None else history[row, :n, : int(source_lengths[b])].cpu()
        results.append(Hypothesis(ids, float(scores[b, best[b]]), float(normalized[b, best[b]]), weights, done))
    return results


@dataclass(frozen=True)
class Translation:
    source: str
    text: str
    source_tokens: list[str]  # subword pieces of the source
    target_tokens: list[str]  # pieces of the output, then "</s>" if it ended
    weights: Tensor | None  # (len(target_tokens), len(source_tokens))
    score: float


def translate(
    model,
    texts: Sequence[str],
    source_tokenizer: Tokenizer,
    target_tokenizer: Tokenizer,
    *,
    beam_size: int = 5,
    batch_size: int = 64,
    max_length: int | None = None,
    length_penalty: float = 1.0,
    progress: bool = False,
) -> list[Translation]:
    """Translate ``texts`` in batches of similar length; results come back in input order.
    ``progress`` shows a tqdm bar (sentences)."""
    was_training = model.training
    model.eval()
    bar = progress_bar(total=len(texts), progress=progress, desc="translating", unit="sent")
    try:
        encoded = source_tokenizer.encode_batch(list(texts))
        for text, ids in zip(texts, encoded):
            if not ids:
                raise ValueError(f"source text has no tokens: {text!r}")
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        results: list[Translation | None] = [None] * len(texts)
        device = next(model.parameters()).device
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = collate([encoded[i] for i in chunk])
            hyps = beam_search(model, batch.source.to(device), batch.source_lengths.to(device), beam_size=beam_size,
                               max_length=max_length, length_penalty=length_penalty)
            for i, hyp in zip(chunk, hyps):
                results[i] = Translation(
                    source=texts[i],
                    text=target_tokenizer.decode(hyp.tokens),
                    source_tokens=[source_tokenizer.id_to_token(t) for t in encoded[i]],
                    target_tokens=[target_tokenizer.id_to_token(t) for t in hyp.tokens] + (["</s>"] if hyp.finished else []),
                    weights=hyp.weights,
                    score=hyp.normalized_score,
                )
            bar.update(len(chunk))
        return [r for r in results if r is not None]  # every index was filled
    finally:
        bar.close()
        model.train(was_training)


# -- decoder-only generation -------------------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    tokens: Tensor  # (B, new) generated ids (after a stop token: the stop token, then <pad>-like repeats cut)
    lengths: list[int]  # new tokens per row, the stop token included
    stopped: list[bool]  # whether each row produced a stop token


def sample_next(logits: Tensor, *, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> Tensor:
    """Next token ids (B,) from logits (B, V): greedy when ``temperature == 0``, otherwise sampled
    from softmax(logits / temperature) restricted to the ``top_k`` most likely tokens and to the
    smallest set whose probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # float64 stays float64
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep tokens until the mass reaches top_p
        drop[..., 0] = False  # the most likely token always stays (rounding could drop it for a tiny top_p)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@torch.no_grad()
def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Token-id prompts of different lengths as (input_ids, attention_mask) (B, L), padded on the
    left (the side generation needs: every row's last token is real)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def takes_fixed_caches(model) -> bool:
    """Whether ``model.new_cache(capacity=...)`` gives fixed-size caches, which ``compile_step`` decodes through."""
    new_cache = getattr(model, "new_cache", None)
    try:
        return new_cache is not None and "capacity" in inspect.signature(new_cache).parameters
    except (TypeError, ValueError):
        return False


def _growing_steps(model, input_ids: Tensor, attention_mask: Tensor | None, use_cache: bool):
    """``advance(token (B,) | None) -> next logits (B, V)`` through a growing cache (or none: every
    step reruns the prefix); None runs the prompt."""
    B = input_ids.shape[0]
    cache = model.new_cache() if use_cache else None
    generated: list[Tensor] = []
    state = {"mask": attention_mask,  # (B, prompt + generated) when padding is in play
             "positions": None if attention_mask is None else (attention_mask.long().cumsum(1) - 1).clamp(min=0)}

    def run(ids: Tensor) -> Tensor:
        kwargs = {}
        full_mask, positions = state["mask"], state["positions"]
        if full_mask is not None and positions is not None:  # the tokens so far: each layer reads what its cache attends
            kwargs = {"attention_mask": full_mask, "position_ids": positions[:, -ids.shape[1]:]}
        return model(ids, cache=cache, last_only=True, **kwargs).logits[:, -1]

    def advance(token: Tensor | None) -> Tensor:
        if token is None:
            return run(input_ids)
        generated.append(token)
        if state["mask"] is not None and state["positions"] is not None:
            state["mask"] = torch.cat([state["mask"], state["mask"].new_ones(B, 1)], 1)
            state["positions"] = torch.cat([state["positions"], state["positions"][:, -1:] + 1], 1)
        if cache is not None:
            return run(token[:, None])
        return run(torch.cat([input_ids, torch.stack(generated, 1)], 1))

    return advance


_FIXED_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (key, its fixed-size caches)


def _fixed_cache_steps(model, input_ids: Tensor, attention_mask: Tensor | None, max_new_tokens: int,
                       compile_step: bool | str):
    """``advance`` (as :func:`_growing_steps`) through fixed-size caches: after the prompt, every
    step has the same shapes and reads nothing from the device, and runs compiled.

    The caches stay with the model for its next call of the same batch, capacity, device, dtype
    and backend (transformers keeps its static cache the same way), zeroed: the step is compiled,
    and on CUDA its graph captured, once, not at every call (new cache tensors are new static
    addresses, which recompile). One set per model; another shape replaces it."""
    B, L = input_ids.shape
    capacity = L + max_new_tokens
    cuda = input_ids.is_cuda
    parameter = next(model.parameters(), None)
    key = (B, capacity, input_ids.device, None if parameter is None else parameter.dtype, compile_step)
    held = _FIXED_CACHES.get(model)  # the value holds no reference to the model: it can still be collected
    if held is not None and held[0] == key:
        cache = held[1]
        for layer in cache:
            layer.reset()
    else:
        cache = model.new_cache(capacity=capacity)
        _FIXED_CACHES[model] = (key, cache)

    def run(ids: Tensor, mask: Tensor | None, position_ids: Tensor | None) -> Tensor:
        return model(ids, cache=cache, attention_mask=mask, position_ids=position_ids, last_only=True).logits[:, -1]

    options: dict = {"fullgraph": True, "dynamic": False}
    if isinstance(compile_step, str):
        options["backend"] = compile_step
    elif cuda:
        options["mode"] = "reduce-overhead"  # CUDA graphs: one launch per step
    step = torch.compile(run, **options)  # the same code and the same cache tensors: Dynamo's cached graph
    graphs = cuda and not isinstance(compile_step, str)  # mode "reduce-overhead"
    full_mask = positions = None
    if attention_mask is not None:  # left padding: the whole (B, capacity) mask at once, and per-row positions
        full_mask = torch.cat([attention_mask, attention_mask.new_ones(B, max_new_tokens)], 1)
        positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
    state = {"positions": positions}

    def advance(token: Tensor | None) -> Tensor:
        if token is None:
            logits = run(input_ids, full_mask, state["positions"])  # the prompt, eager: its shape is its own
            for layer in cache:  # the storage every compiled step writes in place
                for tensor in layer.tensors():
                    torch._dynamo.mark_static_address(tensor)
            if state["positions"] is not None:
                state["positions"] = state["positions"][:, -1:]
            return logits
        if state["positions"] is not None:
            state["positions"] = state["positions"] + 1
        logits = step(token[:, None], full_mask, state["positions"])
        return logits.clone() if graphs else logits  # a CUDA graph reuses its output

    return advance


@torch.no_grad()  # no autograd records per op (host time on a GPU), no graph kept alive by a captured step
def generate(
    model,
    input_ids: Tensor,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] = (),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_tokens=None,
    attention_mask: Tensor | None = None,
    compile_step: bool | str = False,
) -> Generation:
    """Continue prompts input_ids (B, L) with a decoder-only LM.

    Prompts of different lengths are padded on the left with ``attention_mask`` (B, L) 0 at the
    padding (as :func:`pad_prompts` makes them): padded positions are never attended to and each
    row's positions count its real tokens only, so a row's output equals running it alone.
    With ``use_cache`` the prompt is run once and each new token attends to cached keys and values
    (a rolling cache under a sliding window); without it every step recomputes the whole prefix
    (the baseline the cache is measured against). ``on_tokens(ids (B,))`` (a CPU tensor) is called
    after every step, for streaming. Rows stop at a stop token; generation ends when all have.
    On an accelerator each step reads the device once (the new tokens and which rows stopped).

    ``compile_step``: decode through fixed-size caches (``model.new_cache(capacity=prompt +
    max_new_tokens)``, :class:`~attnkit.layers.FixedKVCache`), so that every step after the prompt
    has the same shapes and reads nothing from the device, and compile that step once with
    ``torch.compile(fullgraph=True)``; on CUDA in mode ``"reduce-overhead"`` (CUDA graphs). True
    uses the default backend (inductor, which needs a C++ compiler on a CPU); a string names the
    backend (``"aot_eager"`` checks the capture without compiling). The tokens are those of the
    plain cache (tests/test_generation.py). The fixed-size caches are kept with the model for its
    next call of the same batch size and length (one set per model), so only the first call
    compiles.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (B, L) with L >= 1, got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    B = input_ids.shape[0]
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
        attention_mask = attention_mask.bool()
        if not bool(attention_mask[:, -1].all()):
            raise ValueError("attention_mask: pad prompts on the left (every row's last token must be real)")
    was_training = model.training
    model.eval()
    stop = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long, device=input_ids.device)
    if not isinstance(compile_step, (bool, str)):
        raise TypeError(f"compile_step must be True, False or a torch.compile backend name, got "
                        f"{type(compile_step).__name__} {compile_step!r}")
    if compile_step is not False and not use_cache:
        raise ValueError("compile_step needs use_cache=True (it decodes through fixed-size caches)")
    if compile_step is not False and not takes_fixed_caches(model):
        raise ValueError(f"compile_step: {type(model).__name__} has no fixed-size caches (its new_cache takes no "
                         "capacity; a hybrid's linear layers carry a state that is replaced each step): generate "
                         "without compile_step")
    if compile_step is not False:
        advance = _fixed_cache_steps(model, input_ids, attention_mask, max_new_tokens, compile_step)
    else:
        advance = _growing_steps(model, input_ids, attention_mask, use_cache)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    lengths = [max_new_tokens] * B
    finished = [False] * B  # the host's copy of ``done``, from the one read per step
    new: list[Tensor] = []
    try:
        logits = advance(None)  # the prompt
        for step in range(max_new_tokens):
            token = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            token = torch.where(done, new[-1] if new else token, token)  # finished rows repeat their stop token
            new.append(token)
            hit = torch.isin(token, stop) & ~done if stop.numel() else torch.zeros_like(done)
            done = done | hit
            # The one read from the device per step: the tokens, which rows stopped, whether all have.
            host = torch.cat([token, hit.long(), done.all().long().view(1)]).tolist()
            if on_tokens is not None:
                on_tokens(torch.tensor(host[:B]))
            for b in range(B):
                if host[B + b]:
                    lengths[b] = step + 1
                    finished[b] = True
            if host[-1] or step == max_new_tokens - 1:
                break
            logits = advance(token)
    finally:
        model.train(was_training)
    tokens = torch.stack(new, 1)
    return Generation(tokens, lengths, finished)
