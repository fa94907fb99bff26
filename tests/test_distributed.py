"""Context-parallel attention: W = 1..4 gloo processes on CPU, ring (every layout) and Ulysses,
non-causal / causal / window, GQA (12 query heads on 2 key/value heads); each rank's output shard and the gradients of q, k, v equal single-process
attention on the whole sequence (float64 reference backend); layout helpers; clear errors; a
run that cannot finish fails within a timeout instead of hanging."""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

import attnkit
from attnkit.distributed import LAYOUTS, context_parallel_attention, shard, shard_positions, unshard

from helpers import free_port, spawn_workers

pytestmark = [pytest.mark.slow]  # spawns gloo processes

CASES = [{}, {"is_causal": True}, {"window": 7}, {"is_causal": True, "padding": True}, {"padding": True}]


def _worker(rank: int, world: int, port: int, errors) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    import attnkit.distributed.ring

    attnkit.distributed.ring.QUERY_TILE = 5  # several query tiles per shard, some skipped whole, some cut
    try:
        n = 4 * world * 3  # divisible for every layout
        for method, layout in [("ring", layout) for layout in LAYOUTS] + [("ulysses", "zigzag"), ("ulysses", "striped")]:
            for case in CASES:
                case = dict(case)
                key_mask = None
                if case.pop("padding", False):  # padding keys spread over the ranks; row 1 has one real key
                    key_mask = torch.ones(2, n, dtype=torch.bool)
                    key_mask[0, n // 3: n // 2] = False
                    key_mask[1, 1:] = False
                generator = torch.Generator().manual_seed(0)
                q = torch.randn(2, 12, n, 8, generator=generator, dtype=torch.float64, requires_grad=True)
                k = torch.randn(2, 2, n, 8, generator=generator, dtype=torch.float64, requires_grad=True)
                v = torch.randn(2, 2, n, 6, generator=generator, dtype=torch.float64, requires_grad=True)
                d_out = torch.randn(2, 12, n, 6, generator=generator, dtype=torch.float64)
                mask = None if key_mask is None else key_mask[:, None, None, :]
                expected = attnkit.attention(q, k, v, backend="reference", mask=mask, **case).output
                want = torch.autograd.grad(expected, (q, k, v), d_out)
                parts = [shard(x.detach(), world, rank, layout=layout).requires_grad_() for x in (q, k, v)]
                extra = {} if key_mask is None else {"key_mask": shard(key_mask, world, rank, layout=layout, dim=1)}
                got = context_parallel_attention(*parts, layout=layout, method=method, **case, **extra).output
                torch.testing.assert_close(got, shard(expected.detach(), world, rank, layout=layout), rtol=1e-10, atol=1e-10)
                grads = torch.autograd.grad(got, parts, shard(d_out, world, rank, layout=layout))
                for name, g, w in zip("qkv", grads, want):
                    torch.testing.assert_close(g, shard(w, world, rank, layout=layout), rtol=1e-10, atol=1e-10,
                                               msg=lambda m, name=name: f"{method} {layout} {case} d{name}: {m}")
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    finally:
        torch.distributed.destroy_process_group()
        # Results went through the queue. Skip interpreter teardown: torch 2.13's gloo now and then
        # aborts there ("terminate called without an active exception") after a clean destroy.
        os._exit(0)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_equals_single_process_attention(world):
    spawn_workers(_worker, world, timeout=120)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_process_is_plain_attention(layout):
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 24, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 24, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 24, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    key_mask = torch.arange(24) % 5 != 3
    for case in CASES:
        case = dict(case)
        padding = case.pop("padding", False)
        extra = {"key_mask": key_mask[None]} if padding else {}
        got = context_parallel_attention(q, k, v, layout=layout, **case, **extra).output
        expected = attnkit.attention(q, k, v, backend="reference", mask=key_mask.expand(24, 24) if padding else None, **case).output
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(expected.sum(), (q, k, v))):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_ring_blocks_in_low_precision_match_float64(monkeypatch, dtype, fused):
    """The ring's blocks go through the fused CPU kernel (or plain PyTorch): tiles allowed whole,
    cut by the window, causal triangles and padding, in float32 / bfloat16 against float64."""
    from attnkit.distributed import ring
    from attnkit.functional import partial

    monkeypatch.setattr(ring, "QUERY_TILE", 16)
    monkeypatch.setattr(partial, "FUSED", fused)
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=generator, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    key_mask = torch.rand(2, 64, generator=generator) > 0.2
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    for case in CASES:
        case = dict(case)
        extra = {"key_mask": key_mask} if case.pop("padding", False) else {}
        mask = key_mask[:, None, None, :] if extra else None
        want_x = [x.clone().requires_grad_() for x in (q, k, v)]
        want = attnkit.attention(*want_x, backend="reference", mask=mask, **case).output
        want_grads = torch.autograd.grad(want, want_x, torch.ones_like(want))
        got_x = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        got = context_parallel_attention(*got_x, **case, **extra).output
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want.detach(), rtol=tol, atol=tol, msg=lambda m: f"{case}: {m}")
        for name, a, b in zip("qkv", torch.autograd.grad(got, got_x, torch.ones_like(got)), want_grads):
            torch.testing.assert_close(a.double(), b, rtol=10 * tol, atol=10 * tol,
                                       msg=lambda m, name=name: f"{case} d{name}: {m}")


POSITION_SETS = {  # (query positions, key positions) of one ring step
    "contiguous, earlier keys": (range(40, 80), range(0, 40)),
    "contiguous, the diagonal": (range(40, 80), range(40, 80)),
    "contiguous, later keys": (range(0, 40), range(40, 80)),
    "zigzag": ([*range(10, 20), *range(60, 70)], [*range(20, 30), *range(50, 60)]),
    "runs that overlap in part": ([*range(5, 30), *range(90, 101)], [*range(0, 12), *range(20, 50), 95]),
    "striped": (range(1, 80, 4), range(3, 80, 4)),
}


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("positions", list(POSITION_SETS))
def test_a_ring_step_equals_masked_attention_over_its_keys(monkeypatch, positions, is_causal):
    """One step, forward and backward, against float64 reference attention under the positions'
    causal mask: whole runs as one kernel call (allowed wholly or as the triangle), runs that
    overlap in part, and many runs (striped) by query tiles."""
    from attnkit.distributed import ring
    from attnkit.functional.masks import causal_positions

    monkeypatch.setattr(ring, "QUERY_TILE", 8)
    q_pos, k_pos = (torch.tensor(list(p)) for p in POSITION_SETS[positions])
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, len(q_pos), 8, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 4, len(k_pos), 8, generator=generator, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    allowed = causal_positions(q_pos, k_pos) if is_causal else None
    want = attnkit.attention(q, k, v, mask=allowed, backend="reference", scale=0.3)
    d_out = torch.randn(want.output.shape, generator=generator, dtype=torch.float64)
    want_grads = torch.autograd.grad(want.output, (q, k, v), d_out)
    out = torch.zeros_like(want.output)
    lse = torch.full(want.lse.shape, float("-inf"), dtype=torch.float64)
    with torch.no_grad():
        ring._forward_step(q, k, v, q_pos, k_pos, 0.3, is_causal, None, None, out, lse)
        has_key = torch.isfinite(lse)  # rows with no key before them: out 0, lse -inf
        torch.testing.assert_close(out, want.output.masked_fill(~has_key[..., None], 0.0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[has_key], want.lse[has_key], rtol=1e-12, atol=1e-12)
        dq = torch.zeros_like(q)
        dk, dv = ring._backward_step(d_out, q, k, v, out, lse.masked_fill(~has_key, 0.0), q_pos, k_pos, 0.3,
                                     is_causal, None, None, dq)
    for name, got, expected in zip("qkv", (dq, dk, dv), want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"d{name}: {m}")


def test_layouts_partition_the_sequence_and_unshard_inverts_shard():
    assert shard_positions(16, 2, 0, "zigzag").tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert shard_positions(16, 2, 1, "zigzag").tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert shard_positions(6, 3, 1, "striped").tolist() == [1, 4]
    assert shard_positions(6, 3, 2, "contiguous").tolist() == [4, 5]
    x = torch.randn(2, 3, 24, 5)
    for layout in LAYOUTS:
        for world in (1, 2, 3, 4):
            held = torch.cat([shard_positions(24, world, r, layout) for r in range(world)])
            assert sorted(held.tolist()) == list(range(24))
            torch.testing.assert_close(unshard([shard(x, world, r, layout=layout) for r in range(world)], layout=layout), x)


def test_zigzag_balances_causal_work():
    n, world = 4096, 4
    for layout, bound in (("zigzag", 1.01), ("contiguous", 7.0)):
        work = [int((shard_positions(n, world, r, layout) + 1).sum()) for r in range(world)]  # causal pairs per rank
        assert max(work) / min(work) <= bound, (layout, work)
    work = [int((shard_positions(n, world, r, "contiguous") + 1).sum()) for r in range(world)]
    assert max(work) / min(work) > 5  # contiguous is badly unbalanced under a causal mask


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="must be a multiple of 8 for layout 'zigzag' with 4 processes; pad it"):
        shard_positions(20, 4, 0, "zigzag")
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_positions(8, 2, 0, "spiral")
    q = torch.randn(1, 3, 8, 4)
    with pytest.raises(ValueError, match="query heads 3 must be a multiple of key/value heads 2"):
        context_parallel_attention(q, torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4))
    for window in (0, 2.5, True):  # a float or a bool is not a window (check_int)
        with pytest.raises(ValueError, match=f"window must be a positive int or None, got {window!r}"):
            context_parallel_attention(q, q, q, window=window)


def _dying_worker(rank: int, world: int, port: int, errors) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=20))
    if rank == 1:
        os._exit(3)  # dies without a word, as a killed machine would
    import time

    start = time.monotonic()
    q = torch.randn(1, 2, 8, 4)
    try:
        context_parallel_attention(q, q, q, layout="contiguous")
        errors.put("rank 0: attention returned although its peer died")
    except Exception as error:  # noqa: BLE001 - the error is the expected outcome
        errors.put(f"raised after {time.monotonic() - start:.1f} s: {type(error).__name__}: {error}")


def test_a_dead_peer_makes_the_others_fail_within_the_timeout():
    import time

    context = mp.get_context("spawn")
    errors = context.SimpleQueue()
    port = free_port()
    processes = [context.Process(target=_dying_worker, args=(rank, 2, port, errors)) for rank in range(2)]
    for p in processes:
        p.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and any(p.is_alive() for p in processes):
        time.sleep(0.5)
    hung = [p for p in processes if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, "rank 0 hung after its peer died"
    assert processes[1].exitcode == 3
    assert not errors.empty(), "rank 0 exited without reporting"
    message = errors.get()
    assert message.startswith("raised after") and "PeerFailure: " in message and "on rank 0 of 2" in message, message
    assert float(message.split()[2]) < 30, message


# Options that differ between rank 0 and rank 1 (everything else equal): each must be refused by
# name on every rank, before any transfer, within seconds (no gloo abort, no hang, no wrong numbers).
MISMATCHES = {
    "is_causal": ({"is_causal": False}, {"is_causal": True}),
    "window": ({"window": 3}, {"window": 5}),
    "layout": ({"layout": "zigzag"}, {"layout": "contiguous"}),
    "scale": ({"scale": 0.5}, {"scale": 0.25}),
    "method": ({"method": "ring"}, {"method": "ulysses"}),
    "shard_length": ({"n": 8}, {"n": 12}),
    "kv_heads": ({"kv_heads": 2}, {"kv_heads": 1}),
    "key_mask": ({"padding": False}, {"padding": True}),
    "dtype": ({"dtype": torch.float64}, {"dtype": torch.float32}),
}


def _mismatch_worker(rank: int, world: int, port: int, errors) -> None:

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    from attnkit.distributed import RankMismatch

    try:
        for name, options in MISMATCHES.items():
            mine = dict(layout="zigzag") | options[rank]
            n = mine.pop("n", 8)
            dtype = mine.pop("dtype", torch.float64)
            kv_heads = mine.pop("kv_heads", 2)
            padding = mine.pop("padding", False)
            q = torch.randn(1, 4, n, 8, dtype=dtype)
            kv = torch.randn(1, kv_heads, n, 8, dtype=dtype)
            extra = {"key_mask": torch.ones(1, n, dtype=torch.bool)} if padding else {}
            try:
                context_parallel_attention(q, kv, kv, **mine, **extra)
                errors.put(f"rank {rank}: {name} differed but attention returned")
            except RankMismatch as error:
                if name not in str(error):
                    errors.put(f"rank {rank}: {name}: {error}")
        # And then the ranks agree again: the group is still usable.
        q = torch.randn(1, 4, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        context_parallel_attention(q, q, q, is_causal=True)
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    finally:
        torch.distributed.destroy_process_group()
        os._exit(0)


def test_ranks_that_disagree_are_refused_by_name_on_every_rank():
    spawn_workers(_mismatch_worker, 2, timeout=90)


def _collectives_worker(rank: int, world: int, port: int, errors) -> None:
    import warnings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    from attnkit.distributed.group import exchanged, summed

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch.distributed.nn's collectives warned FutureWarning here
            x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
            total = summed(x)
            (total * (rank + 1)).sum().backward()  # d/dx of sum_r (r + 1) * total = sum_r (r + 1) = 3
            if not (torch.equal(total.detach(), torch.full((3,), 3.0, dtype=torch.float64))
                    and torch.equal(x.grad, torch.full((3,), 3.0, dtype=torch.float64))):
                errors.put(f"rank {rank}: summed gave {total} with gradient {x.grad}")
            chunks = torch.arange(world * 2, dtype=torch.float64).view(world, 2).add(10 * rank).requires_grad_()
            received = exchanged(chunks)  # rank r gets chunk r of every rank
            want = torch.stack([torch.arange(2, dtype=torch.float64) + 2 * rank + 10 * other for other in range(world)])
            (received * (rank + 1)).sum().backward()  # chunk r of this rank went to rank r, weighted r + 1
            grad_want = torch.arange(1, world + 1, dtype=torch.float64)[:, None].expand(world, 2)
            if not (torch.equal(received.detach(), want) and torch.equal(chunks.grad, grad_want)):
                errors.put(f"rank {rank}: exchanged gave {received} with gradient {chunks.grad}")
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    finally:
        torch.distributed.destroy_process_group()
        os._exit(0)


def test_the_differentiable_collectives_are_torchs_supported_ones():
    """Context parallelism sums and exchanges through torch's functional collectives (their values and
    gradients checked), not torch.distributed.nn's, deprecated in the torch attnkit pins (two
    FutureWarnings per run of the example)."""
    spawn_workers(_collectives_worker, 2, timeout=90)
