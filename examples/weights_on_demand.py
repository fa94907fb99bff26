"""Ask one layer for the weights of one head without giving up the fast path for the output.

Runs grouped-query causal attention with each backend, checks that they agree with the
plain reference, and prints which key the chosen head attends to most for each query.

    python examples/weights_on_demand.py
"""

import torch

import attnkit

torch.manual_seed(0)
q = torch.randn(1, 8, 12, 32)  # (B, H, L, E)
k = torch.randn(1, 2, 12, 32)  # (B, Hkv, S, E): 4 query heads per key/value head
v = torch.randn(1, 2, 12, 32)

reference = attnkit.attention(q, k, v, is_causal=True, backend="reference", need_weights=True)
for backend in ("sdpa", "tiled", "auto"):
    result = attnkit.attention(q, k, v, is_causal=True, backend=backend, need_weights=[5])
    output_error = (result.output - reference.output).abs().max().item()
    weight_error = (result.weights[:, 0] - reference.weights[:, 5]).abs().max().item()
    print(f"{backend:>5}: max |output - reference| = {output_error:.1e}, head 5 weights {weight_error:.1e}")
    assert output_error < 1e-5 and weight_error < 1e-5

print("head 5 attends most to key:", reference.weights[0, 5].argmax(-1).tolist())
