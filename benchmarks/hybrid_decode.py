"""A hybrid model's decoding step, attnkit's native model against transformers' own, the same random weights (saved
by transformers, loaded by attnkit's one loader): Qwen3-Next (Gated DeltaNet), Kimi Linear (Kimi Delta Attention)
and MiniMax-01 (lightning attention), each 4 layers of width 256 (three linear, one softmax; MiniMax two and two),
batch 1; by default float32 on the CPU with one thread. A prompt of 32 tokens, then 32 greedy steps, each side
through its own cache; the milliseconds a step (on CUDA, the device synchronised around the 32 steps), best of 5
alternating runs, and whether both sides chose the same tokens (in bfloat16 they may part: rounding).

    python benchmarks/hybrid_decode.py --out benchmarks/results/hybrid_decode.json
    python benchmarks/hybrid_decode.py --device cuda --dtype bfloat16 --out hybrid_decode_cuda.json

Run with PYTHONPATH pointing at the code to measure, to set two commits side by side."""
import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import transformers

import attnkit
from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.models.pretrained import load_hf_folder

COMMON = dict(vocab_size=512, hidden_size=256, num_hidden_layers=4, max_position_embeddings=512, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "qwen3_next": lambda: transformers.Qwen3NextConfig(
        **COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
    "kimi_linear": lambda: transformers.KimiLinearConfig(
        **COMMON, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, intermediate_size=512, moe_intermediate_size=128,
        num_experts=4, num_experts_per_token=2, num_shared_experts=1, num_expert_group=2, topk_group=1,
        routed_scaling_factor=2.0, linear_num_heads=4, linear_head_dim=64, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
    "minimax": lambda: transformers.MiniMaxConfig(
        **COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
        num_local_experts=4, num_experts_per_tok=2, block_size=64,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"]),
}
STEPS = 32


def models(family, device, dtype):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).eval()
    folder = tempfile.mkdtemp()
    try:
        theirs.save_pretrained(folder)
        ours = load_hf_folder(folder).eval()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return ours.to(device, dtype), theirs.to(device, dtype)


def _synchronise(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_ours(model, prompt, device):
    cache = model.new_cache()
    token = model(prompt, cache=cache, last_only=True).logits[:, -1:].argmax(-1)
    tokens = []
    _synchronise(device)
    start = time.perf_counter()
    for _ in range(STEPS):
        token = model(token, cache=cache, last_only=True).logits[:, -1:].argmax(-1)
        tokens.append(token)
    _synchronise(device)
    return (time.perf_counter() - start) / STEPS * 1e3, torch.cat(tokens, 1)


def decode_theirs(model, prompt, device):
    out = model(prompt, use_cache=True)
    cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    tokens = []
    _synchronise(device)
    start = time.perf_counter()
    for _ in range(STEPS):
        out = model(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        tokens.append(token)
    _synchronise(device)
    return (time.perf_counter() - start) / STEPS * 1e3, torch.cat(tokens, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (one thread), or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA device")
    if args.device == "cpu":
        torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    prompt = torch.randint(3, 512, (1, 32), generator=torch.Generator().manual_seed(0)).to(args.device)
    rows = []
    for family in args.families:
        ours, theirs = models(family, args.device, dtype)
        best = {"attnkit_ms": float("inf"), "transformers_ms": float("inf")}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(args.runs):
                ms, ours_tokens = decode_ours(ours, prompt, args.device)
                best["attnkit_ms"] = min(best["attnkit_ms"], ms)
                ms, their_tokens = decode_theirs(theirs, prompt, args.device)
                best["transformers_ms"] = min(best["transformers_ms"], ms)
        row = {"family": family, **best, "transformers_over_attnkit": best["transformers_ms"] / best["attnkit_ms"],
               "same_tokens": bool(torch.equal(ours_tokens, their_tokens))}
        rows.append(row)
        print(f"{family:12s} attnkit {row['attnkit_ms']:6.2f} ms  transformers {row['transformers_ms']:6.2f} ms  "
              f"{row['transformers_over_attnkit']:4.2f}x  same tokens {row['same_tokens']}", flush=True)
    report = {"machine": machine_info(args.device), "transformers": transformers.__version__,
              "attnkit": getattr(attnkit, "__file__", ""), "steps": STEPS, "device": args.device, "dtype": args.dtype,
              "threads": torch.get_num_threads(), "rows": rows}
    write_json(Path(args.out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
