"""Checks for tests/external/test_hf_context_parallel.py, run inside each spawned rank: a tiny random model
of a family, its loss and every gradient with the whole batch on one process against the same under
attnkit.hf.context_parallel (the batch sharded, the ranks' gradients summed)."""

from __future__ import annotations

import contextlib
import copy

import torch

import attnkit.hf

import hf_families
from float64_checks import float64_inside

SIZE = dict(hidden_size=96, num_attention_heads=12, num_key_value_heads=4, head_dim=8, num_heads=12,
            intermediate_size=64, attention_dropout=0.0)
WINDOW = 7  # longer than a shard at W = 4 (n 24): the window crosses ranks
N = 24  # a multiple of 2W for W = 2, 3, 4


def tiny_model(family: str, dtype: torch.dtype):
    """The family's tiny config with 12 query heads (W = 2, 3, 4 divide them; 4 key/value heads), a
    window of 7 where it has one, in eval mode (no dropout), seed 0."""
    config = hf_families.tiny_config(family, **SIZE)
    if getattr(config, "sliding_window", None):
        config.sliding_window = WINDOW
    cls, kind = hf_families.model_class(family)
    assert kind == "decoder", (family, kind)
    torch.manual_seed(0)
    try:  # experts one by one: the grouped kernel takes no float64
        model = cls._from_config(copy.deepcopy(config), attn_implementation=attnkit.hf.IMPLEMENTATION,
                                 experts_implementation="eager")
    except TypeError:
        model = cls._from_config(copy.deepcopy(config), attn_implementation=attnkit.hf.IMPLEMENTATION)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model.to(dtype).eval()


def batch(vocab: int):
    """(ids, mask, labels) (2, N): row 0 right-padded (3 pads), row 1 left-padded (5 pads, the first real
    label predicted from a pad position)."""
    ids = torch.randint(3, vocab, (2, N), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, N, dtype=torch.long)
    mask[0, -3:] = 0
    mask[1, :5] = 0
    return ids, mask, ids.masked_fill(mask == 0, -100)


def _loss(model, dtype: torch.dtype, **batch) -> torch.Tensor:
    """transformers' own loss in float32 (its ForCausalLMLoss); in float64 the same sum over the labels
    computed from the logits in float64 (transformers' loss casts the logits to float32, which would
    hide a 1e-10 comparison), with the labels shifted as it does (``shift_labels`` where given)."""
    if dtype != torch.float64:
        return model(**batch).loss
    labels = batch.pop("labels")
    shifted = batch.pop("shift_labels", None)
    count = batch.pop("num_items_in_batch", None)
    logits = model(**batch).logits
    if shifted is None:
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        count = int((shifted != -100).sum())
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100,
                                             reduction="sum") / count


def compare(family: str, dtype: torch.dtype, layout: str, method: str, tolerance: float | None = None) -> str | None:
    """None when loss and every gradient equal one process's (``tolerance``, relative and absolute;
    default fp32 1e-5, fp64 1e-10), else why not. In float64 both run with the steps transformers rounds to float32
    whatever the model's dtype (norms, softmaxes, rotary angles) kept in float64 (:func:`float64_checks.float64_inside`),
    so that what is compared is the split itself."""
    with float64_inside() if dtype == torch.float64 else contextlib.nullcontext():
        return _compare(family, dtype, layout, method, tolerance)


def _compare(family: str, dtype: torch.dtype, layout: str, method: str, tolerance: float | None) -> str | None:
    model = tiny_model(family, dtype)
    ids, mask, labels = batch(model.config.vocab_size)
    whole = _loss(model, dtype, input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
    whole.backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    cp = attnkit.hf.context_parallel(model, layout=layout, method=method)
    try:
        part = _loss(model, dtype, **cp.shard(ids, labels=labels, attention_mask=mask))
        part.backward()
        cp.all_reduce_gradients()
        loss = cp.all_reduce_loss(part)
    finally:
        cp.remove()
    tol = tolerance if tolerance is not None else 1e-10 if dtype == torch.float64 else 1e-5
    problems = []
    if not torch.allclose(loss, whole.detach(), rtol=tol, atol=tol):
        problems.append(f"loss {float(loss)} vs {float(whole)}")
    for name, p in model.named_parameters():
        if name in want and not torch.allclose(p.grad, want[name], rtol=tol, atol=tol):
            problems.append(f"d{name} off by {float((p.grad - want[name]).abs().max()):.2e}")
    return "; ".join(problems[:3]) or None
