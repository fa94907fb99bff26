"""benchmarks/linear_attention.py's decoding rows on the code at PYTHONPATH, with transformers' own one-token step
beside them: Qwen3-Next's shape (B 1, 16 heads of 128, float32, q and k normalised, 2 threads), one token from a
carried state through attnkit's gated_delta_rule (the layer's call: check_values=False where the code has it) and
through transformers' torch_recurrent_gated_delta_rule (what its Qwen3-Next decodes with when
flash-linear-attention is not installed), and SDPA over 1K cached keys; the benchmarks' round-robin harness,
medians. Run once per side: ``python linear_decode.py --out linear_decode_after.json``."""
import argparse
import inspect
import json
import sys
from pathlib import Path

import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

import attnkit
from attnkit.bench.harness import time_round_robin
from attnkit.functional.linear import gated_delta_rule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: linear_attention's inputs
from linear_attention import E, H, _inputs  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
torch.set_num_threads(2)
q, k, v, g, beta = _inputs(1)
state = torch.randn(1, H, E, E) * 0.01
options = {"check_values": False} if "check_values" in inspect.signature(gated_delta_rule).parameters else {}
keys, values = torch.randn(1, H, 1024, E), torch.randn(1, H, 1024, E)


def t(x):
    return x.transpose(1, 2)


calls = {
    "attnkit gated_delta_rule, one token": lambda: gated_delta_rule(
        q, k, v, g, beta, initial_state=state, output_final_state=True, use_qk_l2norm=True, **options),
    "transformers torch_recurrent_gated_delta_rule, one token": lambda: torch_recurrent_gated_delta_rule(
        t(q), t(k), t(v), t(g), t(beta), initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True),
    "attnkit attention, SDPA step at 1024": lambda: attnkit.attention(q, keys, values, is_causal=True,
                                                                      causal_align="bottom-right"),
}
with torch.no_grad():
    ours = calls["attnkit gated_delta_rule, one token"]()
    theirs = calls["transformers torch_recurrent_gated_delta_rule, one token"]()
    torch.testing.assert_close(ours.output, t(theirs[0]), rtol=1e-4, atol=1e-5)
    times = time_round_robin(calls, repeats=20, min_seconds=0.5)
rows = [{"row": name, "ms": 1e3 * result["time_s"]} for name, result in times.items()]
for row in rows:
    print(f"{row['row']:<58} {row['ms']:.3f} ms")
Path(args.out).write_text(json.dumps({"attnkit": attnkit.__file__, "threads": 2, "check_values": options, "rows": rows},
                                     indent=1))
