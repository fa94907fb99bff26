"""docs/linear/: the implicit attention of a Qwen3-Next-shaped Gated DeltaNet layer beside a softmax layer's.

Both layers take the same 48 tokens (random embeddings; random weights at the model's initialisation, no
checkpoint: the picture shows the shape of each mechanism's weights, not a trained model's heads; the four
linear heads are given decays from slow to fast, A = 0.01, 0.05, 0.3, 2). The
softmax layer is Qwen3-Next's gated attention (attnkit.layers.GatedAttention), causal; the linear one its
Gated DeltaNet (attnkit.layers.GatedDeltaNet, need_weights=True: the exact L x L matrix applied to the
values). Writes softmax_heads.png and gated_deltanet_heads.png (4 heads each).

    python scripts/linear_figure.py
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.layers import GatedAttention, GatedDeltaNet
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
    with torch.no_grad():
        soft = softmax(x, is_causal=True, need_weights=True).weights[0]
        lin = linear(x, need_weights=True).weights[0]
    OUT.mkdir(parents=True, exist_ok=True)
    plot_heads(soft, OUT / "softmax_heads.png", title="softmax attention (Qwen3-Next's gated attention), 4 heads")
    plot_heads(lin, OUT / "gated_deltanet_heads.png",
               title="Gated DeltaNet's implicit attention (out = A v), 4 value heads, decay slow to fast")
    print(f"wrote {OUT}/softmax_heads.png, {OUT}/gated_deltanet_heads.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
