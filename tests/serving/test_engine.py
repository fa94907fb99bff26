"""The engine on attnkit's own tiny models (a Llama-shaped decoder, the same with sliding-window layers, and a
Mamba-2 model: a KV group, a window group and state slots): every request's tokens equal ``generate`` on its prompt
alone whatever the arrival, the token budget, the block size or the prefix cache; the pool's accounting after
every step; preemption; prefix hits; cancellation; bad input; and a randomized run that must end with nothing
held. The families loaded from transformers' checkpoints: tests/external/test_serving_families.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.decoding import generate
from attnkit.models import DecoderConfig, DecoderLM
from attnkit.models.mamba2 import Mamba2Config, Mamba2LM
from attnkit.serving import Engine, generate_many

from helpers import slow

VOCAB = 97


def _llama(window: int | None = None, window_layers=None) -> DecoderLM:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=VOCAB, d_model=48, num_heads=6, num_kv_heads=2, num_layers=2, d_ff=64,
                           max_len=2048, positional="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                           tie_embeddings=False, window=window, window_layers=window_layers)
    return DecoderLM(config).eval()


def _mamba2() -> Mamba2LM:
    torch.manual_seed(0)
    return Mamba2LM(Mamba2Config(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, head_dim=16, state_size=8,
                                 n_groups=2)).eval()


MODELS = {"llama": _llama, "window": lambda: _llama(window=6, window_layers=(1,)), "mamba2": _mamba2}


def _prompts(count: int, seed: int = 0, longest: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=g).tolist()
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _alone(model, prompt: list[int], new: int, **options) -> list[int]:
    return generate(model, torch.tensor([prompt]), max_new_tokens=new, **options).tokens[0].tolist()


def _staggered(engine: Engine, prompts, per_step: int, check=None, **params) -> list[int]:
    """Add ``per_step`` requests before each step until all are in, then step to the end; ``check(engine)`` after
    every step."""
    ids, queue = [], list(prompts)
    while queue or engine.has_unfinished():
        for _ in range(per_step):
            if queue:
                ids.append(engine.add_request(queue.pop(0), **params))
        engine.step()
        if check is not None:
            check(engine)
    return ids


@pytest.mark.parametrize("family", [slow("llama"), slow("window"), "mamba2"])
def test_requests_arriving_over_steps_get_the_tokens_of_their_prompts_alone(family):
    model = MODELS[family]()
    prompts = _prompts(12, seed=1)
    engine = Engine(model, block_size=4, max_batched_tokens=24)
    ids = _staggered(engine, prompts, per_step=4, max_new_tokens=7)
    for request, prompt in zip(ids, prompts):
        assert engine.tokens(request) == _alone(model, prompt, 7), prompt
        assert engine.finish_reason(request) == "length" and len(engine.logprobs(request)) == 7


@pytest.mark.slow
def test_a_request_alone_gets_generates_logits_to_the_bit():
    """One request through the engine runs the computations generate runs (one prefill, then one token a step):
    the same tokens and the same log-probabilities, exactly."""
    model = _llama()
    prompt = _prompts(1, seed=2)[0]
    engine = Engine(model, block_size=16, max_batched_tokens=4096)
    request = engine.add_request(prompt, max_new_tokens=9)
    while engine.has_unfinished():
        engine.step()
    tokens, want = [], []
    with torch.no_grad():
        cache = model.new_cache()
        step = model(torch.tensor([prompt]), cache=cache, last_only=True).logits[0, -1]
        for _ in range(9):
            token = int(step.argmax())
            tokens.append(token)
            want.append(float(torch.log_softmax(step, -1)[token]))
            step = model(torch.tensor([[token]]), cache=cache, last_only=True).logits[0, -1]
    assert engine.tokens(request) == tokens and engine.logprobs(request) == want


@pytest.mark.parametrize("budget", [7, 64, slow(4096)])
@pytest.mark.parametrize("block_size", [slow(1), 16, 32])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_the_tokens_do_not_depend_on_the_budget_the_block_size_or_the_prefix_cache(budget, block_size,
                                                                                      prefix_caching):
    model = _llama()
    shared = _prompts(1, seed=3, longest=40)[0] + [5] * 30
    prompts = [shared[:n] + tail for n, tail in ((70, [7, 8]), (70, [9]), (35, [1, 2, 3]), (70, []))]
    engine = Engine(model, block_size=block_size, max_batched_tokens=budget, prefix_caching=prefix_caching)
    ids = _staggered(engine, prompts, per_step=2, max_new_tokens=5)
    assert [engine.tokens(i) for i in ids] == [_alone(model, p, 5) for p in prompts]
    if prefix_caching and block_size <= 16:
        assert engine.stats()["prefix_hit_tokens"] > 0


def _accounting(engine: Engine) -> None:
    """After a step: the blocks in use are the ones the live requests hold (a shared one once; a window's capped),
    the bytes held are those blocks' bytes, a state slot per live request, the pool's books consistent."""
    stats = engine.stats()
    live = engine.scheduler.running
    assert stats["blocks_in_use"] == engine.held_blocks()
    for group in engine.groups:
        group.pool.check()
        if group.window is not None:
            cap = math.ceil((group.window + engine.max_batched_tokens) / engine.block_size) + 1
            assert all(sum(b is not None for b in r.tables.get(group.window, [])) <= cap for r in live)
    per_block = {group.window: sum(engine.storage[i].bytes_per_block() for i, kind in enumerate(engine.kinds)
                                   if kind is not None and kind[0] != "state" and kind[1] == group.window)
                 for group in engine.groups}
    assert stats["bytes_held"] == sum(group.pool.in_use * per_block[group.window] for group in engine.groups)
    assert stats["slots_in_use"] == (len(live) if engine.states else 0)


@pytest.mark.parametrize("family", list(MODELS))
def test_the_pools_accounting_holds_after_every_step(family):
    model = MODELS[family]()
    engine = Engine(model, block_size=4, max_batched_tokens=16, num_blocks=400)
    ids = _staggered(engine, _prompts(10, seed=4), per_step=3, check=_accounting, max_new_tokens=12)
    assert all(engine.finish_reason(i) == "length" for i in ids)
    stats = engine.stats()
    assert stats["blocks_in_use"] == stats["slots_in_use"] == stats["running"] == 0
    if family == "window":  # the window's blocks came back while the requests still ran
        assert stats["bytes_per_block"] > 0


@pytest.mark.parametrize("family", ["llama", "window"])
def test_a_pool_too_small_for_everyone_preempts_and_still_gives_every_request_its_tokens(family):
    """12 blocks of 8 tokens for 8 requests of 12-40 tokens and 16 new: requests are preempted (their blocks
    freed, recomputed when readmitted) and every one finishes with its tokens alone."""
    model = MODELS[family]()
    prompts = [p for p in _prompts(40, seed=5, longest=40) if len(p) >= 12][:8]
    engine = Engine(model, block_size=8, num_blocks=12, max_batched_tokens=64)
    ids = [engine.add_request(p, max_new_tokens=16) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        _accounting(engine)
    assert engine.stats()["preemptions"] > 0
    assert [engine.tokens(i) for i in ids] == [_alone(model, p, 16) for p in prompts]


@pytest.mark.slow
def test_eight_requests_sharing_a_prefix_compute_it_once():
    """A 256-token prefix shared by 8 requests: the first computes it, the others hit its 16 blocks (>= 7 x 16
    blocks of hits); a salted request hits none; the tokens are the ones computed without the cache."""
    model = _llama()
    prefix = torch.randint(3, VOCAB, (256,), generator=torch.Generator().manual_seed(6)).tolist()
    prompts = [prefix + [3 + i, 50 + i] for i in range(8)]
    engine = Engine(model, block_size=16)
    first = engine.add_request(prompts[0], max_new_tokens=4)
    while engine.has_unfinished():
        engine.step()
    ids = [first] + [engine.add_request(p, max_new_tokens=4) for p in prompts[1:]]
    while engine.has_unfinished():
        engine.step()
    assert engine.stats()["prefix_hit_tokens"] >= 7 * 256
    salted = engine.add_request(prompts[1], max_new_tokens=4, salt="another tenant")
    before = engine.stats()["prefix_hit_tokens"]
    while engine.has_unfinished():
        engine.step()
    assert engine.stats()["prefix_hit_tokens"] == before
    cold = generate_many(model, prompts, max_new_tokens=4, prefix_caching=False)
    assert [engine.tokens(i) for i in ids] == cold and engine.tokens(salted) == cold[1]


def test_two_different_blocks_forced_to_one_hash_are_a_miss(monkeypatch):
    import attnkit.serving.scheduler as scheduler

    monkeypatch.setattr(scheduler, "block_hash", lambda parent, tokens, salt: b"the same")
    model = _llama()
    a, b = [4] * 40, [5] * 40
    engine = Engine(model, block_size=16)
    ids = _staggered(engine, [a, b], per_step=1, max_new_tokens=3)
    assert engine.stats()["prefix_hit_tokens"] == 0
    assert [engine.tokens(i) for i in ids] == [_alone(model, a, 3), _alone(model, b, 3)]


def test_prefix_caching_is_off_with_the_reason_where_it_would_not_be_exact():
    assert Engine(_mamba2()).stats()["prefix_caching_off"].startswith("a model with linear layers")
    assert Engine(_llama(window=6)).stats()["prefix_caching_off"] == "a model with sliding-window layers"
    assert Engine(_llama()).stats()["prefix_caching"] is True


@pytest.mark.slow
def test_seeded_sampling_gives_the_same_tokens_alone_or_among_fifteen_others():
    model = _llama()
    prompts = _prompts(16, seed=8)
    options = dict(max_new_tokens=8, temperature=0.9, top_k=20, top_p=0.9)
    together = generate_many(model, prompts, seed=list(range(16)), **options)
    for index in (0, 7, 15):
        alone = generate_many(model, [prompts[index]], seed=index, **options)[0]
        assert together[index] == alone
        generator = torch.Generator().manual_seed(index)
        assert alone == _alone(model, prompts[index], 8, temperature=0.9, top_k=20, top_p=0.9, generator=generator)


def test_a_stop_token_ends_a_request_and_is_its_last():
    model = _llama()
    prompt = _prompts(1, seed=9)[0]
    free = _alone(model, prompt, 10)
    stop = free[4]
    tokens = generate_many(model, [prompt], max_new_tokens=10, stop_tokens=[stop])[0]
    assert tokens == free[:free.index(stop) + 1]


@pytest.mark.slow
def test_cancelling_frees_a_request_at_the_next_step_in_prefill_or_decode():
    model = _llama()
    engine = Engine(model, block_size=4, max_batched_tokens=8)
    long, short = engine.add_request(list(range(3, 60)), max_new_tokens=20), engine.add_request([5, 6], max_new_tokens=20)
    engine.step()
    assert engine.cancel(long)  # mid-prefill
    for _ in range(3):
        engine.step()
    assert engine.cancel(short)  # mid-decode
    outputs = engine.step()
    assert any(o.request_id == short and o.finished and o.finish_reason == "cancelled" for o in outputs)
    assert engine.finish_reason(long) == "cancelled" and not engine.has_unfinished()
    assert engine.stats()["blocks_in_use"] == 0 and not engine.cancel(short)


@pytest.mark.parametrize("call, error, words", [
    (lambda e: e.add_request([], max_new_tokens=3), ValueError, "prompt_ids is empty"),
    (lambda e: e.add_request([1, VOCAB], max_new_tokens=3), ValueError, f"prompt_ids[1] = {VOCAB} is not a token id"),
    (lambda e: e.add_request([1, -2], max_new_tokens=3), ValueError, "prompt_ids[1] = -2"),
    (lambda e: e.add_request([1, 2], max_new_tokens=0), ValueError, "max_new_tokens must be an int >= 1, got 0"),
    (lambda e: e.add_request([1, 2], max_new_tokens=-5), ValueError, "max_new_tokens must be an int >= 1"),
    (lambda e: e.add_request([1] * 2000, max_new_tokens=100), ValueError, "exceed the model's 2,048 positions"),
    (lambda e: e.add_request([1, 2], max_new_tokens=3, temperature=-1), ValueError, "temperature must be"),
    (lambda e: e.add_request([1, 2], max_new_tokens=3, stop_tokens=[VOCAB + 1]), ValueError, "stop_tokens[0]"),
    (lambda e: e.cancel(12345), KeyError, "request_id 12345 is not a request of this engine"),
    (lambda e: e.add_request(list(range(3, 90)), max_new_tokens=2), ValueError, "cannot hold this request"),
])
def test_bad_input_is_refused_by_name_and_the_engine_keeps_serving_the_others(call, error, words):
    model = _llama()
    engine = Engine(model, block_size=4, num_blocks=8)  # 32 positions
    good = engine.add_request([7, 8, 9], max_new_tokens=4)
    with pytest.raises(error) as info:
        call(engine)
    assert words in str(info.value)
    while engine.has_unfinished():
        engine.step()
    assert engine.tokens(good) == _alone(model, [7, 8, 9], 4)


def test_an_encoder_decoder_is_refused_by_name():
    from attnkit.models import Seq2Seq, Seq2SeqConfig

    with pytest.raises(TypeError, match="decoder-only language models.*encoder-decoder"):
        Engine(Seq2Seq(Seq2SeqConfig(source_vocab=10, target_vocab=10)))


def test_stream_yields_a_requests_tokens_as_they_come():
    model = _llama()
    engine = Engine(model)
    other = engine.add_request([9, 9, 9], max_new_tokens=3)
    mine = engine.add_request([4, 5, 6], max_new_tokens=5)
    pieces = list(engine.stream(mine))
    assert [t for piece in pieces for t in piece] == _alone(model, [4, 5, 6], 5) and len(pieces) == 5
    assert engine.tokens(other) == _alone(model, [9, 9, 9], 3)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                          HealthCheck.large_base_example])
@given(st.data())
def test_a_random_run_of_adds_cancels_preemptions_and_finishes_ends_with_nothing_held(data):
    """500 steps of a random mix on a small pool (preemptions), with cancels mid-prefill and mid-decode: the books
    hold after every step, and at the end no block is in use (those of the prefix cache are free), every reference
    count is 0 and no slot is held."""
    family = data.draw(st.sampled_from(["llama", "window", "mamba2"]))
    model = MODEL_CACHE.setdefault(family, MODELS[family]())
    engine = Engine(model, block_size=data.draw(st.sampled_from([1, 4, 8])), num_blocks=60, max_num_seqs=6,
                    max_batched_tokens=data.draw(st.sampled_from([3, 16, 64])))
    live: list[int] = []
    for _ in range(500):
        action = data.draw(st.sampled_from(["add", "add", "cancel", "step", "step", "step"]))
        if action == "add":
            prompt = data.draw(st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=20))
            live.append(engine.add_request(prompt, max_new_tokens=data.draw(st.integers(1, 8)),
                                           stop_tokens=[data.draw(st.integers(3, VOCAB - 1))]))
        elif action == "cancel" and live:
            engine.cancel(live.pop(data.draw(st.integers(0, len(live) - 1))))
        else:
            engine.step()
            _accounting(engine)
    while engine.has_unfinished():
        engine.step()
    for group in engine.groups:
        group.pool.check()
        assert group.pool.in_use == 0 and all(block.ref_count == 0 for block in group.pool.blocks)
    assert engine.stats()["slots_in_use"] == 0 and engine.held_blocks() == 0


MODEL_CACHE: dict = {}
