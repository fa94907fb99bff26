"""Generation on CUDA (marker ``gpu``): at most one read from the device per step (the new tokens
and which rows stopped), counted with ``torch.cuda.set_sync_debug_mode("warn")``; the same greedy tokens as on the
CPU in float32, batched with left padding."""

from __future__ import annotations

import copy
import warnings

import torch

from attnkit import decoding
from attnkit.models import DecoderConfig, DecoderLM

LLAMA = DecoderConfig(vocab_size=512, d_model=256, num_layers=2, num_heads=8, num_kv_heads=2, d_ff=512,
                      positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)


class Syncs(list):
    """The places (file:line of the Python caller) where the device was read, one entry per read."""

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for site in self:
            counts[site] = counts.get(site, 0) + 1
        return "; ".join(f"{site} x{n}" for site, n in counts.items())


def _syncs(run) -> Syncs:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return Syncs(f"{w.filename}:{w.lineno}" for w in caught
                 if "synchroniz" in str(w.message) and "debug mode is a prototype" not in str(w.message))


def test_batched_generation_reads_the_device_once_per_step():
    torch.manual_seed(0)
    model = DecoderLM(LLAMA).eval()
    gpu = copy.deepcopy(model).cuda()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    ids, mask = decoding.pad_prompts(prompts)
    want = decoding.generate(model, ids, attention_mask=mask, max_new_tokens=24)
    decoding.generate(gpu, ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=4)  # warm up
    got = {}
    steps = 24
    ids, mask = ids.cuda(), mask.cuda()  # the copies in are the caller's, not generate's
    reads = _syncs(lambda: got.setdefault("g", decoding.generate(gpu, ids, attention_mask=mask, max_new_tokens=steps)))
    assert torch.equal(got["g"].tokens.cpu(), want.tokens)
    # one read per step, plus one per call: the check that the prompts are padded on the left
    assert len(reads) <= steps + 1, f"{len(reads)} device reads for {steps} steps: {reads}"


def test_the_compiled_fixed_cache_step_gives_the_same_tokens_and_reads_once_per_step():
    """generate(compile_step=True) on CUDA: fixed-size caches, the step compiled with CUDA graphs;
    fp32 tokens equal the CPU's, and a step still reads the device at most once."""
    torch.manual_seed(0)
    model = DecoderLM(LLAMA).eval()
    gpu = copy.deepcopy(model).cuda()
    ids, mask = decoding.pad_prompts([[5, 6, 7, 8, 9, 10], [11, 12, 13]])
    want = decoding.generate(model, ids, attention_mask=mask, max_new_tokens=24)
    ids, mask = ids.cuda(), mask.cuda()
    run = lambda: decoding.generate(gpu, ids, attention_mask=mask, max_new_tokens=24, compile_step=True)  # noqa: E731
    assert torch.equal(run().tokens.cpu(), want.tokens)  # compiles and captures
    got = {}
    reads = _syncs(lambda: got.setdefault("g", run()))
    assert torch.equal(got["g"].tokens.cpu(), want.tokens)
    assert len(reads) <= 24 + 1, f"{len(reads)} device reads for 24 steps: {reads}"
