"""What attnkit costs per call over the torch call it wraps, on tiny inputs where nothing hides it.

Each case times attnkit as it is by default (the NaN rule off), attnkit with the rule on
(``attnkit.nan_rule(True)``) and its baseline alternately in one process, one thread: ``--rounds`` rounds of
``--calls`` calls each, the best round's mean per call (microseconds), and counts the aten ops one call
dispatches (a ``TorchDispatchMode``: on the CPU each is a kernel launch or a view). Before timing, attnkit's
result is asserted equal to the baseline's. ``--before FILE`` copies each case's ratio from an earlier run's
JSON into this one's (``before_ratio``), and that run's machine and commit (``before``).

    attention()      dense, causal, padding mask, causal window, BlockMask, score_mod, sinks,
                     a decoding step (L = 1) and a short prefill, against F.scaled_dot_product_attention
                     with the equivalent mask (prebuilt) or, where SDPA has no form of it (score_mod,
                     sinks), the same arithmetic written out in torch
    MHA              MultiHeadAttention (D 128, 4 heads, L 16) against its own four projections and SDPA
                     written out in plain PyTorch, with torch.nn.MultiheadAttention's fused fast path beside
    decode step      one DecoderLM step with a KV cache (Llama-style, 4 layers) against the same model's
                     weights run as plain torch ops (norms, projections, rotary, a preallocated cache, SDPA, MLP)

Targets (docs/performance.md, "Per call"): attention() <= 1.25x SDPA on the dense and causal tiny calls and a
decoding call; <= 1.5x with a padding mask, a window or a BlockMask; score_mod <= 2.5x the arithmetic written out;
MultiHeadAttention <= 1.05x its projections + SDPA and faster than torch.nn.MultiheadAttention; a DecoderLM step
<= 1.10x plain torch.

On CUDA (``--device cuda``) the same cases run on the GPU in float32; each round ends with a
synchronisation, so a call's time is what back-to-back calls cost (for these tiny calls: the host's
work, which decides whether the GPU is kept busy). There the baselines repeat grouped keys per query
head as transformers does (PyTorch's math path otherwise).

Usage:
    python benchmarks/overhead.py                       # every case, writes benchmarks/results/overhead.json
    python benchmarks/overhead.py --cases dense MultiHead --out /tmp/overhead.json
    python benchmarks/overhead.py --before old.json     # each case's earlier ratio beside today's
    python benchmarks/overhead.py --device cuda --out benchmarks/results/gpu/overhead.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit import masks
from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.models import DecoderLM
from attnkit.models.config import DecoderConfig

B, H, L, E = 1, 4, 16, 32


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fn) -> int | None:
    """Aten ops one call of ``fn`` dispatches, or None where the call runs an operator a dispatch mode cannot
    count (FlexAttention's, on CUDA)."""
    try:
        with torch.no_grad(), _OpCounter() as counter:
            fn()
    except NotImplementedError:
        return None
    return counter.count


def per_call_us(fns: dict, calls: int, rounds: int, device: str = "cpu") -> dict[str, float]:
    """Best-of-``rounds`` mean microseconds per call of each function, the functions alternating by round
    (on CUDA each round's calls are issued back to back and the round ends when the GPU has run them)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = {name: math.inf for name in fns}
    with torch.no_grad():
        for fn in fns.values():  # warm-up
            for _ in range(max(10, calls // 10)):
                fn()
        for r in range(rounds):
            order = list(fns.items())
            order = order[r % len(order):] + order[: r % len(order)]
            for name, fn in order:
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def _written_out(q, k, v, scale, score=None, sinks=None, allowed=None):
    """softmax(q k^T scale [-> score]) v in plain torch, with optional sink logits and a mask."""
    s = (q @ k.transpose(-1, -2)) * scale
    if score is not None:
        s = score(s)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        column = sinks.view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        return torch.softmax(torch.cat([s, column], -1), -1)[..., :-1] @ v
    return torch.softmax(s, -1) @ v


def attention_cases(generator, device: str = "cpu") -> list[dict]:
    """(name, attnkit call, baseline call) for attention() on the tiny shape (and a decode step)."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device)

    q, k, v = (randn(B, H, L, E) for _ in range(3))
    scale = E**-0.5
    padding = masks.padding(torch.tensor([L - 3], device=device), L)  # (B, 1, 1, S)
    window = masks.sliding_window(L, L, 4, device=device)
    blocks = masks.causal_block_mask(L, block=8, device=device)
    dense_blocks = blocks.to_dense()
    sinks = randn(H)

    def softcap(score, b, h, q_idx, kv_idx):
        return 30 * torch.tanh(score / 30)

    q1 = randn(B, H, 1, E)
    kd, vd = (randn(B, H, 128, E) for _ in range(2))
    qp, kp, vp = (randn(B, H, 64, E) for _ in range(3))
    return [
        dict(case="dense", ours=lambda: attnkit.attention(q, k, v).output,
             torch=lambda: F.scaled_dot_product_attention(q, k, v), baseline="F.sdpa"),
        dict(case="causal", ours=lambda: attnkit.attention(q, k, v, is_causal=True).output,
             torch=lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), baseline="F.sdpa"),
        dict(case="padding mask", ours=lambda: attnkit.attention(q, k, v, mask=padding).output,
             torch=lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=padding), baseline="F.sdpa"),
        dict(case="window 4", ours=lambda: attnkit.attention(q, k, v, window=4).output,
             torch=lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=window), baseline="F.sdpa, mask prebuilt"),
        dict(case="BlockMask", ours=lambda: attnkit.attention(q, k, v, mask=blocks).output,
             torch=lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_blocks),
             baseline="F.sdpa, mask prebuilt"),
        dict(case="score_mod", ours=lambda: attnkit.attention(q, k, v, score_mod=softcap).output,
             torch=lambda: _written_out(q, k, v, scale, score=lambda s: 30 * torch.tanh(s / 30)),
             baseline="written out"),
        dict(case="sinks", ours=lambda: attnkit.attention(q, k, v, sinks=sinks).output,
             torch=lambda: _written_out(q, k, v, scale, sinks=sinks), baseline="written out"),
        dict(case="decode step L=1, S=128", ours=lambda: attnkit.attention(q1, kd, vd, is_causal=True,
                                                                        causal_align="bottom-right").output,
             torch=lambda: F.scaled_dot_product_attention(q1, kd, vd), baseline="F.sdpa"),
        dict(case="prefill L=S=64, causal", ours=lambda: attnkit.attention(qp, kp, vp, is_causal=True).output,
             torch=lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True), baseline="F.sdpa"),
    ]


def mha_case(generator, device: str = "cpu", padded: bool = False) -> dict:
    """MultiHeadAttention's self attention against the same four projections and SDPA written out, with
    nn.MultiheadAttention beside them; ``padded``: with a key mask (the last three keys padding),
    SDPA's mask (B, 1, 1, S) and nn.MultiheadAttention's key_padding_mask."""
    D = 128
    torch.manual_seed(0)
    layer = attnkit.MultiHeadAttention(D, H).eval().to(device)
    theirs = nn.MultiheadAttention(D, H, batch_first=True).eval().to(device)
    x = torch.randn(B, L, D, generator=generator).to(device)
    Wq, Wk, Wv, Wo = layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj
    key_mask = torch.ones(B, L, dtype=torch.bool, device=device)
    key_mask[-1, -3:] = False
    mask = key_mask.view(B, 1, 1, L) if padded else None
    padding = ~key_mask if padded else None

    def plain():  # the same four projections and SDPA, written out
        q, k, v = (F.linear(x, W.weight, W.bias).view(B, L, H, D // H).transpose(1, 2) for W in (Wq, Wk, Wv))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.linear(out.transpose(1, 2).reshape(B, L, D), Wo.weight, Wo.bias)

    if padded:
        return dict(case="MultiHeadAttention D128 H4 L16, key mask", ours=lambda: layer(x, key_mask=key_mask).output,
                    torch=plain, baseline="projections + F.sdpa, mask", extra={"torch.nn.MultiheadAttention": lambda:
                    theirs(x, x, x, key_padding_mask=padding, need_weights=False)[0]})
    return dict(case="MultiHeadAttention D128 H4 L16", ours=lambda: layer(x).output, torch=plain,
                baseline="projections + F.sdpa", extra={"torch.nn.MultiheadAttention":
                                                          lambda: theirs(x, x, x, need_weights=False)[0]})


def decode_case(generator, prompt: int = 32, device: str = "cpu") -> dict:
    """One decoding step of a small Llama-style DecoderLM with a KV cache, and the same model as plain
    torch ops; both continue the same prompt, each with its own cache, restored before every call."""
    config = DecoderConfig(vocab_size=512, d_model=256, num_heads=4, num_kv_heads=2, num_layers=4, d_ff=512,
                           max_len=256, positional="rope", norm="rmsnorm", mlp="swiglu", bias="none")
    torch.manual_seed(0)
    model = DecoderLM(config).eval().to(device)
    ids = torch.randint(0, 512, (1, prompt + 1), generator=generator).to(device)
    with torch.no_grad():
        cache = model.new_cache()
        model(ids[:, :prompt], cache=cache)
    saved = [(c._end, c.position) for c in cache]
    token = ids[:, prompt:]

    def ours():
        for c, (end, position) in zip(cache, saved):
            c._end, c.position = end, position  # back to the prompt: every call is the same step
        return model(token, cache=cache, last_only=True).logits

    blocks = list(model.layers)
    rotary = blocks[0].self_attn.rotary
    Hkv, Eh = config.num_kv_heads, config.head_dim
    keys = [c.keys.clone() for c in cache]
    values = [c.values.clone() for c in cache]
    store_k = [torch.cat([kk, kk.new_zeros(1, Hkv, 1, Eh)], 2) for kk in keys]
    store_v = [torch.cat([vv, vv.new_zeros(1, Hkv, 1, Eh)], 2) for vv in values]
    position = torch.tensor([prompt], device=device)
    groups = config.num_heads // Hkv
    on_cuda = device.startswith("cuda")

    def plain():
        cos, sin = rotary.angles(position)  # once per step, shared by every layer
        cos, sin = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
        x = model.tokens(token)
        for i, block in enumerate(blocks):
            attn = block.self_attn
            h = block.attn_norm(x)
            q = attn.q_proj(h).view(1, 1, config.num_heads, Eh).transpose(1, 2)
            k = attn.k_proj(h).view(1, 1, Hkv, Eh).transpose(1, 2)
            v = attn.v_proj(h).view(1, 1, Hkv, Eh).transpose(1, 2)
            q = q * cos + torch.cat(q.chunk(2, -1)[::-1], -1) * sin
            k = k * cos + torch.cat(k.chunk(2, -1)[::-1], -1) * sin
            store_k[i][:, :, prompt:] = k
            store_v[i][:, :, prompt:] = v
            if on_cuda:  # transformers' recipe there: keys repeated per query head (enable_gqa: the math path)
                kk, vv = (s.repeat_interleave(groups, dim=1) for s in (store_k[i], store_v[i]))
                out = F.scaled_dot_product_attention(q, kk, vv, scale=attn.scale)
            else:
                out = F.scaled_dot_product_attention(q, store_k[i], store_v[i], scale=attn.scale, enable_gqa=True)
            x = x + attn.out_proj(out.transpose(1, 2).reshape(1, 1, -1))
            x = x + block.mlp(block.mlp_norm(x))
        return model.lm_head(model.norm(x))

    return dict(case="DecoderLM decode step (4 layers, D 256)", ours=ours, torch=plain,
                baseline="the same model as plain torch ops")


def measure(case: dict, calls: int, rounds: int, device: str = "cpu") -> dict:
    """One case's row: attnkit by default and with the NaN rule on, and its baseline, timed in the same rounds."""
    with torch.no_grad():
        got, want = case["ours"](), case["torch"]()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, c=case: f"{c['case']}: {m}")
    ours = case["ours"]

    def with_rule(ours=ours):
        with attnkit.nan_rule(True):
            return ours()

    fns = {"attnkit": ours, "attnkit, NaN rule on": with_rule, "torch": case["torch"], **case.get("extra", {})}
    us = per_call_us(fns, calls if "decode step (" not in case["case"] else max(1, calls // 3), rounds, device)
    row = {"case": case["case"], "baseline": case["baseline"], "attnkit_us": us["attnkit"],
           "torch_us": us["torch"], "ratio": us["attnkit"] / us["torch"],
           "nan_rule_on_us": us["attnkit, NaN rule on"], "nan_rule_on_ratio": us["attnkit, NaN rule on"] / us["torch"],
           "attnkit_ops": aten_ops(case["ours"]), "torch_ops": aten_ops(case["torch"])}
    for name in case.get("extra", {}):
        row[f"{name}_us"] = us[name]
    extra = "".join(f"  {n}: {us[n]:.1f} us" for n in case.get("extra", {}))
    print(f"{row['case']:<40} {row['attnkit_us']:8.1f} us {row['torch_us']:8.1f} us  {row['ratio']:5.2f}x  "
          f"NaN rule on {row['nan_rule_on_ratio']:5.2f}x  ops {row['attnkit_ops']} / {row['torch_ops']}"
          f"   ({row['baseline']}){extra}", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Short rounds, many of them: the best falls in a quiet moment of a machine whose speed drifts within seconds
    # (200 x 30 held three processes within 0.05x on every row; 1,000 x 3 moved rows by up to 0.6x:
    # benchmarks/overhead.py)
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=30, help="rounds; the best is kept")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the same cases on the GPU (float32)")
    parser.add_argument("--cases", nargs="+", metavar="WORD",
                        help="only the cases whose name holds one of these words (e.g. dense decode MultiHead)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead.json"))
    parser.add_argument("--before", type=Path, metavar="FILE",
                        help="an earlier run's JSON: its ratio per case is written beside today's (before_ratio)")
    args = parser.parse_args(argv)
    before = None
    if args.before is not None:
        try:
            before = json.loads(args.before.read_text())
            before_ratios = {row["case"]: row["ratio"] for row in before["results"] if "ratio" in row}
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"--before {args.before}: not an overhead.py JSON ({error})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device")
    torch.set_num_threads(1)  # per-call overhead: one thread, no pool hand-offs to time
    generator = torch.Generator().manual_seed(0)
    cases = [*attention_cases(generator, args.device), mha_case(generator, args.device),
             mha_case(generator, args.device, padded=True), decode_case(generator, device=args.device)]
    if args.cases:
        cases = [case for case in cases if any(word in case["case"] for word in args.cases)]
        if not cases:
            parser.error(f"--cases {' '.join(args.cases)}: no case's name holds one of these words")
    rows = []
    report = {"machine": machine_info(args.device), "threads": 1,
              "nan_rule": "off (the default); on in its own column (nan_rule_on_us, nan_rule_on_ratio)",
              "calls": args.calls, "rounds": args.rounds, "shape": {"B": B, "H": H, "L": L, "E": E}, "results": rows}
    if before is not None:
        report["before"] = before.get("machine")  # (its commit among them)
    mismatched = []
    for case in cases:  # the NaN rule on, and off in a column
        try:
            rows.append(measure(case, args.calls, args.rounds, args.device))
            if before is not None and case["case"] in before_ratios:
                rows[-1]["before_ratio"] = before_ratios[case["case"]]
        except AssertionError as error:  # recorded and reported, the other cases still measured
            rows.append({"case": case["case"], "error": str(error).splitlines()[0]})
            mismatched.append(case["case"])
            print(f"{case['case']}: attnkit's result differs from the baseline's: {rows[-1]['error']}", flush=True)
        write_json(args.out, report)  # a run cut short keeps its finished rows
    print(f"wrote {args.out}")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
