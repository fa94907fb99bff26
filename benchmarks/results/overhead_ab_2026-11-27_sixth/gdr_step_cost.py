"""One token of the gated delta rule (a hybrid model's decoding step on a linear layer), float32, one thread: the
public call as it is, its check with and without the look at g's and beta's values, and the three forms of the
rule on the same token (the chunked form's one chunk, the token loop of the reference recurrence, and _step).
The shape of the tiny model of hybrid_decode.py (4 value heads of 64; at Qwen3-Next's 32 heads of 128 each call
allocates 2 MB states, and this machine's page faults, half the time in the kernel, swamped the differences).
Output: gdr_step_cost.txt."""
import torch
from _interleaved import best_us

from attnkit.functional.linear import delta as D
from attnkit.functional.linear import gated_delta_rule

torch.set_num_threads(1)
for H, K in [(4, 64)]:
    g0 = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, 1, K, generator=g0) for _ in range(3))
    q, k = (torch.nn.functional.normalize(x, dim=-1) for x in (q, k))
    g, beta = -torch.rand(1, H, 1, generator=g0), torch.rand(1, H, 1, generator=g0)
    state = torch.randn(1, H, K, K, generator=g0)
    print(f"--- B 1, H {H}, K = V = {K}, L 1, a carried state", flush=True)
    best_us({
        "gated_delta_rule(...) (the public call)": lambda: gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                                           output_final_state=True),
        "gated_delta_rule(..., check_values=False)": lambda: gated_delta_rule(
            q, k, v, g, beta, initial_state=state, output_final_state=True, check_values=False),
        "_check (sizes and the values' look)": lambda: D._check(q, k, v, g, beta, state, 64, None),
        "_check(check_values=False)": lambda: D._check(q, k, v, g, beta, state, 64, None, False),
        "_chunked (one chunk of one token)": lambda: D._chunked(q, k, v, g, beta, state, True, 64),
        "_recurrent (the reference loop)": lambda: D._recurrent(q, k, v, g, beta, state, True),
        "_step": lambda: D._step(q, k, v, g, beta, state, True),
    }, rounds=20)
