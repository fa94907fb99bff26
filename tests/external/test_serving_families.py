"""The engine on every native decoder family (tiny random checkpoints saved by transformers): 16 requests of 1 to
300 tokens arriving 4 a step, greedy, through a token budget that chunks the long prompts: each request's tokens
equal attnkit's ``generate`` on its prompt alone and transformers' greedy tokens, and its log-probabilities
generate's within 1e-5 in float32 (:data:`LOGPROB_TOLERANCE` says where not, and why)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.decoding import generate  # noqa: E402
from attnkit.serving import Engine  # noqa: E402

from serving_families import FAMILIES, VOCAB, family_checkpoint, transformers_greedy  # noqa: E402

NEW = 6

LOGPROB_TOLERANCE = {
    # Gated DeltaNet: a batch's projections round as one product where a row alone rounds as a vector product, and
    # the delta rule carries the difference on (measured at most 1.4e-4 and 2.9e-5 here)
    "qwen3_next": 2e-4, "qwen3_5_text": 5e-5,
    # DeepSeek sparse attention: the indexer keeps the top k of relu scores, among which exact ties at 0 are broken by
    # torch.topk by column, and a batch's padding moves the columns (transformers' own batches do the same): a
    # different key may be kept, a discrete change (measured 4e-2 once in 96 tokens). The tokens are compared.
    "deepseek_v32": None,
}
"""Where batched decoding's float rounding shows more than 1e-5 in the log-probabilities (None: not compared)."""


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    lengths = [1, 300, *torch.randint(2, 300, (14,), generator=g).tolist()]
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _generate_alone(model, prompt: list[int]) -> tuple[list[int], list[float]]:
    """attnkit's generate on one prompt: its tokens and their log-probabilities."""
    scores: list[float] = []
    with torch.no_grad():
        cache = model.new_cache()
        logits = model(torch.tensor([prompt]), cache=cache, last_only=True).logits[0, -1]
        tokens = generate(model, torch.tensor([prompt]), max_new_tokens=NEW).tokens[0].tolist()
        for token in tokens:
            scores.append(float(torch.log_softmax(logits, -1)[token]))
            logits = model(torch.tensor([[token]]), cache=cache, last_only=True).logits[0, -1]
    return tokens, scores


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_sixteen_staggered_requests_get_their_tokens_alone_and_transformers_greedy_tokens(family, tmp_path):
    theirs, ours = family_checkpoint(family, tmp_path)
    prompts = _prompts()
    engine = Engine(ours, block_size=16, max_batched_tokens=128)
    ids, queue = [], list(prompts)
    while queue or engine.has_unfinished():
        for _ in range(4):
            if queue:
                ids.append(engine.add_request(queue.pop(0), max_new_tokens=NEW))
        engine.step()
    assert engine.stats()["preemptions"] == 0 and engine.stats()["blocks_in_use"] == 0
    for request, prompt in zip(ids, prompts):
        tokens, scores = _generate_alone(ours, prompt)
        assert engine.tokens(request) == tokens, (family, len(prompt))
        tolerance = LOGPROB_TOLERANCE.get(family, 1e-5)
        if tolerance is not None:
            torch.testing.assert_close(torch.tensor(engine.logprobs(request)), torch.tensor(scores), rtol=0,
                                       atol=tolerance)
        assert tokens == transformers_greedy(theirs, prompt, NEW), (family, len(prompt))
