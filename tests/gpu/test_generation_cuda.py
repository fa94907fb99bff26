"""Generation on CUDA (marker ``gpu``): at most one read from the device per step (the new tokens
and which rows stopped), counted with ``torch.cuda.set_sync_debug_mode("warn")``; the same greedy
tokens as on the CPU in float32, batched with left padding."""

from __future__ import annotations

import copy
import warnings

import torch

from attnkit import decoding
from attnkit.models import DecoderConfig, DecoderLM

LLAMA = DecoderConfig(vocab_size=512, d_model=256, num_layers=2, num_heads=8, num_kv_heads=2, d_ff=512,
                      positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)


def _syncs(run) -> int:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


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
    count = _syncs(lambda: got.setdefault("g", decoding.generate(gpu, ids.cuda(), attention_mask=mask.cuda(),
                                                                   max_new_tokens=steps)))
    assert torch.equal(got["g"].tokens.cpu(), want.tokens)
    assert count <= steps + 3, f"{count} device reads for {steps} steps"


def test_the_compiled_fixed_cache_step_gives_the_same_tokens_and_reads_once_per_step():
    """generate(compile_step=True) on CUDA: fixed-size caches, the step compiled with CUDA graphs;
    fp32 tokens equal the CPU's, and a step still reads the device at most once."""
    torch.manual_seed(0)
    model = DecoderLM(LLAMA).eval()
    gpu = copy.deepcopy(model).cuda()
    ids, mask = decoding.pad_prompts([[5, 6, 7, 8, 9, 10], [11, 12, 13]])
    want = decoding.generate(model, ids, attention_mask=mask, max_new_tokens=24)
    run = lambda: decoding.generate(gpu, ids.cuda(), attention_mask=mask.cuda(), max_new_tokens=24,  # noqa: E731
                                    compile_step=True)
    assert torch.equal(run().tokens.cpu(), want.tokens)  # compiles and captures
    got = {}
    count = _syncs(lambda: got.setdefault("g", run()))
    assert torch.equal(got["g"].tokens.cpu(), want.tokens)
    assert count <= 24 + 3, f"{count} device reads for 24 steps"
