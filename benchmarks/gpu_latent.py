"""DeepSeek's latent attention (MLA) and sparse attention (DSA) on a GPU, against what they replace.

- **MLA decoding**: one decoding step of DeepSeek-V3's attention layer (hidden 7168, 128 heads, q_lora_rank
  1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128; bf16, batch 1) with S tokens cached (4K-32K):
  attnkit's ``LatentAttention`` absorbed, over its ``LatentCache`` (576 numbers a token), against
  transformers' ``DeepseekV3Attention`` (attention ``"sdpa"``, its ``DynamicCache``: whatever that
  transformers version caches, it is recorded in bytes a token). Both layers hold the same weights and are
  prefilled with the same S tokens (once, at the largest S; each smaller S is the same caches cut back),
  then step the same token: the outputs are compared (``max_rel_diff``, bf16), and the step timed (CUDA
  events, median of ``--repeats``; each step's cache growth undone before the next).
- **DSA against dense**: the absorbed shape (``--heads`` query heads over one 576-wide latent key head, values
  its first 512) at 16K-64K tokens: ``topk_attention`` over each query's top-2048 earlier keys (a random
  causal selection, made on the GPU: the attention's cost, not the indexer's) against
  ``attnkit.attention(is_causal=True)`` over every earlier key; forward ms and peak extra MB.

Writes JSON (``--out``, atomically, after every row) with the machine (device, driver, torch, Triton,
transformers, commit) and prints a table.

    python benchmarks/gpu_latent.py --out benchmarks/results/gpu/latent.json
    python benchmarks/gpu_latent.py --device cpu --tiny          # a smoke run of every path
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import attnkit
from attnkit._files import write_json
from attnkit.bench.harness import machine_info, median_ms, peak_extra_mb
from attnkit.functional import nan
from attnkit.functional.topk import topk_attention
from attnkit.layers import LatentAttention, LatentCache, RotaryEmbedding

V3 = dict(hidden_size=7168, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
          qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
NAMES = {"q_a_layernorm": "q_a_norm", "kv_a_proj_with_mqa": "kv_a_proj", "kv_a_layernorm": "kv_a_norm",
         "o_proj": "out_proj"}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _pair(shape: dict, device: str, dtype: torch.dtype):
    """(transformers' DeepseekV3Attention, attnkit's LatentAttention with its weights, the rotary embedding)."""
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

    config = transformers.DeepseekV3Config(**shape, num_hidden_layers=1, vocab_size=128)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    theirs = v3.DeepseekV3Attention(config, 0).to(device, dtype).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            torch.nn.init.normal_(p, std=0.02)
    theta = config.rope_parameters["rope_theta"]
    ours = LatentAttention(shape["hidden_size"], shape["num_attention_heads"], kv_lora_rank=shape["kv_lora_rank"],
                           qk_nope_head_dim=shape["qk_nope_head_dim"], qk_rope_head_dim=shape["qk_rope_head_dim"],
                           v_head_dim=shape["v_head_dim"], q_lora_rank=shape["q_lora_rank"],
                           rotary=RotaryEmbedding(shape["qk_rope_head_dim"], theta, interleaved=True),
                           scale=theirs.scaling, norm_eps=config.rms_norm_eps).to(device, dtype).eval()
    state = {}
    for name, tensor in theirs.state_dict().items():
        module, rest = name.split(".", 1)
        state[f"{NAMES.get(module, module)}.{rest}"] = tensor
    ours.load_state_dict(state)
    rotary = v3.DeepseekV3RotaryEmbedding(config).to(device)
    return theirs, ours, rotary


def _cut(cache, S: int) -> None:
    """A transformers cache cut back to its first S tokens (a negative ``crop`` removes that many: the form
    transformers' versions agree on)."""
    extra = cache.get_seq_length() - S
    if extra > 0:
        cache.crop(-extra)


def _cache_bytes(cache) -> int:
    """Bytes of every tensor a transformers cache holds (its layers' keys and values)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def mla_rows(sizes: list[int], args, save) -> list[dict]:
    from transformers import DynamicCache

    device, dtype = args.device, getattr(torch, args.dtype)
    shape = TINY if args.tiny else V3
    theirs, ours, rotary = _pair(shape, device, dtype)
    longest = max(sizes)
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(1, longest + 1, shape["hidden_size"], generator=generator) * 0.5).to(device, dtype)
    rows = []
    with torch.no_grad():
        their_cache = DynamicCache()
        positions = torch.arange(longest, device=device)[None]
        theirs(x[:, :longest], rotary(x, positions), None, past_key_values=their_cache)
        our_cache = LatentCache()
        ours(x[:, :longest], cache=our_cache, absorbed=False)  # the prefill the naive way; decoding absorbed
        _sync(device)
        for S in sorted(sizes, reverse=True):  # each S: the caches cut back to S tokens
            step = x[:, S:S + 1]
            position = torch.tensor([[S]], device=device)
            their_rope = rotary(step, position)
            _cut(their_cache, S)
            per_token = _cache_bytes(their_cache) / S

            def theirs_step():
                out = theirs(step, their_rope, None, past_key_values=their_cache)[0]
                _cut(their_cache, S)
                return out

            def ours_step():
                out = ours(step, cache=our_cache).output
                our_cache._end, our_cache.position = S, S  # the step's latent dropped again
                return out

            our_cache._end, our_cache.position = S, S
            want, got = theirs_step(), ours_step()
            diff = float(((got.float() - want.float()).abs().max() / want.float().abs().max()).item())
            row = {"S": S, "transformers_ms": median_ms(theirs_step, args.repeats, device, warmup=1),
                   "attnkit_absorbed_ms": median_ms(ours_step, args.repeats, device, warmup=1),
                   "max_rel_diff": diff, "transformers_cache_bytes_per_token": per_token,
                   "attnkit_cache_bytes_per_token": our_cache.numbers_per_token() * x.element_size()}
            row["speedup"] = row["transformers_ms"] / row["attnkit_absorbed_ms"]
            rows.append(row)
            print(f"MLA decode S={S:>6}: transformers {row['transformers_ms']:8.3f} ms  attnkit absorbed "
                  f"{row['attnkit_absorbed_ms']:8.3f} ms  {row['speedup']:6.2f}x  rel diff {diff:.1e}  cache "
                  f"{per_token:,.0f} / {row['attnkit_cache_bytes_per_token']:,} B a token", flush=True)
            save(rows)
    return rows


def _selection(n: int, topk: int, device: str, seed: int = 0) -> torch.Tensor:
    """(1, n, topk) random causal top-k selections (-1 where a query has fewer earlier keys), made by blocks."""
    generator = torch.Generator(device=device).manual_seed(seed)
    blocks = []
    for start in range(0, n, 1024):
        rows = torch.arange(start, min(n, start + 1024), device=device)[:, None]
        scores = torch.rand(len(rows), n, generator=generator, device=device)
        scores = scores.masked_fill(torch.arange(n, device=device)[None, :] > rows, -1.0)
        picked = scores.topk(min(topk, n), dim=-1)
        blocks.append(picked.indices.masked_fill(picked.values < 0, -1))
    return torch.cat(blocks)[None]


def dsa_rows(sizes: list[int], args, save) -> list[dict]:
    device, dtype = args.device, getattr(torch, args.dtype)
    latent, rope = (16, 8) if args.tiny else (512, 64)
    scale = (128 + 64) ** -0.5
    rows = []
    for n in sizes:
        generator = torch.Generator().manual_seed(n)
        q = (torch.randn(1, args.heads, n, latent + rope, generator=generator) * 0.05).to(device, dtype)
        k = (torch.randn(1, 1, n, latent + rope, generator=generator) * 0.05).to(device, dtype)
        v = k[..., :latent]
        indices = _selection(n, args.topk, device)
        calls = {"dense": lambda: attnkit.attention(q, k, v, is_causal=True, scale=scale).output,
                 "dsa": lambda: topk_attention(q, k, v, indices, is_causal=True, scale=scale).output}
        row: dict = {"n": n, "heads": args.heads, "topk": args.topk}
        with torch.no_grad():
            for name, call in calls.items():
                try:
                    row[f"{name}_ms"] = median_ms(call, args.dsa_repeats, device, warmup=1)
                    row[f"{name}_peak_extra_mb"] = peak_extra_mb(call, device) if device.startswith("cuda") else None
                except (torch.OutOfMemoryError, RuntimeError) as error:  # recorded with its reason, not hidden
                    row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
        if "dense_ms" in row and "dsa_ms" in row:
            row["dsa_speedup"] = row["dense_ms"] / row["dsa_ms"]
        rows.append(row)
        print(f"DSA n={n:>6}: dense {row.get('dense_ms', float('nan')):9.2f} ms  dsa {row.get('dsa_ms', float('nan')):9.2f} ms"
              f"  {row.get('dsa_speedup', float('nan')):5.2f}x  MB {row.get('dense_peak_extra_mb')} / "
              f"{row.get('dsa_peak_extra_mb')}", flush=True)
        save(rows)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--mla-sizes", type=int, nargs="*", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--dsa-sizes", type=int, nargs="*", default=[16384, 32768, 65536])
    parser.add_argument("--heads", type=int, default=16, help="DSA's query heads (DeepSeek-V3.2: 128)")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10, help="MLA decoding steps timed")
    parser.add_argument("--dsa-repeats", type=int, default=3, help="DSA and dense calls timed")
    parser.add_argument("--tiny", action="store_true", help="a small MLA layer (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "latent.json")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (use --device cpu --tiny for a smoke run)")
    report: dict = {"benchmark": "gpu_latent", "machine": machine_info(args.device), "config": vars(args) | {"out": str(args.out)},
                    "nan_rule": "on" if nan.on() else "off",
                    "mla": [], "dsa": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def saver(key):
        def save(rows):
            report[key] = rows
            write_json(args.out, report)
        return save

    if args.mla_sizes:
        mla_rows(args.mla_sizes, args, saver("mla"))
    if args.dsa_sizes:
        dsa_rows(args.dsa_sizes, args, saver("dsa"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
