"""attnkit.hf.context_parallel: a transformers model with its sequence split over W processes (gloo) gives
the loss and every gradient of one process running the whole batch (tests/external/hf_parallel_check.py),
with left and right padding (a left-padded row's first label predicted from a pad position: a row with no
key), for every family of attnkit.hf.CONTEXT_PARALLEL_FAMILIES, both methods, W = 2, 3, 4: float64 (1e-10, the
steps transformers rounds to float32 whatever the model's dtype kept in float64: hf_parallel_check.compare) at
every W, float32 (1e-5) at W = 2 (the split is the same in both dtypes: float64 holds it to 1e-10, float32 adds
the dtype's own path once); and what it refuses, by name."""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnkit.hf  # noqa: E402
from attnkit.distributed import LAYOUTS, METHODS  # noqa: E402
from attnkit.hf import CONTEXT_PARALLEL_FAMILIES, UnsupportedFeature  # noqa: E402

import hf_parallel_check as check  # noqa: E402
from helpers import spawn_workers, torchrun_and_one_process  # noqa: E402

RING_REFUSES = {"gemma2": "softcap", "gpt_oss": "s_aux"}  # named refusals of method="ring": Ulysses runs them


def _cases(world: int, families) -> list[tuple]:
    """(family, dtype, layout, method): each family with both methods in float64, and in float32 too at W = 2; its
    layout turning with its place in the list (each layout on a third of the families); Llama with every layout."""
    cases = []
    for index, family in enumerate(families):
        layouts = LAYOUTS if family == "llama" else (LAYOUTS[(index + world) % len(LAYOUTS)],)
        for layout in layouts:
            for method in METHODS:
                for dtype in (torch.float32, torch.float64) if world == 2 else (torch.float64,):
                    cases.append((family, dtype, layout, method))
    return cases


def _worker(rank: int, world: int, port: int, errors, families) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    try:
        attnkit.hf.register()
        failures = []
        for family, dtype, layout, method in _cases(world, families):
            where = f"{family} {str(dtype)[6:]} {layout} {method} W={world}"
            if method == "ring" and family in RING_REFUSES:
                with pytest.raises(UnsupportedFeature, match=f"{RING_REFUSES[family]} is not supported by method='ring'"):
                    check.compare(family, dtype, layout, method)
                continue
            problem = check.compare(family, dtype, layout, method)
            if problem:
                failures.append(f"{where}: {problem}")
        assert not failures, "\n".join(failures)
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    finally:
        torch.distributed.destroy_process_group()
        os._exit(0)  # results went through the queue; gloo can abort in interpreter teardown (torch 2.13)


def _spawn(world: int, families, timeout: float) -> None:
    import functools

    spawn_workers(functools.partial(_worker, families=tuple(families)), world, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_listed_family_equals_one_process(world):
    _spawn(world, CONTEXT_PARALLEL_FAMILIES, timeout=900)


def test_the_list_holds_the_families_the_issue_names_and_docs_show_it():
    for family in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2",
                   "gpt_oss", "gpt2"):
        assert family in CONTEXT_PARALLEL_FAMILIES
    assert len(CONTEXT_PARALLEL_FAMILIES) >= 20
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "hf.md").read_text()
    section = docs.split("## Context parallelism")[1].split("\n## ")[0]
    listed = section.split("Verified families")[1].split("\n\n")[1]
    assert sorted(f.strip("` ") for f in listed.split(",")) == sorted(CONTEXT_PARALLEL_FAMILIES)


def test_what_cannot_be_sharded_is_refused_by_name():
    attnkit.hf.register()
    model = check.tiny_model("llama", torch.float32)
    with pytest.raises(UnsupportedFeature, match="verified for .*not for 'opt'"):
        attnkit.hf.context_parallel(type("M", (), {"config": type("C", (), {"model_type": "opt"})()})())
    eager = check.tiny_model("llama", torch.float32)
    eager.config._attn_implementation = "eager"
    with pytest.raises(UnsupportedFeature, match="load the model with attn_implementation='attnkit'"):
        attnkit.hf.context_parallel(eager)
    with pytest.raises(ValueError, match="layout must be one of"):
        attnkit.hf.context_parallel(model, layout="diagonal")
    cp = attnkit.hf.context_parallel(model)  # one process: the whole sequence is this rank's shard
    ids, mask, labels = check.batch(model.config.vocab_size)
    with pytest.raises(UnsupportedFeature, match="attention weights are not available"):
        model(**cp.shard(ids, attention_mask=mask), output_attentions=True)
    with pytest.raises(UnsupportedFeature, match="a KV cache"):
        model.generate(input_ids=ids[:, :4], max_new_tokens=2, do_sample=False)
    with pytest.raises(UnsupportedFeature, match="structure plus padding"):
        model(input_ids=ids, attention_mask=torch.ones(2, 1, ids.shape[1], ids.shape[1], dtype=torch.bool),
              use_cache=False)
    with pytest.raises(ValueError, match="must be \\(B, n\\) = \\(2, 24\\)"):
        cp.shard(ids, labels=labels[:, :5])
    with pytest.raises(ValueError, match="input_ids must be a \\(B, n\\) tensor of the whole batch, got Tensor \\(24,\\)"):
        cp.shard(ids[0])
    with pytest.raises(ValueError, match="sequence length 23 must be a multiple of 2 for layout 'zigzag'.*pad it"):
        cp.shard(ids[:, :23])
    model.train()
    model.config.attention_dropout = 0.5
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    with pytest.raises(UnsupportedFeature, match="attention dropout 0.5 while training"):
        model(**cp.shard(ids, attention_mask=mask))
    cp.remove()
    model.eval()
    assert model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions is not None  # on again


def test_one_process_equals_the_plain_bridge_and_shard_shifts_labels_over_the_whole_sequence():
    attnkit.hf.register()
    assert check.compare("mistral", torch.float64, "zigzag", "ring") is None  # W = 1: no process group
    model = check.tiny_model("llama", torch.float32)
    cp = attnkit.hf.context_parallel(model)
    ids, mask, labels = check.batch(model.config.vocab_size)
    batch = cp.shard(ids, labels=labels, attention_mask=mask)
    assert torch.equal(batch["shift_labels"][:, :-1], labels[:, 1:]) and (batch["shift_labels"][:, -1] == -100).all()
    assert batch["num_items_in_batch"] == int((labels[:, 1:] != -100).sum()) and batch["use_cache"] is False
    cp.remove()
    # Without a mask, shard() gives an all-ones one: else transformers reads the zigzag positions of a shard
    # (0-5, 18-23 at W = 2) as packed sequences and builds a mask attnkit must refuse.
    assert torch.equal(cp.shard(ids)["attention_mask"], torch.ones_like(ids))


@pytest.mark.slow
def test_the_example_under_torchrun_prints_the_losses_of_one_process():
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "hf_context_parallel.py"
    (stdout, losses), (_, single) = torchrun_and_one_process(script, ["--steps", "3", "--length", "256"])
    assert "2 process(es), 128 of 256 tokens each" in stdout
    assert len(losses) == 3 and losses == pytest.approx(single, rel=1e-5)
    assert single[-1] < single[0]  # it trains
