"""The layer-level performance targets, each against its baseline in the same run.

    mha-overhead     MultiHeadAttention (D = 512, H = 8, n = 1K, B = 1, forward, eval) against the
                     same projections written out by hand around F.scaled_dot_product_attention
                     ("raw SDPA"), and torch.nn.MultiheadAttention. Target: the layer adds <= 10%.
    need-weights     peak extra memory of attention(need_weights=...) at n = 4K, H = 8, each in a
                     fresh process: False, [0] (one head), True (all heads). Target: one head costs
                     one head's weights (B x n x n x 4 bytes) only.
    bahdanau-step    one Bahdanau decoding step at S = 50 (B = 64, Dq = 256, Dk = 512, A = 256)
                     with the keys projected once per sentence vs projected again every step.
                     Target: >= 2x faster per step.
    training         tokens/s of a training step (forward, cross entropy, backward, AdamW) of
                     attnkit's TransformerEncoderDecoder against torch.nn.Transformer with the same
                     sizes, embeddings, sinusoidal positions and output layer, timed round-robin.
                     Target: >= 0.95x.

Usage:
    python benchmarks/targets.py                 # all four
    python benchmarks/targets.py --only training
Prints a table and writes JSON (default benchmarks/results/targets.json).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import attnkit
from attnkit._files import write_json
from attnkit.bench import machine_info, peak_extra_mb, run_worker, time_round_robin
from attnkit.bench.harness import serve_worker
from attnkit.layers.positional import sinusoidal_table

TARGETS = ("mha-overhead", "need-weights", "bahdanau-step", "training")


def mha_overhead(args) -> dict:
    torch.manual_seed(0)
    D, H, n = 512, 8, args.mha_n
    layer = attnkit.MultiHeadAttention(D, H).eval()
    theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
    x = torch.randn(1, n, D)
    Wq, Wk, Wv, Wo = layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj

    def raw():  # the minimum: three projections, SDPA, the output projection
        q, k, v = (F.linear(x, W.weight, W.bias).view(1, n, H, D // H).transpose(1, 2) for W in (Wq, Wk, Wv))
        return F.linear(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, n, D), Wo.weight, Wo.bias)

    calls = {
        "raw-sdpa": raw,
        "attnkit": lambda: layer(x).output,
        "torch.nn.MultiheadAttention": lambda: theirs(x, x, x, need_weights=False)[0],
    }
    with torch.no_grad():
        torch.testing.assert_close(calls["attnkit"](), raw())  # the same computation
        times = time_round_robin(calls, repeats=args.repeats * 5, min_seconds=3.0)
    base = times["raw-sdpa"]["time_s"]
    rows = [{"impl": name, **t, "x_raw_sdpa": base / t["time_s"]} for name, t in times.items()]
    overhead = times["attnkit"]["time_s"] / base - 1
    return {"shape": {"B": 1, "n": n, "D": D, "H": H}, "rows": rows, "attnkit_overhead": overhead,
            "target": "overhead <= 0.10", "met": overhead <= 0.10}


def _need_weights_worker(spec: dict) -> dict:
    torch.manual_seed(0)
    n, H = spec["n"], 8
    q, k, v = (torch.randn(1, H, n, 64) for _ in range(3))
    need = {"False": False, "[0]": [0], "True": True}[spec["need"]]
    with torch.no_grad():
        small = torch.randn(1, H, 256, 64)
        attnkit.attention(small, small, small, need_weights=need)  # initialise libraries
        mb = peak_extra_mb(lambda: attnkit.attention(q, k, v, need_weights=need))
    return {"peak_extra_mb": mb}


def need_weights(args) -> dict:
    n = args.weights_n
    one_head_mb = n * n * 4 / 2**20
    rows = []
    for need in ("False", "[0]", "True"):
        result = run_worker(__file__, {"task": "need-weights", "n": n, "need": need}, timeout=600)
        rows.append({"need_weights": need, **result})
    extra = rows[1]["peak_extra_mb"] - rows[0]["peak_extra_mb"]
    return {"shape": {"B": 1, "H": 8, "n": n, "E": 64}, "rows": rows, "one_head_weights_mb": one_head_mb,
            "one_head_extra_mb": extra, "target": "one head costs ~ one head's weights",
            "met": extra <= 1.25 * one_head_mb}


def bahdanau_step(args) -> dict:
    torch.manual_seed(0)
    B, S, Dq, Dk, A = 64, args.bahdanau_s, 256, 512, 256
    layer = attnkit.BahdanauAttention(Dq, Dk, A).eval()
    keys, query = torch.randn(B, S, Dk), torch.randn(B, Dq)
    mask = torch.ones(B, S, dtype=torch.bool)
    with torch.no_grad():
        projected = layer.project_keys(keys)
        calls = {
            "recompute keys each step": lambda: layer(query, keys, mask=mask),
            "keys projected once": lambda: layer(query, keys, mask=mask, projected_keys=projected),
        }
        torch.testing.assert_close(calls["keys projected once"]()[0], calls["recompute keys each step"]()[0])
        times = time_round_robin(calls, repeats=args.repeats * 20, min_seconds=2.0)
    speedup = times["recompute keys each step"]["time_s"] / times["keys projected once"]["time_s"]
    rows = [{"impl": name, **t} for name, t in times.items()]
    return {"shape": {"B": B, "S": S, "Dq": Dq, "Dk": Dk, "A": A}, "rows": rows, "speedup": speedup,
            "target": "speedup >= 2", "met": speedup >= 2.0}


class _TorchTranslator(nn.Module):
    """torch.nn.Transformer with the same embeddings (x sqrt(D)), sinusoidal positions and output
    layer as attnkit's TransformerEncoderDecoder."""

    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.scale = math.sqrt(D)
        self.source = nn.Embedding(config.source_vocab, D)
        self.target = nn.Embedding(config.target_vocab, D)
        self.register_buffer("positions", sinusoidal_table(config.max_len, D))
        self.dropout = nn.Dropout(config.dropout)
        self.transformer = nn.Transformer(
            D, config.num_heads, config.encoder_layers, config.decoder_layers, config.d_ff, config.dropout,
            batch_first=True,
        )
        self.generator = nn.Linear(D, config.target_vocab)

    def embed(self, embedding, tokens):
        return self.dropout(embedding(tokens) * self.scale + self.positions[: tokens.shape[1]])

    def forward(self, source, source_lengths, target_in):
        pad = torch.arange(source.shape[1]) >= source_lengths[:, None]  # True = ignore (torch convention)
        T = target_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        x = self.transformer(self.embed(self.source, source), self.embed(self.target, target_in), tgt_mask=causal,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
        return self.generator(x)


def training(args) -> dict:
    from attnkit.models import TransformerConfig, TransformerEncoderDecoder, count_parameters

    torch.manual_seed(0)
    config = TransformerConfig(4000, 4000, d_model=256, num_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3,
                               dropout=0.1, max_len=256)
    B, S, T = 32, 40, 40
    models = {"attnkit": TransformerEncoderDecoder(config), "torch.nn.Transformer": _TorchTranslator(config)}
    source = torch.randint(4, 4000, (B, S))
    lengths = torch.randint(S // 2, S + 1, (B,))
    lengths[0] = S
    target = torch.randint(4, 4000, (B, T + 1))

    def step_fn(model, optimizer):
        def step():
            optimizer.zero_grad(set_to_none=True)
            out = model(source, lengths, target[:, :-1])
            logits = out.logits if hasattr(out, "logits") else out
            F.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten()).backward()
            optimizer.step()
        return step

    calls = {}
    for name, model in models.items():
        model.train()
        calls[name] = step_fn(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    times = time_round_robin(calls, repeats=args.repeats * 5, min_seconds=10.0, warmup_seconds=3.0)
    tokens = B * T
    rows = [
        {"impl": name, **t, "tokens_per_s": tokens / t["time_s"], "parameters": count_parameters(models[name])}
        for name, t in times.items()
    ]
    ratio = times["torch.nn.Transformer"]["time_s"] / times["attnkit"]["time_s"]
    return {"shape": {"B": B, "S": S, "T": T, "d_model": 256, "heads": 4, "d_ff": 1024, "layers": "3+3",
                      "vocab": 4000, "dropout": 0.1}, "rows": rows, "throughput_ratio": ratio,
            "target": "ratio >= 0.95", "met": ratio >= 0.95}


def format_report(results: dict) -> str:
    lines = []
    for name, result in results.items():
        lines.append(f"== {name} {result['shape']}  target: {result['target']}  met: {result['met']}")
        for row in result["rows"]:
            cells = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()]
            lines.append("   " + "  ".join(cells))
        for key in ("attnkit_overhead", "one_head_extra_mb", "one_head_weights_mb", "speedup", "throughput_ratio"):
            if key in result:
                lines.append(f"   {key} = {result[key]:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mha-n", type=int, default=1024)
    parser.add_argument("--weights-n", type=int, default=4096)
    parser.add_argument("--bahdanau-s", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "targets.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(args.worker, _need_weights_worker)
    runs = {"mha-overhead": mha_overhead, "need-weights": need_weights, "bahdanau-step": bahdanau_step,
            "training": training}
    results = {}
    for name in args.only:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = runs[name](args)
        write_json(args.out, {"benchmark": "targets", "machine": machine_info(), "results": results})
    print(format_report(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
