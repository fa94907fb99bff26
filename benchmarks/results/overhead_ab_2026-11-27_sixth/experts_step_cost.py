"""One token's mixture of experts (a decoding step): routed_experts on x (1, 256) with 4 experts of 128 (the tiny
hybrids of hybrid_decode.py), 2 chosen, float32, one thread: microseconds a call, best of 20 rounds of 500. Run once
per side (the README's loop: before, then after, three times); output appended to experts_step_cost.txt."""
import torch
from _interleaved import best_us

from attnkit.models import blocks

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(1, 256, generator=g)
gate_up_proj, down_proj = torch.randn(4, 256, 256, generator=g), torch.randn(4, 256, 128, generator=g)
experts, weights = torch.tensor([[2, 0]]), torch.rand(1, 2, generator=g)
best_us({f"routed_experts, one token ({blocks.__file__.split('/src/')[0]})":
         lambda: blocks.routed_experts(x, gate_up_proj, down_proj, experts, weights)}, calls=500, rounds=20)
