"""docs/linear/: the implicit attention of a Qwen3-Next-shaped Gated DeltaNet layer and of a Mamba-2 layer beside a
softmax layer's.

Both layers take the same 48 tokens (random embeddings; random weights at the model's initialisation, no
checkpoint: the picture shows the shape of each mechanism's weights, not a trained model's heads; the four
linear heads are given decays from slow to fast, A = 0.01, 0.05, 0.3, 2). The
softmax layer is Qwen3-Next's gated attention (attnkit.layers.GatedAttention), causal; the linear one its
Gated DeltaNet (attnkit.layers.GatedDeltaNet, need_weights=True: the exact L x L matrix applied to the
values); the Mamba-2 one attnkit.layers.Mamba2 (4 heads of 64, a state of 64, one group of B and C; its decays
given the same slow-to-fast rates, its steps dt around 0.5), need_weights=True likewise: how much of each earlier
token's dt x reaches y_i (the skip D x aside). Writes softmax_heads.png, gated_deltanet_heads.png and
mamba2_heads.png (4 heads each).

    python scripts/linear_figure.py
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.layers import GatedAttention, GatedDeltaNet, Mamba2
from attnkit.viz import plot_heads

OUT = Path(__file__).resolve().parents[1] / "docs" / "linear"


def main() -> int:
    torch.manual_seed(0)
    D, L = 256, 48
    x = torch.randn(1, L, D)
    softmax = GatedAttention(D, 4, num_kv_heads=2).eval()
    linear = GatedDeltaNet(D, num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64).eval()
    with torch.no_grad():  # one decay per head from slow to fast (the initialisation draws A from [0.01, 16]:
        linear.A_log.copy_(torch.tensor([0.01, 0.05, 0.3, 2.0]).log())  # mostly fast, nearly diagonal maps)
    mamba = Mamba2(D, num_heads=4, head_dim=64, state_size=64).eval()
    with torch.no_grad():
        mamba.A_log.copy_(torch.tensor([0.01, 0.05, 0.3, 2.0]).log())
        mamba.dt_bias.fill_(0.0)  # softplus(0 + the projection's part): steps around 0.7
    with torch.no_grad():
        soft = softmax(x, is_causal=True, need_weights=True).weights[0]
        lin = linear(x, need_weights=True).weights[0]
        ssm = mamba(x, need_weights=True).weights[0]
    OUT.mkdir(parents=True, exist_ok=True)
    plot_heads(soft, OUT / "softmax_heads.png", title="softmax attention (Qwen3-Next's gated attention), 4 heads")
    plot_heads(lin, OUT / "gated_deltanet_heads.png",
               title="Gated DeltaNet's implicit attention (out = A v), 4 value heads, decay slow to fast")
    plot_heads(ssm, OUT / "mamba2_heads.png",
               title="Mamba-2's implicit attention (y = A dt x), 4 heads, decay slow to fast")
    print(f"wrote {OUT}/softmax_heads.png, {OUT}/gated_deltanet_heads.png, {OUT}/mamba2_heads.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
